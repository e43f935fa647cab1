"""Learning-rate schedules, computed on the client and sent in ``AdamParams``.

``linear_warmup`` has two knobs (``trainer.warmup_unit``, ``trainer.warmup_start``):

- unit ``optimizer_step``: step k is the k-th optimizer step of the run; ``step``: it is the
  training step (rollout → update), and every optimizer step of that rollout shares its LR,
  as verl steps its scheduler once per ``update_actor`` call;
- start ``first``: (k+1)/W with W = ceil(ratio · total), so the first step already learns;
  ``zero``: min(1, k/max(1, W)) with W = int(ratio · total), verl's LambdaLR, whose first
  step runs at LR 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def learning_rate(
    schedule: str, base_lr: float, step: int, total_steps: int, warmup_ratio: float,
    start: str = "first",
) -> float:
    """LR for step ``step`` (0-based) of ``total_steps`` (module docstring for the rules)."""
    name = getattr(schedule, "value", schedule)
    if name == "constant":
        return base_lr
    if name != "linear_warmup":
        raise ValueError(f"unknown lr_schedule {schedule!r}; valid: constant, linear_warmup")
    start = getattr(start, "value", start)
    if start == "zero":
        warmup = int(warmup_ratio * total_steps)
        return base_lr * min(1.0, step / max(1, warmup))
    if start != "first":
        raise ValueError(f"unknown warmup_start {start!r}; valid: first, zero")
    warmup = math.ceil(warmup_ratio * total_steps)
    if warmup <= 0 or step >= warmup:
        return base_lr
    return base_lr * (step + 1) / warmup


@dataclass(frozen=True)
class StepLR:
    """The LRs of training step ``step``: ``lr_at(k)`` for the run's k-th optimizer step."""

    schedule: str
    base_lr: float
    warmup_ratio: float
    unit: str  # optimizer_step | step
    start: str  # first | zero
    step: int
    training_steps: int
    optimizer_steps: int

    def __call__(self, k: int) -> float:
        if getattr(self.unit, "value", self.unit) == "step":
            return learning_rate(self.schedule, self.base_lr, self.step, self.training_steps,
                                 self.warmup_ratio, self.start)
        return learning_rate(self.schedule, self.base_lr, k, self.optimizer_steps,
                             self.warmup_ratio, self.start)


def step_lr(tcfg, optimizer_steps: int, step: int) -> StepLR:
    """``lr_at`` of training step ``step`` under the trainer config ``tcfg``."""
    return StepLR(tcfg.lr_schedule, tcfg.learning_rate, tcfg.warmup_ratio,
                  getattr(tcfg, "warmup_unit", "optimizer_step"),
                  getattr(tcfg, "warmup_start", "first"), step, tcfg.steps, optimizer_steps)
