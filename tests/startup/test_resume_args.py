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


@pytest.mark.parametrize("content, where, why", [
    (b"- experiment=smoke\n- rollout.group_size=2\n  broken: [\n", ":3 ", "is not valid YAML"),
    (b"- experiment=smoke\n- data.train_path=caf\xe9.jsonl\n", ":2 ", "byte 40"),
    (b"experiment: smoke\n", " ", "is not a list of overrides"),
])
def test_corrupt_saved_overrides_exit_2_naming_the_file_and_line(run, capsys, content, where, why):
    path = run / ".hydra/overrides.yaml"
    path.write_bytes(content)
    with pytest.raises(SystemExit) as err:
        resume_argv(["trainer.resume=auto", f"hydra.run.dir={run}"])
    assert err.value.code == 2
    text = capsys.readouterr().err.strip()
    assert f"{path}{where}" in text and why in text and "\n" not in text


def test_main_resume_with_corrupt_overrides_is_one_paragraph(run):
    (run / ".hydra/overrides.yaml").write_bytes(b"- experiment=smoke\n- 'unterminated\n")
    cmd = [sys.executable, "-m", "searchr1.main", "trainer.resume=auto", f"hydra.run.dir={run}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"{run}/.hydra/overrides.yaml:3 is not valid YAML" in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0
