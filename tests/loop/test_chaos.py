"""Chaos: one tiny-model run broken again and again at seeded random points, then resumed.

A chain of faulted runs shares one run dir (3 steps, ``save_every=1``, ``resume=auto``): each
run is killed by SIGKILL, stopped by SIGTERM or SIGINT, or hits a full disk (``ENOSPC`` at one
of the checkpoint's writes) at a point drawn from a seeded generator, and between runs the
newest checkpoint is sometimes corrupted (garbage loop state, truncated adapters or optimizer
state). Each faulted run must end the way its fault says (exit -9, 4 or 5) and leave the
newest complete checkpoint where the fault predicts; the last resume must end equal to the
uninterrupted run of tests/loop/test_sigkill.py (same final engine files, loop state and
``metrics.jsonl`` rows apart from timing keys), with no temp folder left.
"""

from __future__ import annotations

import random
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

import searchr1.loop.checkpoint as ck
from searchr1.loop.stop import EXIT_STOPPED
from searchr1.utils import faults
from tests.loop.test_sigkill import (STEPS, assert_rows_equal, orphans, outcome, reference,  # noqa: F401
                                     rows, spawn)

SEED, FAULTS = 6, 10
STEP_POINTS = ["mid_rollout", "after_update"]  # reached before the step's save begins
WRITE_POINTS = ["engine_mid_write", "after_engine_state", "after_sampler", "loop_mid_write",
                "before_loop_state"]
CORRUPTIONS = ["trainer_state.json", "adapter_model.safetensors", "trainer_state.pt"]


@dataclass(frozen=True)
class Fault:
    kind: str  # KILL | TERM | INT | ENOSPC | corrupt (the newest checkpoint, between runs)
    point: str = ""
    step: int = 0

    def run_args(self) -> tuple[str | None, dict]:
        """``kill_at`` and the extra environment of the faulted run."""
        if self.kind == "ENOSPC":
            return None, {faults.FAIL_ENV: f"{self.point}@{self.step}"}
        return f"{self.point}@{self.step}", {faults.KILL_SIGNAL_ENV: self.kind}

    def exit_code(self) -> int:
        return {"KILL": -signal.SIGKILL, "ENOSPC": ck.EXIT_CHECKPOINT_WRITE}.get(self.kind, EXIT_STOPPED)


def chain(rng: random.Random, n: int) -> list[tuple[Fault, int]]:
    """``n`` faults, each reachable from where the last left the run, with the newest complete
    checkpoint after each: a stop signal finishes and saves its step, a kill or a failed write
    loses it, a corruption drops the newest checkpoint."""
    out, newest = [], 0
    while len(out) < n:
        kind = rng.choice(["KILL", "KILL", "TERM", "INT", "ENOSPC", "ENOSPC", "corrupt"])
        if kind == "corrupt":
            if newest == 0:
                continue
            out.append((Fault("corrupt", rng.choice(CORRUPTIONS), newest), newest - 1))
            newest -= 1
            continue
        if kind in ("TERM", "INT") and newest + 1 == STEPS:
            continue  # a stop at the last step would finish the run
        step = newest + 1
        point = rng.choice(WRITE_POINTS if kind == "ENOSPC" else STEP_POINTS + WRITE_POINTS)
        newest = step if kind in ("TERM", "INT") else step - 1
        out.append((Fault(kind, point, step), newest))
    return out


def corrupt(run_dir: Path, name: str, step: int) -> None:
    """Spoil one file of checkpoint ``step``: garbage loop state, or a truncated engine file."""
    if name == ck.STATE_FILE:
        (ck.checkpoint_dir(run_dir, step) / name).write_text("{not json")
        return
    path = run_dir / "checkpoints/engine/state" / f"step_{step:06d}" / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_the_chain_of_faults_is_seeded_and_reaches_every_kind():
    faults_ = chain(random.Random(SEED), FAULTS)
    assert faults_ == chain(random.Random(SEED), FAULTS)
    kinds = {f.kind for f, _ in faults_}
    assert {"KILL", "ENOSPC", "corrupt"} <= kinds and kinds & {"TERM", "INT"}, kinds
    assert all(0 <= newest < STEPS for _, newest in faults_)


def test_random_kills_stops_full_disks_and_corruptions_resume_to_the_uninterrupted_run(
        spawn, reference, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    for fault, newest in chain(random.Random(SEED), FAULTS):
        if fault.kind == "corrupt":
            corrupt(run_dir, fault.point, fault.step)
        else:
            kill_at, env = fault.run_args()
            assert spawn(run_dir, kill_at, env) == fault.exit_code(), fault
        state = ck.newest_state(run_dir)
        assert (state.step if state else 0) == newest, fault
        train = [r["step"] for r in rows(run_dir) if "reward/mean" in r]
        assert len(train) == len(set(train)), fault  # never two rows for one step
    assert spawn(run_dir) == 0
    assert outcome(run_dir) == reference["outcome"]
    assert_rows_equal(rows(run_dir), reference["rows"])
    assert orphans(run_dir) == []
