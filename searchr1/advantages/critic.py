"""The critic's algorithm half (``advantage=ppo_gae``): its batch, its update, its metrics.

The value model — a causal LM with a scalar value head, always in this process, since PyTRIO
has no value head — is the local engine's (``engines/local/training/critic.py``); the step
reaches it only through ``ValueModel``: values per position of a datum's model input, the
gradient of a per-datum weighted value loss, and one optimizer step. What an update *is*
is decided here, as verl's critic does it: one optimizer step per actor mini-batch, whose
loss is the mean over loss micro-batches (``critic.microbatch_trajectories`` datums, cut
from the global mini-batch) of their token-mean clipped value loss (``losses/value.py``),
with the weights of ``losses/aggregation.py``. ``ppo_gae`` (``advantages/gae.py``) gives
the returns and the tokens they are fitted on; ``critic_batch`` reads them from the step
batch's columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from searchr1.batch.step_batch import StepBatch
from searchr1.losses.aggregation import global_totals, microbatch_token_weights
from searchr1.losses.value import explained_variance


@dataclass
class CriticBatch:
    """One mini-batch for the critic: per-datum inputs and targets (shifted layout)."""

    inputs_D: list[np.ndarray]  # model_input token ids
    old_values_D: list[np.ndarray]  # values at rollout time
    returns_D: list[np.ndarray]  # GAE returns (0 off action tokens)
    masks_D: list[np.ndarray]  # 1 where the value is fitted (advantage.gae_domain's tokens)


class ValueModel(Protocol):
    """What the step needs of a value model (the local engine's ``Critic``)."""

    @property
    def microbatch_trajectories(self) -> int:
        """Datums per loss micro-batch of the value loss (``critic.microbatch_trajectories``)."""

    def values(self, inputs_D: list[np.ndarray]) -> list[np.ndarray]:
        """V at every position of each datum's model input (no gradient)."""

    def backward(self, batch: CriticBatch, weights_D: Sequence[float]) -> dict[str, float]:
        """Accumulate the gradient of Σ_d w_d Σ_t mask·ℓ_t (ℓ the clipped value loss) and
        return the weighted sums ``value_loss`` and ``vf_clipfrac``."""

    def optimizer_step(self, step: int | None = None, dp=None) -> float:
        """Sum the gradients over the ranks (``dp``), clip, take one step at the warm-up LR of
        the training step ``step`` (or of the optimizer step) and return that LR."""

    def save(self, path) -> None:
        """Its whole state (weights, optimizer, steps), for ``trainer.resume``."""

    def load(self, path) -> None:
        """Restore what ``save`` wrote."""


def critic_batch(batch: StepBatch, part: list[int]) -> CriticBatch:
    """The critic's inputs and targets for the datums ``part``, fitted on ``value_mask_T``."""
    return CriticBatch(batch.rows("input_T", part), batch.rows("values_T", part),
                       batch.rows("returns_T", part), batch.rows("value_mask_T", part))


def update_critic(model: ValueModel, batch: CriticBatch, step: int | None = None, share=None,
                  dp=None) -> dict[str, float]:
    """One optimizer step: the mean over micro-batches of the token-mean value loss (``step``:
    the training step, for ``trainer.warmup_unit=step``).

    Under data parallelism (``share``: this rank's part of the global mini-batch, ``dp``)
    token means use the global micro-batch token counts and the gradients are summed.
    """
    n = len(batch.inputs_D)
    offset, size = (share.offset, share.size) if share is not None else (0, n)
    tokens = [float((np.asarray(m) > 0).sum()) for m in batch.masks_D]
    totals = global_totals(tokens, max(1, model.microbatch_trajectories), float(size), offset, size,
                           dp.all_sum if dp is not None else None)
    sums = model.backward(batch, microbatch_token_weights(totals, n))
    lr = model.optimizer_step(step, dp)
    return {"critic/value_loss": sums["value_loss"], "critic/vf_clipfrac": sums["vf_clipfrac"],
            "critic/lr": lr}


def critic_metrics(values_D, returns_D, masks_D, dp=None) -> dict[str, float]:
    """``critic/values_mean`` and ``critic/explained_variance`` on action tokens (of every
    rank under data parallelism: from global sums, population variances)."""
    pick = lambda xs: [np.asarray(x, float)[np.asarray(m) > 0] for x, m in zip(xs, masks_D)]
    v = np.concatenate(pick(values_D)) if masks_D else np.zeros(0)
    r = np.concatenate(pick(returns_D)) if masks_D else np.zeros(0)
    if dp is not None and dp.active:
        d = r - v
        n, sv, sr, sr2, sd, sd2 = dp.all_sum([v.size, v.sum(), r.sum(), (r * r).sum(), d.sum(), (d * d).sum()])
        if n == 0:
            return {}
        var_r, var_d = sr2 / n - (sr / n) ** 2, sd2 / n - (sd / n) ** 2
        return {"critic/values_mean": sv / n,
                "critic/explained_variance": 0.0 if var_r == 0 else 1.0 - var_d / var_r}
    if v.size == 0:
        return {}
    return {"critic/values_mean": float(v.mean()),
            "critic/explained_variance": explained_variance(torch.as_tensor(v), torch.as_tensor(r))}


def critic_summary(batch: StepBatch, dp=None) -> dict[str, float]:
    """Value statistics on the critic's tokens (of every rank)."""
    return critic_metrics(batch.rows("values_T"), batch.rows("returns_T"), batch.rows("value_mask_T"), dp)
