"""SIGTERM under torchrun: every rank stops at the same boundary, with one checkpoint; a
checkpoint of sharded (full fine-tuning) state resumes only on the number of processes that
wrote it, refused before the model loads on another.

Real 2-rank gloo jobs (``tests/helpers/dist_run.py``); the signal reaches one rank only (the
``SEARCHR1_KILL_AT`` hook on ``KILL_RANK``), the hardest case: torchrun forwards a SIGTERM to
every rank, but not at the same instant, so a rank must never go on alone.
"""

from __future__ import annotations

import json

import pytest

import searchr1.loop.checkpoint as ck
from tests.helpers.dist_run import join_whole_job, make_cfg, rows, start_job

WORLD = 2


def _job(model_dir, root, algo: str, env: dict | None = None, **trainer) -> list[int | None]:
    procs = start_job(WORLD, model_dir, root / "run", root / "out", algo, 4, env=env, steps=3,
                      save_every=0, resume="auto", **trainer)
    return join_whole_job(procs, timeout=300)


def _term_rank_1(point: str) -> dict:
    return {"SEARCHR1_KILL_AT": point, "SEARCHR1_KILL_SIGNAL": "TERM", "KILL_RANK": "1",
            "DIST_TIMEOUT": "60"}


def _stopped(root, rank: int) -> dict:
    return json.loads((root / "out" / f"stopped_{rank}.json").read_text())


def test_sigterm_to_one_rank_as_its_step_ends_stops_both_after_that_step(tiny_model_dir, tmp_path):
    codes = _job(tiny_model_dir, tmp_path, "grpo", _term_rank_1("mid_rollout@2"))
    assert codes == [4, 4], codes  # both stopped cleanly: none went on alone, none hung
    assert _stopped(tmp_path, 0) == {"step": 2, "reason": "stopped by a stop signal on another rank"}
    assert _stopped(tmp_path, 1) == {"step": 2, "reason": "stopped by SIGTERM"}
    assert ck.newest_state(tmp_path / "run").step == 2  # saved though save_every=0
    assert [r["step"] for r in rows(tmp_path) if "reward/mean" in r] == [1, 2]


def test_sigterm_to_one_rank_mid_rollout_then_resume_on_another_count_is_refused(
        tiny_model_dir, tmp_path, monkeypatch, capsys):
    import searchr1.build
    from searchr1.distributed.context import SINGLE
    from searchr1.main import run

    codes = _job(tiny_model_dir, tmp_path, "grpo_full", _term_rank_1("in_rollout@2"))
    assert codes == [4, 4], codes
    want = {"step": 1, "reason": "stopped by a stop signal on another rank during the rollout of step 2"}
    assert _stopped(tmp_path, 0) == want  # rank 0 was not signalled: it agreed with rank 1
    assert _stopped(tmp_path, 1) == {**want, "reason": "stopped by SIGTERM during the rollout of step 2"}
    state = ck.newest_state(tmp_path / "run")
    assert (state.step, state.processes) == (1, WORLD)  # one checkpoint, both ranks' shards
    assert not ck.checkpoint_dir(tmp_path / "run", 2).exists()

    monkeypatch.setattr(searchr1.build, "build_app_or_exit", lambda *a: pytest.fail("the model loaded"))
    cfg = make_cfg(tiny_model_dir, "grpo_full", 4, steps=3, resume="auto")
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        run(cfg, tmp_path / "run", None, SINGLE)  # the same run dir, one process
    assert err.value.code == 2
    text = capsys.readouterr().err.strip()
    assert "step_000001 was written by 2 processes and this job has 1" in text
    assert "torchrun --nproc-per-node 2" in text and "\n" not in text

    monkeypatch.undo()
    assert _job(tiny_model_dir, tmp_path, "grpo_full") == [0, 0]  # the same count resumes
    assert [r["step"] for r in rows(tmp_path) if "reward/mean" in r] == [1, 2, 3]
