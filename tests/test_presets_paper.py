"""The paper presets against the official Search-R1 scripts (commit a14dc3a), value for value,
and the mechanisms those values select: the warm-up, the exact entropy, GAE over the response,
trained truncated turns, the context check and BM25's verbatim titles."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from searchr1.utils.lr_schedule import learning_rate, step_lr
from searchr1.startup.checks import check_config
from tests.test_config import _compose, _value

MIRROR = Path("/work/.mirror/PeterGriffinJin+Search-R1/repo")
COMMIT = "a14dc3a"
GRPO, FMT, PPO = ("scripts/nq_hotpotqa/v0.2/train_grpo.sh", "scripts/nq_hotpotqa/v0.3/train_grpo_format.sh",
                  "scripts/nq_hotpotqa/v0.2/train_ppo.sh")
VERL = "verl/trainer/config/ppo_trainer.yaml"
FSDP = "verl/workers/fsdp_workers.py"
VLLM = "verl/workers/rollout/vllm_rollout/vllm_rollout.py"
RAY = "verl/trainer/ppo/ray_trainer.py"

# (preset, config key, our value, official file, line, text on that line)
TABLE = [
    *[(p, k, v, f, n, t) for p, f, lines in (("paper_grpo", GRPO, (31, 42, 43, 45, 56, 59, 60, 68, 69, 73, 78)),
                                            ("paper_grpo_format", FMT, (36, 47, 48, 50, 61, 64, 65, 73, 74, 78, 86)))
      for (k, v, t), n in zip([
          ("trainer.questions_per_step", 512, "train_batch_size=512"),
          ("trainer.learning_rate", 1e-6 if p == "paper_grpo" else 5e-7, "optim.lr="),
          ("trainer.warmup_ratio", 0.285, "lr_warmup_steps_ratio=0.285"),
          ("trainer.minibatch_trajectories", 256, "ppo_mini_batch_size=256"),
          ("loss.kl.coef", 0.001, "kl_loss_coef=0.001"),
          ("rollout.group_size", 5, "n_agent=5"),
          ("rollout.temperature", 1.0, "temperature=1"),
          ("trainer.save_every", 100, "save_freq=100"),
          ("trainer.eval_every", 100, "test_freq=100"),
          ("trainer.steps", 1005, "total_training_steps=1005"),
          ("retriever.topk", 3, "retriever.topk=3"),
      ], lines)],
    ("paper_grpo", "rollout.top_p", 0.95, VERL, 71, "top_p: 0.95"),
    ("paper_grpo_format", "rollout.top_p", 0.95, VERL, 71, "top_p: 0.95"),
    ("paper_grpo", "rollout.max_searches", 4, GRPO, 76, "max_turns=4"),
    ("paper_grpo", "rollout.max_turn_tokens", 500, GRPO, 34, "max_response_length=500"),
    ("paper_grpo", "rollout.max_observation_tokens", 500, GRPO, 36, "max_obs_length=500"),
    ("paper_grpo", "rollout.max_prompt_tokens", 4096, GRPO, 33, "max_prompt_length=4096"),
    ("paper_grpo", "loss.kl.estimator", "low_var_kl", GRPO, 57, "kl_loss_type=low_var_kl"),
    ("paper_grpo", "eval.before_training", True, GRPO, 64, "val_before_train=true"),
    ("paper_grpo", "eval.split", "test", GRPO, 28, "test.parquet"),
    ("paper_ppo", "rollout.top_p", 1.0, PPO, 57, "rollout.top_p=1.0"),
    ("paper_ppo", "rollout.group_size", 1, PPO, 55, "n_agent=1"),
    ("paper_ppo", "trainer.learning_rate", 1e-6, PPO, 40, "optim.lr=1e-6"),
    ("paper_ppo", "trainer.warmup_ratio", 0.285, PPO, 43, "lr_warmup_steps_ratio=0.285"),
    ("paper_ppo", "critic.learning_rate", 1e-5, PPO, 59, "critic.optim.lr=1e-5"),
    ("paper_ppo", "critic.warmup_ratio", 0.015, PPO, 61, "lr_warmup_steps_ratio=0.015"),
    ("paper_ppo", "loss.kl.coef", 0.001, PPO, 68, "kl_coef=0.001"),
    ("paper_ppo", "trainer.eval_every", 100, PPO, 78, "test_freq=100"),
    ("paper_ppo", "rollout.max_searches", 4, PPO, 85, "max_turns=4"),
    ("paper_ppo", "advantage.gamma", 1.0, VERL, 153, "gamma: 1.0"),
    ("paper_ppo", "advantage.lam", 1.0, VERL, 154, "lam: 1.0"),
    ("paper_ppo", "critic.cliprange_value", 0.5, VERL, 126, "cliprange_value: 0.5"),
    ("paper_grpo", "trainer.activation_checkpointing", True, GRPO, 40, "enable_gradient_checkpointing=true"),
    ("paper_grpo_format", "trainer.activation_checkpointing", True, FMT, 45, "enable_gradient_checkpointing=true"),
    ("paper_ppo", "trainer.activation_checkpointing", True, PPO, 41, "enable_gradient_checkpointing=true"),
    *[(p, k, v, f, n, t) for p in ("paper_grpo", "paper_grpo_format", "paper_ppo") for k, v, f, n, t in [
        ("loss.clip_low", 0.2, VERL, 34, "clip_ratio: 0.2"),
        ("loss.entropy_coef", 0.001, VERL, 35, "entropy_coeff: 0.001"),
        ("trainer.grad_clip_norm", 1.0, VERL, 32, "grad_clip: 1.0"),
        ("trainer.beta1", 0.9, FSDP, 231, "(0.9, 0.999)"),
        ("trainer.beta2", 0.999, FSDP, 231, "(0.9, 0.999)"),
        ("trainer.weight_decay", 0.01, FSDP, 232, "1e-2"),
        ("trainer.eps", 1e-8, FSDP, 229, "optim.AdamW("),  # eps not passed: torch's 1e-8
        ("trainer.warmup_unit", "step", FSDP, 381, "actor_lr_scheduler.step()"),
        ("trainer.warmup_start", "zero", "verl/utils/torch_functional.py", 429,
         "min(1, float(current_step) / float(max(1, num_warmup_steps)))"),
        ("engine.max_seq_len", 4596, VLLM, 99, "max_model_len=config.prompt_length + config.response_length"),
        ("trainer.data_order", "epochs_drop_last", RAY, 393, "drop_last=True"),
        ("protocol.empty_query", "search", "search_r1/llm_agent/generation.py", 425,
         "content = match.group(2).strip()"),
    ]],
]


@pytest.mark.parametrize("preset,key,want,source,line,text", TABLE,
                         ids=[f"{r[0]}:{r[1]}" for r in TABLE])
def test_composed_preset_value_equals_the_official_one(preset, key, want, source, line, text):
    got = _value(_compose([f"experiment={preset}"]), key)
    assert got == want, f"{preset} {key}: {got!r} != official {want!r} ({source}:{line})"
    if MIRROR.is_dir():  # the cited line says what the table claims
        shown = subprocess.run(["git", "--git-dir", str(MIRROR), "show", f"{COMMIT}:{source}"],
                               capture_output=True, text=True)
        if shown.returncode == 0:
            assert text in shown.stdout.splitlines()[line - 1], f"{source}:{line}"


# ----------------------------------------------------------------------- 3. warm-up


@pytest.mark.parametrize("preset,lr", [("paper_grpo", 1e-6), ("paper_grpo_format", 5e-7), ("paper_ppo", 1e-6)])
def test_first_five_learning_rates_follow_verl(preset, lr):
    # verl: W = int(0.285 · 1005) = 286, LambdaLR min(1, s/W), stepped once per training step
    t = _compose([f"experiment={preset}"]).trainer
    want = [0.0, lr / 286, 2 * lr / 286, 3 * lr / 286, 4 * lr / 286]
    per_step = 10  # every optimizer step of one rollout shares its training step's LR
    got = [step_lr(t, 1005 * per_step, s)(s * per_step + k) for s in range(5) for k in (0, per_step - 1)]
    assert got == pytest.approx([w for w in want for _ in (0, 1)], rel=1e-12, abs=0)


def test_ours_stays_one_override_away():
    t = _compose(["experiment=paper_grpo", "trainer.warmup_unit=optimizer_step",
                  "trainer.warmup_start=first"]).trainer
    lr_at = step_lr(t, 100, 0)  # W = ceil(0.285 · 100) = 29, (k+1)/W per optimizer step
    assert [lr_at(k) for k in (0, 1, 28, 29)] == pytest.approx([1e-6 / 29, 2e-6 / 29, 1e-6, 1e-6])


def test_critic_warms_up_per_training_step_from_zero():
    from searchr1.engines.local.training.critic import Critic

    critic = object.__new__(Critic)  # the schedule alone: no model
    critic.cfg = SimpleNamespace(learning_rate=1e-5, warmup_ratio=0.015)
    critic.steps, critic.total_steps = 7, 2010
    critic.warmup = ("step", "zero", 1005)  # W = int(0.015 · 1005) = 15
    assert [critic._lr(s) for s in (0, 1, 14, 15)] == pytest.approx([0.0, 1e-5 / 15, 14e-5 / 15, 1e-5])
    critic.warmup = ("optimizer_step", "first", 2010)  # W = ceil(30.15) = 31, by optimizer step 7
    assert critic._lr(3) == pytest.approx(8e-5 / 31)


def test_learning_rate_rules_by_hand():
    assert learning_rate("linear_warmup", 1.0, 0, 10, 0.25, "zero") == 0.0  # W = int(2.5) = 2
    assert learning_rate("linear_warmup", 1.0, 1, 10, 0.25, "zero") == 0.5
    assert learning_rate("linear_warmup", 1.0, 0, 10, 0.25, "first") == pytest.approx(1 / 3)  # W = 3
    with pytest.raises(ValueError):
        learning_rate("linear_warmup", 1.0, 0, 10, 0.25, "middle")


# ----------------------------------------------------------------------- 4. eval


@pytest.mark.parametrize("preset", ["paper_grpo", "paper_grpo_format", "paper_ppo"])
def test_eval_is_the_whole_test_split_greedy_before_and_every_100(preset):
    from searchr1.data.selection import eval_examples
    from searchr1.data.types import QAExample

    cfg = _compose([f"experiment={preset}"])
    assert (cfg.data.dev_per_source, cfg.eval.split, cfg.eval.max_questions) == (0, "test", None)
    assert (cfg.eval.temperature, cfg.eval.before_training, cfg.trainer.eval_every) == (0.0, True, 100)
    sources = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
    test = [QAExample(id=f"{s}{i}", question="q", golden_answers=("a",), data_source=s)
            for s in sources for i in range(3)]
    dataset = SimpleNamespace(split=lambda name: {"test": test}[name])
    assert eval_examples(dataset, cfg.eval) == test  # all 21 rows, file order


def test_the_official_eval_loader_drops_one_row_ours_reads_all():
    """[ray:410-413] the val DataLoader has drop_last=True and the scripts' val_batch_size is
    256: of test.parquet's 51,713 rows it evaluates 51,712 (a departure: we read every row)."""
    from torch.utils.data import DataLoader

    official = DataLoader(range(51_713), batch_size=256, shuffle=False, drop_last=True)
    assert sum(len(b) for b in official) == 51_712


# ----------------------------------------------------------------------- 5. context


def test_presets_leave_a_whole_turn_after_the_longest_prompt():
    for preset in ("paper_grpo", "paper_grpo_format", "paper_ppo"):
        cfg = _compose([f"experiment={preset}"])
        assert cfg.engine.max_seq_len == cfg.rollout.max_prompt_tokens + cfg.rollout.max_turn_tokens
        assert not [p for p in check_config(cfg).problems if "max_seq_len" in p]


def test_a_context_limit_without_room_for_a_turn_is_refused():
    cfg = _compose(["experiment=paper_grpo", "engine.max_seq_len=4096"])
    problems = [p for p in check_config(cfg).problems if "max_seq_len" in p]
    assert problems == ["engine.max_seq_len=4096 leaves 0 tokens to generate after a prompt of "
                        "rollout.max_prompt_tokens=4096, fewer than rollout.max_turn_tokens=500: "
                        "set engine.max_seq_len>=4596 (or lower max_prompt_tokens)"]


def test_the_context_refusal_exits_2(tmp_path):
    from tests.startup.test_checks import assert_refused_before_work, run_main

    out, seconds = run_main(["experiment=paper_grpo", "engine.max_seq_len=4096",
                             f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    assert "engine.max_seq_len=4096 leaves 0 tokens" in out.stderr


def test_exact_entropy_on_trio_and_bm25_without_corpus_are_refused():
    cfg = _compose(["experiment=paper_grpo", "engine=trio"])
    problems = check_config(cfg).problems
    assert any(p.startswith("loss.entropy=exact needs the full distribution") for p in problems)
    assert any(p.startswith("retriever=bm25 with data=nq_hotpotqa needs retriever.corpus_path") for p in problems)
    ok = _compose(["experiment=paper_grpo", "engine=trio", "loss.entropy=sampled"])
    assert not any("loss.entropy" in p for p in check_config(ok).problems)
