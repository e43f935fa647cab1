"""Run-dir safety: the lock (two processes, stale locks), finished run dirs, resume paths,
free disk space, and ``metrics.jsonl`` rows keyed by step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from searchr1.startup.rundir import (
    LOCK_FILE,
    DiskSpaceError,
    RunDirBusy,
    RunDirLock,
    dir_size,
    ensure_free_space,
    is_locked,
    run_dir_problems,
)
from searchr1.trackers.jsonl import JsonlTracker

ROOT = Path(__file__).resolve().parents[3]
HOLD = "import sys, time; from searchr1.startup.rundir import RunDirLock; RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)"


@pytest.fixture
def holder(tmp_path):
    """Another process holding ``tmp_path/run``'s lock; yields (run dir, process)."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield run, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_second_holder_is_refused_and_a_dead_holder_is_taken_over(holder, capsys):
    run, proc = holder
    assert is_locked(run)
    with pytest.raises(RunDirBusy) as err:
        RunDirLock(run).acquire()
    assert err.value.code == 2 and f"pid {proc.pid}" in err.value.message
    assert f"pid {proc.pid}" in capsys.readouterr().err
    os.kill(proc.pid, signal.SIGKILL)  # dies holding it: the lock file stays behind
    proc.wait()
    assert (run / LOCK_FILE).exists() and not is_locked(run)
    with RunDirLock(run) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        with pytest.raises(RunDirBusy):  # a second job in this process is refused too
            RunDirLock(run).acquire()
    assert not is_locked(run)


def _main(args: list[str], via_module: bool = True) -> subprocess.CompletedProcess:
    if via_module:
        cmd = [sys.executable, "-m", "searchr1.main", *args]
    else:  # skip the pre-Hydra check: the lock taken inside the job must refuse too
        code = ("import runpy, searchr1.startup.rundir as r; r.refuse_live_run_dir = lambda argv: None; "
                "runpy.run_module('searchr1.main', run_name='__main__', alter_sys=True)")
        cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_main_refuses_a_live_run_dir_without_touching_its_hydra_files(holder, tmp_path):
    run, proc = holder
    hydra = run / ".hydra"
    hydra.mkdir()
    (hydra / "overrides.yaml").write_text("- the first job's overrides\n")
    args = [f"hydra.run.dir={run}", f"engine.cache_dir={tmp_path / 'model_cache'}"]
    out = _main(args)
    assert out.returncode == 2 and f"is in use by pid {proc.pid}" in out.stderr
    assert "Traceback" not in out.stderr
    assert (hydra / "overrides.yaml").read_text() == "- the first job's overrides\n"
    inside = _main(args, via_module=False)
    assert inside.returncode == 2 and f"pid {proc.pid}" in inside.stderr
    assert not (tmp_path / "model_cache").exists()  # refused before the model loaded


def test_finished_run_dir_and_resume_paths(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert run_dir_problems(run, "never") == []
    (run / "summary.json").write_text("{}")
    [msg] = run_dir_problems(run, "never")
    assert "finished run" in msg and "trainer.resume=auto" in msg
    assert run_dir_problems(run, "auto") == []
    [msg] = run_dir_problems(None, str(tmp_path / "nope"))
    assert "no such checkpoint" in msg
    (tmp_path / "ckpt").mkdir()
    [msg] = run_dir_problems(None, str(tmp_path / "ckpt"))
    assert "no trainer_state.json" in msg
    (tmp_path / "ckpt" / "trainer_state.json").write_text("{}")
    assert run_dir_problems(None, str(tmp_path / "ckpt")) == []


def test_ensure_free_space(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"x" * 1000)
    assert dir_size(tmp_path / "a") == 1000 and dir_size(tmp_path / "missing") == 0
    ensure_free_space(tmp_path / "not/yet/there", 1000)  # checks the nearest existing folder
    with pytest.raises(DiskSpaceError, match="not enough disk space"):
        ensure_free_space(tmp_path / "ckpt", 10**18)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_metrics_rows_are_keyed_by_step_across_a_resume(tmp_path):
    first = JsonlTracker(tmp_path)
    first.log({"eval/em": 0.1}, 0)
    for step in (1, 2, 3):
        first.log({"reward/mean": step / 10}, step)
    first.log({"eval/em": 0.3}, 3)  # an eval row beside the step's train row
    first.finish()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reward/me')  # killed mid-write
    resumed = JsonlTracker(tmp_path)  # resumed from the step-2 checkpoint: redoes 3 and 4
    resumed.log({"reward/mean": 0.33}, 3)
    resumed.log({"reward/mean": 0.4}, 4)
    resumed.finish()
    rows = _rows(tmp_path)
    assert [(r["step"], sorted(r)[0]) for r in rows] == [
        (0, "eval/em"), (1, "reward/mean"), (2, "reward/mean"), (3, "eval/em"),
        (3, "reward/mean"), (4, "reward/mean")]
    assert next(r for r in rows if r["step"] == 3 and "reward/mean" in r)["reward/mean"] == 0.33
