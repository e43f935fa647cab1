"""Advantage estimators against hand-computed numbers."""

import math

import numpy as np
import pytest

from searchr1.advantages import ADVANTAGES, grpo_std, group_mean, is_degenerate


def test_group_mean_hand_computed():
    # mean of [1, 0, 0, -0.1] = 0.225
    np.testing.assert_allclose(group_mean(np.array([1.0, 0.0, 0.0, -0.1])), [0.775, -0.225, -0.225, -0.325])


def test_grpo_std_unbiased_hand_computed():
    # r = [1, 0, 0]: mean 1/3; unbiased var = ((2/3)^2 + 2·(1/3)^2)/2 = 1/3; std = 0.57735
    std = math.sqrt(1 / 3)
    expected = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6)]
    np.testing.assert_allclose(grpo_std(np.array([1.0, 0.0, 0.0])), expected, rtol=1e-12)
    assert grpo_std(np.array([1.0, 0.0, 0.0]))[0] == pytest.approx(1.1547, abs=1e-4)


def test_grpo_std_group_of_one_uses_mean_zero_std_one():
    np.testing.assert_allclose(grpo_std(np.array([1.0])), [1.0 / (1.0 + 1e-6)])
    np.testing.assert_allclose(grpo_std(np.array([0.0])), [0.0])


def test_degenerate_groups():
    assert is_degenerate(np.array([1.0, 1.0])) and is_degenerate(np.array([0.0, 0.0]))
    assert not is_degenerate(np.array([1.0, 0.0]))
    assert not is_degenerate(np.array([1.0]))  # a singleton is not degenerate


def test_every_estimator_is_registered_with_its_kind():
    assert ADVANTAGES.names() == ["group_mean", "grpo_std", "ppo_gae"]
    assert ADVANTAGES.get("group_mean").group_baseline and ADVANTAGES.get("grpo_std").group_baseline
    assert ADVANTAGES.get("group_mean").group_rule is group_mean and ADVANTAGES.get("grpo_std").group_rule is grpo_std
    gae = ADVANTAGES.get("ppo_gae")
    assert gae.needs_critic and not gae.group_baseline


def test_unknown_estimator_lists_valid_ones():
    with pytest.raises(KeyError, match="group_mean, grpo_std, ppo_gae"):
        ADVANTAGES.get("gae")


# ---- the lab's arithmetic and degenerate test (advantage.degenerate=zero_advantages) -------

from searchr1.advantages import signal_members  # noqa: E402
from searchr1.advantages.config import DegenerateRule  # noqa: E402
from searchr1.advantages.group import compensated_sum  # noqa: E402

ZERO = DegenerateRule.zero_advantages


def test_compensated_sum_is_pythons_sum_since_3_12():
    # eight copies of fl(0.1) = 3602879701896397·2^-55 sum exactly to 3602879701896397·2^-52,
    # within half an ulp of fl(0.8); the compensation recovers it (a plain loop: 0.7999999999999999)
    assert compensated_sum([-0.1] * 8) == -0.8
    naive = 0.0
    for _ in range(8):
        naive += -0.1
    assert naive == -0.7999999999999999
    # six: 6·fl(0.1) = 10808639105689191·2^-54, halfway between two doubles; ties to even
    # give 5404319552844596·2^-53 = fl(0.6) + 2^-53
    assert compensated_sum([0.1] * 6) == 0.6000000000000001
    assert compensated_sum([1e16, 1.0, -1e16]) == 1.0  # the compensation carries the 1.0
    assert compensated_sum([]) == 0.0


def test_group_mean_of_equal_penalties_under_the_labs_arithmetic():
    # eight: −0.8 / 8 = −0.1 exactly, every advantage 0.0 (the group is degenerate)
    assert np.array_equal(group_mean(np.full(8, -0.1)), np.zeros(8))
    # six: −(fl(0.6) + 2^-53) / 6 rounds to −(fl(0.1) + 2^-56): every advantage is +2^-56
    assert np.array_equal(group_mean(np.full(6, -0.1)), np.full(6, 2.0 ** -56))


def test_signal_members_under_both_rules():
    mean = ADVANTAGES.get("group_mean")
    six, eight = np.full(6, -0.1), np.full(8, -0.1)
    assert signal_members(mean, six) is None and signal_members(mean, eight) is None
    assert signal_members(mean, six, ZERO) == list(range(6))  # ±2^-56: trained (the lab)
    assert signal_members(mean, eight, ZERO) is None  # exactly 0.0: degenerate in both
    assert signal_members(mean, np.array([1.0]), ZERO) is None  # r − r = 0: the lab counts it
    assert signal_members(mean, np.array([1.0])) == [0]  # ours: a singleton is not degenerate
    mixed = np.array([1.0, 0.0, -0.1, 1.0])
    assert signal_members(mean, mixed) == signal_members(mean, mixed, ZERO) == [0, 1, 2, 3]
    # a member at exactly its group's mean has advantage 0.0: the lab builds no datum for it
    assert signal_members(mean, np.array([1.0, 0.5, 0.0]), ZERO) == [0, 2]
    gae = ADVANTAGES.get("ppo_gae")
    assert signal_members(gae, eight, ZERO) == signal_members(gae, eight) == list(range(8))


# ----- the registered estimators on a step batch's columns

from searchr1.advantages.config import AdvantageConfig  # noqa: E402
from searchr1.batch.step_batch import build_step_batch  # noqa: E402
from searchr1.advantages import fill_advantages  # noqa: E402
from searchr1.loop.train_step import select_stage  # noqa: E402
from searchr1.rollout.types import Trajectory  # noqa: E402
from tests.helpers.step_batches import EX, one_turn, trajectory, two_turn  # noqa: E402


def test_group_estimator_uses_the_whole_group_and_subtracts_the_penalty():
    empty = Trajectory.start(EX, 2, [10, 11])  # no action token: no datum, but in the group
    empty.reward = 0.5
    groups = [[two_turn(1.0, 0), one_turn(0.0, 1), empty]]
    sel = select_stage(groups, ADVANTAGES.get("grpo_std"), skip_degenerate=True)
    assert [t.group_index for t in sel.trajs_D] == [0, 1] and sel.member_D == [0, 1]
    batch = build_step_batch(sel.trajs_D, sel.group_D, sel.member_D, sel.rewards_G, sel.n_trajectories, 100)
    batch.penalty_T = np.zeros_like(batch.mask_T)
    batch.penalty_T[2] = 0.25  # the first datum's second target (an action token)
    fill_advantages(batch, ADVANTAGES.get("grpo_std"), AdvantageConfig(eps=0.0))
    # rewards [1, 0, 0.5]: mean 0.5, unbiased std 0.5 → A = +1, −1
    a0, a1 = batch.rows("advantages_T")
    np.testing.assert_allclose(a0, [0, 1, 1 - 0.25, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(a1, [0, -1, -1, -1])
    # per group: Σ (token advantages + penalty) / trained tokens sums to 0 (mean-centred)
    assert sum((a + p).sum() / m.sum() for a, p, m in zip(batch.rows("advantages_T"), batch.rows("penalty_T"),
                                                           batch.rows("mask_T"))) == pytest.approx(0.0)


def test_ppo_gae_on_the_batch_columns_by_hand():
    # shifted masks [0, 1, 1] and [1, 1]; values 0; rewards 1 and 0; γ = λ = 1
    a = trajectory([5, 6, 7, 8], [0, 0, 1, 1], [0, 0, -1, -1], reward=1.0)
    b = trajectory([5, 6, 7], [0, 1, 1], [0, -1, -1], reward=0.0)
    batch = build_step_batch([a, b], [0, 1], [0, 0], [np.ones(1), np.zeros(1)], 2, 100)
    batch.set_rows("values_T", [np.zeros(3), np.zeros(2)])
    batch.penalty_T = np.array([0, 0.1, 0.2, 0, 0])
    fill_advantages(batch, ADVANTAGES.get("ppo_gae"), AdvantageConfig(name="ppo_gae"))
    # rewards per token: a [0, −0.1, 1 − 0.2], b [0, 0] → returns a [0, 0.7, 0.8], b [0, 0]
    np.testing.assert_allclose(batch.returns_T, [0, 0.7, 0.8, 0, 0])
    flat = np.array([0.7, 0.8, 0.0, 0.0])  # whitened over the batch's action tokens
    mean, std = flat.mean(), math.sqrt(flat.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(batch.advantages_T, [0, *(flat - mean) / std])
