"""The paper-findings study's resume archives: an unfinished arm moves to another machine with
only its newest checkpoint, and resumes there from it."""

from __future__ import annotations

import random
import tarfile
from pathlib import Path

import pytest

from searchr1.loop.checkpoint import TrainerState, newest_state, write_state
from tests.helpers.scripts import load_script


def _carry_runs():
    return load_script("experiments/paper_findings/carry_runs.py")


def _arm(study: Path, name: str, steps=(10, 20), finished=False, payload=b"w" * 100) -> Path:
    run = study / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "trajectories.jsonl").write_text("{}\n")
    for step in steps:
        for kind in ("state", "sampler"):
            d = run / "checkpoints" / "engine" / kind / f"step_{step:06d}"
            d.mkdir(parents=True)
            (d / "weights.bin").write_bytes(payload)
        write_state(run, TrainerState(step=step, cursor=step, engine_state=f"checkpoints/engine/state/step_{step:06d}",
                                      sampler_weights=f"checkpoints/engine/sampler/step_{step:06d}"))
        ev = run / "eval" / f"step_{step:06d}"
        ev.mkdir(parents=True)
        (ev / "summary.json").write_text("{}")
        (ev / "trajectories.jsonl").write_text("{}\n")
    if finished:
        (run / "summary.json").write_text("{}")
    return run


def test_an_unfinished_arm_resumes_elsewhere_from_its_newest_checkpoint(tmp_path):
    carry = _carry_runs()
    study = tmp_path / "study"
    _arm(study, "grpo_s1", finished=True)
    _arm(study, "lab_s1")
    written = carry.carry(study, tmp_path / "out", max_bytes=2**20)
    assert [p.name for p in written] == ["resume_lab_s1.tgz"]  # the finished arm needs none
    with tarfile.open(written[0]) as tar:
        names = set(tar.getnames())
    assert "lab_s1/checkpoints/step_000020/trainer_state.json" in names
    assert "lab_s1/checkpoints/engine/state/step_000020/weights.bin" in names
    assert not any("step_000010" in n and "checkpoints" in n for n in names)  # older ones stay
    assert "lab_s1/eval/step_000010/summary.json" in names and "lab_s1/metrics.jsonl" in names
    assert not any(n.endswith("trajectories.jsonl") for n in names)
    other = tmp_path / "machine2"
    other.mkdir()
    with tarfile.open(written[0]) as tar:
        tar.extractall(other, filter="data")
    state = newest_state(other / "lab_s1")
    assert state is not None and state.step == 20
    assert Path(state.engine_state).resolve().is_relative_to(other.resolve())


def test_an_archive_over_the_limit_is_refused_and_removed(tmp_path):
    carry = _carry_runs()
    study = tmp_path / "study"
    _arm(study, "ppo_s1", payload=random.Random(0).randbytes(2**20))  # 1 MiB, incompressible
    with pytest.raises(SystemExit, match="over 0 MB"):
        carry.carry(study, tmp_path / "out", max_bytes=100_000)
    assert not list((tmp_path / "out").glob("*.tgz"))
