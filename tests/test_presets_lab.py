"""``experiment=lab`` composes to the lab's rules, and the composed values build objects that
behave the lab's way (not only: the YAML says so)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from searchr1.build import to_schema
from searchr1.config import Config, register_configs
from searchr1.data.selection import eval_examples
from searchr1.data.types import Dataset, QAExample
from searchr1.protocols.tool_call import ToolCallProtocol
from searchr1.rewards import RewardInput, build_reward
from searchr1.loop.config import EvalConfig, TrainerConfig
from searchr1.rollout.config import RolloutConfig
from tests.protocols.test_tool_call import FIXTURES, make_tokenizer

CONF = Path(__file__).resolve().parents[1] / "conf"
OFFLINE = ["engine=local", "model=smollm2_135m", "retriever=bm25", "data=world"]


def compose_lab(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=["experiment=lab", *overrides])


@pytest.fixture(scope="module")
def lab():
    return compose_lab()


def test_optimizer_and_seed_differ_from_the_defaults(lab):
    defaults = TrainerConfig()
    assert (lab.seed, Config.seed) == (42, 0)
    assert (lab.trainer.eps, defaults.eps) == (1e-12, 1e-8)
    assert (lab.trainer.grad_clip_norm, defaults.grad_clip_norm) == (0.0, 1.0)  # 0 = no clip
    assert lab.rollout.search_concurrency == 8 != RolloutConfig().search_concurrency
    assert "max_concurrency" not in lab.retriever  # one concurrency setting (the rollout's)


def test_the_composed_protocol_is_the_labs():
    for cfg in (compose_lab(), compose_lab(*OFFLINE)):
        proto = ToolCallProtocol.from_config(
            to_schema(cfg.protocol), make_tokenizer((FIXTURES / "qwen3_5_4b.jinja").read_text()))
        system, user = proto.messages("Who wrote Hamlet?")
        assert system["role"] == "system" and "worked example" in system["content"]
        assert user == {"role": "user", "content": "Who wrote Hamlet?"}
        assert proto.on_invalid == "end" and "web search" in proto.tool["function"]["description"]


def test_the_composed_reward_is_the_labs(lab):
    reward = build_reward(to_schema(lab.reward))
    assert (reward.answer_rule, reward.normalize) == ("lab", "lab")
    assert reward(RewardInput("O’Brien", ("OBrien",), True)) == 1.0
    assert reward(RewardInput(None, ("OBrien",), False)) == pytest.approx(-0.1)


def test_the_composed_eval_selects_ten_per_source(lab):
    e = OmegaConf.to_object(lab.eval)
    assert (e.split, e.per_source, e.selection, e.selection_seed, e.max_questions) == (
        "test", 10, "lab", 42, None)
    assert (EvalConfig().per_source, EvalConfig().selection) == (None, "first")
    rows = [QAExample(f"r{i}", "q", ("a",), f"src{i % 7}") for i in range(7 * 15)]
    picked = eval_examples(Dataset(train=[], dev=[], test=rows), e)
    assert len(picked) == 70 and len({ex.data_source for ex in picked}) == 7


def test_offline_variant_composes_with_the_labs_rules():
    cfg = compose_lab(*OFFLINE)
    assert (cfg.engine.name, cfg.data.name, cfg.retriever.name) == ("local", "world", "bm25")
    assert (cfg.reward.answer_rule, cfg.protocol.on_invalid, cfg.trainer.eps) == ("lab", "end", 1e-12)
