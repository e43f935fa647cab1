"""SIGTERM at each phase of ``python -m searchr1.main``: exit 4 within seconds, the last
completed step's checkpoint, ``stopped_reason`` and a resume command that works.

Each run is a real process (``tests/helpers/main_run.py``: ``searchr1.main`` as ``__main__`` in
a process forked from a server that imported torch once) of the smoke preset on a tiny random
model, sent SIGTERM by the ``SEARCHR1_KILL_AT`` hook while a phase's work is in flight: the eval
before training, step 2's rollout, step 2's update, step 1's checkpoint write, the final eval.
The time from the signal to the process's exit is bounded by half of SLURM's default grace
period (30 s before SIGKILL).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import searchr1.loop.checkpoint as ck
from tests.helpers.main_run import run_main, signal_at, tiny_overrides

EXIT_BOUND_S = 15.0  # from the signal to the process's exit; SLURM kills after 30 s


def _rows(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r["step"] for r in map(json.loads, lines) if "reward/mean" in r]


def _resume_args(stderr: str) -> list[str]:
    """The arguments of the resume command main.py printed."""
    command = stderr.rsplit("python -m searchr1.main ", 1)[1].splitlines()[0]
    return shlex.split(command)


PHASES = {  # hook point, extra overrides, (stopped after step, reason's end)
    "pre_eval": ("in_eval@0", [], 0, "during the eval before training"),
    "rollout": ("in_rollout@2", ["eval.before_training=false", "trainer.save_every=0"], 1,
                "during the rollout of step 2"),
    "update": ("in_update@2", ["eval.before_training=false", "trainer.save_every=0"], 2, "SIGTERM"),
    "checkpoint_write": ("engine_mid_write@1", ["eval.before_training=false"], 1, "SIGTERM"),
    "final_eval": ("in_eval@2", ["eval.before_training=false"], 2, "during the eval after step 2"),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_sigterm_in_each_phase_stops_within_seconds_and_resumes(tiny_model_dir, tmp_path, phase):
    point, extra, step, reason = PHASES[phase]
    run_dir = tmp_path / "run"
    args = [*tiny_overrides(tiny_model_dir), *extra, f"hydra.run.dir={run_dir}"]
    ended = run_main(args, tmp_path / "logs", signal_at(point))
    assert ended.code == 4, ended.stderr[-3000:]
    seconds = ended.seconds_after_signal()
    print(f"{phase}: exit {seconds:.2f} s after SIGTERM")
    assert seconds < EXIT_BOUND_S
    state = ck.newest_state(run_dir)
    assert (state.step if state else 0) == step
    assert _rows(run_dir) == list(range(1, step + 1))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_reason"].endswith(reason), summary
    assert "Traceback" not in ended.stderr
    assert f"stopped (exit code 4): {summary['stopped_reason']}" in ended.stdout  # not "failed (1)"
    if phase.endswith("eval"):  # the eval cut short left no files
        assert not (run_dir / "eval" / f"step_{step:06d}").exists()
    if phase in ("rollout", "final_eval"):  # the printed command continues the run to its end
        resumed = run_main(_resume_args(ended.stderr), tmp_path / "logs")
        assert resumed.code == 0, resumed.stderr[-3000:]
        assert _rows(run_dir) == [1, 2] and ck.newest_state(run_dir).step == 2
        summary = json.loads((run_dir / "summary.json").read_text())
        assert "stopped_reason" not in summary and summary["steps"] == 2
        assert (run_dir / "eval" / "step_000002" / "summary.json").exists()


def test_sigterm_to_a_sweep_stops_its_job_as_a_single_run_and_releases_the_lock(tiny_model_dir,
                                                                                  tmp_path):
    """A multirun (``-m``, Hydra's basic launcher) signalled while job 0 starts up (model and
    index loading, before the trainer): the job stops at its first boundary as a single run
    does, and the sweep starts no further job."""
    import os
    import signal
    import time

    from searchr1.startup.rundir import LOCK_FILE, is_locked
    from tests.helpers.main_run import MainRun

    sweep = tmp_path / "sweep"
    args = ["-m", *tiny_overrides(tiny_model_dir), "seed=0,1", f"hydra.sweep.dir={sweep}"]
    run = MainRun(args, tmp_path / "logs")
    lock = sweep / "0" / LOCK_FILE
    deadline = time.monotonic() + 300
    while not lock.exists() and run.proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sent = time.time()
    os.kill(run.pid, signal.SIGTERM)  # as a scheduler ends the sweep's process
    ended = run.wait()
    assert ended.code == 4, ended.stderr[-3000:]
    print(f"sweep job 0 (start-up): exit {ended.ended_at - sent:.2f} s after SIGTERM")
    assert ended.ended_at - sent < EXIT_BOUND_S
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["stopped_reason"] == "stopped by SIGTERM during the eval before training"
    assert not is_locked(sweep / "0") and lock.read_text() == ""  # released, no holder named
    assert f"trainer.resume=auto hydra.run.dir={sweep / '0'}" in ended.stderr
    assert "stopped (exit code 4)" in ended.stdout
    assert not (sweep / "1").exists()  # the sweep was asked to stop: no further job
