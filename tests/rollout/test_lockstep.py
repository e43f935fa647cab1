"""``rollout.schedule=lockstep``: turn barriers, one search call per turn or serial searches,
and trajectories equal to the async schedule's.

No clocks: the fakes yield to the event loop a different number of times per call
(``asyncio.sleep(0)``), which interleaves independent trajectories deterministically, and
record the order of events. A schedule that overlapped what lockstep must not overlap would
show it in that order.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace

import pytest
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence

from searchr1.data.types import QAExample
from searchr1.retrievers.base import Document, Retriever
from searchr1.rewards import RewardConfig, build_reward
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.lockstep import LockstepSearch, RolloutSchedule
from searchr1.rollout.scoring import score_trajectory
from searchr1.rollout.types import EndReason, Turn
from searchr1.schemas import RolloutConfig
from tests.helpers.rollout_fakes import CharProtocol, dec, enc

EXAMPLES = [QAExample(id=f"q{k}", question=f"w{k}", golden_answers=("x",), data_source="t")
            for k in range(4)]
SETTINGS = SamplingSettings(temperature=1.0, seed=7)
ASYNC = {"schedule": RolloutSchedule["async"]}
BATCHED = {"schedule": RolloutSchedule["lockstep"], "lockstep_search": LockstepSearch.batched}
SERIAL = {"schedule": RolloutSchedule["lockstep"], "lockstep_search": LockstepSearch.serial}


def yields(key: str) -> int:
    """How often a fake call yields to the loop: 0..12 by a stable hash of ``key``, and 40
    more for question ``w0`` (a slow group that independent trajectories overtake)."""
    return sum(map(ord, key)) * 7 % 13 + (40 if "w0" in key else 0)


class SeededSampler:
    """Replies ``script(prompt, sample_index, seed)``; logs ("sample", turn) at the call and
    ("sampled", turn) at the return, where turn = assistant turns already in the prompt.

    ``fail(prompt, seed)`` → raise instead (a sampler error)."""

    def __init__(self, script, log: list, fail=lambda prompt, seed: False) -> None:
        self.script, self.log, self.fail = script, log, fail
        self.seeds: list[tuple[str, int, int]] = []  # (prompt, num_samples, seed)

    async def sample_async(self, prompt, num_samples=1, sampling_params=None):
        text, seed = dec(prompt.to_ints()), sampling_params.seed
        self.seeds.append((text, num_samples, seed))
        self.log.append(("sample", text.count(";")))
        for _ in range(1 + yields(text)):  # at least once: a request is never instant
            await asyncio.sleep(0)
        self.log.append(("sampled", text.count(";")))
        if self.fail(text, seed):
            raise RuntimeError("sampler down")
        seqs = []
        for i in range(num_samples):
            reply, stop = self.script(text, i, seed), "stop"
            if len(reply) > sampling_params.max_tokens:
                reply, stop = reply[: sampling_params.max_tokens], "length"
            toks = enc(reply)
            seqs.append(SampleSequence(stop_reason=stop, tokens=toks, text=reply,
                                       logprobs=[-(k + 1) / 10 for k in range(len(toks))]))
        return SampleResponse(sequences=seqs)


class LoggingRetriever(Retriever):
    """One document per query; logs every call and how many calls were in flight at once."""

    def __init__(self, log: list, fail_on: str | None = None) -> None:
        super().__init__()
        self.log, self.fail_on = log, fail_on
        self.calls: list[list[str]] = []
        self.in_flight = self.max_in_flight = 0

    async def _search(self, queries, topk):
        self.calls.append(list(queries))
        self.log.append(("search", tuple(queries)))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            for _ in range(yields("|".join(queries))):
                await asyncio.sleep(0)
        finally:
            self.in_flight -= 1
        if self.fail_on is not None and self.fail_on in queries:
            raise RuntimeError("backend down")
        return [[Document(id=f"d-{q}", title=q, text=q)] for q in queries]


def rollout(schedule: dict, script, retriever_fail: str | None = None, protocol=None,
            sampler_fail=lambda p, s: False, group_size: int = 3, **limits):
    """Run one training rollout of ``EXAMPLES``; (groups, sampler, retriever, event log)."""
    log: list = []
    sampler = SeededSampler(script, log, sampler_fail)
    retriever = LoggingRetriever(log, retriever_fail)
    cfg = RolloutConfig(**{"max_searches": 3, "max_turns": 5, **limits, **schedule})
    engine = RolloutEngine(protocol or CharProtocol(), retriever, topk=1, cfg=cfg)
    groups = asyncio.run(engine.rollout(sampler, EXAMPLES, group_size, SETTINGS))
    return groups, sampler, retriever, log


def searches_by_index(prompt: str, i: int, seed: int) -> str:
    """Trajectory i of a group searches ``g{i}t{n}`` on turn n, i + 1 times, then answers."""
    first = re.search(r"S:g(\d)t0-", prompt)
    g = int(first.group(1)) if first else i
    n = prompt.count("[")  # observations so far
    return "A:x;" if n > g else f"S:g{g}t{n}-{prompt[2:4]};"


def turn_of(event) -> int:
    return event[1]


# --- the turn barrier ------------------------------------------------------------------


@pytest.mark.parametrize("schedule", [BATCHED, SERIAL], ids=["batched", "serial"])
def test_lockstep_issues_every_turn_t_sample_before_any_turn_t_plus_1(schedule):
    _, _, _, log = rollout(schedule, searches_by_index)
    starts = [turn_of(e) for e in log if e[0] == "sample"]
    assert starts == sorted(starts) and max(starts) == 3  # turns 0..3
    # a turn's samples are issued together (all 12 of turn 1 in flight at once) and awaited
    # together: no search starts while one is in flight
    open_samples = most = 0
    for kind, *_ in log:
        open_samples += {"sample": 1, "sampled": -1}.get(kind, 0)
        most = max(most, open_samples)
        assert kind != "search" or open_samples == 0
    assert most == len(EXAMPLES) * 3


def test_async_overlaps_turns_and_searches_with_sampling():
    _, _, retriever, log = rollout(ASYNC, searches_by_index)
    starts = [turn_of(e) for e in log if e[0] == "sample"]
    assert starts != sorted(starts)  # a fast trajectory's turn 2 before a slow one's turn 1
    assert retriever.max_in_flight > 1  # searches of different trajectories overlap
    open_samples, overlapped = 0, False
    for kind, *_ in log:
        open_samples += {"sample": 1, "sampled": -1}.get(kind, 0)
        overlapped |= kind == "search" and open_samples > 0
    assert overlapped  # a search ran while another trajectory was sampling


# --- how a lockstep turn searches -------------------------------------------------------


def expected_turn_queries() -> list[list[str]]:
    """Turn n searches every trajectory with group index ≥ n, in examples × group order."""
    return [[f"g{g}t{n}-{ex.question}" for ex in EXAMPLES for g in range(3) if g >= n]
            for n in range(3)]


def test_batched_makes_one_search_call_per_turn_with_all_its_queries():
    _, _, retriever, _ = rollout(BATCHED, searches_by_index)
    assert retriever.calls == expected_turn_queries()


def test_serial_makes_one_call_per_query_in_order_never_overlapping():
    _, _, retriever, log = rollout(SERIAL, searches_by_index)
    assert retriever.calls == [[q] for turn in expected_turn_queries() for q in turn]
    assert retriever.max_in_flight == 1


def test_batched_call_failure_is_a_tool_error_for_every_query_of_the_turn():
    groups, _, retriever, _ = rollout(BATCHED, searches_by_index, retriever_fail="g1t1-w0")
    failed = [(t.example.id, t.group_index) for g in groups for t in g
              if any(turn.tool_error for turn in t.turns)]
    assert len(retriever.calls[1]) == 8 and len(failed) == 8  # the whole second turn's call
    # serial runs that query alone: one trajectory sees the error
    groups, _, _, _ = rollout(SERIAL, searches_by_index, retriever_fail="g1t1-w0")
    failed = [(t.example.id, t.group_index) for g in groups for t in g
              if any(turn.tool_error for turn in t.turns)]
    assert failed == [("q0", 1)]


# --- same trajectories as async ---------------------------------------------------------


def mixed(prompt: str, i: int, seed: int) -> str:
    """A seed-driven mix of searches, invalid turns, over-long turns and answers."""
    n, r = prompt.count("["), (seed + i) % 9
    if n >= 1 + r % 4:
        return "A:x;" if r % 2 else "A:y;"
    return {0: "hmm;", 1: "S:" + "z" * 40 + ";"}.get(r, f"S:q{r}{n};")


def on_invalid_end() -> CharProtocol:
    protocol = CharProtocol()
    protocol.on_invalid = "end"
    return protocol


def ends(groups) -> set[EndReason]:
    return {t.end_reason for g in groups for t in g}


def turns(groups) -> list[Turn]:
    return [turn for g in groups for t in g for turn in t.turns]


def clipped(groups) -> bool:
    """Whether some turn was sampled from a cut context (kept, but with mask 0)."""
    return any(t.num_action_tokens < sum(len(turn.sampled_tokens) for turn in t.turns)
               for g in groups for t in g)


# case → (rollout arguments, what the async reference must show for the case to bite)
CASES = {
    "budgets": ({"max_searches": 1, "max_turns": 4},
                lambda gs: EndReason.SEARCH_BUDGET in ends(gs)),
    "turn_limit": ({"max_searches": 6, "max_turns": 2},
                   lambda gs: EndReason.TURN_LIMIT in ends(gs)),
    "token_limit": ({"max_trajectory_tokens": 30, "max_turn_tokens": 12},
                    lambda gs: EndReason.TOKEN_LIMIT in ends(gs)
                    and any(turn.stop_reason == "length" for turn in turns(gs))),
    "context_clip": ({"max_prompt_tokens": 18}, clipped),
    "observation_cut": ({"max_observation_tokens": 4},
                        lambda gs: any(turn.observation_len == 4 for turn in turns(gs))),
    "invalid_ends": ({"protocol": on_invalid_end()},
                     lambda gs: EndReason.INVALID in ends(gs)),
    "sampler_errors": ({"sampler_fail": lambda p, seed: seed % 5 == 0 or p.startswith("Q:w2")},
                       lambda gs: EndReason.SAMPLER_ERROR in ends(gs)
                       and any(t.turns for g in gs for t in g
                               if t.end_reason is EndReason.SAMPLER_ERROR)),
    "search_error": ({"retriever_fail": "q50"},
                     lambda gs: any(turn.tool_error for turn in turns(gs))),
}


def summary(groups) -> list:
    """Everything a trajectory records except timing."""
    reward = build_reward(RewardConfig(name="em_format"))
    out = []
    for group in groups:
        for t in group:
            score_trajectory(t, CharProtocol(), reward)
            turns = [replace(turn, search_seconds=0.0) for turn in t.turns]
            out.append((t.example.id, t.group_index, t.tokens_T, t.mask_T, t.logprobs_T,
                        t.end_reason, turns, t.answer, t.reward))
    return out


# a failed batched call fails its whole turn (the test above), so search_error is serial only
EQUAL_CASES = [pytest.param(case, schedule, id=f"{name}-{case}") for case in CASES
               for name, schedule in (("batched", BATCHED), ("serial", SERIAL))
               if (case, name) != ("search_error", "batched")]


@pytest.mark.parametrize("case,schedule", EQUAL_CASES)
def test_lockstep_trajectories_equal_async(case, schedule):
    kwargs, bites = CASES[case]
    ref_groups, ref_sampler, _, _ = rollout(ASYNC, mixed, **kwargs)
    groups, sampler, _, _ = rollout(schedule, mixed, **kwargs)
    assert summary(groups) == summary(ref_groups)
    assert sorted(sampler.seeds) == sorted(ref_sampler.seeds)  # same requests, same seeds
    assert bites(ref_groups)  # the rule the case is about was exercised


def test_eval_rollout_group_follows_the_schedule():
    log: list = []
    cfg = RolloutConfig(max_searches=3, max_turns=5, **BATCHED)
    retriever = LoggingRetriever(log)
    engine = RolloutEngine(CharProtocol(), retriever, topk=1, cfg=cfg)
    trajs = asyncio.run(engine.rollout_group(SeededSampler(searches_by_index, log),
                                             EXAMPLES[0], 3, SETTINGS))
    assert [t.group_index for t in trajs] == [0, 1, 2]
    assert retriever.calls == [[q for q in turn if q.endswith("w0")]
                               for turn in expected_turn_queries()]


# --- configuration --------------------------------------------------------------------


def test_default_is_async_and_unknown_values_are_refused_with_the_valid_ones():
    assert RolloutConfig().schedule is RolloutSchedule["async"]
    assert RolloutConfig().lockstep_search is LockstepSearch.batched
    with pytest.raises(ValueError, match=r"rollout.schedule='sync'.*valid: async, lockstep"):
        RolloutEngine(CharProtocol(), LoggingRetriever([]), 1, RolloutConfig(schedule="sync"))
    with pytest.raises(ValueError, match=r"lockstep_search='parallel'.*valid: batched, serial"):
        RolloutEngine(CharProtocol(), LoggingRetriever([]), 1,
                      RolloutConfig(lockstep_search="parallel"))
    # plain strings are accepted (a config built in Python)
    engine = RolloutEngine(CharProtocol(), LoggingRetriever([]), 1,
                           RolloutConfig(schedule="lockstep", lockstep_search="serial"))
    assert (engine.schedule, engine.lockstep_search) == (RolloutSchedule["lockstep"],
                                                         LockstepSearch.serial)


def test_compose_takes_the_knobs_and_rejects_an_unknown_schedule():
    from hydra.errors import ConfigCompositionException

    from searchr1.build import to_schema
    from tests.test_config import _compose

    cfg = to_schema(_compose(["rollout.schedule=lockstep", "rollout.lockstep_search=serial"])
                    .rollout)
    assert (cfg.schedule, cfg.lockstep_search) == (RolloutSchedule["lockstep"],
                                                   LockstepSearch.serial)
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["rollout.schedule=sync"])
    assert "expected one of [async, lockstep]" in str(err.value.__cause__)
