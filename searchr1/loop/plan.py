"""The run's planned sizes, derived from the config here and nowhere else.

- trajectories per step: ``trainer.questions_per_step × rollout.group_size`` (a question is
  one group of ``group_size`` trajectories);
- optimizer steps per rollout: those trajectories in mini-batches of
  ``trainer.minibatch_trajectories`` (rounded up; 0 = the whole batch, one step);
- total optimizer steps: ``trainer.steps ×`` optimizer steps per rollout — the horizon of the
  learning-rate schedule (``utils/lr_schedule.py``) and of the critic's warm-up.

These are plans: a step that drops degenerate groups or failed searches trains fewer
trajectories and may take fewer optimizer steps; what it took is in its metrics
(``train/optimizer_steps``). ``trainer`` is a ``TrainerConfig`` or its config node.
"""

from __future__ import annotations


def trajectories_per_step(trainer, group_size: int) -> int:
    """Trajectories one step samples."""
    return trainer.questions_per_step * group_size


def optimizer_steps_per_rollout(trainer, group_size: int) -> int:
    """Optimizer steps one rollout takes: trajectories ÷ ``minibatch_trajectories`` (ceil)."""
    n = trajectories_per_step(trainer, group_size)
    size = trainer.minibatch_trajectories or n
    return max(1, -(-n // size))


def total_optimizer_steps(trainer, group_size: int) -> int:
    """Optimizer steps of the whole run, as planned."""
    return trainer.steps * optimizer_steps_per_rollout(trainer, group_size)
