"""The critic's torch half on a tiny model: it learns a constant return on action tokens (with
the algorithm half's update), its state round-trips, and its forward passes group work only."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from searchr1.advantages.config import CriticConfig
from searchr1.advantages.critic import CriticBatch, critic_metrics, update_critic
from searchr1.engines.local.training.critic import Critic


def test_critic_learns_a_constant_return(tiny_model_dir):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = CriticConfig(lora_rank=4, lora_alpha=8, learning_rate=3e-2, warmup_ratio=0.0,
                       cliprange_value=10.0, microbatch_trajectories=2)
    critic = Critic(base, cfg, total_steps=60, seed=0, device="cpu")
    rng = np.random.default_rng(0)
    inputs = [rng.integers(3, 90, size=n) for n in (12, 9, 15, 7)]
    masks = [np.r_[np.zeros(3), np.ones(n - 3)] for n in (12, 9, 15, 7)]
    returns = [0.7 * m for m in masks]
    first = critic.values(inputs)
    assert all(np.allclose(v, 0.0) for v in first)  # zero-initialised head
    for _ in range(60):
        old = critic.values(inputs)
        metrics = update_critic(critic, CriticBatch(inputs, old, returns, masks))
    after = critic.values(inputs)
    err = np.concatenate([np.abs(v - 0.7)[m > 0] for v, m in zip(after, masks)])
    assert err.max() < 0.05
    assert metrics["critic/value_loss"] < 1e-3
    stats = critic_metrics(after, returns, masks)
    assert abs(stats["critic/values_mean"] - 0.7) < 0.05


def test_critic_state_round_trips(tiny_model_dir, tmp_path):
    cfg = CriticConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-2, warmup_ratio=0.0)
    a = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg, 10, 0, "cpu")
    inputs, masks = [np.arange(3, 13)], [np.ones(10)]
    update_critic(a, CriticBatch(inputs, a.values(inputs), [0.5 * masks[0]], masks))
    a.save(tmp_path / "critic.pt")
    b = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg, 10, 1, "cpu")
    assert not np.allclose(a.values(inputs)[0], b.values(inputs)[0])
    b.load(tmp_path / "critic.pt")
    np.testing.assert_allclose(a.values(inputs)[0], b.values(inputs)[0], atol=1e-6)
    assert b.steps == 1


def _two_critics(tiny_model_dir, **cfg):
    """Two critics with equal weights, whose forwards take one datum, or all of them."""
    base = dict(lora_rank=4, lora_alpha=8, learning_rate=1e-2, warmup_ratio=0.0, cliprange_value=10.0,
                microbatch_trajectories=2, **cfg)
    one = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir), CriticConfig(**base, max_tokens_per_pass=1), 10, 0, "cpu")
    all_ = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir), CriticConfig(**base, max_tokens_per_pass=10_000), 10, 0, "cpu")
    with torch.no_grad():  # a non-zero head, so the values differ between datums
        for c in (one, all_):
            c.head.weight.copy_(torch.linspace(-0.5, 0.5, c.head.weight.numel()).view_as(c.head.weight))
    return one, all_


def test_forward_passes_do_not_change_values_or_update(tiny_model_dir):
    one, all_ = _two_critics(tiny_model_dir)
    rng = np.random.default_rng(1)
    lengths = (12, 5, 9, 7, 3)
    inputs = [rng.integers(3, 90, size=n) for n in lengths]
    masks = [np.r_[np.zeros(2), np.ones(n - 2)] for n in lengths]
    returns = [rng.normal(size=n) * m for n, m in zip(lengths, masks)]
    v_one, v_all = one.values(inputs), all_.values(inputs)
    assert not np.allclose(v_one[0], 0.0)
    for a, b in zip(v_one, v_all):
        np.testing.assert_allclose(a, b, atol=1e-6)
    m_one = update_critic(one, CriticBatch(inputs, v_one, returns, masks))
    m_all = update_critic(all_, CriticBatch(inputs, v_all, returns, masks))
    for key in ("critic/value_loss", "critic/vf_clipfrac"):
        assert abs(m_one[key] - m_all[key]) < 1e-6
    for p, q in zip(one.params, all_.params):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)
    assert one.steps == all_.steps == 1


def test_passes_fill_the_token_budget_longest_first(tiny_model_dir):
    one, _ = _two_critics(tiny_model_dir)
    one.cfg = CriticConfig(max_tokens_per_pass=20)
    # lengths 9, 8, 4, 3, 3: [0, 1] (2×9 = 18), then [2, 3, 4] (3×4 = 12)
    assert one._passes([0, 1, 2, 3, 4], [9, 8, 4, 3, 3]) == [[0, 1], [2, 3, 4]]
    assert one._passes([0], [50]) == [[0]]  # a datum over the budget still gets its pass
