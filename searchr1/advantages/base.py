"""The advantage registry: every estimator has one signature over the step batch.

``estimate(batch, cfg, dp) -> TokenAdvantages``: per-token advantages (0 off the mask) and, for
estimators that train a critic, per-token returns and the tokens they are defined on, all
flat over the batch's ``_T`` columns (``loop/step_batch.py``). ``dp`` (data parallelism, None
on one process) is for statistics over the whole job's batch (GAE's whitening); groups are
whole on one rank, so group statistics need no collective. An estimator reads only columns: ``mask_T``, ``reward_D``,
``group_D`` / ``member_D`` / ``rewards_G`` (the whole group's rewards), ``penalty_T`` (coef·KL
when KL is in the reward, else None) and ``values_T`` (when it ``needs_critic``).
``group_baseline`` estimators are relative to the group, so a group whose rewards are all equal
carries no signal for them (selection may skip it, ``advantage.skip_degenerate_groups``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from searchr1.utils.registry import Registry

if TYPE_CHECKING:
    from searchr1.advantages.config import AdvantageConfig
    from searchr1.loop.step_batch import StepBatch


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

    def __call__(self, batch: "StepBatch", cfg: "AdvantageConfig", dp=None) -> TokenAdvantages:
        return self.estimate(batch, cfg, dp)


ADVANTAGES: Registry[Estimator] = Registry("advantage")


def is_degenerate(rewards_G: np.ndarray) -> bool:
    """A group whose rewards are all equal carries no learning signal."""
    r = np.asarray(rewards_G, dtype=np.float64)
    return bool(r.size > 1 and np.all(r == r[0]))
