"""Trainer checkpoints: the engine's state path plus the loop's own state, as one record.

A checkpoint is ``<run_dir>/checkpoints/step_<N>/trainer_state.json`` holding the step,
the data cursor, the engine's saved state path (local directory or ``trio://`` URI) and
the sampler-weights path (and, for ``advantage=ppo_gae``, ``critic.pt`` beside it).

Crash safety (``save_checkpoint``): the engine state and sampler weights are saved first
(each atomically by the engine, replacing an earlier save of the same step), then the loop's
folder is written under a temp name (``.step_<N>.tmp``) and renamed into place with
``trainer_state.json`` inside it, so a step is complete exactly when its folder exists. A
crash anywhere before the rename leaves the previous checkpoint as the newest complete one;
the resumed run redoes the step and overwrites whatever the crash left (a half-written or
already-present step counts as not yet done), so resuming twice equals resuming once.
Orphan temp folders (ours and the local engine's ``.step_<N>.*``) are removed on resume and
before each save. Free disk space is checked before writing, estimated from the previous
checkpoint's size.

``SEARCHR1_KILL_AT=<point>[@<step>]`` SIGKILLs the process at a named point (``crash_point``),
the first time it is reached or only on step ``<step>``: a test hook (tests/loop/test_sigkill.py).
The points, in the order a step reaches them: ``mid_rollout`` (train_step.py: the step's
rollout sampled, nothing trained), ``after_update`` (trainer.py: updated and its metrics row
logged, nothing saved), then in ``save_checkpoint``: ``engine_mid_write`` (inside the local
engine's ``write_atomically``: files in its temp folder, not renamed), ``after_engine_state``,
``after_sampler``, ``loop_mid_write`` (the loop's temp folder made, ``trainer_state.json``
not yet in it) and ``before_loop_state`` (the temp folder complete, not renamed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path

from searchr1.startup.rundir import dir_size, ensure_free_space

STATE_FILE = "trainer_state.json"
CRITIC_FILE = "critic.pt"  # advantage=ppo_gae: the local critic (adapters, head, optimizer)
KILL_ENV = "SEARCHR1_KILL_AT"  # test hook: SIGKILL at <point>[@<step>] (crash_point)
TMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class TrainerState:
    """Everything the loop needs to continue after ``step`` completed steps."""

    step: int  # completed steps
    cursor: int  # next data-stream position
    engine_state: str  # path/URI from TrainingClient.save_state
    sampler_weights: str  # path/URI from save_weights_for_sampler
    optimizer_steps: int = 0  # optimizer steps taken (drives the LR schedule)
    # run totals so far, restored on resume so the summary and the cumulative search/* rows
    # of a resumed run equal an uninterrupted one: {"trainer": Trainer.totals,
    # "search": StepRunner.search_totals as a dict}; empty in checkpoints written before them
    totals: dict = field(default_factory=dict)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def write_state(run_dir: Path, state: TrainerState) -> Path:
    """Write ``trainer_state.json`` for ``state.step`` atomically; returns its path."""
    d = checkpoint_dir(run_dir, state.step)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    os.replace(tmp, d / STATE_FILE)
    return d / STATE_FILE


def read_state(path: Path) -> TrainerState:
    path = Path(path)
    if path.is_dir():
        path = path / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"no trainer checkpoint at {path}")
    return TrainerState(**json.loads(path.read_text(encoding="utf-8")))


def newest_state(run_dir: Path) -> TrainerState | None:
    """The complete checkpoint with the highest step in ``run_dir``, or None."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(root.glob(f"step_*/{STATE_FILE}")) if root.exists() else []
    return read_state(done[-1]) if done else None


def crash_point(name: str, step: int | None = None) -> None:
    """SIGKILL this process when ``$SEARCHR1_KILL_AT`` names this point (tests only).

    ``<point>`` kills the first time the point is reached; ``<point>@<N>`` only when it is
    reached on step ``N`` (1-based: the step whose metrics row and checkpoint are numbered
    ``N``), so a test can let step 1 complete and kill step 2. A point whose caller does not
    know the step (``step=None``) matches the plain form only.
    """
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    point, _, at = spec.partition("@")
    if point == name and (not at or (step is not None and step == int(at))):
        os.kill(os.getpid(), signal.SIGKILL)


def clean_orphans(run_dir: Path) -> list[Path]:
    """Remove temp folders a crashed save left (ours and the local engine's); return them."""
    root = Path(run_dir) / "checkpoints"
    found: list[Path] = []
    for parent in (root, root / "engine" / "state", root / "engine" / "sampler"):
        if parent.is_dir():
            found += [p for p in parent.glob(".step_*") if p.is_dir()]
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return found


def _local_size(path: str) -> int:
    return 0 if "://" in path else dir_size(path)


def checkpoint_size(run_dir: Path, state: TrainerState) -> int:
    """Bytes of one complete checkpoint: loop folder + local engine state + sampler weights."""
    return (dir_size(checkpoint_dir(run_dir, state.step)) + _local_size(state.engine_state)
            + _local_size(state.sampler_weights))


def save_checkpoint(run_dir: Path, client, step: int, cursor: int, optimizer_steps: int,
                    critic=None, totals: dict | None = None) -> Path:
    """Engine state, sampler weights, then the loop folder (renamed into place last).

    Any earlier save of ``step`` (a crashed attempt, or a step redone after a resume) is
    replaced; returns the checkpoint folder.
    """
    run_dir = Path(run_dir)
    clean_orphans(run_dir)
    previous = newest_state(run_dir)
    if previous is not None:
        ensure_free_space(run_dir / "checkpoints", checkpoint_size(run_dir, previous))
    name = f"step_{step:06d}"
    engine_state = client.save_state(name, overwrite=True).result().path
    crash_point("after_engine_state", step)
    sampler = client.save_weights_for_sampler(name).result().path
    crash_point("after_sampler", step)
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}{TMP_SUFFIX}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if critic is not None:
        critic.save(tmp / CRITIC_FILE)
    crash_point("loop_mid_write", step)
    state = TrainerState(step, cursor, engine_state, sampler, optimizer_steps, dict(totals or {}))
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    crash_point("before_loop_state", step)
    trash = final.with_name(f".{final.name}.old")
    if final.exists():  # an earlier save of this step, now redone: set it aside atomically
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
    os.replace(tmp, final)
    shutil.rmtree(trash, ignore_errors=True)
    return final


def resolve_resume(resume: str, run_dir: Path) -> TrainerState | None:
    """``never`` → None; ``auto`` → newest in run_dir (None if none); else a path."""
    if resume == "never":
        return None
    if resume == "auto":
        clean_orphans(run_dir)
        return newest_state(run_dir)
    return read_state(Path(resume))
