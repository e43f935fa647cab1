"""Step metrics the lab logs beyond one batch's rewards: ``search/*`` and ``train/*`` sizes.

Pure functions; the step calls them with its own trajectories and micro-batch plan.

``search/*`` (lab: ``search.py``'s ``SearchStats``, logged every step) are **cumulative over
the run**: the lab's counters are never reset. They are computed here from the searches the
step's own trajectories executed (a turn parsed as a search that got an observation), so a
concurrent eval or another user of the retriever cannot leak into them, and the state is a
small frozen ``SearchCounts`` the caller keeps between steps. The same rates for the step
alone are logged under ``search/step_*``. Retriever-internal events the trajectories cannot
see (timeouts, HTTP 429 / Code 30001, key failovers) are taken from the retriever's
``metrics()`` of the step as rate × ``search/requests`` and accumulated the same way.

Departure: ``search/latency`` is measured around the rollout's search call, so it includes
time queued behind ``rollout.search_concurrency``; the lab searched one query at a time.

``train/*`` batch sizes (lab: ``train.py``'s ``rollout_metrics``): datums, micro-batches,
input tokens, loss tokens, padded tokens (longest datum × datums, per micro-batch) and the
largest micro-batch, plus ``train/update_skipped`` (1.0 when no datum carried signal and no
optimizer step ran).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from searchr1.protocols.base import ActionKind
from searchr1.batch.microbatches import padded_tokens
from searchr1.rollout.tool_errors import turn_failed
from searchr1.rollout.types import Trajectory

#: retriever event rates → the ``SearchCounts`` field that accumulates them
EVENT_RATES = {
    "search/timeout_rate": "timeouts",
    "search/429_rate": "rate_limited",
    "search/credential_failover_rate": "failovers",
}


@dataclass(frozen=True)
class SearchCounts:
    """Search counts over some span (one step, or the run so far)."""

    requests: int = 0  # executed searches
    errors: int = 0  # of which failed (the model saw a tool error)
    latency_s: float = 0.0  # summed seconds of all of them, failures included
    timeouts: float = 0.0  # searches that saw a timeout (from the retriever)
    rate_limited: float = 0.0  # searches that saw a rate limit (from the retriever)
    failovers: float = 0.0  # key failovers (from the retriever)

    def __add__(self, other: SearchCounts) -> SearchCounts:
        return SearchCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def rates(self, prefix: str) -> dict[str, float]:
        """The lab's ratios under ``prefix`` (``search/`` or ``search/step_``)."""
        n = max(self.requests, 1)
        out = {
            f"{prefix}requests": float(self.requests),
            f"{prefix}success_rate": (self.requests - self.errors) / n,
            f"{prefix}error_rate": self.errors / n,
            f"{prefix}latency": self.latency_s / n,
        }
        for key, name in EVENT_RATES.items():
            out[prefix + key.removeprefix("search/")] = getattr(self, name) / n
        return out


def search_counts(
    trajs: Sequence[Trajectory], retriever_metrics: Mapping[str, float] | None = None,
    promises_results: bool = True,
) -> SearchCounts:
    """Counts of the searches ``trajs`` executed (+ the retriever's event counts, if given).

    A search failed when it raised, or came back empty from a retriever that promises
    results (``rollout/tool_errors.py``): empty results do not count as successes.
    """
    done = [
        turn for t in trajs for turn in t.turns
        if turn.action.kind is ActionKind.SEARCH and turn.observation_len > 0
    ]
    events = {}
    if retriever_metrics:
        served = float(retriever_metrics.get("search/requests", 0.0))
        events = {name: float(retriever_metrics.get(key, 0.0)) * served
                  for key, name in EVENT_RATES.items()}
    return SearchCounts(
        requests=len(done),
        errors=sum(turn_failed(turn, promises_results) for turn in done),
        latency_s=float(sum(turn.search_seconds for turn in done)),
        **events,
    )


def batch_metrics(
    lengths_D: Sequence[int], loss_tokens_D: Sequence[int], bins: Sequence[Sequence[int]]
) -> dict[str, float]:
    """The lab's ``train/*`` sizes for a step's datums and its micro-batch plan.

    ``lengths_D``: input tokens per datum; ``loss_tokens_D``: tokens with a non-zero loss
    weight per datum; ``bins``: datum indices per micro-batch (all mini-batches together).
    """
    if len(lengths_D) != len(loss_tokens_D):
        raise ValueError(f"{len(lengths_D)} datum lengths but {len(loss_tokens_D)} loss counts")
    lengths = list(lengths_D)
    bins = [list(b) for b in bins if b]
    per_bin = [max(lengths[i] for i in b) * len(b) for b in bins]
    return {
        "train/datums_per_rollout_batch": float(len(lengths)),
        "train/micro_batches_per_step": float(len(per_bin)),
        "train/tokens_per_rollout_batch": float(sum(lengths)),
        "train/loss_tokens_per_rollout_batch": float(sum(loss_tokens_D)),
        "train/padded_tokens_per_rollout_batch": float(padded_tokens(lengths, bins)),
        "train/max_micro_batch_padded_tokens": float(max(per_bin, default=0)),
        "train/update_skipped": float(not per_bin),
    }
