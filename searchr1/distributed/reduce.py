"""Per-rank metrics → the job's metrics, each family reduced as its definition needs.

Kinds: ``PRODUCT`` (loss_sum = the reduced loss_mean × token_count), ``SUM`` (counters, and loss shares: under global normalisation each rank's loss is
its share of the global loss), ``MEAN`` (a mean over some unit — trajectories, groups,
tokens, search turns, a source's trajectories — weighted by the rank's count of that unit,
so Σ w·m / Σ w is the mean over the whole batch), ``MAX`` (wall times: the step waits for
the slowest rank), ``MIN`` and ``FIRST`` (values already global: replicated after the
all-reduce, or computed from globally reduced counts). A rank without a key (an empty
mini-batch share) does not take part in that key's reduction.

Two tables: ``UPDATE`` for one mini-batch's update metrics, ``STEP`` for everything else of
a step; a key matches the first entry whose prefix it starts with.
"""

from __future__ import annotations

from collections import Counter
from enum import Enum

from searchr1.rollout.scoring import TOOL_CALL_OPEN


class Kind(str, Enum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    FIRST = "first"
    PRODUCT = "product"  # the product of two reduced metrics (``PRODUCTS``)


#: metrics defined as a product of two others: pytrio's loss_sum = loss_mean × token_count
PRODUCTS = {"train/loss_sum": ("train/loss_mean", "train/token_count")}


#: (prefixes, kind, weight name) for one mini-batch's update metrics
UPDATE = (
    (tuple(PRODUCTS), Kind.PRODUCT, None),
    (("train/lr", "train/learning_rate", "train/step", "train/grad_norm", "critic/lr"), Kind.FIRST, None),
    (("train/loss", "train/kl", "train/token_count", "train/tokens_per_second",
      "critic/value_loss", "critic/vf_clipfrac"), Kind.SUM, None),
    (("train/",), Kind.MEAN, "tokens"),
    (("critic/",), Kind.MEAN, "tokens"),
)

#: (prefixes, kind, weight name) for the rest of a step's metrics
STEP = (
    (("time/",), Kind.MAX, None),
    (("train/staleness", "train/optimizer_steps", "search/", "eval/"), Kind.FIRST, None),
    (("rollout/sampled_tokens", "rollout/tool_error_trajectories", "train/dropped_for_tool_error",
      "train/skipped_overlong", "train/unmasked_observation_tokens", "train/datums", "train/micro_batches_per_step",
      "train/tokens_per_rollout_batch", "train/loss_tokens_per_rollout_batch",
      "train/padded_tokens_per_rollout_batch"), Kind.SUM, None),
    (("train/max_micro_batch_padded_tokens",), Kind.MAX, None),
    (("train/update_skipped",), Kind.MIN, None),
    (("train/kl",), Kind.MEAN, "tokens"),
    (("rollout/degenerate_group_rate",), Kind.MEAN, "groups"),
    (("rollout/tool_error_rate",), Kind.MEAN, "search_turns"),
    (("rollout/valid_tool_call_rate",), Kind.MEAN, "tool_call_attempts"),
    (("reward/mean", "reward/correct", "reward/format"), Kind.MEAN, "trajectories"),
    (("reward/",), Kind.MEAN, "source"),  # reward/<data_source>: that source's trajectories
    (("",), Kind.MEAN, "trajectories"),
)


def kind_of(key: str, table) -> tuple[Kind, str | None]:
    """(kind, weight name) of ``key``: the first entry of ``table`` it starts with."""
    for prefixes, kind, weight in table:
        if key.startswith(prefixes):
            if weight == "source":
                weight = "source/" + key.removeprefix("reward/")
            return kind, weight
    return Kind.MEAN, "trajectories"


def reduce_gathered(rows: list[tuple[dict, dict]], table) -> dict[str, float]:
    """Reduce per-rank ``(metrics, weights)`` (rank order) into one metrics dict.

    A ``MEAN`` whose weights are all 0 (no rank counted a unit) is the plain mean.
    """
    keys = sorted({k for metrics, _ in rows for k in metrics})
    out: dict[str, float] = {}
    for key in keys:
        have = [(m[key], w) for m, w in rows if key in m]
        vals = [float(v) for v, _ in have]
        kind, weight = kind_of(key, table)
        if kind is Kind.SUM:
            out[key] = float(sum(vals))
        elif kind is Kind.MAX:
            out[key] = max(vals)
        elif kind is Kind.MIN:
            out[key] = min(vals)
        elif kind is Kind.FIRST:
            out[key] = vals[0]
        elif kind is Kind.PRODUCT:
            continue
        else:
            ws = [float(w.get(weight, 0.0)) for _, w in have]
            total = sum(ws)
            out[key] = (sum(v * x for v, x in zip(vals, ws)) / total if total > 0
                        else sum(vals) / len(vals))
    for key, (a, b) in PRODUCTS.items():
        if key in keys and kind_of(key, table)[0] is Kind.PRODUCT:
            out[key] = out[a] * out[b]
    return out


def trajectory_weights(trajs, n_groups: int) -> dict[str, float]:
    """The units ``STEP``'s means are over, counted on this rank's trajectories."""
    search = [turn for t in trajs for turn in t.turns if turn.action.kind.value == "search"]
    attempts = sum(TOOL_CALL_OPEN in turn.text or turn.action.kind.value == "search"
                   for t in trajs for turn in t.turns)
    out = {"trajectories": float(len(trajs)), "groups": float(n_groups),
           "search_turns": float(len(search)), "tool_call_attempts": float(attempts)}
    out.update({f"source/{s}": float(c) for s, c in Counter(t.example.data_source for t in trajs).items()})
    return out
