"""The run's planned sizes (``searchr1/loop/plan.py``), each derived in one place."""

from __future__ import annotations

import pytest

from searchr1.loop.config import TrainerConfig
from searchr1.loop.plan import optimizer_steps_per_rollout, total_optimizer_steps, trajectories_per_step


@pytest.mark.parametrize(("minibatch", "per_rollout"), [(0, 1), (8, 3), (10, 2), (20, 1), (64, 1)])
def test_sizes_follow_questions_groups_and_minibatches(minibatch, per_rollout):
    t = TrainerConfig(steps=5, questions_per_step=5, minibatch_trajectories=minibatch)
    assert trajectories_per_step(t, 4) == 20
    assert optimizer_steps_per_rollout(t, 4) == per_rollout  # ceil(20 / minibatch); 0 = all
    assert total_optimizer_steps(t, 4) == 5 * per_rollout
