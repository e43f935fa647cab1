"""The composed ``experiment=lab`` against the lab's values (llm-agent-rl-lab 03-search-r1),
row by row with the file and line each value comes from; then the objects built from the
composed preset behave the lab's way: the Zhihu client's timeout and retries, the metric
names of a trained step, and training on a failed search.

With ``LAB_REPO`` set to a checkout of llm-agent-rl-lab, every cited line is also checked to
hold the quoted text, so a citation that drifts fails instead of misleading.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from omegaconf import OmegaConf

from searchr1.build import to_schema
from searchr1.loop.metric_names import FORWARD_KEYS, named_metrics
from searchr1.retrievers.base import SearchError
from searchr1.retrievers.zhihu import ZhihuRetriever
from searchr1.rollout.tool_errors import split_tool_errors
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.config import RolloutConfig
from tests.helpers.rollout_fakes import SlowRetriever
from tests.protocols.test_tool_call_lab_fidelity import EX
from tests.protocols.test_tool_call_lab import TokSampler, lab_protocol, tok  # noqa: F401  (fixture)
from tests.protocols.test_tool_call import xml_call
from tests.loop.test_trainer import make_cfg, run_trainer, train_rows

from tests.test_presets_lab import compose_lab, lab  # noqa: E402,F401  (the lab preset, composed)

CONF = Path(__file__).resolve().parents[1] / "conf"
LAB = "03-search-r1"

# (composed key, the lab's value, the lab's file:line, text on that line)
TABLE = [
    ("seed", 42, "train.py:449", "default=42"),
    ("model.hf_id", "Qwen/Qwen3.5-4B", "train.py:352", 'default="Qwen/Qwen3.5-4B"'),
    ("model.lora_rank", 32, "train.py:362", "default=32"),
    ("trainer.questions_per_step", 8, "train.py:368", "default=8"),
    ("rollout.group_size", 8, "train.py:374", "default=8"),
    ("rollout.max_searches", 4, "train.py:380", "default=4"),
    ("rollout.max_turns", 6, "train.py:386", "default=6"),
    ("rollout.max_trajectory_tokens", 8192, "train.py:392", "default=8192"),
    ("rollout.max_turn_tokens", 1024, "train.py:398", "default=1024"),
    ("rollout.max_observation_tokens", 1024, "train.py:404", "default=1024"),
    ("rollout.temperature", 1.0, "train.py:410", "default=1.0"),
    ("rollout.top_p", 1.0, "train.py:416", "default=1.0"),
    ("trainer.learning_rate", 4e-5, "train.py:422", "default=4e-5"),
    ("trainer.beta1", 0.9, "train.py:428", "default=0.9"),
    ("trainer.beta2", 0.95, "train.py:434", "default=0.95"),
    ("trainer.max_datum_tokens", 8192, "train.py:45", "MAX_TRAIN_CONTEXT_TOKENS = 8192"),
    ("trainer.max_datums_per_microbatch", 32, "train.py:46", "MAX_MICRO_BATCH_ITEMS = 32"),
    ("trainer.max_padded_tokens_per_microbatch", 64000, "train.py:47", "64_000"),
    ("loss.name", "importance_sampling", "train.py:581", 'loss_fn="importance_sampling"'),
    ("trainer.metric_names", "lab", "train.py:295", 'merged[f"trainer/{key}"]'),
    ("trainer.data_order", "lab", "data.py:39", "random.Random(seed).shuffle(examples)"),
    ("rollout.on_tool_error", "observe", "rollout.py:124", "Search error:"),
    ("advantage.name", "group_mean", "rollout.py:257", "mean_reward = sum(item.reward for item in group)"),
    ("advantage.degenerate", "zero_advantages", "train.py:134", "if trajectory.advantage == 0.0:"),
    ("reward.name", "em_format", "reward.py:45", "RewardResult(-0.1, False, False, None)"),
    ("reward.no_answer_penalty", -0.1, "reward.py:45", "-0.1"),
    ("reward.answer_rule", "lab", "reward.py:8", "re.IGNORECASE | re.MULTILINE"),
    ("reward.normalize", "lab", "reward.py:26", 'unicodedata.category(char).startswith("P")'),
    ("protocol.name", "tool_call", "protocol.py:73", "tools=[SEARCH_TOOL]"),
    ("protocol.enable_thinking", False, "protocol.py:76", "enable_thinking=False"),
    ("protocol.parse_rule", "lab", "protocol.py:160", 'if not query or "<" in query or ">" in query'),
    ("protocol.on_invalid", "end", "rollout.py:208", "if not can_search:"),
    ("protocol.on_observation_overflow", "end", "rollout.py:149", "if not accepted"),
    ("protocol.max_content_chars", 1200, "search.py:207", "[:1200]"),
    ("retriever.name", "zhihu_lab", "search.py:18", "global_search"),  # Zhihu, the lab's settings
    ("retriever.topk", 3, "search.py:181", '"Count": 3'),
    ("retriever.timeout_s", 15.0, "search.py:72", "timeout: float = 15.0"),
    ("retriever.max_retries", 2, "search.py:73", "max_retries: int = 2"),
    ("retriever.backoff_s", 1.0, "search.py:74", "retry_delay: float = 1.0"),
    ("eval.per_source", 10, "prepare_data.py:133", '"--dev-per-source", type=int, default=10'),
    ("eval.selection_seed", 42, "prepare_data.py:134", '"--seed", type=int, default=42'),
    ("eval.selection", "lab", "prepare_data.py:108", "for source in sorted(groups):"),
    ("eval.temperature", 0.0, "eval.py:169", "default=0.0"),
]


def _plain(value):
    return getattr(value, "value", value)


@pytest.mark.parametrize(("key", "value", "where", "text"), TABLE, ids=[r[0] for r in TABLE])
def test_composed_lab_preset_equals_the_labs_value(lab, key, value, where, text):
    assert _plain(OmegaConf.select(lab, key)) == value, f"{key}: the lab's {where}"


@pytest.mark.skipif(not os.environ.get("LAB_REPO"), reason="LAB_REPO (a lab checkout) not set")
@pytest.mark.parametrize(("key", "value", "where", "text"), TABLE, ids=[r[0] for r in TABLE])
def test_cited_lab_line_holds_the_value(key, value, where, text):
    name, line = where.split(":")
    lines = (Path(os.environ["LAB_REPO"]) / LAB / name).read_text(encoding="utf-8").splitlines()
    assert text in lines[int(line) - 1], f"{where} no longer reads {text!r}"


# ---- 15. the Zhihu client ----------------------------------------------------------------

def test_lab_zhihu_client_waits_15s_and_retries_twice(lab, monkeypatch):
    calls, sleeps = [], []

    def timeout(request):
        calls.append(request)
        raise httpx.ReadTimeout("slow", request=request)

    async def no_sleep(seconds):
        sleeps.append(seconds)

    monkeypatch.setattr("searchr1.retrievers.zhihu.asyncio.sleep", no_sleep)
    retriever = ZhihuRetriever(to_schema(lab.retriever), keys=["k-1"],
                               transport=httpx.MockTransport(timeout))

    async def search():
        client, _ = retriever._client()
        assert client.timeout == httpx.Timeout(15.0)
        with pytest.raises(SearchError, match="after 3 attempts"):
            await retriever.search(["capital of France"], 3)

    asyncio.run(search())
    assert (len(calls), sleeps) == (3, [1.0, 2.0])  # one try + 2 retries, 1 s doubling
    ours = compose_lab("retriever=zhihu").retriever
    assert (ours.timeout_s, ours.max_retries, ours.backoff_s) == (10.0, 3, 0.5)


# ---- 16. metric names --------------------------------------------------------------------

def test_forward_keys_are_pytrios_forward_metrics():
    from pytrio.protocol.actor.events.trainer.forward import TrainerForwardMetrics

    assert set(FORWARD_KEYS) == set(TrainerForwardMetrics.model_fields)


def test_lab_names_rename_only_the_forward_metrics():
    row = {"train/loss_mean": 0.5, "train/loss_sum": 4.0, "train/token_count": 8.0,
           "train/lr": 4e-5, "train/datums_per_rollout_batch": 3.0, "reward/mean": 0.2}
    assert named_metrics(row, "lab") == {
        "trainer/loss_mean": 0.5, "trainer/loss_sum": 4.0, "trainer/token_count": 8.0,
        "train/lr": 4e-5, "train/datums_per_rollout_batch": 3.0, "reward/mean": 0.2}
    assert named_metrics(row, "ours") == row
    with pytest.raises(ValueError, match="metric_names"):
        named_metrics(row, "theirs")


def test_a_trained_step_is_logged_under_the_labs_names(tiny_model_dir, tmp_path, lab):
    cfg = make_cfg(tiny_model_dir, steps=1, metric_names=lab.trainer.metric_names)
    cfg.eval.max_questions = 1
    _, tracker, _ = run_trainer(cfg, tmp_path)
    (_, row), = train_rows(tracker)
    assert row["trainer/token_count"] > 0 and "train/token_count" not in row
    assert "train/loss_tokens_per_rollout_batch" in row and "train/lr" in row  # the lab's train/*


# ---- 17. tool failures -------------------------------------------------------------------

def test_lab_preset_trains_on_failed_searches(lab, tok):  # noqa: F811
    script = lambda p, i: xml_call("bravo") if "<tool_response>" not in p else "Answer: x"
    cfg = RolloutConfig(max_searches=4, max_turns=6, max_trajectory_tokens=4096,
                        max_turn_tokens=256, max_observation_tokens=512)
    engine = RolloutEngine(lab_protocol(tok, parse_rule="lab"),
                           SlowRetriever(0.0, fail_on="bravo"), topk=3, cfg=cfg)
    group = asyncio.run(engine.rollout_group(TokSampler(tok, script), EX, 2, SamplingSettings(0.0)))
    assert all(t.turns[0].tool_error and "search failed" in t.turns[0].observation_text
               for t in group)
    split = split_tool_errors([group], lab.rollout.on_tool_error)
    assert split.tool_error_trajectories == 2 and split.groups([group]) == [group]  # trained
    assert split_tool_errors([group], "drop_group").groups([group]) == []  # ours: left out


def test_a_missing_or_bad_observation_template_is_a_start_up_problem(tmp_path):
    from searchr1.startup.checks import check_config

    missing = compose_lab(f"protocol.observation_template_file={tmp_path}/none.yaml")
    assert any("observation_template_file" in p for p in check_config(missing).problems)
    bad = tmp_path / "bad.yaml"
    bad.write_text("titel: x\n")
    typo = compose_lab(f"protocol.observation_template_file={bad}")
    assert any("unknown keys ['titel']" in p for p in check_config(typo).problems)
    assert not any("observation_template" in p for p in check_config(compose_lab()).problems)
