"""Trainer checkpoints: the engine's state path plus the loop's own state, as one record.

A checkpoint is ``<run_dir>/checkpoints/step_<N>/`` holding ``trainer_state.json`` (the step,
the data cursor, the engine's saved state and sampler-weights paths, run totals), for
``advantage=ppo_gae`` ``critic.pt``, and ``manifest.json``: the size and sha256 of every file
of the checkpoint (its own, the engine state's and the sampler weights'), written last, with
the folder and step it was written for, so a folder copied or renamed to another step is
refused rather than resumed as the step its name claims.

Relocatable: local paths are stored relative to the run dir (``trio://`` URIs as they are), so
a copied or moved run dir resumes from its own files and never touches the original's.

Crash safety (``save_checkpoint``): free space is checked first (the previous checkpoint's
size, or for the first one an estimate from the trainable parameter count), the engine
state and sampler weights are saved (each atomically by the engine, replacing an earlier
save of the same step), then the loop's folder is written under a temp name
(``.step_<N>.tmp``) and renamed into place with its manifest inside, so a step is complete
exactly when its folder exists and matches its manifest. A crash anywhere before the rename
leaves the previous checkpoint as the newest complete one; the resumed run redoes the step
and overwrites whatever the crash left, so resuming twice equals resuming once. A failed
write (a full disk, any ``OSError``) removes its temp folder and raises
``CheckpointWriteError``: ``main.py`` exits ``EXIT_CHECKPOINT_WRITE`` with the previous
checkpoint intact. Orphan temp folders (ours and the local engine's ``.step_<N>.*``) are
removed on resume and before each save.

Resume (``resolve_resume``) walks the checkpoints newest first and takes the first that
verifies, warning about each one skipped (a corrupt or truncated newest one); when
checkpoints exist but none verifies it stops with exit 2 (``main.py`` asks before the model
loads), as it does when the engine state is sharded over another number of processes than the
job has (full fine-tuning: ``TrainerState.processes``). Checkpoints written before manifests
are taken when their files exist.

Test hooks (``utils/faults.py``, whose ``POINTS`` lists them all): ``SEARCHR1_KILL_AT`` /
``SEARCHR1_FAIL_AT=<point>[@<step>]``; ``save_checkpoint`` passes ``engine_mid_write`` (inside
the engine's save), ``after_engine_state``, ``after_sampler``, ``loop_mid_write`` and
``before_loop_state``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from searchr1.startup.errors import StartupError, exit_with
from searchr1.startup.rundir import STATE_FILE, dir_size, ensure_free_space
from searchr1.utils.faults import KILL_ENV, crash_point  # noqa: F401
from searchr1.utils.manifest import (MANIFEST_FILE, files_under, manifest_problem, read_manifest,
                                     write_manifest)

log = logging.getLogger(__name__)

CRITIC_FILE = "critic.pt"  # advantage=ppo_gae: the local critic (adapters, head, optimizer)
TMP_SUFFIX = ".tmp"
EXIT_CHECKPOINT_WRITE = 5  # main.py's exit code when a checkpoint could not be written
ENGINE_ROOT = "checkpoints/engine"  # where the local engine saves, inside the run dir


@dataclass(frozen=True)
class TrainerState:
    """Everything the loop needs to continue after ``step`` completed steps."""

    step: int  # completed steps
    cursor: int  # next data-stream position
    engine_state: str  # path/URI from TrainingClient.save_state (relative to the run dir on disk)
    sampler_weights: str  # path/URI from save_weights_for_sampler (likewise)
    optimizer_steps: int = 0  # optimizer steps taken (drives the LR schedule)
    # run totals so far, restored on resume so the summary and the cumulative search/* rows
    # of a resumed run equal an uninterrupted one: {"trainer": Trainer.totals,
    # "search": StepRunner.search_totals as a dict}; empty in checkpoints written before them
    totals: dict = field(default_factory=dict)
    # model.tuning=full: the number of processes that wrote the engine state (one shard each
    # under torchrun, the whole copy for 1); a resume needs as many. 0: any (LoRA adapters are
    # replicated); checkpoints written before this field are told by their shard files
    processes: int = 0


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (the previous one is intact)."""

    exit_code = EXIT_CHECKPOINT_WRITE

    def __init__(self, step: int, err: OSError) -> None:
        super().__init__(err.errno, str(err))
        self.step, self.cause = step, err

    @property
    def reason(self) -> str:
        return f"checkpoint of step {self.step} could not be written: {self.cause}"


class NoCompleteCheckpoint(StartupError):
    """``trainer.resume=auto`` found checkpoints, none of them complete."""


class OtherProcessCount(StartupError):
    """The checkpoint's sharded state was written by another number of processes."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def _relative(path: str, run_dir: Path) -> str:
    """``path`` relative to the run dir when it lies inside it (URIs and outside paths as is)."""
    if "://" in path:
        return path
    try:
        return Path(path).resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:
        return path


def _absolute(path: str, run_dir: Path) -> str:
    """Inverse of ``_relative``; an absolute path into another run dir's engine folder (a
    checkpoint written before relative paths, then copied) is mapped into this run dir."""
    if "://" in path:
        return path
    p = Path(path)
    if not p.is_absolute():
        return str(Path(run_dir) / p)
    tail = p.as_posix().rpartition(f"/{ENGINE_ROOT}/")[2]
    mine = Path(run_dir) / ENGINE_ROOT / tail
    return str(mine) if tail != p.as_posix() and mine.exists() else path


def _run_dir_of(folder: Path) -> Path:
    """The run dir of a ``<run_dir>/checkpoints/step_<N>`` folder."""
    return Path(folder).resolve().parent.parent


def read_state(path: Path) -> TrainerState:
    """The state in a checkpoint folder (or its ``trainer_state.json``), paths made absolute."""
    path = Path(path)
    if path.is_dir():
        path = path / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(f"no trainer checkpoint at {path}")
    state = TrainerState(**json.loads(path.read_text(encoding="utf-8")))
    run_dir = _run_dir_of(path.parent)
    return replace(state, engine_state=_absolute(state.engine_state, run_dir),
                   sampler_weights=_absolute(state.sampler_weights, run_dir))


def _folder_step(folder: Path) -> int | None:
    """N of a ``step_<N>`` folder (None for another name)."""
    head, _, number = Path(folder).name.partition("_")
    return int(number) if head == "step" and number.isdigit() else None


def _identity_problem(folder: Path) -> str | None:
    """Why ``folder``'s manifest vouches for another folder (one copied or renamed)."""
    record = read_manifest(folder / MANIFEST_FILE) or {}
    mine = f"checkpoints/{folder.name}"
    written = record.get("folder")
    if written is None:  # written before manifests named their folder: by the files listed
        listed = {name.rpartition("/")[0] for name in record.get("files", {})
                  if name.startswith("checkpoints/step_") and name.endswith("/" + STATE_FILE)}
        written = next(iter(listed), mine) if mine not in listed else mine
    if written != mine:
        return (f"its {MANIFEST_FILE} was written for {written}, not {mine} (a checkpoint "
                f"folder copied or renamed to another step)")
    return None


def checkpoint_problem(folder: Path) -> str | None:
    """Why the checkpoint in ``folder`` cannot be resumed from (None when it is complete):
    its manifest must be its own (written for this folder and step) and every file it lists
    must match it, and ``trainer_state.json`` must hold the folder's step."""
    folder = Path(folder)
    if (folder / MANIFEST_FILE).exists():
        problem = (_identity_problem(folder)
                   or manifest_problem(folder / MANIFEST_FILE, _run_dir_of(folder)))
        if problem:
            return problem
    try:
        state = read_state(folder)
    except (OSError, ValueError, TypeError) as err:
        return f"{STATE_FILE} is unreadable ({type(err).__name__})"
    step = _folder_step(folder)
    if step is not None and state.step != step:
        return f"its {STATE_FILE} holds step {state.step}, not {step}"
    for path in (state.engine_state, state.sampler_weights):
        if "://" not in path and not Path(path).exists():
            return f"{path} is missing"
    return None


def scan_checkpoints(run_dir: Path) -> tuple[TrainerState | None, list[str]]:
    """The newest complete checkpoint (or None) and a line per newer one skipped."""
    root = Path(run_dir) / "checkpoints"
    folders = sorted(root.glob("step_*"), reverse=True) if root.is_dir() else []
    skipped: list[str] = []
    for folder in (f for f in folders if f.is_dir()):
        problem = checkpoint_problem(folder)
        if problem is None:
            return read_state(folder), skipped
        skipped.append(f"{folder.name}: {problem}")
    return None, skipped


def newest_state(run_dir: Path) -> TrainerState | None:
    """The complete checkpoint with the highest step in ``run_dir``, or None."""
    return scan_checkpoints(run_dir)[0]


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


def estimate_checkpoint_bytes(client) -> int:
    """A first checkpoint's size before it exists: 4 bytes-per-weight copies of the trainable
    parameters (the state's adapters, AdamW's two moments, the sampler's adapters).

    A remote engine (not ``capabilities.in_process``) writes nothing here: 0.
    """
    if not client.capabilities.in_process:
        return 0
    return 4 * sum(p.numel() * p.element_size() for p in client.model.parameters() if p.requires_grad)


def _manifest_entries(run_dir: Path, final: Path, tmp: Path, *engine_paths: str) -> dict[str, Path]:
    """name (relative to the run dir, as after the rename) → file, for every checkpoint file."""
    entries = {f"checkpoints/{final.name}/{f.name}": f for f in files_under([tmp])}
    for path in engine_paths:
        rel = _relative(path, run_dir)
        if "://" not in path and not Path(rel).is_absolute():
            entries.update({f"{rel}/{f.relative_to(path).as_posix()}": f
                            for f in files_under([Path(path)])})
    return entries


def save_checkpoint(run_dir: Path, client, step: int, cursor: int, optimizer_steps: int,
                    critic=None, totals: dict | None = None, processes: int = 0) -> Path:
    """Engine state, sampler weights, then the loop folder (renamed into place last).

    Any earlier save of ``step`` (a crashed attempt, or a step redone after a resume) is
    replaced; returns the checkpoint folder. Raises ``CheckpointWriteError`` when a write
    fails (disk full, or refused by the free-space check), leaving earlier checkpoints intact.
    """
    run_dir = Path(run_dir)
    clean_orphans(run_dir)
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f".{final.name}{TMP_SUFFIX}")
    try:
        previous = newest_state(run_dir)
        need = checkpoint_size(run_dir, previous) if previous else estimate_checkpoint_bytes(client)
        ensure_free_space(run_dir / "checkpoints", need)
        return _write(run_dir, client, step, cursor, optimizer_steps, critic, totals, final, tmp,
                      processes)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(step, err) from err


def engine_state_name(step: int) -> str:
    """The name the loop saves a step's engine state and sampler weights under."""
    return f"step_{step:06d}"


def _write(run_dir, client, step, cursor, optimizer_steps, critic, totals, final, tmp,
           processes) -> Path:
    name = engine_state_name(step)
    engine_state = client.save_state(name, overwrite=True).result().path
    crash_point("after_engine_state", step)
    sampler = client.save_weights_for_sampler(name).result().path
    crash_point("after_sampler", step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if critic is not None:
        critic.save(tmp / CRITIC_FILE)
    crash_point("loop_mid_write", step)
    state = TrainerState(step, cursor, _relative(engine_state, run_dir),
                         _relative(sampler, run_dir), optimizer_steps, dict(totals or {}), processes)
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    entries = _manifest_entries(run_dir, final, tmp, engine_state, sampler)
    write_manifest(tmp / MANIFEST_FILE, entries, {"folder": f"checkpoints/{final.name}", "step": step})
    crash_point("before_loop_state", step)
    trash = final.with_name(f".{final.name}.old")
    if final.exists():  # an earlier save of this step, now redone: set it aside atomically
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(final, trash)
    os.replace(tmp, final)
    shutil.rmtree(trash, ignore_errors=True)
    return final


def writer_processes(state: TrainerState) -> int:
    """How many processes a resume of ``state`` needs (0: any number)."""
    if state.processes or "://" in state.engine_state:
        return state.processes
    return len(list(Path(state.engine_state).glob("rank_*.pt")))  # engines/local/sharding/dcp.py's files


def _refuse_other_world(state: TrainerState, run_dir: Path, world: int | None) -> TrainerState:
    """``state``, or exit 2 (before the model loads) when it needs another process count."""
    need = writer_processes(state)
    if world is None or not need or need == world:
        return state
    how = ("`python -m searchr1.main …` (one process)" if need == 1 else
           f"`torchrun --nproc-per-node {need} -m searchr1.main …`")
    exit_with(f"searchr1: {checkpoint_dir(run_dir, state.step)} was written by {need} "
              f"process{'es' if need > 1 else ''} and this job has {world}: under "
              f"model.tuning=full its weights and optimizer state are kept as one shard per "
              f"process, so it resumes only on {need}. Resume with {how}, or start a new run "
              f"in another hydra.run.dir.", OtherProcessCount)


def resolve_resume(resume: str, run_dir: Path, world: int | None = None) -> TrainerState | None:
    """``never`` → None; ``auto`` → newest complete in run_dir (None if none); else a path.

    Exits 2 (``NoCompleteCheckpoint``) when checkpoints exist and none is complete, and
    (``OtherProcessCount``) when ``world`` processes cannot resume the one found.
    """
    if resume == "never":
        return None
    if resume != "auto":
        problem = checkpoint_problem(Path(resume))
        if problem:
            exit_with(f"searchr1: trainer.resume={resume} cannot be resumed from: {problem}. "
                      f"Pick another checkpoints/step_N folder.", NoCompleteCheckpoint)
        return _refuse_other_world(read_state(Path(resume)), _run_dir_of(Path(resume)), world)
    clean_orphans(run_dir)
    state, skipped = scan_checkpoints(run_dir)
    if skipped and state is None:
        exit_with(
            f"searchr1: run directory {run_dir} holds checkpoints but none is complete "
            f"({'; '.join(skipped)}), so trainer.resume=auto has nothing to continue from. "
            f"Restore the files from a copy, or start a new run in another hydra.run.dir.",
            NoCompleteCheckpoint)
    if skipped:
        log.warning("resuming from %s; skipped newer incomplete checkpoint(s): %s",
                    checkpoint_dir(run_dir, state.step).name, "; ".join(skipped))
    return state if state is None else _refuse_other_world(state, run_dir, world)
