"""Schemas of the ``advantage`` group and of the PPO critic (``critic:``, ``advantage=ppo_gae``).

The estimators' registry lives here, beside the field that names one (``advantage.name``);
the estimators register into it from ``advantages/gae.py`` and ``advantages/group.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from searchr1.utils.registry import Registry
from searchr1.utils.schema import one_of, ranged

if TYPE_CHECKING:
    from searchr1.advantages.base import Estimator

ADVANTAGES: "Registry[Estimator]" = Registry("advantage")


class GaeDomain(str, Enum):
    """Which tokens ``ppo_gae`` treats as steps (``searchr1/advantages/gae.py``)."""

    action = "action"  # sampled tokens only; an observation is one environment transition
    response = "response"  # every token after the prompt, as verl (policy loss still masked)


class DegenerateRule(str, Enum):
    """Which groups carry no signal for a group-relative estimator (``advantages/base.py``)."""

    equal_rewards = "equal_rewards"  # every reward of the group is equal (ours)
    # every advantage the estimator gives the group is exactly 0.0 in float64, and members
    # whose advantage is exactly 0.0 are not trained (the lab's train.py)
    zero_advantages = "zero_advantages"


@dataclass
class AdvantageConfig:
    """Advantage estimator (``searchr1/advantages/``)."""

    name: str = one_of("grpo_std", ADVANTAGES)  # group_mean | grpo_std | ppo_gae
    eps: float = ranged(1e-6, ge=0)  # grpo_std: A = (r - mean) / (std + eps)
    skip_degenerate_groups: bool = True  # drop degenerate groups (no signal; see `degenerate`)
    # what makes a group degenerate: equal_rewards | zero_advantages (the lab's float test)
    degenerate: DegenerateRule = DegenerateRule.equal_rewards
    gamma: float = 1.0  # ppo_gae: discount per action token (paper 1.0)
    lam: float = 1.0  # ppo_gae: GAE λ (paper 1.0)
    # ppo_gae: tokens GAE, whitening and the value loss run over — action (ours: observations
    # are environment steps) | response (verl: every token after the prompt, observations too)
    gae_domain: GaeDomain = GaeDomain.action


@dataclass
class CriticConfig:
    """The critic of ``advantage=ppo_gae`` (``searchr1/advantages/critic.py``; its value model
    ``searchr1/engines/local/training/critic.py``).

    It always runs in this process (PyTRIO has no value head), whichever engine holds the
    policy. Unused by the other estimators.
    """

    model: str | None = None  # HF id / local dir of the critic's base; null = the policy's base
    lora_rank: int = 32  # LoRA rank of the critic's own adapters
    lora_alpha: int = 64
    learning_rate: float = ranged(1e-5, gt=0)  # paper critic lr
    warmup_ratio: float = 0.015  # paper critic warm-up ratio (linear warm-up, then constant)
    cliprange_value: float = ranged(0.5, ge=0)  # clip of the value update around the rollout's values
    grad_clip_norm: float = 1.0
    microbatch_trajectories: int = ranged(8, ge=1)  # trajectories per micro-batch: the value loss is the mean of their token means
    max_tokens_per_pass: int = ranged(16384, ge=1)  # padded tokens per critic forward (speed and memory only, not the loss)
    device: str = "auto"  # auto = the local engine's rule (cuda when available)
