"""GAE, whitening and the clipped value loss against hand-computed numbers, on a trajectory
with an observation between two turns (observation tokens are environment transitions)."""

import math

import numpy as np
import pytest
import torch

from searchr1.advantages.gae import gae, outcome_rewards, whiten
from searchr1.losses.value import clipped_value_terms, explained_variance

# shifted positions: [prompt, a1, a2, obs, obs, a3, a4]
MASK = np.array([0, 1, 1, 0, 0, 1, 1])
VALUES = np.array([9.0, 0.1, 0.2, 7.0, 7.0, 0.3, 0.4])  # values on observations must be unused


def test_outcome_reward_sits_on_the_last_action_token():
    np.testing.assert_array_equal(outcome_rewards(MASK, 1.0), [0, 0, 0, 0, 0, 0, 1.0])


def test_gae_gamma_lambda_one_gives_return_minus_value():
    adv, ret = gae(outcome_rewards(MASK, 1.0), VALUES, MASK, 1.0, 1.0)
    # γ = λ = 1: A_t = R − V_t, returns = R = 1 on every action token, 0 elsewhere
    np.testing.assert_allclose(adv, [0, 0.9, 0.8, 0, 0, 0.7, 0.6])
    np.testing.assert_allclose(ret, [0, 1, 1, 0, 0, 1, 1])


def test_gae_by_hand_with_discount_skips_the_observation():
    g, lam = 0.9, 0.5
    rewards = np.array([0, 0, -0.1, 0, 0, 0, 1.0])
    adv, ret = gae(rewards, VALUES, MASK, g, lam)
    # backwards over action tokens 6, 5, 2, 1; the "next" of token 2 is token 5 (not 3)
    d6 = 1.0 + 0 - 0.4
    a6 = d6
    d5 = 0 + g * 0.4 - 0.3
    a5 = d5 + g * lam * a6
    d2 = -0.1 + g * 0.3 - 0.2
    a2 = d2 + g * lam * a5
    d1 = 0 + g * 0.2 - 0.1
    a1 = d1 + g * lam * a2
    np.testing.assert_allclose(adv, [0, a1, a2, 0, 0, a5, a6], rtol=1e-12)
    np.testing.assert_allclose(ret, [0, a1 + 0.1, a2 + 0.2, 0, 0, a5 + 0.3, a6 + 0.4], rtol=1e-12)


def test_whiten_uses_action_tokens_of_the_whole_batch_with_bessel():
    a = [np.array([0.0, 1.0, 5.0]), np.array([3.0, 2.0])]
    m = [np.array([0, 1, 1]), np.array([1, 0])]
    flat = np.array([1.0, 5.0, 3.0])  # mean 3, unbiased var 4
    out = whiten(a, m)
    scale = 1 / math.sqrt(4 + 1e-8)
    np.testing.assert_allclose(out[0], [0, (1 - 3) * scale, (5 - 3) * scale])
    np.testing.assert_allclose(out[1], [0, 0])
    assert flat.var(ddof=1) == 4


def test_clipped_value_loss_by_hand():
    v = torch.tensor([1.0, 0.0, 2.0])
    old = torch.tensor([0.0, 0.0, 0.0])
    ret = torch.tensor([1.0, 1.0, 0.0])
    loss_T, clipped_T = clipped_value_terms(v, old, ret, 0.5)
    # token 0: v=1 clipped to .5: max((1-1)², (.5-1)²) = .25 → clipped wins
    # token 1: v=0 inside the clip: (0-1)² both → not counted as clipped
    # token 2: v=2 clipped to .5: max((2-0)², (.5-0)²) = 4 → unclipped wins
    np.testing.assert_allclose(loss_T.numpy(), [0.125, 0.5, 2.0])
    np.testing.assert_allclose(clipped_T.numpy(), [1.0, 0.0, 0.0])
    with pytest.raises(ValueError):
        clipped_value_terms(v, old, ret, -1.0)


def test_explained_variance():
    r = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert explained_variance(r, r) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), r) == pytest.approx(0.0)
    assert explained_variance(r, torch.ones(4)) == 0.0
