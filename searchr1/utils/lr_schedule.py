"""Learning-rate schedules, computed on the client and sent in ``AdamParams``."""

from __future__ import annotations

import math


def learning_rate(
    schedule: str, base_lr: float, step: int, total_steps: int, warmup_ratio: float
) -> float:
    """LR for optimizer step ``step`` (0-based) of ``total_steps``.

    ``linear_warmup``: rises linearly over ``ceil(warmup_ratio · total_steps)`` steps,
    reaching ``base_lr`` at the end of warm-up (step k gets (k+1)/W · lr), then constant.
    """
    name = getattr(schedule, "value", schedule)
    if name == "constant":
        return base_lr
    if name == "linear_warmup":
        warmup = math.ceil(warmup_ratio * total_steps)
        if warmup <= 0 or step >= warmup:
            return base_lr
        return base_lr * (step + 1) / warmup
    raise ValueError(f"unknown lr_schedule {schedule!r}; valid: constant, linear_warmup")
