"""Crash-safe checkpoints: temp name + rename, loop state last, idempotent resume, disk space.

Crashes here are exceptions raised at the save's crash points (fast, in-process); real
SIGKILLs of a training process at every point are in tests/loop/test_sigkill.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import searchr1.loop.checkpoint as ck
from searchr1.startup.rundir import DiskSpaceError
from searchr1.engines.base import EngineCapabilities
from tests.loop.test_trainer import make_cfg, run_trainer, train_rows


class Crash(RuntimeError):
    """Stands in for a kill at a point of the save sequence."""


def crash_at(monkeypatch, point: str, step: int) -> None:
    """Make ``crash_point(point)`` raise during the save of ``step`` (save_every=1)."""
    seen = {"n": 0}

    def hook(name: str, step_: int | None = None) -> None:
        if name == point:
            seen["n"] += 1
            if seen["n"] == step:
                raise Crash(f"killed at {point} of step {step}")

    monkeypatch.setattr(ck, "crash_point", hook)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outcome(run_dir: Path, step: int) -> dict:
    """Loop state (run dir stripped from paths) and adapter hashes of checkpoint ``step``."""
    state = json.loads((ck.checkpoint_dir(run_dir, step) / ck.STATE_FILE).read_text())
    state = {k: v.replace(str(run_dir), "<run>") if isinstance(v, str) else v
             for k, v in state.items()}
    state["totals"].get("trainer", {}).pop("wall_seconds", None)  # wall time: differs between equal runs
    eng = run_dir / "checkpoints/engine"
    return {"state": state,
            "engine": sha(eng / f"state/step_{step:06d}/adapter_model.safetensors"),
            "sampler": sha(eng / f"sampler/step_{step:06d}/adapter_model.safetensors")}


def orphans(run_dir: Path) -> list[str]:
    root = run_dir / "checkpoints"
    return sorted(str(p.relative_to(root)) for p in root.rglob(".step_*"))


# ----- save_checkpoint with a fake engine client: ordering, orphans, disk space -------------


class FakeClient:
    """Writes ``nbytes`` per save like the local engine (atomic dirs, overwrite honoured)."""

    capabilities = EngineCapabilities()  # a remote-like engine: nothing in process

    def __init__(self, root: Path, nbytes: int = 1000) -> None:
        self.root, self.nbytes, self.calls = root, nbytes, []

    def _save(self, kind: str, name: str, overwrite: bool):
        from searchr1.engines.local.training.checkpoint import write_atomically

        self.calls.append((kind, name, overwrite))
        path = self.root / kind / name
        write_atomically(path, overwrite, lambda d: (d / "w.bin").write_bytes(b"x" * self.nbytes))
        return SimpleNamespace(result=lambda: SimpleNamespace(path=str(path)))

    def save_state(self, name, overwrite=False):
        return self._save("state", name, overwrite)

    def save_weights_for_sampler(self, name):
        return self._save("sampler", name, True)


def test_loop_state_is_renamed_into_place_last(tmp_path, monkeypatch):
    client = FakeClient(tmp_path / "checkpoints/engine")
    seen = []
    monkeypatch.setattr(ck, "crash_point", lambda name, step=None: seen.append(
        (name, step, ck.checkpoint_dir(tmp_path, 1).exists())))
    final = ck.save_checkpoint(tmp_path, client, 1, 2, 3)
    assert [n for n, _, _ in seen] == ["after_engine_state", "after_sampler", "loop_mid_write",
                                       "before_loop_state"]
    assert {s for _, s, _ in seen} == {1}  # each point knows the step it saves
    assert not any(exists for _, _, exists in seen)  # the step's folder appears only at the end
    assert ck.read_state(final) == ck.TrainerState(1, 2, str(tmp_path / "checkpoints/engine/state/step_000001"),
                                                   str(tmp_path / "checkpoints/engine/sampler/step_000001"), 3)
    on_disk = json.loads((final / ck.STATE_FILE).read_text())  # relative: the run dir can move
    assert (on_disk["engine_state"], on_disk["sampler_weights"]) == (
        "checkpoints/engine/state/step_000001", "checkpoints/engine/sampler/step_000001")
    assert orphans(tmp_path) == []


@pytest.mark.parametrize("point", ["after_engine_state", "after_sampler", "loop_mid_write",
                                   "before_loop_state"])
def test_a_crash_anywhere_in_the_save_leaves_the_previous_step_newest(tmp_path, monkeypatch, point):
    client = FakeClient(tmp_path / "checkpoints/engine")
    ck.save_checkpoint(tmp_path, client, 1, 2, 1)
    crash_at(monkeypatch, point, 1)
    with pytest.raises(Crash):
        ck.save_checkpoint(tmp_path, client, 2, 4, 2)
    assert ck.resolve_resume("auto", tmp_path).step == 1
    assert orphans(tmp_path) == []  # resume cleaned the temp folder a crash left
    monkeypatch.setattr(ck, "crash_point", lambda name, step=None: None)
    ck.save_checkpoint(tmp_path, client, 2, 4, 2)  # redoing the step overwrites, never raises
    assert ck.resolve_resume("auto", tmp_path).step == 2
    assert ("state", "step_000002", True) in client.calls


def test_orphan_temp_folders_are_cleaned(tmp_path):
    root = tmp_path / "checkpoints"
    for p in (root / ".step_000002.tmp", root / "engine/state/.step_000002.abc123",
              root / "engine/sampler/.step_000002.old.xyz/old"):
        p.mkdir(parents=True)
        (p / "junk").write_text("half")
    (root / "engine/state/step_000001").mkdir(parents=True)  # a complete one stays
    assert len(ck.clean_orphans(tmp_path)) == 3
    assert orphans(tmp_path) == [] and (root / "engine/state/step_000001").is_dir()


def test_free_disk_space_is_checked_from_the_previous_checkpoint(tmp_path, monkeypatch):
    import searchr1.startup.rundir as rundir

    client = FakeClient(tmp_path / "checkpoints/engine", nbytes=5000)
    ck.save_checkpoint(tmp_path, client, 1, 2, 1)  # no previous checkpoint: nothing to estimate
    prev = ck.newest_state(tmp_path)
    size = ck.checkpoint_size(tmp_path, prev)
    assert size >= 2 * 5000  # engine state + sampler weights (+ the loop state)
    real = rundir.shutil.disk_usage
    monkeypatch.setattr(rundir.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=size))  # less than size × 1.1
    with pytest.raises(ck.CheckpointWriteError, match="not enough disk space") as err:
        ck.save_checkpoint(tmp_path, client, 2, 4, 2)
    assert isinstance(err.value.cause, DiskSpaceError) and err.value.step == 2
    assert client.calls[-1][1] == "step_000001"  # refused before writing anything
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: real(p)._replace(free=2 * size))
    ck.save_checkpoint(tmp_path, client, 2, 4, 2)
    assert ck.newest_state(tmp_path).step == 2


# ----- the trainer on the tiny model: kill between engine save and loop state, resume ---------


def test_resume_after_a_kill_between_engine_save_and_loop_state_is_idempotent(
        tiny_model_dir, tmp_path, monkeypatch):
    cfg = lambda **kw: make_cfg(tiny_model_dir, steps=3, save_every=1, **kw)  # noqa: E731
    # once: killed after step 2's engine state was saved, then one resume
    crash_at(monkeypatch, "after_engine_state", 2)
    with pytest.raises(Crash):
        run_trainer(cfg(), tmp_path / "once")
    assert (tmp_path / "once/checkpoints/engine/state/step_000002").is_dir()
    assert not ck.checkpoint_dir(tmp_path / "once", 2).exists()
    monkeypatch.setattr(ck, "crash_point", lambda name, step=None: None)
    _, once_tr, _ = run_trainer(cfg(resume="auto"), tmp_path / "once")  # no FileExistsError
    assert [s for s, _ in train_rows(once_tr)] == [2, 3]

    # twice: the same kill, a resume killed again just before step 2's loop state, a resume
    crash_at(monkeypatch, "after_engine_state", 2)
    with pytest.raises(Crash):
        run_trainer(cfg(), tmp_path / "twice")
    crash_at(monkeypatch, "before_loop_state", 1)
    with pytest.raises(Crash):
        run_trainer(cfg(resume="auto"), tmp_path / "twice")
    assert orphans(tmp_path / "twice") == [".step_000002.tmp"]
    monkeypatch.setattr(ck, "crash_point", lambda name, step=None: None)
    _, twice_tr, _ = run_trainer(cfg(resume="auto"), tmp_path / "twice")
    assert [s for s, _ in train_rows(twice_tr)] == [2, 3]
    assert orphans(tmp_path / "twice") == []

    # a resume of a finished run is a no-op that still succeeds
    run_trainer(cfg(resume="auto"), tmp_path / "twice")
    assert outcome(tmp_path / "twice", 3) == outcome(tmp_path / "once", 3)
    assert outcome(tmp_path / "twice", 2) == outcome(tmp_path / "once", 2)
    for a, b in zip(train_rows(once_tr), train_rows(twice_tr)):
        assert a[1]["train/loss"] == b[1]["train/loss"]

