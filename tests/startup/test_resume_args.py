"""A resume re-composes the run's saved overrides and leaves its ``.hydra/`` files alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from searchr1.startup.resume_args import resume_argv

ROOT = Path(__file__).resolve().parents[2]
SAVED = ["experiment=smoke", "rollout.group_size=2", "trainer.resume=never"]


@pytest.fixture
def run(tmp_path) -> Path:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra/overrides.yaml").write_text(yaml.safe_dump(SAVED))
    return tmp_path


def test_a_resume_takes_the_runs_overrides_and_writes_no_hydra_files(run):
    argv = ["trainer.resume=auto", f"hydra.run.dir={run}", "--cfg", "job"]
    assert resume_argv(argv) == ["experiment=smoke", "rollout.group_size=2",
                                 "hydra.output_subdir=null", *argv]
    same = [*argv, "rollout.group_size=2"]  # the printed resume command repeats them: accepted
    assert resume_argv(same)[:2] == ["experiment=smoke", "rollout.group_size=2"]


def test_a_resume_with_another_config_is_refused_naming_the_keys(run, capsys):
    with pytest.raises(SystemExit) as err:
        resume_argv(["trainer.resume=auto", f"hydra.run.dir={run}", "rollout.group_size=5",
                     "loss=dro"])
    assert err.value.code == 2
    text = capsys.readouterr().err.strip()
    assert "rollout.group_size: the run has rollout.group_size=2, this command gives " \
           "rollout.group_size=5" in text
    assert "loss: the run has (not set)" in text and "\n" not in text


def test_other_command_lines_are_left_alone(run, tmp_path):
    for argv in (["trainer.resume=never", f"hydra.run.dir={run}"],  # not a resume
                 ["trainer.resume=auto", f"hydra.run.dir={tmp_path / 'new'}"],  # nothing saved
                 ["-m", "trainer.resume=auto", f"hydra.run.dir={run}"],  # a sweep
                 ["trainer.resume=auto"]):  # no run dir named
        assert resume_argv(argv) == argv


def test_main_resume_composes_the_runs_config(run):
    cmd = [sys.executable, "-m", "searchr1.main", "trainer.resume=auto", f"hydra.run.dir={run}",
           "--cfg", "job"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert yaml.safe_load(out.stdout)["rollout"]["group_size"] == 2  # not the default's
    assert yaml.safe_load((run / ".hydra/overrides.yaml").read_text()) == SAVED
