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
    gae = ADVANTAGES.get("ppo_gae")
    assert gae.needs_critic and not gae.group_baseline


def test_unknown_estimator_lists_valid_ones():
    with pytest.raises(KeyError, match="group_mean, grpo_std, ppo_gae"):
        ADVANTAGES.get("gae")
