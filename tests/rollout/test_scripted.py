"""The scripted worst-case policy: searches to the budget, then answers, every turn full length."""

from __future__ import annotations

import asyncio

import pytest
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence
from transformers import AutoModelForCausalLM

from searchr1.data.types import QAExample
from searchr1.engines.local.config import LocalEngineConfig
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient
from searchr1.protocols.base import ActionKind
from searchr1.protocols.tags import TagsProtocol
from searchr1.rollout.config import RolloutConfig
from searchr1.rollout.engine import RolloutEngine, SamplingSettings
from searchr1.rollout.scripted import ScriptedTurns, check_scripted
from searchr1.rollout.types import EndReason
from tests.conftest import tiny_tokenizer
from tests.helpers.rollout_fakes import SlowRetriever

EXAMPLES = [QAExample(id=f"q{i}", question=f"who is {i}", golden_answers=("x",), data_source="t")
            for i in range(2)]


class Recorder:
    """Forwards to a real sampler and keeps every response."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.responses: list[tuple[int, SampleResponse]] = []

    async def sample_async(self, prompt, num_samples=1, sampling_params=None):
        assert list(sampling_params.stop or []) == []  # the scripted turn samples its full length
        out = await self.inner.sample_async(prompt=prompt, num_samples=num_samples,
                                            sampling_params=sampling_params)
        self.responses.append((len(prompt.to_ints()), out))
        return out


@pytest.fixture(scope="module")
def tiny_sampler(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return LocalSamplingClient(model, tiny_tokenizer(), LocalEngineConfig(sampler="hf", device="cpu"))


@pytest.mark.parametrize("schedule", ["async", "lockstep"])
def test_every_trajectory_searches_to_the_budget_then_answers_with_full_turns(tiny_sampler, schedule):
    cfg = RolloutConfig(max_searches=2, max_turns=3, max_turn_tokens=48, max_trajectory_tokens=2000,
                        max_observation_tokens=64, scripted_policy="search_until_budget",
                        schedule=schedule)
    protocol = TagsProtocol(tiny_tokenizer(), cut="official")
    engine = RolloutEngine(protocol, SlowRetriever(0.0), topk=1, cfg=cfg)
    sampler = Recorder(tiny_sampler)
    groups = asyncio.run(engine.rollout(sampler, EXAMPLES, 2, SamplingSettings(temperature=1.0, seed=3)))
    for example, group in zip(EXAMPLES, groups):
        for traj in group:
            kinds = [t.action.kind for t in traj.turns]
            assert kinds == [ActionKind.SEARCH, ActionKind.SEARCH, ActionKind.ANSWER]
            assert traj.num_searches == 2 and traj.end_reason is EndReason.ANSWER
            assert [t.action.query for t in traj.turns[:2]] == [example.question] * 2
            assert all(len(t.sampled_tokens) == 48 for t in traj.turns)
            assert traj.num_action_tokens == 3 * 48
            for turn in traj.turns[:2]:  # the observation follows the turn, unmasked
                start = turn.prompt_len + len(turn.sampled_tokens)
                assert turn.observation_len > 0 and turn.documents[0].id == f"d-{example.question}"
                assert traj.mask_T[start:start + turn.observation_len] == [0] * turn.observation_len
                assert protocol.tokenizer.decode(traj.tokens_T[start:start + turn.observation_len]) \
                    == turn.observation_text
    # every scripted turn's head is what the sampler drew, with the sampler's log-probs
    drawn = {}
    for prompt_len, response in sampler.responses:
        for seq in response.sequences:
            drawn.setdefault(prompt_len, []).append(seq)
    turn = groups[0][0].turns[1]
    action_len = len(tiny_tokenizer().encode(f"<search> {EXAMPLES[0].question} </search>"))
    heads = [s for s in drawn[turn.prompt_len] if list(s.tokens[:10]) == turn.sampled_tokens[:10]]
    assert heads and heads[0].logprobs[:10] == turn.sampled_logprobs[:10]
    assert len(turn.sampled_logprobs) == 48 and action_len < 48


class EosThenTokens:
    """Stops its first reply on EOS (id 1) after two tokens; later replies fill to the limit."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    async def sample_async(self, prompt, num_samples=1, sampling_params=None):
        ints = prompt.to_ints()
        self.calls.append((ints, sampling_params.max_tokens))
        if len(self.calls) == 1:
            seq = SampleSequence(stop_reason="stop", tokens=[5, 6, 1], logprobs=[-0.5, -0.6, -0.1])
        else:
            n = sampling_params.max_tokens
            seq = SampleSequence(stop_reason="length", tokens=[7] * n, logprobs=[-0.7] * n)
        return SampleResponse(sequences=[seq])


def test_early_eos_is_dropped_and_the_row_continued_then_the_tail_overwritten():
    import pytrio

    tok = tiny_tokenizer()
    scripted = ScriptedTurns(TagsProtocol(tok), max_searches=0)  # turn 0 answers
    fake = EosThenTokens()
    params = pytrio.SamplingParams(max_tokens=24, stop=["</answer>"], seed=1)
    out = asyncio.run(scripted.sample(fake, [9, 9], 1, params, "q", 0))
    action = tok.encode("<answer> x </answer>", add_special_tokens=False)
    assert len(action) == 20
    # 2 sampled + EOS dropped, then continued from [9, 9, 5, 6] for the 22 tokens left
    assert fake.calls[1] == ([9, 9, 5, 6], 22)
    (seq,) = out.sequences
    assert seq.tokens == [5, 6, 7, 7] + action
    assert seq.logprobs == [-0.5, -0.6] + [-0.7] * 22
    assert seq.text == tok.decode([5, 6, 7, 7]) + "<answer> x </answer>"


def test_unknown_policy_or_other_protocol_is_refused():
    tags = TagsProtocol(tiny_tokenizer())
    assert check_scripted(None, tags) is None
    with pytest.raises(ValueError, match="valid: null, search_until_budget"):
        check_scripted("always", tags)
    with pytest.raises(ValueError, match="protocol=tags"):
        check_scripted("search_until_budget", object())
