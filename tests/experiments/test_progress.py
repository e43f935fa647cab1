"""``progress.py``: an arm's steps and time left, from its own run folder (``run_study.sh status``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.scripts import ROOT, load_script


def _progress():
    return load_script("experiments/paper_findings/progress.py")


def _rows(step_seconds: list[float], eval_seconds: dict[int, float]) -> list[dict]:
    rows = []
    for step, seconds in enumerate(step_seconds, start=1):
        rows.append({"step": step, "time/step_seconds": seconds, "reward/mean": 0.5})
        if step in eval_seconds:
            rows.append({"step": step, "eval/em/macro": 0.4, "time/eval": eval_seconds[step]})
    return rows


def test_time_left_is_recent_steps_times_steps_left_plus_evals_left():
    pg = _progress()
    # 12 steps: two slow ones first, then ten of 2 s (only the last RECENT count); evals of 4 and 6 s
    rows = _rows([100.0, 100.0] + [2.0] * 10, {5: 4.0, 10: 6.0})
    p = pg.estimate(rows, steps=20, eval_every=5)
    # 8 steps × 2 s + the evals at 15 and 20 × the median eval (5 s)
    assert (p.step, p.steps) == (12, 20)
    assert p.seconds_left == pytest.approx(8 * 2.0 + 2 * 5.0)
    assert p.line() == "step 12 of 20, ≈ 0.4 min left"


def test_runs_without_eval_times_count_evals_as_free_and_an_untimed_run_says_so():
    pg = _progress()
    p = pg.estimate(_rows([3.0, 3.0, 3.0], {}), steps=10, eval_every=5)
    assert p.seconds_left == pytest.approx(7 * 3.0)
    fresh = pg.estimate([], steps=100, eval_every=10)
    assert fresh.seconds_left is None and fresh.line() == "step 0 of 100, time left unknown"
    done = pg.estimate(_rows([1.0] * 10, {10: 2.0}), steps=10, eval_every=10)
    assert done.seconds_left == 0.0 and done.line() == "step 10 of 10"


def _run_dir(tmp_path: Path, rows: list[dict], torn: str = "") -> Path:
    run = tmp_path / "grpo_s1"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("trainer:\n  steps: 30\n  eval_every: 10\n  lr: 1.0e-06\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)
    return run


def test_a_run_folder_is_read_from_its_config_and_a_torn_last_line_is_skipped(tmp_path):
    pg = _progress()
    run = _run_dir(tmp_path, _rows([4.0] * 10, {10: 8.0}), torn='{"step": 11, "time/step_')
    p = pg.progress(run)
    assert (p.step, p.steps) == (10, 30)
    assert p.seconds_left == pytest.approx(20 * 4.0 + 2 * 8.0)


def test_status_prints_each_arms_progress(tmp_path):
    study = tmp_path
    _run_dir(study, _rows([6.0] * 10, {10: 12.0}))
    (study / "grpo_s1.pid").write_text("999999999\n")  # no such process: stopped
    env = {**os.environ, "R": str(study)}
    out = subprocess.run(["bash", "experiments/paper_findings/run_study.sh", "status"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    # 20 steps × 6 s + 2 evals × 12 s = 144 s
    assert "grpo_s1: step 10 of 30, ≈ 2.4 min left, stopped" in out
