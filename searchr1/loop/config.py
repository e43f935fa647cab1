"""Schemas of the loop's config groups: ``trainer`` (with the search circuit breaker) and ``eval``.

Every field's default is written here once; the YAML files under ``conf/`` only state what an
option changes. A field's range or choices are declared with it (``utils/schema.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from searchr1.data.order import DATA_ORDERS
from searchr1.data.selection import EVAL_SELECTIONS
from searchr1.data.types import SPLITS
from searchr1.loop.metric_names import METRIC_NAMES
from searchr1.utils.schema import one_of, ranged


class LRSchedule(str, Enum):
    """Learning-rate schedule, computed on the client and sent in AdamParams."""

    constant = "constant"
    linear_warmup = "linear_warmup"  # linear from 0 over warmup_ratio·steps, then constant


class WarmupUnit(str, Enum):
    """What ``linear_warmup`` counts (``searchr1/utils/lr_schedule.py``)."""

    optimizer_step = "optimizer_step"  # each optimizer step gets its own LR
    step = "step"  # training steps (verl): every optimizer step of a rollout shares one LR


class WarmupStart(str, Enum):
    """The first LR of ``linear_warmup``."""

    first = "first"  # (k+1)/W, W = ceil(ratio·total): the first step already learns
    zero = "zero"  # k/W, W = int(ratio·total): verl's LambdaLR, LR 0 on step 0


@dataclass
class BreakerConfig:
    """Search circuit breaker (``searchr1/loop/breaker.py``): stop a run whose searches fail."""

    enabled: bool = True
    window: int = ranged(5, ge=1)  # steps in the sliding window the search error rate is taken over
    threshold: float = ranged(0.5, gt=0, le=1)  # trip when the window's error rate is at or above this ...
    grace_steps: int = ranged(2, ge=0)  # ... for more than this many consecutive steps
    backoff_s: float = ranged(0.0, ge=0)  # pause before the next step while over (doubles each step; 0 = none)


@dataclass
class TrainerConfig:
    """The RL loop (``searchr1/loop/trainer.py``)."""

    steps: int = ranged(3, ge=0)  # logical steps (rollout → update)
    questions_per_step: int = ranged(2, ge=1)  # questions per step; trajectories = this × group_size
    learning_rate: float = ranged(1e-4, gt=0)
    lr_schedule: LRSchedule = LRSchedule.constant
    warmup_ratio: float = ranged(0.0, ge=0, le=1)  # share of steps used for linear warm-up
    warmup_unit: WarmupUnit = WarmupUnit.optimizer_step  # optimizer_step | step (verl)
    warmup_start: WarmupStart = WarmupStart.first  # first ((k+1)/W) | zero (verl: k/W)
    beta1: float = ranged(0.9, ge=0, lt=1)
    beta2: float = ranged(0.95, ge=0, lt=1)
    eps: float = ranged(1e-8, gt=0)
    weight_decay: float = ranged(0.0, ge=0)
    grad_clip_norm: float = ranged(1.0, ge=0)  # 0 = no clipping
    minibatch_trajectories: int = ranged(0, ge=0)  # trajectories per optimizer step (paper ppo_mini_batch_size); 0 = all
    microbatch_trajectories: int = ranged(0, ge=0)  # loss.aggregation=microbatch_token_mean: trajectories per micro-batch
    max_datum_tokens: int = ranged(8192, ge=1)  # longer trajectories are truncated (tail tokens dropped)
    max_datums_per_microbatch: int = ranged(32, ge=1)
    max_padded_tokens_per_microbatch: int = ranged(64000, ge=1)  # first-fit decreasing packing limit
    save_every: int = ranged(0, ge=0)  # checkpoint every N steps (0 = only at the end)
    eval_every: int = ranged(0, ge=0)  # eval on the dev split every N steps (0 = before and after only)
    # registered in searchr1/data/order.py: epochs (reshuffle each pass) | epochs_drop_last
    # (the official DataLoader: whole batches a pass, the tail unread) | lab (one seeded
    # shuffle, read round and round)
    data_order: str = one_of("epochs", DATA_ORDERS)
    # ours (engine metrics as train/<key>) | lab (PyTRIO's forward-backward metrics as
    # trainer/<key>, the lab's names) — searchr1/loop/metric_names.py
    metric_names: str = one_of("ours", METRIC_NAMES)
    resume: str = "never"  # never | auto (newest checkpoint in the run dir) | a checkpoint path
    breaker: BreakerConfig = field(default_factory=BreakerConfig)  # search circuit breaker
    max_staleness: int = 0  # 0 = rollout then update; 1 = step k+1's rollout runs while step k trains


@dataclass
class EvalConfig:
    """Evaluation: greedy rollouts on a split, per-source EM table."""

    split: str = one_of("dev", SPLITS)  # dev | test | train
    max_questions: int | None = ranged(8, ge=1, null="the whole split")  # null = the whole split (8 = 2 per world source: CPU-sized)
    per_source: int | None = ranged(None, ge=1, null="all")  # questions per data_source; null = all (searchr1/data/selection.py)
    # first (file order) | lab (one Random(selection_seed) over the sources in sorted order) |
    # per_source_seed (a fresh Random(selection_seed) per source) — searchr1/data/selection.py
    selection: str = one_of("first", EVAL_SELECTIONS)
    selection_seed: int = 42  # seed of selection=lab / per_source_seed (the lab's eval set uses 42)
    model_path: str | None = None  # mode=eval: saved sampler weights (local dir or trio://); null = base
    temperature: float = ranged(0.0, ge=0)  # 0 = greedy
    before_training: bool = True  # in train mode, evaluate the base model first
