"""A config Hydra cannot compose exits 2 with Hydra's own message; a crash keeps exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.utils import run_and_report
from hydra.errors import ConfigCompositionException

from searchr1.config import register_configs
from searchr1.startup.config_errors import is_config_error, run_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("override", [
    "retriever.topkk=3",  # a misspelt key
    "retriever=nope",  # an unknown option of a group
    "nosuchgroup=x",  # an unknown group
    "seed=[1",  # an override that does not parse
    "seed=abc",  # a value of the wrong type
    "+experiment=smoke,lab",  # a sweep given to a single composition
    "engine.sampler=paged",  # a closed choice (an enum of the schema) it does not have
    "model.tuning=qlora",
    "model.lora_compute=fp8",
    "engine.decode_attention=paged",
])
def test_hydra_composition_errors_are_config_errors(override):
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"), \
            pytest.raises(Exception) as raised:
        compose(config_name="config", overrides=[override])
    assert is_config_error(raised.value), repr(raised.value)


def _hydra_like(err: Exception):
    """A task run as ``@hydra.main`` runs it: Hydra prints the error and exits 1."""
    def main():
        def fail():
            raise err
        run_and_report(fail)
    return main


def test_run_main_turns_hydra_s_exit_1_into_2_for_config_errors_only(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as config:
        run_main(_hydra_like(ConfigCompositionException("Could not override 'a.b'")))
    with pytest.raises(SystemExit) as crash:
        run_main(_hydra_like(RuntimeError("a bug")))
    assert (config.value.code, crash.value.code) == (2, 1)


def test_with_hydra_full_error_the_exception_still_maps_to_2(monkeypatch, capsys):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(SystemExit) as config:
        run_main(_hydra_like(ConfigCompositionException("Could not override 'a.b'")))
    assert config.value.code == 2 and "Could not override 'a.b'" in capsys.readouterr().err
    with pytest.raises(RuntimeError):
        run_main(_hydra_like(RuntimeError("a bug")))


@pytest.mark.parametrize("args", [["retriever.topkk=3"], ["-m", "retriever.topkk=3,4"]])
def test_a_misspelt_key_exits_2_with_hydra_s_message(tmp_path, args):
    """Was exit 1, the code of a crash: a sweep could not tell the two apart."""
    where = "hydra.sweep.dir" if "-m" in args else "hydra.run.dir"
    out = subprocess.run([sys.executable, "-m", "searchr1.main", *args,
                          f"{where}={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Could not override 'retriever.topkk'" in out.stderr
    assert "Key 'topkk' not in 'BM25Config'" in out.stderr  # Hydra's helpful text, kept
