"""Checkpoints that move, rot or cannot be written, and runs stopped by a signal.

Relocation (relative paths), verification against the manifest (fall back to the newest
complete checkpoint, or exit 2 before the model loads), a full disk at any write (exit 5,
previous checkpoint intact, the first checkpoint's size estimated), SIGTERM / SIGINT (a
checkpoint, then ``Stopped``) and the refusal of a fresh start over an unfinished run.
"""

from __future__ import annotations

from types import SimpleNamespace
import errno
import json
import logging
import shutil
import signal
from pathlib import Path

import pytest
import torch

import searchr1.loop.checkpoint as ck
from searchr1.engines.base import EngineCapabilities
from searchr1.loop.stop import Stopped, StopSignals
from searchr1.startup.rundir import run_dir_problems
from searchr1.utils import faults
from tests.loop.test_checkpoint import FakeClient, orphans, sha
from tests.loop.test_trainer import lora_state, make_cfg, run_trainer

ENGINE = "checkpoints/engine"


def saved(run_dir: Path, steps: int, client=None) -> FakeClient:
    client = client or FakeClient(run_dir / ENGINE)
    for step in range(1, steps + 1):
        ck.save_checkpoint(run_dir, client, step, 2 * step, step)
    return client


# ----- relocatable -----------------------------------------------------------------------------


def test_a_copied_run_dir_resumes_from_its_own_files(tmp_path):
    saved(tmp_path / "a", 1)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    state = ck.resolve_resume("auto", tmp_path / "b")
    assert state.engine_state == str((tmp_path / "b" / ENGINE / "state/step_000001").resolve())
    assert state.sampler_weights == str((tmp_path / "b" / ENGINE / "sampler/step_000001").resolve())
    # a checkpoint written with absolute paths (before relative ones), copied: mapped into the copy
    legacy = tmp_path / "c"
    shutil.copytree(tmp_path / "a", legacy)
    folder = ck.checkpoint_dir(legacy, 1)
    (folder / "manifest.json").unlink()
    (folder / ck.STATE_FILE).write_text(json.dumps({
        "step": 1, "cursor": 2, "engine_state": str(tmp_path / "a" / ENGINE / "state/step_000001"),
        "sampler_weights": str(tmp_path / "a" / ENGINE / "sampler/step_000001")}))
    assert ck.resolve_resume("auto", legacy).engine_state.startswith(str(legacy.resolve()))


def test_a_run_dir_moved_after_one_step_resumes_equal_to_an_uninterrupted_run(tiny_model_dir, tmp_path):
    _, _, full = run_trainer(make_cfg(tiny_model_dir, steps=2, save_every=1), tmp_path / "full")
    run_trainer(make_cfg(tiny_model_dir, steps=1, save_every=1), tmp_path / "orig")
    shutil.copytree(tmp_path / "orig", tmp_path / "moved")
    shutil.rmtree(tmp_path / "orig")
    _, tracker, moved = run_trainer(make_cfg(tiny_model_dir, steps=2, save_every=1, resume="auto"),
                                    tmp_path / "moved")
    assert [s for s, m in tracker.rows if "reward/mean" in m] == [2]  # resumed, not restarted
    a, b = lora_state(full), lora_state(moved)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0
    assert not (tmp_path / "orig").exists()  # nothing written to (or read from) the original


# ----- verified against the manifest ----------------------------------------------------------


@pytest.mark.parametrize("spoil", ["garbage_state", "truncated_engine_state", "missing_sampler"])
def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, caplog, spoil):
    saved(tmp_path, 3)
    engine = tmp_path / ENGINE
    target = {"garbage_state": ck.checkpoint_dir(tmp_path, 3) / ck.STATE_FILE,
              "truncated_engine_state": engine / "state/step_000003/w.bin",
              "missing_sampler": engine / "sampler/step_000003/w.bin"}[spoil]
    if spoil == "garbage_state":
        target.write_text("{not json")
    elif spoil == "missing_sampler":
        target.unlink()
    else:
        target.write_bytes(target.read_bytes()[:10])
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
        state = ck.resolve_resume("auto", tmp_path)
    assert state.step == 2
    [record] = [r.getMessage() for r in caplog.records]
    assert "step_000003" in record and target.name in record and "step_000002" in record


def test_a_flipped_byte_of_the_same_size_is_caught_by_the_hash(tmp_path):
    saved(tmp_path, 2)
    path = tmp_path / ENGINE / "state/step_000002/w.bin"
    path.write_bytes(b"y" + path.read_bytes()[1:])
    assert "sha256" in ck.checkpoint_problem(ck.checkpoint_dir(tmp_path, 2))
    assert ck.checkpoint_problem(ck.checkpoint_dir(tmp_path, 1)) is None


def test_no_complete_checkpoint_exits_2_before_the_model_loads(tmp_path, monkeypatch, capsys,
                                                               tiny_model_dir):
    import searchr1.build
    from searchr1.main import run

    saved(tmp_path, 2)
    for step in (1, 2):
        (ck.checkpoint_dir(tmp_path, step) / ck.STATE_FILE).write_text("garbage")
    monkeypatch.setattr(searchr1.build, "build_app_or_exit",
                        lambda *a: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as err:
        run(make_cfg(tiny_model_dir, resume="auto"), tmp_path, None)
    assert err.value.code == 2
    text = capsys.readouterr().err.strip()
    assert "none is complete" in text and "step_000001" in text and "step_000002" in text
    assert "\n" not in text  # one paragraph


# ----- a full disk -----------------------------------------------------------------------------


@pytest.mark.parametrize("point", ["engine_mid_write", "after_engine_state", "after_sampler",
                                   "loop_mid_write", "before_loop_state"])
def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch, point):
    client = saved(tmp_path, 1)
    before = {p: sha(p) for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    monkeypatch.setenv(faults.FAIL_ENV, f"{point}@2")
    with pytest.raises(ck.CheckpointWriteError) as err:
        ck.save_checkpoint(tmp_path, client, 2, 4, 2)
    assert err.value.errno == errno.ENOSPC and err.value.step == 2
    assert ck.resolve_resume("auto", tmp_path).step == 1
    assert not ck.checkpoint_dir(tmp_path, 2).exists() and orphans(tmp_path) == []
    assert all(sha(p) == h for p, h in before.items())  # step 1 untouched
    monkeypatch.delenv(faults.FAIL_ENV)
    ck.save_checkpoint(tmp_path, client, 2, 4, 2)  # room again: the step is saved
    assert ck.newest_state(tmp_path).step == 2


def test_the_first_checkpoint_is_refused_from_an_estimate_before_any_write(tmp_path, monkeypatch):
    import searchr1.startup.rundir as rundir

    client = FakeClient(tmp_path / ENGINE)
    client.capabilities = EngineCapabilities(in_process=True)  # the local engine: its model is here
    client.model = torch.nn.Linear(3, 2)  # 6 + 2 trainable fp32 weights
    client.model.bias.requires_grad_(False)  # frozen: not saved, no optimizer state
    assert ck.estimate_checkpoint_bytes(client) == 4 * 6 * 4  # 4 copies × 6 weights × 4 bytes
    real = rundir.shutil.disk_usage
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda p: real(p)._replace(free=100))
    with pytest.raises(ck.CheckpointWriteError, match="not enough disk space"):
        ck.save_checkpoint(tmp_path, client, 1, 2, 1)
    assert client.calls == [] and not (tmp_path / "checkpoints/step_000001").exists()
    assert ck.estimate_checkpoint_bytes(SimpleNamespace(capabilities=EngineCapabilities())) == 0  # remote: nothing here


def test_the_stop_report_records_the_reason_and_the_run_dir_then_needs_a_resume(tmp_path, capsys):
    from searchr1.main import EXIT_CODES, report_stop, resume_command

    saved(tmp_path, 1)
    err = ck.CheckpointWriteError(2, OSError(errno.ENOSPC, "No space left on device"))
    text = report_stop(err, tmp_path, ["trainer.steps=9"])
    assert EXIT_CODES[type(err)] == ck.EXIT_CHECKPOINT_WRITE == 5
    assert "checkpoint of step 2 could not be written" in text and "\n" not in text
    assert resume_command(tmp_path, ["trainer.steps=9"]) in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "No space left" in summary["stopped_reason"]
    [msg] = run_dir_problems(tmp_path, "never")
    assert "unfinished run" in msg and "trainer.resume=auto" in msg and "No space left" in msg
    assert run_dir_problems(tmp_path, "auto") == []


def test_a_killed_run_dir_refuses_a_fresh_start(tmp_path):
    assert run_dir_problems(tmp_path, "never") == []
    saved(tmp_path, 1)  # a checkpoint, no summary: killed
    [msg] = run_dir_problems(tmp_path, "never")
    assert "unfinished run" in msg and f"trainer.resume=auto hydra.run.dir={tmp_path}" in msg
    assert run_dir_problems(tmp_path, "auto") == []


# ----- stop signals ----------------------------------------------------------------------------


def test_sigterm_mid_step_finishes_the_step_checkpoints_and_stops(tiny_model_dir, tmp_path, monkeypatch):
    original = signal.getsignal(signal.SIGTERM)
    monkeypatch.setenv(faults.KILL_ENV, "mid_rollout@2")
    monkeypatch.setenv(faults.KILL_SIGNAL_ENV, "TERM")
    with pytest.raises(Stopped) as err:
        run_trainer(make_cfg(tiny_model_dir, steps=3, save_every=0), tmp_path)
    assert (err.value.step, err.value.reason) == (2, "stopped by SIGTERM")
    assert err.value.summary["steps"] == 2.0
    assert ck.newest_state(tmp_path).step == 2  # saved although save_every=0
    assert signal.getsignal(signal.SIGTERM) is original  # handlers restored


def test_a_second_signal_stops_at_once(monkeypatch):
    sent = []
    monkeypatch.setattr("searchr1.loop.stop.os.kill", lambda pid, sig: sent.append(sig))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest run as a background job ignores it
    with StopSignals() as stop:
        stop._handle(signal.SIGINT, None)
        assert stop.requested == "SIGINT" and sent == []
        stop._handle(signal.SIGINT, None)
        assert sent == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_hook_acts_once_per_process_though_its_point_is_reached_again(monkeypatch):
    """The engine state and the sampler weights both pass ``engine_mid_write``: one signal."""
    sent = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: sent.append(sig))
    monkeypatch.setenv(faults.KILL_ENV, "engine_mid_write@2")
    monkeypatch.setenv(faults.KILL_SIGNAL_ENV, "TERM")
    for step in (1, 2, 2):
        faults.crash_point("engine_mid_write", step)
    assert sent == [signal.SIGTERM]
    monkeypatch.setenv(faults.FAIL_ENV, "after_sampler")
    with pytest.raises(OSError, match="No space left"):
        faults.crash_point("after_sampler", 1)
    faults.crash_point("after_sampler", 2)  # spent


# ----- a checkpoint folder is its own step ------------------------------------------------------


@pytest.mark.parametrize("how", ["copied", "renamed"])
def test_a_checkpoint_folder_copied_or_renamed_to_another_step_is_refused(tmp_path, caplog, how):
    saved(tmp_path, 3)
    src, dst = ck.checkpoint_dir(tmp_path, 2 if how == "copied" else 3), ck.checkpoint_dir(tmp_path, 4)
    (shutil.copytree if how == "copied" else shutil.move)(src, dst)
    problem = ck.checkpoint_problem(dst)
    assert f"written for checkpoints/{src.name}, not checkpoints/step_000004" in problem
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
        state = ck.resolve_resume("auto", tmp_path)
    assert state.step == (3 if how == "copied" else 2)  # the newest checkpoint that is its own
    assert "step_000004" in caplog.text and "copied or renamed" in caplog.text


def test_a_trainer_state_of_another_step_is_refused_without_a_manifest_too(tmp_path):
    saved(tmp_path, 2)
    folder = ck.checkpoint_dir(tmp_path, 2)
    (folder / "manifest.json").unlink()  # a checkpoint written before manifests
    state = json.loads((folder / ck.STATE_FILE).read_text())
    (folder / ck.STATE_FILE).write_text(json.dumps({**state, "step": 1}))
    assert ck.checkpoint_problem(folder) == f"its {ck.STATE_FILE} holds step 1, not 2"
    assert ck.resolve_resume("auto", tmp_path).step == 1


def test_a_manifest_written_before_it_named_its_folder_is_tied_by_its_files(tmp_path):
    saved(tmp_path, 2)
    for step in (1, 2):  # as older versions wrote it: the file list alone
        path = ck.checkpoint_dir(tmp_path, step) / "manifest.json"
        path.write_text(json.dumps({"files": json.loads(path.read_text())["files"]}))
    assert ck.checkpoint_problem(ck.checkpoint_dir(tmp_path, 2)) is None
    shutil.copytree(ck.checkpoint_dir(tmp_path, 1), ck.checkpoint_dir(tmp_path, 3))
    assert "written for checkpoints/step_000001" in ck.checkpoint_problem(ck.checkpoint_dir(tmp_path, 3))
    assert ck.resolve_resume("auto", tmp_path).step == 2


# ----- sharded state resumes on the process count that wrote it --------------------------------


def test_a_sharded_checkpoint_on_another_process_count_exits_2_naming_both(tmp_path, capsys):
    client = FakeClient(tmp_path / ENGINE)
    ck.save_checkpoint(tmp_path, client, 1, 2, 1, processes=2)
    assert ck.resolve_resume("auto", tmp_path, world=2).step == 1
    for world in (1, 3):
        with pytest.raises(SystemExit) as err:
            ck.resolve_resume("auto", tmp_path, world=world)
        assert err.value.code == 2
        text = capsys.readouterr().err.strip()
        assert f"step_000001 was written by 2 processes and this job has {world}" in text
        assert "torchrun --nproc-per-node 2" in text and "\n" not in text
    with pytest.raises(SystemExit):  # a checkpoint path too
        ck.resolve_resume(str(ck.checkpoint_dir(tmp_path, 1)), tmp_path, world=1)
    ck.save_checkpoint(tmp_path, client, 2, 4, 2)  # replicated (LoRA): any count
    assert ck.resolve_resume("auto", tmp_path, world=3).step == 2


def test_a_sharded_checkpoint_written_before_the_count_was_recorded_is_told_by_its_files(tmp_path):
    saved(tmp_path, 1)
    for rank in range(2):  # distributed/dcp.py's per-rank files in the engine state
        (tmp_path / ENGINE / "state/step_000001" / f"rank_{rank}.pt").write_bytes(b"x")
    folder = ck.checkpoint_dir(tmp_path, 1)
    (folder / "manifest.json").unlink()
    assert ck.writer_processes(ck.read_state(folder)) == 2
    with pytest.raises(SystemExit):
        ck.resolve_resume("auto", tmp_path, world=1)
