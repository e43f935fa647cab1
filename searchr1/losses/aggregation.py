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
loss and per-datum advantage weights (``update.datum_weights``), as the lab did. Assumption, stated: 0.2.3's per-sample loss is a token mean (if it
were a token sum, the lab's objective would be ``seq_mean_token_sum``).
"""

from __future__ import annotations

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
