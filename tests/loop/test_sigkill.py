"""SIGKILL matrix: a tiny-model run killed for real at each point of a step, then resumed.

Every case is a 3-step run (``save_every=1``) killed by ``SEARCHR1_KILL_AT=<point>@2`` on its
second step, then resumed with ``trainer.resume=auto`` into the same run dir, then resumed
again. Each must end equal to one uninterrupted run of the same config and seed (run once
per module): byte-identical engine state and sampler weights of the last step, the same
loop state, the same ``metrics.jsonl`` rows (one per step and kind, none duplicated or lost;
every field but wall-clock times equal to 1e-6) and no orphan temp folder. The second resume
must change nothing (resuming twice equals resuming once), and a chain of resumes that are
killed again ends where a single resume does.

Each run is its own process, forked from a ``forkserver`` that imported torch and the
project once (a fresh interpreter spends ~15 s on imports on 2 cores), so a kill is a real
SIGKILL of a whole training process. Two processes on one run dir (the lock) are covered by
tests/startup/test_rundir.py.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import searchr1.loop.checkpoint as ck
from searchr1.trackers.jsonl import METRICS_FILE, JsonlTracker
from tests.loop.test_trainer import make_cfg, run_trainer

STEPS = 3
KILL_STEP = 2


def wall_clock(name: str) -> bool:
    """A metric that measures wall time (so differs between equal runs)."""
    return name.startswith("time/") or name.endswith(("latency", "tokens_per_second"))


def train(tiny_model_dir: str, run_dir: str, kill_at: str | None, env: dict | None = None) -> None:
    """One training process (a forked child): 3 steps, resume=auto, ``metrics.jsonl``.

    ``env`` adds fault settings (``SEARCHR1_KILL_SIGNAL``, ``SEARCHR1_FAIL_AT``); a run that
    stops on a signal or a failed checkpoint write exits with main.py's code for it.
    """
    from searchr1.main import EXIT_CODES
    from searchr1.utils import faults

    for name in (faults.KILL_ENV, faults.KILL_SIGNAL_ENV, faults.FAIL_ENV):
        os.environ.pop(name, None)
    os.environ.update(env or {})
    if kill_at is not None:
        os.environ[ck.KILL_ENV] = kill_at
    cfg = make_cfg(Path(tiny_model_dir), steps=STEPS, save_every=1, resume="auto")
    # One request per forward pass: which concurrent requests share a batch depends on
    # timing, and batch composition moves logits by ~1e-7 (enough to change adapter bytes),
    # so equal runs are byte-equal only when batches cannot depend on the clock.
    cfg.engine.max_batch_size = 1
    tracker = JsonlTracker(run_dir)
    try:
        run_trainer(cfg, Path(run_dir), tracker)
    except tuple(EXIT_CODES) as err:
        raise SystemExit(EXIT_CODES[type(err)]) from err
    finally:
        tracker.finish()


@pytest.fixture(scope="module")
def spawn(tiny_model_dir):
    """``spawn(run_dir, kill_at=None, env=None)`` runs ``train`` in a forked process; returns
    its exit code."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])

    def run(run_dir: Path, kill_at: str | None = None, env: dict | None = None) -> int:
        proc = ctx.Process(target=train, args=(str(tiny_model_dir), str(run_dir), kill_at, env))
        proc.start()
        proc.join(timeout=300)
        if proc.exitcode is None:  # hung: never leave it behind
            proc.kill()
            proc.join()
        return proc.exitcode

    return run


def _feed(h, obj) -> None:
    """Hash a nest of dicts, lists, tensors and scalars by content."""
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            h.update(repr(k).encode())
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _feed(h, x)
    elif torch.is_tensor(obj):
        h.update(f"{obj.dtype}{tuple(obj.shape)}".encode())
        h.update(obj.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(repr(obj).encode())


def sha_tree(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (relative names).

    ``torch.save`` files (the optimizer state, step and RNG states) are hashed by content:
    their zip archive carries a per-save serialization id, so equal states differ in bytes.
    """
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h = hashlib.sha256()
            if p.suffix == ".pt":
                _feed(h, torch.load(p, map_location="cpu", weights_only=True))
            else:
                h.update(p.read_bytes())
            out[str(p.relative_to(path))] = h.hexdigest()
    return out


def orphans(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*")) if root.exists() else []


def rows(run_dir: Path) -> list[dict]:
    """``metrics.jsonl`` rows in file order, wall-clock fields dropped."""
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not wall_clock(k)} for line in lines]


def outcome(run_dir: Path) -> dict:
    """What must equal the uninterrupted run: last step's engine files, loop state, layout."""
    root = run_dir / "checkpoints"
    last = f"step_{STEPS:06d}"
    state = json.loads((ck.checkpoint_dir(run_dir, STEPS) / ck.STATE_FILE).read_text())
    state = {k: v.replace(str(run_dir), "<run>") if isinstance(v, str) else v for k, v in state.items()}
    state["totals"].get("trainer", {}).pop("wall_seconds", None)  # wall time: differs between equal runs
    return {"engine_state": sha_tree(root / "engine/state" / last),
            "sampler": sha_tree(root / "engine/sampler" / last),
            "loop_state": state,
            "layout": sorted(str(p.relative_to(root)) for p in root.rglob("step_*") if p.is_dir())}


def assert_rows_equal(got: list[dict], want: list[dict]) -> None:
    assert [(r["step"], sorted(r)) for r in got] == [(r["step"], sorted(r)) for r in want]
    for g, w in zip(got, want):
        for k, v in w.items():
            if isinstance(v, float):
                assert g[k] == pytest.approx(v, abs=1e-6), (g["step"], k)
            else:
                assert g[k] == v, (g["step"], k)


@pytest.fixture(scope="module")
def reference(spawn, tmp_path_factory) -> dict:
    """The uninterrupted run, once per module."""
    run_dir = tmp_path_factory.mktemp("sigkill") / "reference"
    assert spawn(run_dir) == 0
    ref = {"outcome": outcome(run_dir), "rows": rows(run_dir)}
    train_steps = [r["step"] for r in ref["rows"] if "reward/mean" in r]
    assert train_steps == [1, 2, 3]
    assert any(r.get("train/loss", 0.0) != 0.0 for r in ref["rows"])  # it trained
    return ref


def engine(run_dir: Path, kind: str, step: int) -> bool:
    return (run_dir / "checkpoints/engine" / kind / f"step_{step:06d}").is_dir()


@dataclass(frozen=True)
class AfterKill:
    """What is on disk right after a kill at step 2."""

    rows: list[int]  # steps with a train row in metrics.jsonl
    engine: bool  # step 2's engine state is in place
    sampler: bool  # step 2's sampler weights are in place
    orphan: str | None  # the temp folder left (a prefix, under checkpoints/), or None
    newest: int = 1  # the newest complete checkpoint


CASES = {  # in the order a step reaches the points
    "mid_rollout": AfterKill([1], engine=False, sampler=False, orphan=None),
    "after_update": AfterKill([1, 2], engine=False, sampler=False, orphan=None),
    "engine_mid_write": AfterKill([1, 2], engine=False, sampler=False, orphan="engine/state/.step_000002."),
    "after_engine_state": AfterKill([1, 2], engine=True, sampler=False, orphan=None),
    "after_sampler": AfterKill([1, 2], engine=True, sampler=True, orphan=None),
    "loop_mid_write": AfterKill([1, 2], engine=True, sampler=True, orphan=".step_000002.tmp"),
    "before_loop_state": AfterKill([1, 2], engine=True, sampler=True, orphan=".step_000002.tmp"),
}


@pytest.mark.parametrize("point", list(CASES))
def test_sigkill_at_step_2_then_resume_equals_uninterrupted(spawn, reference, tmp_path, point):
    run_dir, want = tmp_path / "run", CASES[point]
    assert spawn(run_dir, f"{point}@{KILL_STEP}") == -9  # killed by SIGKILL, not an error
    newest = ck.newest_state(run_dir)
    assert newest is not None and newest.step == want.newest
    assert [r["step"] for r in rows(run_dir) if "reward/mean" in r] == want.rows
    assert engine(run_dir, "state", KILL_STEP) == want.engine
    assert engine(run_dir, "sampler", KILL_STEP) == want.sampler
    left = orphans(run_dir)
    if want.orphan is None:
        assert left == []
    else:
        assert len(left) == 1 and left[0].startswith(want.orphan), left
        tmp = run_dir / "checkpoints" / left[0]
        assert any(tmp.iterdir()) or point == "loop_mid_write"  # files written, not renamed
        assert (tmp / ck.STATE_FILE).exists() == (point == "before_loop_state")

    assert spawn(run_dir) == 0  # resume=auto into the same run dir
    once = {"outcome": outcome(run_dir), "rows": rows(run_dir)}
    assert once["outcome"] == reference["outcome"]
    assert_rows_equal(once["rows"], reference["rows"])
    assert orphans(run_dir) == []

    assert spawn(run_dir) == 0  # resuming twice equals resuming once
    assert outcome(run_dir) == once["outcome"]
    assert_rows_equal(rows(run_dir), once["rows"])
    assert orphans(run_dir) == []


def test_resumes_killed_again_end_equal_to_one_resume(spawn, reference, tmp_path):
    """Kills of the resumed runs too (the same step redone three times, then step 3): one end."""
    run_dir = tmp_path / "run"
    for kill in ("after_engine_state@2", "engine_mid_write@2", "before_loop_state@2", "after_update@3"):
        assert spawn(run_dir, kill) == -9, kill
    assert ck.newest_state(run_dir).step == 2 and orphans(run_dir) == []
    assert [r["step"] for r in rows(run_dir)] == [1, 2, 3]  # step 2's row redone, not repeated
    assert spawn(run_dir) == 0
    assert outcome(run_dir) == reference["outcome"]
    assert_rows_equal(rows(run_dir), reference["rows"])
    assert orphans(run_dir) == []


def test_plain_point_kills_the_first_time_before_any_loop_state(spawn, reference, tmp_path):
    """``SEARCHR1_KILL_AT=<point>`` (no step) kills at step 1: the resume starts over."""
    run_dir = tmp_path / "run"
    assert spawn(run_dir, "after_engine_state") == -9
    assert engine(run_dir, "state", 1) and ck.newest_state(run_dir) is None
    assert [r["step"] for r in rows(run_dir)] == [1]
    assert spawn(run_dir) == 0
    assert outcome(run_dir) == reference["outcome"]
    assert_rows_equal(rows(run_dir), reference["rows"])


def test_kill_spec_matches_point_and_step(monkeypatch):
    """``crash_point`` decides from the env alone; a point of unknown step matches the plain form."""
    killed: list[int] = []
    monkeypatch.setattr(ck.os, "kill", lambda pid, sig: killed.append(sig))
    for spec, name, step, kills in [("after_update@2", "after_update", 2, True),
                                    ("after_update@2", "after_update", 1, False),
                                    ("after_update@2", "after_sampler", 2, False),
                                    ("after_update@2", "after_update", None, False),
                                    ("after_update", "after_update", 7, True),
                                    ("engine_mid_write", "engine_mid_write", None, True)]:
        killed.clear()
        monkeypatch.setenv(ck.KILL_ENV, spec)
        ck.crash_point(name, step)
        assert bool(killed) == kills, (spec, name, step)
    killed.clear()
    monkeypatch.delenv(ck.KILL_ENV)
    ck.crash_point("after_update", 2)
    assert killed == []
