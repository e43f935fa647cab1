"""Stop signals honoured within a phase: a rollout or an eval is cut short (nothing of it kept,
the last completed step saved), an update is finished and its step saved.

In-process runs of the real trainer on a tiny model, each signalled for real (``os.kill`` of
this process by a ``SEARCHR1_KILL_AT`` hook while the phase's work is in flight); the same
phases through ``python -m searchr1.main``, with exit codes and times to exit, are in
tests/test_main_stop.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

import searchr1.loop.checkpoint as ck
from searchr1.loop.stop import Interrupted, Stopped, StopSignals
from searchr1.utils import faults
from tests.loop.test_trainer import lora_state, make_cfg, run_trainer, train_rows


def _signal_at(monkeypatch, spec: str) -> None:
    monkeypatch.setenv(faults.KILL_ENV, spec)
    monkeypatch.setenv(faults.KILL_SIGNAL_ENV, "TERM")


def _cfg(model_dir, **kw):
    cfg = make_cfg(model_dir, steps=3, save_every=0, **kw)
    cfg.engine.max_batch_size = 1  # equal runs stay byte-equal (see tests/loop/test_sigkill.py)
    return cfg


def test_a_signal_mid_rollout_saves_the_last_completed_step_and_a_resume_equals_no_stop(
        tiny_model_dir, tmp_path, monkeypatch):
    _, _, plain = run_trainer(_cfg(tiny_model_dir), tmp_path / "plain")
    original = signal.getsignal(signal.SIGTERM)
    _signal_at(monkeypatch, "in_rollout@2")
    with pytest.raises(Stopped) as err:
        run_trainer(_cfg(tiny_model_dir), tmp_path / "run")
    assert (err.value.step, err.value.reason) == (1, "stopped by SIGTERM during the rollout of step 2")
    assert ck.newest_state(tmp_path / "run").step == 1  # saved by the stop (save_every=0)
    assert not ck.checkpoint_dir(tmp_path / "run", 2).exists()
    assert signal.getsignal(signal.SIGTERM) is original
    monkeypatch.delenv(faults.KILL_ENV)
    _, resumed_rows, resumed = run_trainer(_cfg(tiny_model_dir, resume="auto"), tmp_path / "run")
    assert [s for s, _ in train_rows(resumed_rows)] == [2, 3]  # step 2 redone, none skipped
    a, b = lora_state(plain), lora_state(resumed)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) == 0.0


@pytest.mark.parametrize("spec, before, step, phase", [
    ("in_eval@0", True, 0, "the eval before training"),
    ("in_eval@3", False, 3, "the eval after step 3"),
])
def test_a_signal_mid_eval_discards_the_eval_and_stops(tiny_model_dir, tmp_path, monkeypatch,
                                                       spec, before, step, phase):
    _signal_at(monkeypatch, spec)
    cfg = _cfg(tiny_model_dir)
    cfg.eval.before_training = before
    with pytest.raises(Stopped) as err:
        run_trainer(cfg, tmp_path)
    assert (err.value.step, err.value.reason) == (step, f"stopped by SIGTERM during {phase}")
    state = ck.newest_state(tmp_path)
    assert (state.step if state else 0) == step  # the last step is saved; before it, nothing
    assert not (tmp_path / "eval" / f"step_{step:06d}").exists()  # the partial eval: no files


def test_a_signal_as_the_update_starts_finishes_the_step(tiny_model_dir, tmp_path, monkeypatch):
    _signal_at(monkeypatch, "in_update@2")
    with pytest.raises(Stopped) as err:
        run_trainer(_cfg(tiny_model_dir), tmp_path)
    assert (err.value.step, err.value.reason) == (2, "stopped by SIGTERM")
    assert ck.newest_state(tmp_path).step == 2


class _Ranks:
    """A stand-in ``DataParallel`` whose other rank was signalled."""

    def __init__(self, other: bool) -> None:
        self.other, self.asked = other, 0

    def any(self, flag: bool) -> bool:
        self.asked += 1
        return flag or self.other


def test_cut_short_agrees_across_ranks_and_leaves_other_cancellations_alone():
    async def work(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    async def scenario():
        stop = StopSignals()
        assert await stop.cut_short(work(0)) == "done"
        ranks = _Ranks(other=True)
        with pytest.raises(Interrupted, match="a stop signal on another rank"):
            await stop.cut_short(work(0), ranks)  # this rank finished; the other was stopped
        assert ranks.asked == 1
        outer = asyncio.ensure_future(stop.cut_short(work(10)))
        await asyncio.sleep(0)
        outer.cancel()  # cancelled by its caller, not by a signal: stays a cancellation
        with pytest.raises(asyncio.CancelledError):
            await outer
        stop.requested = "SIGTERM"  # a signal before the phase starts: it never runs
        with pytest.raises(Interrupted, match="SIGTERM"):
            await stop.cut_short(work(10))

    asyncio.run(scenario())


def test_overlapped_rollouts_a_signal_during_an_update_saves_that_step(tiny_model_dir, tmp_path,
                                                                      monkeypatch, caplog):
    """``trainer.max_staleness=1``: step 3's rollout, launched while step 2 trains, is cut
    short; step 2's update finishes and is saved; the rollout left behind raises nothing."""
    _signal_at(monkeypatch, "in_rollout@3")
    with pytest.raises(Stopped) as err:
        run_trainer(_cfg(tiny_model_dir, max_staleness=1), tmp_path)
    assert (err.value.step, err.value.reason) == (2, "stopped by SIGTERM")
    assert ck.newest_state(tmp_path).step == 2
    assert "never retrieved" not in caplog.text
