"""KL estimators against hand-computed values, and both placements."""

from __future__ import annotations

import math

import pytest
import torch

from searchr1.losses import KLConfig, kl_estimate, kl_loss_term, kl_penalty_advantages

F64 = torch.float64
LOG2 = math.log(2.0)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


@pytest.mark.parametrize(
    "estimator, expected",
    [
        ("k1", LOG2),  # log .5 − log .25
        ("k2", 0.5 * LOG2**2),
        ("k3", 0.5 + LOG2 - 1.0),  # d = −log 2: e^d − d − 1
        ("low_var_kl", 0.5 + LOG2 - 1.0),  # inside the clamps it is k3
    ],
)
def test_estimators_hand_values(estimator: str, expected: float) -> None:
    value = kl_estimate(t(math.log(0.5)), t(math.log(0.25)), estimator)
    assert value.item() == pytest.approx(expected, abs=1e-12)


def test_k3_is_nonnegative_and_zero_at_equality() -> None:
    logp = t(-3.0, -1.0, -0.1, -2.0)
    ref = t(-0.5, -1.0, -4.0, -2.0)
    k3 = kl_estimate(logp, ref, "k3")
    assert (k3 >= 0).all() and k3[1] == 0 and k3[3] == 0


def test_low_var_kl_is_clamped_like_verl() -> None:
    # d = ref − logp = 30 → clamped to 20; e^20 − 20 − 1 ≫ 10 → clamped to 10
    assert kl_estimate(t(-31.0), t(-1.0), "low_var_kl").item() == 10.0
    assert kl_estimate(t(-31.0), t(-1.0), "k3").item() > 1e12  # raw k3 is not clamped


def test_unknown_estimator_lists_valid_names() -> None:
    with pytest.raises(KeyError, match="k1, k2, k3, low_var_kl"):
        kl_estimate(t(0.0), t(0.0), "k4")


def test_reward_placement_touches_action_tokens_only() -> None:
    advantages = t(0.0, 1.0, 1.0, 0.0, -1.0)
    sampler = t(0.0, math.log(0.5), -1.0, 0.0, math.log(0.5))  # observations carry logprob 0
    ref = t(-7.0, math.log(0.25), -1.0, -50.0, math.log(0.25))
    mask = t(0.0, 1.0, 1.0, 0.0, 1.0)
    out = kl_penalty_advantages(advantages, sampler, ref, mask, coef=0.1, estimator="k1")
    assert torch.equal(out[mask == 0], advantages[mask == 0])
    assert torch.allclose(out, t(0.0, 1.0 - 0.1 * LOG2, 1.0, 0.0, -1.0 - 0.1 * LOG2), atol=1e-12)
    assert not out.requires_grad


def test_loss_placement_value_and_gradient() -> None:
    logp = t(math.log(0.5), -1.0, -2.0).requires_grad_(True)
    ref = t(math.log(0.25), -1.5, -9.0)
    mask = t(1.0, 1.0, 0.0)
    loss = kl_loss_term(logp, ref, mask, coef=0.5, estimator="k3", denominator=4.0)
    k3 = [0.5 + LOG2 - 1.0, math.exp(-0.5) + 0.5 - 1.0]
    assert loss.item() == pytest.approx(0.5 * sum(k3) / 4.0, abs=1e-12)
    loss.backward()
    # d k3 / d logp = 1 − exp(ref − logp)
    grad = 0.5 / 4.0 * (1.0 - torch.exp(ref - logp.detach())) * mask
    assert torch.allclose(logp.grad, grad, atol=1e-12)


def test_kl_config_defaults() -> None:
    cfg = KLConfig()
    assert (cfg.coef, cfg.estimator, cfg.placement) == (0.0, "k3", "loss")
