"""Trainer checkpoints: the engine's state path plus the loop's own state, as one record.

A checkpoint is ``<run_dir>/checkpoints/step_<N>/trainer_state.json`` holding the step,
the data cursor, the engine's saved state path (local directory or ``trio://`` URI) and
the sampler-weights path (and, for ``advantage=ppo_gae``, ``critic.pt`` beside it). It is
written last and atomically, so a crash mid-save leaves the
previous checkpoint as the newest complete one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "trainer_state.json"
CRITIC_FILE = "critic.pt"  # advantage=ppo_gae: the local critic (adapters, head, optimizer)


@dataclass(frozen=True)
class TrainerState:
    """Everything the loop needs to continue after ``step`` completed steps."""

    step: int  # completed steps
    cursor: int  # next data-stream position
    engine_state: str  # path/URI from TrainingClient.save_state
    sampler_weights: str  # path/URI from save_weights_for_sampler
    optimizer_steps: int = 0  # optimizer steps taken (drives the LR schedule)


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


def resolve_resume(resume: str, run_dir: Path) -> TrainerState | None:
    """``never`` → None; ``auto`` → newest in run_dir (None if none); else a path."""
    if resume == "never":
        return None
    if resume == "auto":
        return newest_state(run_dir)
    return read_state(Path(resume))
