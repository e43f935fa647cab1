"""Per-token losses → one scalar per mini-batch: the four ``loss.aggregation`` modes.

Inputs are flat over the mini-batch's tokens: ``values_T`` (per-token loss), ``domain_T``
(bool: the token carries loss), ``seq_T`` (trajectory index, 0…n_seq−1) and ``micro_T``
(micro-batch index, 0…n_micro−1). With n_s / n_m the domain tokens of trajectory s /
micro-batch m:

    token_mean              Σ_t l_t / Σ_s n_s
    seq_mean_token_mean     (1/n_seq) Σ_s (Σ_{t∈s} l_t / n_s)
    seq_mean_token_sum      (1/n_seq) Σ_s Σ_{t∈s} l_t
    microbatch_token_mean   (1/n_micro) Σ_m (Σ_{t∈m} l_t / n_m)

These are verl's ``agg_loss`` modes (``core_algos.py``: token-mean, seq-mean-token-mean,
seq-mean-token-sum) plus the behaviour of the Search-R1 actor (``dp_actor.py``), whose loss
is each micro-batch's token mean divided by the number of micro-batches
(``ppo_mini_batch_size / ppo_micro_batch_size``) with gradient accumulation — the
official paper presets use ``microbatch_token_mean``. A trajectory or micro-batch with no
domain token contributes 0 (its mean is taken as 0/1), as verl's ``masked_mean`` with
its ε would give.

The lab's loss scale (``experiment=lab``): the lab (``03-search-r1/train.py``)
calls ``forward_backward`` once per FFD micro-batch k with n_k datums and multiplies the
advantages by n_k / N, N = all trajectories of the step (``total_samples=len(trajectories)``,
including those dropped for zero advantage). pytrio 0.2.3 took each call's loss as the
*mean over its samples* (the lab's comment, and its seed text: "远端对每次 forward_backward
的样本取均值"), each sample's loss being its token mean; so the step's gradient is that of

    Σ_k (n_k/N) · (1/n_k) Σ_{d∈k} mean_t(−r·A)_d = (1/N) Σ_d mean_t(−r·A)_d,

a per-datum (not per-token) weighting: ``seq_mean_token_mean`` with n_seq = N. Dropped
trajectories count in N and add 0 (their A is 0). pytrio 0.2.9 instead normalises every
chunk of one call by the call's ``total_active_tokens`` (``training_batch.py``,
``GradientAccumulationTotals``), i.e. ``token_mean`` — which weights long trajectories
more. The update passes n_seq = the trajectories the mini-batch stands for (datums plus
their share of dropped ones), so the lab's objective is reproduced exactly with one
mini-batch per step; on PyTRIO the update expresses it with the built-in importance_sampling
loss and per-datum advantage weights (``datum_weights``), as the lab did. Assumption, stated: 0.2.3's per-sample loss is a token mean (if it
were a token sum, the lab's objective would be ``seq_mean_token_sum``).

This module is the one owner of these rules, in three encodings of the same loss:

- per token (``aggregate``): the custom objective's, and the denominators it takes;
- per datum (``datum_weights``): a weight w_d on each datum's advantages such that an
  engine's token mean over its call (pytrio's built-in losses) is the chosen mode — exact for
  losses linear in A (``test_per_token_and_per_datum_encodings_give_the_same_gradient``);
- per token as weights (``microbatch_token_weights``): the critic's value loss, a weighted
  sum over its forward passes.

The denominators of one mini-batch are ``GlobalTotals`` (``global_totals``: one rank's
datums, summed over the ranks), and a datum's loss micro-batch is its position in the global
mini-batch over ``micro_size`` (``micro_index``), for the actor and the critic alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from searchr1.losses.config import Aggregation


def _group_sums(values_T: torch.Tensor, index_T: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n, dtype=values_T.dtype, device=values_T.device)
    return out.index_add(0, index_T, values_T)


def _mean_of_means(values_T, domain_T, index_T, n: int, counts=None) -> torch.Tensor:
    """(1/n) Σ_g (Σ_{t∈g} v_t / max(n_g, 1)) over groups g = 0…n−1 (``counts``: given n_g)."""
    masked_T = torch.where(domain_T, values_T, torch.zeros_like(values_T))
    sums = _group_sums(masked_T, index_T, n)
    if counts is None:
        counts = _group_sums(domain_T.to(values_T.dtype), index_T, n)
    else:
        counts = torch.as_tensor(counts, dtype=values_T.dtype, device=values_T.device)
    counts = counts.clamp(min=1.0)
    return (sums / counts).sum() / n


def aggregate(
    values_T: torch.Tensor,
    domain_T: torch.Tensor,
    mode: Aggregation | str,
    seq_T: torch.Tensor | None = None,
    n_seq: float | None = None,
    micro_T: torch.Tensor | None = None,
    n_micro: int | None = None,
    tokens: float | None = None,
    micro_tokens=None,
) -> torch.Tensor:
    """One scalar from per-token values under ``mode`` (module docstring).

    ``tokens`` / ``micro_tokens`` replace the counted Σ_s n_s / n_m by given totals: a
    data-parallel rank holds part of the mini-batch and normalises by the global counts,
    so the ranks' losses sum to the one-process loss.
    """
    mode = Aggregation(mode)
    masked_T = torch.where(domain_T, values_T, torch.zeros_like(values_T))
    if mode is Aggregation.token_mean:
        if tokens is not None:
            return masked_T.sum() / max(float(tokens), 1.0)
        return masked_T.sum() / domain_T.sum().clamp(min=1)
    if mode is Aggregation.microbatch_token_mean:
        _require(micro_T, n_micro, "micro_T and n_micro")
        return _mean_of_means(values_T, domain_T, micro_T, int(n_micro), micro_tokens)
    _require(seq_T, n_seq, "seq_T and n_seq")
    n_groups = int(seq_T.max()) + 1 if seq_T.numel() else 1
    if mode is Aggregation.seq_mean_token_sum:
        return masked_T.sum() / n_seq
    masked_means = _mean_of_means(values_T, domain_T, seq_T, n_groups) * n_groups
    return masked_means / n_seq


def _require(index, n, what: str) -> None:
    if index is None or n is None or n <= 0:
        raise ValueError(f"this aggregation needs {what} (positive count)")


# ------------------------------------------------------------------------- denominators


def micro_index(position: int, micro_size: int) -> int:
    """The loss micro-batch of the datum at ``position`` of its global mini-batch."""
    return position // micro_size


@dataclass(frozen=True)
class GlobalTotals:
    """What one mini-batch's loss is normalised by, counted over all ranks.

    With one process these are the mini-batch's own counts; under data parallelism each
    rank holds a share (``offset`` is its first datum's position in the global mini-batch of
    ``size`` datums), and normalising by the global counts makes the ranks' losses — and
    gradients — sum to the one-process ones.
    """

    tokens: float  # loss-domain tokens of the global mini-batch
    n_seq: float  # trajectories the global mini-batch stands for (seq_mean_* modes)
    micro_tokens: tuple[float, ...]  # loss-domain tokens per loss micro-batch
    micro_size: int  # datums per loss micro-batch
    offset: int = 0
    size: int = 0

    @property
    def n_micro(self) -> int:
        return len(self.micro_tokens)

    def micro_of(self, position: int) -> int:
        """The loss micro-batch of the datum at ``position`` of the global mini-batch."""
        return micro_index(position, self.micro_size)


def global_totals(tokens_D: Sequence[float], micro_size: int, n_seq: float, offset: int = 0,
                  size: int | None = None,
                  all_sum: Callable[[list[float]], list[float]] | None = None) -> GlobalTotals:
    """The ``GlobalTotals`` of a global mini-batch of ``size`` datums (default: these alone)
    from one rank's datums at ``offset`` in it, ``tokens_D`` their loss-domain tokens in
    order; ``all_sum`` sums a list over the ranks (one collective of a short vector)."""
    size = len(tokens_D) if size is None else size
    vec = [0.0] * (1 + max(-(-size // micro_size), 1))
    for j, n in enumerate(tokens_D):
        vec[0] += n
        vec[1 + micro_index(offset + j, micro_size)] += n
    if all_sum is not None:
        vec = all_sum(vec)
    return GlobalTotals(vec[0], n_seq, tuple(vec[1:]), micro_size, offset, size)


# ---------------------------------------------------------------- the per-datum encodings


def datum_weights(mode: Aggregation | str, tokens_D: Sequence[float], g: GlobalTotals) -> list[float]:
    """w_d that turns an engine's token mean over one call into ``mode`` over the global
    mini-batch ``g``: the call's datums are ``tokens_D`` (loss-domain tokens, in mini-batch
    order from ``g.offset``), and w_d = N_call · c_d, c_d the datum's one-process coefficient
    (module docstring). Multiplying a datum's advantages by w_d multiplies its loss by w_d
    for a loss linear in A (importance_sampling, ppo, cispo)."""
    mode = Aggregation(mode)
    total = sum(tokens_D) or 1.0
    if mode is Aggregation.token_mean:
        return [1.0 if total == g.tokens else total / max(g.tokens, 1.0) for _ in tokens_D]
    if mode is Aggregation.microbatch_token_mean:
        return [total / (g.n_micro * (g.micro_tokens[g.micro_of(g.offset + k)] or 1.0))
                for k in range(len(tokens_D))]
    if mode is Aggregation.seq_mean_token_sum:
        return [total / g.n_seq for _ in tokens_D]
    return [total / (g.n_seq * (n or 1.0)) for n in tokens_D]


def microbatch_token_weights(g: GlobalTotals, n: int) -> list[float]:
    """The weight of every loss token of each of this rank's ``n`` datums (at ``g.offset``)
    under ``microbatch_token_mean``: 1 / (n_m · n_micro), n_m its micro-batch's tokens — the
    critic's value loss as a weighted sum, whichever forward pass a datum shares."""
    return [1.0 / (max(g.micro_tokens[g.micro_of(g.offset + j)], 1.0) * g.n_micro) for j in range(n)]
