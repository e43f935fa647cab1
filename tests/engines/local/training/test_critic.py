"""The critic on a tiny model learns a constant return on action tokens."""

from __future__ import annotations

import numpy as np
from transformers import AutoModelForCausalLM

from searchr1.engines.local.training.critic import Critic, CriticBatch, critic_metrics
from searchr1.schemas import CriticConfig


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
        metrics = critic.update(CriticBatch(inputs, old, returns, masks))
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
    a.update(CriticBatch(inputs, a.values(inputs), [0.5 * masks[0]], masks))
    a.save(tmp_path / "critic.pt")
    b = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg, 10, 1, "cpu")
    assert not np.allclose(a.values(inputs)[0], b.values(inputs)[0])
    b.load(tmp_path / "critic.pt")
    np.testing.assert_allclose(a.values(inputs)[0], b.values(inputs)[0], atol=1e-6)
    assert b.steps == 1
