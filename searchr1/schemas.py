"""Schemas of the config groups owned by the RL loop itself: rollout, advantage, trainer,
eval and logger. Option-specific schemas (a retriever's, a model's, …) live beside their
code and are collected in ``searchr1.config``.

Every field's default is written here once; the YAML files under ``conf/`` only state
what an option changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from searchr1.rollout.lockstep import LockstepSearch, RolloutSchedule
from searchr1.rollout.tool_errors import ToolErrorPolicy
from searchr1.trackers.swanlab import SwanlabConfig  # noqa: F401  (schema of `swanlab:`)
from searchr1.trackers.wandb import WandbConfig  # noqa: F401  (schema of `wandb:`)


class Mode(str, Enum):
    """What ``python -m searchr1.main`` does."""

    train = "train"  # RL training, with eval before, every ``eval_every`` steps and after
    eval = "eval"  # greedy rollouts on the eval split only
    sft = "sft"  # supervised warm start alone; saves adapters (searchr1/warmstart/)


@dataclass
class RolloutConfig:
    """Limits and sampling of the multi-turn rollout (DESIGN §1, Rollout)."""

    group_size: int = 4  # trajectories per question (GRPO group)
    max_searches: int = 2  # search calls per trajectory; then one last turn without search
    max_turns: int = 3  # assistant turns per trajectory
    max_trajectory_tokens: int = 2048  # prompt + all turns + observations
    max_turn_tokens: int = 128  # tokens sampled per assistant turn
    max_observation_tokens: int = 384  # tokens of one observation (whole passages dropped first)
    # sampler context limit (paper max_prompt_length 4096): left-truncate the running context
    # to this many tokens; null = never. Turns sampled from a cut context are not trained.
    max_prompt_tokens: int | None = None
    temperature: float = 1.0  # sampling temperature during training rollouts
    top_p: float = 1.0  # nucleus sampling threshold
    top_k: int = -1  # -1 = no top-k truncation
    sampler_concurrency: int = 256  # sampling requests in flight at once
    search_concurrency: int = 32  # search requests in flight at once
    # a trajectory whose search failed (error, or empty where results are due): drop_group |
    # drop_trajectory | observe (train on it; the ablation) — searchr1/rollout/tool_errors.py
    on_tool_error: ToolErrorPolicy = ToolErrorPolicy.drop_group
    # false = the paper's ablation: retrieved tokens get the trajectory's advantage and a loss,
    # their old log-probs from scoring with the sampling weights (searchr1/rollout/unmask.py)
    mask_observations: bool = True
    # async = each trajectory on its own; lockstep = all advance one turn at a time, as the
    # paper and the lab do (an ablation of timing only) — searchr1/rollout/lockstep.py
    schedule: RolloutSchedule = RolloutSchedule["async"]
    # lockstep only: batched = one search call per turn (paper) | serial = one by one (lab)
    lockstep_search: LockstepSearch = LockstepSearch.batched


@dataclass
class AdvantageConfig:
    """Advantage estimator (``searchr1/advantages/``)."""

    name: str = "grpo_std"  # group_mean | grpo_std | ppo_gae
    eps: float = 1e-6  # grpo_std: A = (r - mean) / (std + eps)
    skip_degenerate_groups: bool = True  # drop groups whose rewards are all equal (no signal)
    gamma: float = 1.0  # ppo_gae: discount per action token (paper 1.0)
    lam: float = 1.0  # ppo_gae: GAE λ (paper 1.0)


@dataclass
class CriticConfig:
    """The value model of ``advantage=ppo_gae`` (``searchr1/engines/local/training/critic.py``).

    It always runs in this process (PyTRIO has no value head), whichever engine holds the
    policy. Unused by the other estimators.
    """

    model: str | None = None  # HF id / local dir of the critic's base; null = the policy's base
    lora_rank: int = 32  # LoRA rank of the critic's own adapters
    lora_alpha: int = 64
    learning_rate: float = 1e-5  # paper critic lr
    warmup_ratio: float = 0.015  # paper critic warm-up ratio (linear warm-up, then constant)
    cliprange_value: float = 0.5  # clip of the value update around the rollout's values
    grad_clip_norm: float = 1.0
    microbatch_trajectories: int = 8  # trajectories per critic forward/backward
    device: str = "auto"  # auto = the local engine's rule (cuda when available)


class LRSchedule(str, Enum):
    """Learning-rate schedule, computed on the client and sent in AdamParams."""

    constant = "constant"
    linear_warmup = "linear_warmup"  # linear from 0 over warmup_ratio·steps, then constant


@dataclass
class BreakerConfig:
    """Search circuit breaker (``searchr1/loop/breaker.py``): stop a run whose searches fail."""

    enabled: bool = True
    window: int = 5  # steps in the sliding window the search error rate is taken over
    threshold: float = 0.5  # trip when the window's error rate is at or above this ...
    grace_steps: int = 2  # ... for more than this many consecutive steps
    backoff_s: float = 0.0  # pause before the next step while over (doubles each step; 0 = none)


@dataclass
class TrainerConfig:
    """The RL loop (``searchr1/loop/trainer.py``)."""

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
    minibatch_trajectories: int = 0  # trajectories per optimizer step (paper ppo_mini_batch_size); 0 = all
    microbatch_trajectories: int = 0  # loss.aggregation=microbatch_token_mean: trajectories per micro-batch
    max_datum_tokens: int = 8192  # longer trajectories are truncated (tail tokens dropped)
    max_datums_per_microbatch: int = 32
    max_padded_tokens_per_microbatch: int = 64000  # first-fit decreasing packing limit
    save_every: int = 0  # checkpoint every N steps (0 = only at the end)
    eval_every: int = 0  # eval on the dev split every N steps (0 = before and after only)
    data_order: str = "epochs"  # epochs (reshuffle each pass) | lab (one seeded shuffle, read round and round)
    resume: str = "never"  # never | auto (newest checkpoint in the run dir) | a checkpoint path
    breaker: BreakerConfig = field(default_factory=BreakerConfig)  # search circuit breaker
    max_staleness: int = 0  # 0 = rollout then update; 1 = step k+1's rollout runs while step k trains


@dataclass
class EvalConfig:
    """Evaluation: greedy rollouts on a split, per-source EM table."""

    split: str = "dev"  # dev | test | train
    max_questions: int | None = 8  # null = the whole split (8 = 2 per world source: CPU-sized)
    per_source: int | None = None  # questions per data_source; null = all (searchr1/data/selection.py)
    selection: str = "first"  # first (file order) | lab (per source Random(selection_seed) shuffle)
    selection_seed: int = 42  # seed of selection=lab (the lab's fixed eval set uses 42)
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
