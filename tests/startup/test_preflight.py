"""Problems found before any work: option values the checks of ``startup/preflight.py`` own."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from searchr1.config import register_configs
from searchr1.startup.preflight import problems

CONF = Path(__file__).resolve().parents[2] / "conf"


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_engine_threads_accept_auto_torch_or_a_count_and_refuse_the_rest():
    assert problems(_compose(["engine.threads=2", "engine.interop_threads=torch"])) == []
    found = problems(_compose(["engine.threads=0", "engine.interop_threads=lots"]))
    assert found == ["engine.threads='0': give auto, torch or a positive integer",
                     "engine.interop_threads='lots': give auto, torch or a positive integer"]
