"""The lab's metric definitions on a scripted rollout (protocol=tool_call, Qwen3.5 template):
``rollout/valid_tool_call_rate``, cumulative ``search/*`` with ``search/step_*``, and the
``train/*`` batch sizes of ``step_metrics.batch_metrics`` (values computed by hand)."""

from __future__ import annotations

import asyncio

import pytest

from searchr1.data.types import QAExample
from searchr1.batch.microbatches import pack_ffd
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.scoring import rollout_metrics
from searchr1.rollout.step_metrics import SearchCounts, batch_metrics, search_counts
from searchr1.rollout.types import EndReason
from searchr1.rollout.config import RolloutConfig
from tests.helpers.rollout_fakes import SlowRetriever
from tests.protocols.test_tool_call_lab import TokSampler, lab_protocol, tok  # noqa: F401  (fixture)
from tests.protocols.test_tool_call import xml_call

EX = QAExample(id="q", question="Which?", golden_answers=("x",), data_source="nq")


def script(prompt: str, i: int) -> str:
    """Sample 0 searches then answers; 1 sends a malformed call; 2 searches (the backend
    fails) and then tries a second search past the budget."""
    if "<tool_response>" not in prompt:
        return [xml_call("alpha"), "<tool_call>junk</tool_call>", xml_call("bravo")][i]
    return "Answer: x" if "alpha" in prompt.rsplit("<tool_response>", 1)[1] else xml_call("again")


@pytest.fixture()
def group(tok):  # noqa: F811
    cfg = RolloutConfig(max_searches=1, max_turns=6, max_trajectory_tokens=4096,
                        max_turn_tokens=256, max_observation_tokens=512)
    retriever = SlowRetriever(0.01, fail_on="bravo")
    engine = RolloutEngine(lab_protocol(tok), retriever, topk=1, cfg=cfg)
    sampler = TokSampler(tok, script)
    trajs = asyncio.run(engine.rollout_group(sampler, EX, 3, SamplingSettings(0.0)))
    assert [t.end_reason for t in trajs] == [EndReason.ANSWER, EndReason.INVALID,
                                             EndReason.SEARCH_BUDGET]
    return trajs, retriever


def test_valid_tool_call_rate_is_searches_over_tool_call_turns(group):
    trajs, _ = group
    # <tool_call> turns: alpha, junk, bravo, again = 4; executed searches: alpha, bravo = 2
    assert rollout_metrics(trajs)["rollout/valid_tool_call_rate"] == pytest.approx(2 / 4)
    assert rollout_metrics([trajs[0]])["rollout/valid_tool_call_rate"] == 1.0
    assert rollout_metrics([])["rollout/valid_tool_call_rate"] == 0.0


def search_metrics(trajs, totals: SearchCounts, served=None) -> tuple[dict, SearchCounts]:
    """What a step logs (``loop/train_step.py``): run totals as ``search/*``, the step's as
    ``search/step_*``; and the new totals."""
    step = search_counts(trajs, served)
    total = totals + step
    return {**total.rates("search/"), **step.rates("search/step_")}, total


def test_search_metrics_are_cumulative_with_step_deltas(group):
    trajs, retriever = group
    seconds = sum(turn.search_seconds for t in trajs for turn in t.turns)
    assert seconds >= 0.02  # two searches of ≥ 10 ms each
    before = SearchCounts(requests=2, errors=0, latency_s=1.0)
    served = {"search/requests": 2.0, "search/429_rate": 0.5, "search/timeout_rate": 0.0}
    metrics, totals = search_metrics(trajs, before, served)
    assert totals == SearchCounts(requests=4, errors=1, latency_s=pytest.approx(1.0 + seconds),
                                  rate_limited=1.0)
    assert metrics["search/step_requests"] == 2 and metrics["search/requests"] == 4
    assert metrics["search/step_success_rate"] == 0.5 and metrics["search/success_rate"] == 0.75
    assert metrics["search/step_error_rate"] == 0.5 and metrics["search/error_rate"] == 0.25
    assert metrics["search/step_latency"] == pytest.approx(seconds / 2)
    assert metrics["search/latency"] == pytest.approx((1.0 + seconds) / 4)
    assert metrics["search/step_429_rate"] == 0.5 and metrics["search/429_rate"] == 0.25
    assert metrics["search/timeout_rate"] == 0.0 and metrics["search/credential_failover_rate"] == 0
    again, totals2 = search_metrics([], totals)  # a step without searches keeps the totals
    assert totals2 == totals and again["search/success_rate"] == 0.75
    assert again["search/step_requests"] == 0 and again["search/step_success_rate"] == 0.0
    assert retriever.metrics()["search/requests"] == 2  # the same searches the retriever saw


def test_batch_metrics_hand_computed():
    lengths, loss = [10, 7, 3, 5], [4, 2, 1, 3]
    bins = pack_ffd(lengths, max_datums=2, max_padded_tokens=20)
    assert bins == [[0, 1], [3, 2]]  # padded 10×2 = 20 and 5×2 = 10
    assert batch_metrics(lengths, loss, bins) == {
        "train/datums_per_rollout_batch": 4.0,
        "train/micro_batches_per_step": 2.0,
        "train/tokens_per_rollout_batch": 25.0,
        "train/loss_tokens_per_rollout_batch": 10.0,
        "train/padded_tokens_per_rollout_batch": 30.0,
        "train/max_micro_batch_padded_tokens": 20.0,
        "train/update_skipped": 0.0,
    }
    skipped = batch_metrics([], [], [])
    assert skipped["train/update_skipped"] == 1.0 and skipped["train/micro_batches_per_step"] == 0
    with pytest.raises(ValueError, match="2 datum lengths but 1 loss counts"):
        batch_metrics([1, 2], [1], [[0, 1]])
