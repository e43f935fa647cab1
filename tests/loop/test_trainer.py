"""The RL loop on a tiny local model: steps, checkpoints, exact resume, metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from searchr1.config import Config
from searchr1.data.types import Dataset, QAExample
from searchr1.engines.local.model import LocalEngineConfig, ModelConfig
from searchr1.engines.local.service import LocalService
from searchr1.losses.config import LossConfig
from searchr1.protocols.base import Action, ActionKind
from searchr1.rewards import RewardConfig
from searchr1.rollout.engine import RolloutEngine
from searchr1.advantages.config import AdvantageConfig
from searchr1.rollout.config import RolloutConfig
from searchr1.loop.config import TrainerConfig
from searchr1.loop.trainer import Trainer
from tests.helpers.rollout_fakes import CharProtocol, SlowRetriever


class TextProtocol(CharProtocol):
    """Every turn is an answer: its text. Lets a random model produce varied rewards."""

    stop = ["\n"]

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def initial_prompt(self, question):
        return self.tok.encode(f"Q: {question}\nA:", add_special_tokens=False)

    def parse_action(self, text):
        return Action(ActionKind.ANSWER, answer=text)

    def final_answer(self, turn_texts):
        return turn_texts[-1] if turn_texts else None


def vowel_reward(inp) -> float:
    """Share of vowels in the answer: differs between samples, so groups carry signal."""
    text = inp.answer or ""
    return sum(c in "aeiou" for c in text) / max(len(text), 1)


class ListTracker:
    def __init__(self):
        self.rows: list[tuple[int, dict]] = []

    def log(self, metrics, step):
        self.rows.append((step, dict(metrics)))


def make_cfg(tiny_model_dir, steps=3, **trainer):
    cfg = OmegaConf.structured(Config)
    cfg.engine = OmegaConf.structured(LocalEngineConfig(device="cpu", batch_window_ms=1.0))
    cfg.model = ModelConfig(name="tiny", hf_id=str(tiny_model_dir), gguf_file=None, lora_rank=4, lora_alpha=8)
    cfg.reward = RewardConfig()
    # degenerate groups still train (at zero advantage), so every step logs its train/* metrics
    # whatever rewards the sampled tokens earn
    cfg.advantage = AdvantageConfig(name="grpo_std", skip_degenerate_groups=False)
    cfg.loss = LossConfig(name="ppo")
    cfg.rollout = RolloutConfig(group_size=3, max_turns=1, max_turn_tokens=12, max_trajectory_tokens=64)
    cfg.trainer = TrainerConfig(steps=steps, questions_per_step=2, learning_rate=5e-2, **trainer)
    cfg.eval.max_questions = 2
    cfg.eval.before_training = False
    return cfg


def dataset() -> Dataset:
    qs = [QAExample(id=f"q{i}", question=f"question {i}", golden_answers=("a",), data_source="t")
          for i in range(5)]
    return Dataset(train=qs, dev=qs[:2], test=[])


def run_trainer(cfg, run_dir: Path, tracker=None):
    service = LocalService(cfg.engine, cfg.model, run_dir, cfg.trainer)
    rollout = RolloutEngine(TextProtocol(service.get_tokenizer()), SlowRetriever(0.0), 1, cfg.rollout)
    tracker = tracker or ListTracker()
    trainer = Trainer(cfg, run_dir, service, dataset(), rollout, vowel_reward, tracker)
    final = asyncio.run(trainer.run())
    return final, tracker, service


def lora_state(service) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in service.training.model.named_parameters() if "lora_" in k}


def train_rows(tracker):
    return [(s, m) for s, m in tracker.rows if "reward/mean" in m]


def test_resume_after_crash_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    full_final, full_tr, full_svc = run_trainer(make_cfg(tiny_model_dir, save_every=1), tmp_path / "a")
    # the "crashed" run: stops after step 2, then a new process resumes from its run dir
    crashed = make_cfg(tiny_model_dir, steps=2, save_every=1)
    run_trainer(crashed, tmp_path / "b")
    resumed_cfg = make_cfg(tiny_model_dir, steps=3, save_every=1, resume="auto")
    _, res_tr, res_svc = run_trainer(resumed_cfg, tmp_path / "b")
    full3 = train_rows(full_tr)[2]
    res3 = train_rows(res_tr)
    assert [s for s, _ in res3] == [3]  # no repeated or skipped step
    for key in ("reward/mean", "train/loss", "rollout/trajectory_tokens"):
        assert res3[0][1][key] == pytest.approx(full3[1][key], abs=1e-6), key
    a, b = lora_state(full_svc), lora_state(res_svc)
    assert max(float(v.abs().max()) for k, v in a.items() if "lora_B" in k) > 0  # it trained
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    assert full_final["steps"] == 3.0


def test_metrics_names_and_checkpoint_layout(tiny_model_dir, tmp_path):
    final, tracker, _ = run_trainer(make_cfg(tiny_model_dir, steps=2, save_every=1), tmp_path)
    step_metrics = train_rows(tracker)[0][1]
    for name in ("reward/mean", "reward/correct", "reward/format", "reward/t", "rollout/turns",
                 "rollout/search_calls", "rollout/trajectory_tokens", "rollout/valid_tool_call_rate",
                 "rollout/degenerate_group_rate", "train/loss_tokens_per_rollout_batch",
                 "search/success_rate", "search/error_rate", "search/latency", "time/step_seconds",
                 "train/loss", "train/kl", "train/clip_fraction", "train/grad_norm", "train/lr",
                 "train/logprob_mismatch", "train/entropy", "time/rollout", "time/train"):
        assert name in step_metrics, name
    # the sampler and the trainer see the same weights: mismatch is numerical noise only
    assert abs(step_metrics["train/logprob_mismatch"]) < 1e-4
    assert step_metrics["train/lr"] == 5e-2
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert ckpts == ["step_000001", "step_000002"]
    state = json.loads((tmp_path / "checkpoints/step_000002/trainer_state.json").read_text())
    assert (state["step"], state["cursor"]) == (2, 4)
    assert (tmp_path / "eval/step_000002/trajectories.jsonl").exists()
    assert "eval/em/macro" in final
    # every eval row carries its own duration (the report's "eval s per eval")
    evals = [m for _, m in tracker.rows if "eval/em/macro" in m]
    assert evals and all(m["time/eval"] > 0 for m in evals)
    assert all("time/eval" not in m for _, m in train_rows(tracker))


def test_ppo_gae_resume_restores_the_critic(tiny_model_dir, tmp_path):
    from searchr1.advantages.config import CriticConfig

    def ppo_cfg(steps, **trainer):
        cfg = make_cfg(tiny_model_dir, steps=steps, save_every=1, **trainer)
        cfg.advantage = AdvantageConfig(name="ppo_gae")
        cfg.critic = CriticConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-2, warmup_ratio=0.0,
                                  device="cpu")
        cfg.rollout.group_size = 1
        return cfg

    _, full_tr, _ = run_trainer(ppo_cfg(3), tmp_path / "a")
    run_trainer(ppo_cfg(2), tmp_path / "b")
    assert (tmp_path / "b/checkpoints/step_000002/critic.pt").exists()
    _, res_tr, _ = run_trainer(ppo_cfg(3, resume="auto"), tmp_path / "b")
    full3, res3 = train_rows(full_tr)[2][1], train_rows(res_tr)[0][1]
    for key in ("critic/values_mean", "critic/value_loss", "train/loss"):
        assert res3[key] == pytest.approx(full3[key], abs=1e-6), key
    assert full3["critic/values_mean"] != 0.0  # the critic trained (zero-initialised head)


def test_the_kl_reference_is_the_warm_start_and_survives_a_resume(tiny_model_dir, tmp_path):
    """After a warm start, KL(policy ‖ reference) is 0 at step 1: the reference is the policy RL
    starts from (the warm start), not the base model before it; a resumed run keeps it."""
    donor = make_cfg(tiny_model_dir, steps=2, save_every=1)
    run_trainer(donor, tmp_path / "donor")  # its trained adapters serve as the warm start
    adapters = tmp_path / "donor/checkpoints/engine/sampler/step_000002"
    assert (adapters / "adapter_config.json").is_file()

    def cfg(steps, **kw):
        c = make_cfg(tiny_model_dir, steps=steps, save_every=1, **kw)
        c.warmstart.init_from = str(adapters)
        c.loss.kl.coef = 0.5
        return c

    _, full, _ = run_trainer(cfg(2), tmp_path / "a")
    kl = [m["train/kl"] for _, m in train_rows(full)]
    assert abs(kl[0]) < 1e-6 < abs(kl[1])  # equal at the start, apart once the policy moved
    run_trainer(cfg(1), tmp_path / "b")
    _, resumed, _ = run_trainer(cfg(2, resume="auto"), tmp_path / "b")
    assert train_rows(resumed)[0][1]["train/kl"] == pytest.approx(kl[1], rel=1e-5, abs=1e-9)
    base = cfg(1)
    base.warmstart.init_from = None  # no warm start: the reference is the base, KL 0 as well
    _, plain, _ = run_trainer(base, tmp_path / "c")
    assert abs(train_rows(plain)[0][1]["train/kl"]) < 1e-6


def test_zero_steps_evaluate_once(tiny_model_dir, tmp_path):
    """``trainer.steps=0`` with the eval before training: that eval is the run's only one."""
    cfg = make_cfg(tiny_model_dir, steps=0)
    cfg.eval.before_training = True
    final, tracker, _ = run_trainer(cfg, tmp_path)
    evals = [s for s, m in tracker.rows if "eval/em/macro" in m]
    assert evals == [0]
    assert final["steps"] == 0.0 and "eval/em/macro" in final


def test_before_after_table_carries_intervals_and_what_the_run_shows(tiny_model_dir, tmp_path, capsys):
    cfg = make_cfg(tiny_model_dir, steps=1)
    cfg.eval.before_training = True
    run_trainer(cfg, tmp_path)
    out = capsys.readouterr().out
    table = out[out.index("eval (dev)"):]
    assert "95% interval" in table.splitlines()[0]
    assert "This run shows that the loop trains: 1 steps; trained tokens" in table
    assert "over the 2 dev questions, paired by question" in table


def test_wall_seconds_accumulate_over_a_resume(tiny_model_dir, tmp_path):
    first, _, _ = run_trainer(make_cfg(tiny_model_dir, steps=2, save_every=1), tmp_path)
    state = json.loads((tmp_path / "checkpoints/step_000002/trainer_state.json").read_text())
    saved = state["totals"]["trainer"]["wall_seconds"]  # the time up to that checkpoint
    assert 0 < saved <= first["wall_seconds"]
    resumed, _, _ = run_trainer(make_cfg(tiny_model_dir, steps=3, save_every=1, resume="auto"), tmp_path)
    assert resumed["wall_seconds"] > saved  # the earlier process's time is kept
    state = json.loads((tmp_path / "checkpoints/step_000003/trainer_state.json").read_text())
    assert state["totals"]["trainer"]["wall_seconds"] > saved
