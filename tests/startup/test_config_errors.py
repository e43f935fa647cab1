"""A config Hydra cannot compose exits 2 with Hydra's own message; a crash keeps exit 1; a key
that moved (``MOVED_KEYS``) exits 2 with one more line naming its new place."""

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
from searchr1.startup.config_errors import MOVED_KEYS, is_config_error, moved_key_hints, renamed, run_main

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


def test_a_moved_key_is_read_under_its_new_name():
    assert renamed("trainer.compile_layers=true") == "engine.compile_layers=true"
    assert renamed("+trainer.offload_optimizer=true") == "+engine.offload_optimizer=true"
    assert renamed("~trainer.activation_checkpointing") == "~engine.activation_checkpointing"
    assert renamed("trainer.steps=3") == "trainer.steps=3"
    assert renamed("trainer.compile_layers_x=1") == "trainer.compile_layers_x=1"


def test_a_moved_key_in_an_error_gets_one_hint_line_naming_its_new_key():
    text = "Could not override 'trainer.offload_optimizer'.\nKey 'offload_optimizer' not in 'TrainerConfig'"
    assert moved_key_hints(text) == [
        "searchr1: trainer.offload_optimizer is now engine.offload_optimizer (a setting of engine=local)"]
    assert moved_key_hints("Could not override 'trainer.offload_optimizer_x'") == []
    assert moved_key_hints("Could not override 'engine.offload_optimizer'") == []
    for old, new in MOVED_KEYS.items():
        assert moved_key_hints(f"Could not override '{old}'") == [
            f"searchr1: {old} is now {new} (a setting of engine=local)"]


def test_an_old_key_on_the_command_line_exits_2_naming_the_new_one(tmp_path):
    old = "trainer.compile_layers"  # as the benchmarks' command lines gave it (each key: above)
    out = subprocess.run([sys.executable, "-m", "searchr1.main", f"{old}=true",
                          f"hydra.run.dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr[-2000:]
    hints = [line for line in out.stderr.splitlines() if "is now" in line]
    assert hints == ["searchr1: trainer.compile_layers is now engine.compile_layers (a setting of engine=local)"]
    assert "Could not override 'trainer.compile_layers'" in out.stderr  # Hydra's own text first
