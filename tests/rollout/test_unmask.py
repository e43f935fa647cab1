"""The observation-mask ablation (rollout.mask_observations=false) on hand-built trajectories."""

from __future__ import annotations

import asyncio

import pytest

from searchr1.data.types import QAExample
from searchr1.rollout.types import Trajectory
from searchr1.rollout.unmask import apply_unmasked, unmask_observations

EX = QAExample(id="q", question="?", golden_answers=("a",), data_source="t")


def trajectory() -> Trajectory:
    """prompt [1, 2, 3] · sampled [4, 5] · observation [6, 7] · sampled [8]."""
    t = Trajectory.start(EX, 0, [1, 2, 3])
    t.append_sampled([4, 5], [-0.5, -0.6])
    t.append_observation([6, 7])
    t.append_sampled([8], [-0.8])
    return t


def test_observation_tokens_get_mask_and_scored_logprobs_prompt_stays_masked():
    t = trajectory()
    scored = [None, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    assert apply_unmasked(t, scored) == 2
    assert t.mask_T == [0, 0, 0, 1, 1, 1, 1, 1]
    # sampled tokens keep the sampler's log-probs; observation tokens take the scored ones
    assert t.logprobs_T == [0.0, 0.0, 0.0, -0.5, -0.6, -5.0, -6.0, -0.8]


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="8 tokens"):
        apply_unmasked(trajectory(), [None, -1.0])


def test_unmask_scores_each_full_trajectory_with_the_sampler():
    seen = []

    class Sampler:
        async def compute_logprobs_async(self, prompt):
            tokens = prompt.to_ints()
            seen.append(tokens)
            return [None] + [-float(x) for x in tokens[1:]]

    trajs = [trajectory(), trajectory()]
    assert asyncio.run(unmask_observations(trajs, Sampler())) == 4
    assert seen == [[1, 2, 3, 4, 5, 6, 7, 8]] * 2
    assert trajs[1].logprobs_T[5:7] == [-6.0, -7.0]
