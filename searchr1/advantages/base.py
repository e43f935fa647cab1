"""The advantage registry: every estimator has one signature over the step batch.

``estimate(batch, cfg, dp) -> TokenAdvantages``: per-token advantages (0 off the mask) and, for
estimators that train a critic, per-token returns and the tokens they are defined on, all
flat over the batch's ``_T`` columns (``batch/step_batch.py``). ``dp`` (data parallelism, None
on one process) is for statistics over the whole job's batch (GAE's whitening); groups are
whole on one rank, so group statistics need no collective. An estimator reads only columns: ``mask_T``, ``reward_D``,
``group_D`` / ``member_D`` / ``rewards_G`` (the whole group's rewards), ``penalty_T`` (coef·KL
when KL is in the reward, else None) and ``values_T`` (when it ``needs_critic``).
``group_baseline`` estimators are relative to the group, so a degenerate group carries no signal
for them (selection may skip it, ``advantage.skip_degenerate_groups``). Which groups are
degenerate is ``advantage.degenerate``: ``equal_rewards`` (ours) — every reward equal;
``zero_advantages`` (the lab's) — every advantage of the estimator's ``group_rule`` exactly
0.0 in float64, and within a kept group the members at exactly 0.0 are not trained. The two
differ where float arithmetic leaves a residue: six rewards of −0.1 have a mean one ulp off
−0.1, so the lab trains them at advantages of ±1.39e-17 and takes an optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from searchr1.advantages.config import ADVANTAGES, DegenerateRule  # noqa: F401  (the registry)

if TYPE_CHECKING:
    from searchr1.advantages.config import AdvantageConfig
    from searchr1.batch.step_batch import StepBatch


@dataclass(frozen=True)
class TokenAdvantages:
    """An estimator's output, flat over the batch's tokens."""

    advantages_T: np.ndarray
    returns_T: np.ndarray | None = None  # value targets (critic estimators only)
    value_mask_T: np.ndarray | None = None  # 1 where ``returns_T`` is a target (critic only)


@dataclass(frozen=True)
class Estimator:
    """One registered estimator (module docstring)."""

    estimate: Callable[..., TokenAdvantages]  # (batch, cfg, dp) -> TokenAdvantages
    group_baseline: bool  # relative to the group's rewards: degenerate groups carry no signal
    needs_critic: bool = False  # reads ``values_T``: the step runs the in-process critic
    # the per-group rule of a group-baseline estimator: (rewards_G, eps=) -> advantages_G
    group_rule: Callable[..., np.ndarray] | None = None

    def __call__(self, batch: "StepBatch", cfg: "AdvantageConfig", dp=None) -> TokenAdvantages:
        return self.estimate(batch, cfg, dp)


def is_degenerate(rewards_G: np.ndarray) -> bool:
    """A group whose rewards are all equal carries no learning signal."""
    r = np.asarray(rewards_G, dtype=np.float64)
    return bool(r.size > 1 and np.all(r == r[0]))


def signal_members(estimator: Estimator, rewards_G: np.ndarray,
                   rule: DegenerateRule = DegenerateRule.equal_rewards,
                   eps: float = 1e-6) -> list[int] | None:
    """The members of one group that carry signal for ``estimator``; None when the group is
    degenerate under ``rule`` (module docstring). Estimators without a group baseline: all."""
    members = list(range(len(rewards_G)))
    if not estimator.group_baseline:
        return members
    if rule != DegenerateRule.zero_advantages or estimator.group_rule is None:
        return None if is_degenerate(rewards_G) else members
    adv_G = estimator.group_rule(np.asarray(rewards_G, dtype=np.float64), eps=eps)
    kept = [m for m in members if adv_G[m] != 0.0]
    return kept or None


def fill_advantages(batch: "StepBatch", estimator: Estimator, cfg: "AdvantageConfig", dp=None) -> None:
    """Fill ``advantages_T`` (0 off the mask) and, for a critic's estimator, ``returns_T``
    and ``value_mask_T`` (where the critic is fitted; default the mask)."""
    out = estimator(batch, cfg, dp)
    batch.advantages_T = np.asarray(out.advantages_T, np.float64) * batch.mask_T
    batch.returns_T = out.returns_T
    if out.returns_T is not None:
        batch.value_mask_T = batch.mask_T.copy() if out.value_mask_T is None else out.value_mask_T
