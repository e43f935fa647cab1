"""The five PyTRIO losses against hand-computed numbers and a per-token reference loop."""

from __future__ import annotations

import math

import pytest
import torch
from pytrio.client.training_batch import LOSS_INPUT_SCHEMAS

from searchr1.losses import (
    POLICY_LOSSES,
    LossConfig,
    finalize_metrics,
    loss_fn_config,
    validate_loss_config,
)
from searchr1.losses.policy import cispo, cross_entropy, dro, importance_sampling, ppo

F64 = torch.float64


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_registry_holds_exactly_pytrios_loss_names() -> None:
    assert POLICY_LOSSES.names() == sorted(LOSS_INPUT_SCHEMAS)
    assert POLICY_LOSSES.get("dro").denominator == "total_advantage_tokens"
    others = [n for n in POLICY_LOSSES.names() if n != "dro"]
    assert {POLICY_LOSSES.get(n).denominator for n in others} == {"total_active_tokens"}
    with pytest.raises(KeyError, match="valid: cispo, cross_entropy, dro"):
        POLICY_LOSSES.get("grpo")


def test_cross_entropy_is_weighted_nll_over_weighted_tokens() -> None:
    logp = t(math.log(0.5), math.log(0.25), -3.0)
    loss, sums = cross_entropy(logp, None, None, t(1.0, 0.5, 0.0), denominator=2.0)
    expected = -(math.log(0.5) + 0.5 * math.log(0.25)) / 2.0
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert sums["token_count"] == 2.0


def test_importance_sampling_at_ratio_one_is_minus_mean_advantage() -> None:
    logp = t(-1.0, -2.0, -0.5, -4.0)
    advantages = t(1.0, -0.5, 2.0, 0.0)
    loss, sums = importance_sampling(logp, logp.clone(), advantages, torch.ones(4, dtype=F64), 4.0)
    assert loss.item() == pytest.approx(-2.5 / 4.0, abs=1e-12)
    assert finalize_metrics(sums)["ratio_mean"] == pytest.approx(1.0)


def test_importance_sampling_known_ratios_and_mask() -> None:
    logp = t(math.log(0.5), math.log(0.25), -1.0)
    q = t(math.log(0.25), math.log(0.5), -9.0)  # ratios 2, 0.5; third token is masked out
    loss, sums = importance_sampling(logp, q, t(1.0, -2.0, 5.0), t(1.0, 1.0, 0.0), denominator=2.0)
    assert loss.item() == pytest.approx(-(2.0 * 1.0 + 0.5 * -2.0) / 2.0, abs=1e-12)
    assert sums["token_count"] == 2.0
    assert sums["ratio_sum"] == pytest.approx(2.5)


def test_ppo_takes_the_min_and_counts_binding_clips() -> None:
    ratios = [1.5, 0.5, 0.5, 1.5]
    advantages = t(1.0, 1.0, -1.0, -1.0)
    q = t(-2.0, -2.0, -2.0, -2.0)
    logp = (q + torch.log(t(*ratios))).requires_grad_(True)
    loss, sums = ppo(logp, q, advantages, torch.ones(4, dtype=F64), 4.0, 0.8, 1.2)
    # objectives: min(1.5, 1.2)=1.2 (clip), min(.5, .8)=.5, min(-.5, -.8)=-.8 (clip), min(-1.5, -1.2)=-1.5
    assert loss.item() == pytest.approx(-(1.2 + 0.5 - 0.8 - 1.5) / 4.0, abs=1e-12)
    assert finalize_metrics(sums)["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    # clipped tokens carry no gradient; unclipped ones d/dlogp(−r·A/N) = −r·A/N
    assert torch.allclose(logp.grad, t(0.0, -0.5 / 4, 0.0, 1.5 / 4), atol=1e-12)


def test_ppo_defaults_are_tinkers_thresholds() -> None:
    q = t(-1.0)
    logp = q + math.log(1.3)
    loss, _ = ppo(logp, q, t(1.0), t(1.0), 1.0)
    assert loss.item() == pytest.approx(-1.2, abs=1e-12)


def test_cispo_stops_gradient_through_the_clipped_ratio() -> None:
    q = t(-2.0, -2.0, -2.0)
    logp = (q + torch.log(t(1.5, 1.0, 0.5))).requires_grad_(True)
    advantages = t(1.0, -1.0, 2.0)
    loss, sums = cispo(logp, q, advantages, torch.ones(3, dtype=F64), 3.0, 0.8, 1.2)
    coef = t(1.2, 1.0, 0.8)
    assert loss.item() == pytest.approx(-(coef * advantages * logp.detach()).sum().item() / 3.0, abs=1e-12)
    assert sums["clipped_count"] == 2.0
    loss.backward()
    assert torch.allclose(logp.grad, -coef * advantages / 3.0, atol=1e-12)


def test_dro_sums_over_advantage_tokens_only() -> None:
    q = t(-1.0, -2.0, 0.0)
    logp = t(-1.5, -1.0, -3.0).requires_grad_(True)  # token 3: an observation (A = 0, q = 0)
    advantages = t(1.0, -2.0, 0.0)
    beta = 0.3
    loss, sums = dro(logp, q, advantages, torch.ones(3, dtype=F64), 2.0, beta=beta)
    obj = [(-1.5 * 1.0 - 0.5 * beta * 0.25), (-1.0 * -2.0 - 0.5 * beta * 1.0)]
    assert loss.item() == pytest.approx(-sum(obj) / 2.0, abs=1e-12)
    assert sums["token_count"] == 2.0
    loss.backward()
    expected = -(advantages - beta * (logp.detach() - q)) / 2.0
    expected[2] = 0.0
    assert torch.allclose(logp.grad, expected, atol=1e-12)


def _reference_loop(name: str, logp, q, adv, w, denominator, **cfg) -> float:
    """Token-by-token Python version of each Tinker formula, for the vectorised code."""
    total = 0.0
    for lp, sq, a, wt in zip(logp.tolist(), q.tolist(), adv.tolist(), w.tolist()):
        if wt == 0 or (name == "dro" and a == 0):
            continue
        r = math.exp(lp - sq)
        if name == "cross_entropy":
            total += -wt * lp
        elif name == "importance_sampling":
            total += -r * a
        elif name == "ppo":
            total += -min(r * a, min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"]) * a)
        elif name == "cispo":
            total += -min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"]) * a * lp
        else:
            total += -(lp * a - 0.5 * cfg["beta"] * (lp - sq) ** 2)
    return total / denominator


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_vectorised_matches_reference_loop(name: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = 5 + 7 * seed
    logp = -torch.rand(n, generator=g, dtype=F64) * 4
    q = logp + (torch.rand(n, generator=g, dtype=F64) - 0.5)
    adv = torch.randn(n, generator=g, dtype=F64) * (torch.rand(n, generator=g) > 0.3)
    w = (torch.rand(n, generator=g) > 0.2).to(F64)
    cfg = {"ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
           "cispo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
           "dro": {"beta": 0.2}}.get(name, {})
    loss, _ = POLICY_LOSSES.get(name).fn(logp, q, adv, w, 3.0, **cfg)
    assert loss.item() == pytest.approx(_reference_loop(name, logp, q, adv, w, 3.0, **cfg), abs=1e-12)


def test_huge_negative_sampling_logprob_on_masked_token_stays_finite() -> None:
    loss, _ = importance_sampling(t(-1.0, -1.0), t(-1.0, -5000.0), t(1.0, 0.0), t(1.0, 0.0), 1.0)
    assert math.isfinite(loss.item())


def test_config_mapping_and_validation() -> None:
    cfg = LossConfig(name="ppo", clip_low=0.2, clip_high=0.28)
    mapped = loss_fn_config(cfg.name, cfg.clip_low, cfg.clip_high, cfg.dro_beta)
    assert mapped == pytest.approx({"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    assert loss_fn_config("dro", 0.2, 0.2, 0.05) == {"beta": 0.05}
    assert loss_fn_config("importance_sampling", 0.2, 0.2, 0.1) is None
    assert validate_loss_config("ppo", mapped) == mapped
    with pytest.raises(ValueError, match="does not accept loss_fn_config keys \\['clip_low'\\]"):
        validate_loss_config("ppo", {"clip_low": 0.2})
    with pytest.raises(ValueError, match="0 <= low <= high"):
        ppo(t(-1.0), t(-1.0), t(1.0), t(1.0), 1.0, clip_low_threshold=1.3, clip_high_threshold=1.2)


def test_loss_config_defaults() -> None:
    cfg = LossConfig()
    assert (cfg.name, cfg.clip_low, cfg.clip_high) == ("importance_sampling", 0.2, 0.2)
    assert (cfg.kl.coef, cfg.kl.estimator, cfg.kl.placement) == (0.0, "k3", "loss")


def test_finalize_metrics_uses_pytrios_names() -> None:
    out = finalize_metrics({"loss_sum": 3.0, "token_count": 6.0, "clipped_count": 3.0, "ratio_sum": 6.0})
    assert out == {"loss_sum": 3.0, "token_count": 6.0, "loss_mean": 0.5, "ratio_mean": 1.0,
                   "clip_fraction": 0.5}
    assert finalize_metrics({})["loss_mean"] == 0.0
