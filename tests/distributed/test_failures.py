"""A rank that dies ends the job with a message naming it; bad settings stop before work."""

from __future__ import annotations

import time

import pytest

from searchr1.distributed.launch import join, startup_problems
from tests.helpers.dist_run import join as join_procs
from tests.helpers.dist_run import make_cfg, start_job


def test_killed_rank_fails_the_job_within_the_timeout_naming_it(tiny_model_dir, tmp_path):
    timeout = 20.0
    env = {"SEARCHR1_KILL_AT": "mid_rollout@2", "KILL_RANK": "1", "DIST_TIMEOUT": str(timeout)}
    t0 = time.monotonic()
    procs = start_job(2, tiny_model_dir, tmp_path / "run", tmp_path / "out", "grpo", 4, env=env)
    codes = join_procs(procs, timeout=240)
    assert codes[1] == -9  # SIGKILLed mid-step
    assert codes[0] == 1  # RankLost: exit 1, not a hang (join would have killed it: -9)
    text = (tmp_path / "out" / "lost_0.txt").read_text()
    assert "rank 0 of 2" in text and "rank(s) 1 did not answer" in text, text
    assert "timeout_s=20" in text
    assert time.monotonic() - t0 < 240


def test_startup_checks_name_the_fix(tiny_model_dir):
    cfg = make_cfg(tiny_model_dir, "grpo", 5)
    (msg,) = startup_problems(cfg, 2)
    assert "questions_per_step=5" in msg and "=4 or 6" in msg
    assert startup_problems(cfg, 1) == [] and startup_problems(make_cfg(tiny_model_dir, "grpo", 4), 2) == []
    cfg.trainer.max_staleness = 1
    cfg.warmstart.name = "oracle_sft"
    assert len(startup_problems(cfg, 3)) == 3


def test_rank0_exits_2_before_joining(tiny_model_dir, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as err:
        join(make_cfg(tiny_model_dir, "grpo", 3), tmp_path)
    assert err.value.code == 2
    assert "cannot start this 2-process run" in capsys.readouterr().err
