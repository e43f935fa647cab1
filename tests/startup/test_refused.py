"""A start refused with exit 2 leaves no empty run dir behind; a real run's dir is never touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1.startup.errors import StartupError
from searchr1.startup.refused import remove_if_empty, removed_if_refused
from searchr1.startup.rundir import RunDirLock

ROOT = Path(__file__).resolve().parents[2]


def _hydra_start(run_dir: Path) -> Path:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text("{}\n")
    (run_dir / "main.log").write_text("")
    return run_dir


def test_only_a_dir_holding_hydras_start_files_is_removed(tmp_path):
    day = tmp_path / "runs" / "2026-12-07"
    empty = _hydra_start(day / "10-00-00")
    assert remove_if_empty(empty) and not empty.exists()
    assert not day.exists() and (tmp_path / "runs").exists()  # the emptied date folder too
    run = _hydra_start(tmp_path / "runs" / "2026-12-08" / "11-00-00")
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    assert not remove_if_empty(run) and (run / ".hydra").exists()


def test_a_dir_locked_by_a_live_job_is_left_alone(tmp_path):
    run = _hydra_start(tmp_path / "live")
    code = ("import sys, time; from searchr1.startup.rundir import RunDirLock\n"
            "with RunDirLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not remove_if_empty(run) and run.exists()
    finally:
        holder.kill()
        holder.wait()


def test_the_context_removes_on_a_refusal_only(tmp_path, capsys):
    kept = _hydra_start(tmp_path / "ok")
    with removed_if_refused(kept):
        pass
    assert kept.exists()
    refused = _hydra_start(tmp_path / "refused")
    with pytest.raises(StartupError), removed_if_refused(refused):
        with RunDirLock(refused):  # the job's own lock is released before the removal
            raise StartupError("searchr1: cannot start this run")
    assert not refused.exists()


def test_a_hub_model_without_network_is_refused_in_one_paragraph_leaving_no_run_dir(tmp_path):
    """``model=qwen2_5_3b_base warmstart=none`` offline: no retries, no traceback, no empty dir."""
    run = tmp_path / "2026-12-07" / "12-00-00"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    out = subprocess.run([sys.executable, "-m", "searchr1.main", "model=qwen2_5_3b_base",
                          "warmstart=none", f"hydra.run.dir={run}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Retrying" not in out.stderr
    assert "model.hf_id=Qwen/Qwen2.5-3B" in out.stderr and "no network" in out.stderr
    assert not run.exists() and not run.parent.exists()
