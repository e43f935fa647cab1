"""The async rollout engine on a scripted sampler: spans, masks, limits, concurrency."""

from __future__ import annotations

import asyncio

import pytest

from searchr1.data.types import QAExample
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.types import EndReason
from searchr1.schemas import RolloutConfig
from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler, SlowRetriever, dec, enc

EX = QAExample(id="q1", question="who", golden_answers=("x",), data_source="t")
GREEDY = SamplingSettings(temperature=0.0)


def engine(retriever=None, **limits) -> RolloutEngine:
    cfg = RolloutConfig(**limits)
    return RolloutEngine(CharProtocol(), retriever or SlowRetriever(0.0), topk=1, cfg=cfg)


def run(coro):
    return asyncio.run(coro)


def test_two_turn_trajectory_token_spans_and_masks():
    # turn 1 searches "ab", turn 2 answers "x"
    script = lambda prompt, i: "S:ab;" if "[" not in prompt else "A:x;"
    (traj,) = run(engine().rollout_group(ScriptedSampler(script), EX, 1, GREEDY))
    prompt, t1, obs, t2 = "Q:who|", "S:ab;", "[d-ab]", "A:x;"
    assert dec(traj.tokens_T) == prompt + t1 + obs + t2
    assert traj.mask_T == [0] * len(prompt) + [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    lp1 = [-(k + 1) / 10 for k in range(len(t1))]
    lp2 = [-(k + 1) / 10 for k in range(len(t2))]
    assert traj.logprobs_T == [0.0] * len(prompt) + lp1 + [0.0] * len(obs) + lp2
    assert traj.end_reason is EndReason.ANSWER
    assert [t.prompt_len for t in traj.turns] == [6, 6 + 5 + 6]
    assert traj.turns[0].observation_len == len(obs)
    assert traj.turns[0].documents[0].id == "d-ab"
    assert traj.num_searches == 1


def test_first_turn_shared_then_independent():
    script = lambda prompt, i: f"S:q{i};" if "[" not in prompt else "A:x;"
    sampler = ScriptedSampler(script)
    trajs = run(engine().rollout_group(sampler, EX, 3, GREEDY))
    # one shared call with num_samples=3, then one call per trajectory
    assert sampler.calls[0] == ("Q:who|", 3)
    assert sorted(n for _, n in sampler.calls[1:]) == [1, 1, 1]
    assert [t.turns[0].action.query for t in trajs] == ["q0", "q1", "q2"]
    assert [t.group_index for t in trajs] == [0, 1, 2]


def test_search_budget_then_last_turn_without_search():
    always_search = lambda prompt, i: "S:z;"
    retriever = SlowRetriever(0.0)
    (traj,) = run(engine(retriever, max_searches=2, max_turns=10).rollout_group(
        ScriptedSampler(always_search), EX, 1, GREEDY))
    assert traj.end_reason is EndReason.SEARCH_BUDGET
    assert len(traj.turns) == 3  # 2 executed searches + the last turn, not executed
    assert traj.num_searches == 2
    assert len(retriever.spans) == 2
    assert traj.turns[-1].observation_len == 0


def test_turn_limit_with_invalid_turns():
    (traj,) = run(engine(max_turns=3).rollout_group(
        ScriptedSampler(lambda p, i: "hmm;"), EX, 1, GREEDY))
    assert traj.end_reason is EndReason.TURN_LIMIT
    assert len(traj.turns) == 3
    assert dec(traj.tokens_T).count("[invalid]") == 2


def test_token_limit_caps_turn_length():
    # prompt 6 tokens; budget 20 → first turn may sample at most 14 tokens
    long_reply = lambda p, i: "S:" + "a" * 40 + ";"
    (traj,) = run(engine(max_trajectory_tokens=20, max_turn_tokens=100).rollout_group(
        ScriptedSampler(long_reply), EX, 1, GREEDY))
    assert len(traj.tokens_T) == 20
    assert traj.turns[0].stop_reason == "length"
    assert traj.end_reason is EndReason.TOKEN_LIMIT


def test_search_error_is_shown_to_model_and_recorded():
    script = lambda prompt, i: "S:boom;" if "[" not in prompt else "A:x;"
    (traj,) = run(engine(SlowRetriever(0.0, fail_on="boom")).rollout_group(
        ScriptedSampler(script), EX, 1, GREEDY))
    assert "backend down" in traj.turns[0].tool_error
    assert "[error]" in dec(traj.tokens_T)
    assert traj.end_reason is EndReason.ANSWER


def test_sampler_error_ends_group_as_data():
    class Broken:
        async def sample_async(self, **kw):
            raise RuntimeError("sampler down")

    trajs = run(engine().rollout_group(Broken(), EX, 2, GREEDY))
    assert [t.end_reason for t in trajs] == [EndReason.SAMPLER_ERROR] * 2
    assert all(t.turns == [] for t in trajs)


def test_searches_of_different_trajectories_overlap():
    retriever = SlowRetriever(delay=0.2)
    script = lambda prompt, i: f"S:q{i};" if "[" not in prompt else "A:x;"
    exs = [QAExample(id=f"q{k}", question="w", golden_answers=("x",), data_source="t") for k in range(2)]
    groups = run(engine(retriever).rollout(ScriptedSampler(script), exs, 2, GREEDY))
    assert [len(g) for g in groups] == [2, 2]
    spans = sorted(retriever.spans)
    assert len(spans) == 4
    # all four searches run concurrently: each starts before the first one ends
    assert all(start < spans[0][1] for start, _ in spans)
    assert retriever.metrics()["search/requests"] == 4.0


def test_search_concurrency_limit_is_respected():
    retriever = SlowRetriever(delay=0.05)
    script = lambda prompt, i: f"S:q{i};" if "[" not in prompt else "A:x;"
    run(engine(retriever, search_concurrency=1).rollout_group(ScriptedSampler(script), EX, 3, GREEDY))
    spans = sorted(retriever.spans)
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:]))
