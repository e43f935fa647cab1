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
