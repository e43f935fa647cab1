"""Schemas of the config groups owned by the RL loop itself: rollout, advantage, trainer,
eval and logger. Option-specific schemas (a retriever's, a model's, …) live beside their
code and are collected in ``searchr1.config``.

Every field's default is written here once; the YAML files under ``conf/`` only state
what an option changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from searchr1.trackers.swanlab import SwanlabConfig  # noqa: F401  (schema of `swanlab:`)
from searchr1.trackers.wandb import WandbConfig  # noqa: F401  (schema of `wandb:`)


class Mode(str, Enum):
    """What ``python -m searchr1.main`` does."""

    train = "train"  # RL training, with eval before, every ``eval_every`` steps and after
    eval = "eval"  # greedy rollouts on the eval split only


@dataclass
class RolloutConfig:
    """Limits and sampling of the multi-turn rollout (DESIGN §1, Rollout)."""

    group_size: int = 4  # trajectories per question (GRPO group)
    max_searches: int = 2  # search calls per trajectory; then one last turn without search
    max_turns: int = 3  # assistant turns per trajectory
    max_trajectory_tokens: int = 2048  # prompt + all turns + observations
    max_turn_tokens: int = 128  # tokens sampled per assistant turn
    max_observation_tokens: int = 384  # tokens of one observation (whole passages dropped first)
    temperature: float = 1.0  # sampling temperature during training rollouts
    top_p: float = 1.0  # nucleus sampling threshold
    top_k: int = -1  # -1 = no top-k truncation
    sampler_concurrency: int = 256  # sampling requests in flight at once
    search_concurrency: int = 32  # search requests in flight at once


@dataclass
class AdvantageConfig:
    """Advantage estimator (``searchr1/advantages/``)."""

    name: str = "grpo_std"  # group_mean | grpo_std | ppo_gae
    eps: float = 1e-6  # grpo_std: A = (r - mean) / (std + eps)
    skip_degenerate_groups: bool = True  # drop groups whose rewards are all equal (no signal)


class LRSchedule(str, Enum):
    """Learning-rate schedule, computed on the client and sent in AdamParams."""

    constant = "constant"
    linear_warmup = "linear_warmup"  # linear from 0 over warmup_ratio·steps, then constant


@dataclass
class TrainerConfig:
    """The RL loop (``searchr1/trainer.py``)."""

    steps: int = 3  # logical steps (rollout → update)
    questions_per_step: int = 2  # questions per step; trajectories = this × group_size
    learning_rate: float = 1e-4
    lr_schedule: LRSchedule = LRSchedule.constant
    warmup_ratio: float = 0.0  # share of steps used for linear warm-up
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 1.0  # 0 = no clipping
    optimizer_steps_per_rollout: int = 1  # paper: ppo_mini_batch_size splits a step into several
    max_datum_tokens: int = 8192  # longer trajectories are truncated (tail tokens dropped)
    max_datums_per_microbatch: int = 32
    max_padded_tokens_per_microbatch: int = 64000  # first-fit decreasing packing limit
    save_every: int = 0  # checkpoint every N steps (0 = only at the end)
    eval_every: int = 0  # eval on the dev split every N steps (0 = before and after only)
    resume: str = "never"  # never | auto (newest checkpoint in the run dir) | a checkpoint path


@dataclass
class EvalConfig:
    """Evaluation: greedy rollouts on a split, per-source EM table."""

    split: str = "dev"  # dev | test | train
    max_questions: int | None = 16  # null = the whole split (the default keeps CPU runs short)
    model_path: str | None = None  # mode=eval: saved sampler weights (local dir or trio://); null = base
    temperature: float = 0.0  # 0 = greedy
    before_training: bool = True  # in train mode, evaluate the base model first


@dataclass
class LoggerConfig:
    """Which trackers receive metrics; ``metrics.jsonl`` is always written.

    Select with ``logger=wandb``, ``logger=[wandb,swanlab]`` or ``logger=none``.
    """

    console: bool = True  # final summary on stdout (the per-step bar is always shown)
    wandb: bool = False
    swanlab: bool = False
