"""Advantage estimators against hand-computed numbers."""

import math

import numpy as np
import pytest

from searchr1.advantages import ADVANTAGES, compute_group_advantages, grpo_std, group_mean, is_degenerate


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


def test_degenerate_groups_counted_and_skipped():
    groups = [np.array([1.0, 1.0]), np.array([1.0, 0.0]), np.array([0.0, 0.0]), np.array([0.5])]
    adv, rate = compute_group_advantages(groups, "group_mean", 1e-6, skip_degenerate=True)
    assert rate == 0.5  # two of four groups have all-equal rewards; a singleton is not degenerate
    assert adv[0] is None and adv[2] is None
    np.testing.assert_allclose(adv[1], [0.5, -0.5])
    np.testing.assert_allclose(adv[3], [0.0])
    kept, rate2 = compute_group_advantages(groups, "group_mean", 1e-6, skip_degenerate=False)
    assert rate2 == 0.5
    np.testing.assert_allclose(kept[0], [0.0, 0.0])
    assert not is_degenerate(np.array([1.0]))


def test_unknown_estimator_lists_valid_ones():
    with pytest.raises(KeyError, match="group_mean, grpo_std"):
        ADVANTAGES.get("gae")
