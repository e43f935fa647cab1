"""End to end through ``python -m searchr1.main``: the embedded model, real subprocesses.

These are the slowest tests (a few minutes on 2 cores): the smoke training run of the
default (paper-style) setting, the lab preset's offline variant, and the credential check
of the real lab preset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = ["rollout.max_turn_tokens=24", "rollout.max_turns=2", "eval.max_questions=2"]


def run_main(args: list[str], tmp_path: Path, env: dict | None = None, timeout=900):
    cmd = [sys.executable, "-m", "searchr1.main", f"hydra.run.dir={tmp_path}", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def steps_of(run_dir: Path) -> list[dict]:
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward/mean" in r]


def test_smoke_preset_trains_and_evaluates(tmp_path):
    out = run_main(["experiment=smoke", *TINY_RUN], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/trajectory_tokens"] > 0 for r in steps)
    assert all(r["train/datums"] == 4 and "train/grad_norm" in r for r in steps)  # it updated
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and "eval/em/macro" in summary
    for step in ("step_000000", "step_000002"):
        assert (tmp_path / "eval" / step / "trajectories.jsonl").exists()
        assert (tmp_path / "eval" / step / "trajectories.html").exists()
    assert (tmp_path / "checkpoints/step_000002/trainer_state.json").exists()


def test_lab_preset_offline_variant_trains_two_steps(tmp_path):
    args = ["experiment=lab", "engine=local", "model=smollm2_135m", "retriever=bm25", "data=world",
            "trainer.steps=2", "trainer.questions_per_step=2", "rollout.group_size=2",
            "rollout.max_observation_tokens=256", *TINY_RUN]
    out = run_main(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    cfg = (tmp_path / ".hydra/config.yaml").read_text()
    assert "name: tool_call" in cfg and "name: em_format" in cfg and "name: group_mean" in cfg
    # em_format gives −0.1 to trajectories without a valid final answer, never below
    assert all(-0.1 - 1e-9 <= r["reward/mean"] <= 1.0 for r in steps)


def test_lab_preset_without_credentials_stops_with_one_message(tmp_path):
    env = {"HOME": str(tmp_path), "PYTRIO_API_KEY": "", "ZHIHU_SEARCH_KEYS": ""}
    out = run_main(["experiment=lab"], tmp_path / "run", env=env, timeout=300)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "ZHIHU_SEARCH_KEYS" in text and "trio login" in text
    assert "Traceback" not in text
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before any work


CI_SIZE = {  # the world presets shrunk to a CPU-sized run with 2 optimizer steps per rollout
    "paper_grpo_world": ["trainer.questions_per_step=2", "trainer.minibatch_trajectories=5",
                         "trainer.microbatch_trajectories=2"],
    "paper_ppo_world": ["trainer.questions_per_step=4", "trainer.minibatch_trajectories=2",
                        "trainer.microbatch_trajectories=1", "critic.microbatch_trajectories=2"],
}


@pytest.mark.parametrize("preset,opt_steps", [("paper_grpo_world", 2), ("paper_ppo_world", 2)])
def test_paper_world_presets_train_offline(tmp_path, preset, opt_steps):
    args = [f"experiment={preset}", "trainer.steps=2", "eval.before_training=false",
            "rollout.max_searches=1", "rollout.max_trajectory_tokens=1024",
            "rollout.max_observation_tokens=160", *CI_SIZE[preset], *TINY_RUN]
    out = run_main(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert r["train/optimizer_steps"] == opt_steps  # several optimizer steps per rollout
        assert "train/kl" in r and "train/entropy" in r and "search/step_requests" in r
    if preset == "paper_ppo_world":
        assert all(k in steps[-1] for k in ("critic/value_loss", "critic/vf_clipfrac",
                                            "critic/values_mean", "critic/explained_variance"))
    assert steps[-1]["train/step"] == 2 * opt_steps  # the optimizer's count, not a mean
