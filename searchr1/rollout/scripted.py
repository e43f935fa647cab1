"""The scripted worst-case policy for benchmarks (``rollout.scripted_policy``).

A random-weight model never writes the protocol's tags, so every trajectory would end after
one invalid turn and a paper-scale benchmark would measure almost nothing. Under
``search_until_budget`` each trajectory is the paper's worst case instead: turn ``k`` (from 0)
is ``<search> question </search>`` while ``k < rollout.max_searches``, then the next turn is
``<answer> x </answer>``; every turn is as long as its request allows (``max_turn_tokens``,
less only where the trajectory's token budget is shorter).

Rule of one turn (``L`` = the request's ``max_tokens``, ``A`` = the action's tokens):

1. sample ``L`` tokens with the real sampler and no stop strings, so the decode cost is that of
   ``L`` sampled tokens; a row that stops early on EOS has the EOS dropped and is continued
   by a further request from its own context until it holds ``L`` sampled tokens;
2. overwrite the last ``len(A)`` tokens with ``A`` (the whole turn is ``A[:L]`` when
   ``L <= len(A)``).

Sampled positions keep the sampler's log-probs; an overwritten position keeps the log-prob the
sampler gave the token it drew there — a stand-in of the right magnitude, since the policy's
log-prob of the forced token would cost a scoring pass. Only the tag protocol is scripted.
"""

from __future__ import annotations


import pytrio
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence

from searchr1.rollout.config import ScriptedPolicy

ANSWER = "x"  # the scripted answer (never correct: rewards stay at the format part only)


def check_scripted(policy: object, protocol) -> ScriptedPolicy | None:
    """The policy as a member (None when unset); ValueError for an unknown value or protocol."""
    if policy is None:
        return None
    try:
        member = ScriptedPolicy(getattr(policy, "value", policy))
    except ValueError:
        valid = ", ".join(m.value for m in ScriptedPolicy)
        raise ValueError(f"rollout.scripted_policy={policy!r} is unknown (valid: null, {valid})") from None
    if type(protocol).__name__ != "TagsProtocol":
        raise ValueError("rollout.scripted_policy needs protocol=tags (it writes <search>/<answer> tags)")
    return member


class ScriptedTurns:
    """Samples a turn with the real sampler and ends it with the scripted action."""

    def __init__(self, protocol, max_searches: int) -> None:
        self.tokenizer = protocol.tokenizer
        self.max_searches = max_searches

    def action_text(self, question: str, turn: int) -> str:
        """The forced action of turn ``turn`` (0-based) of a trajectory for ``question``."""
        if turn < self.max_searches:
            return f"<search> {question.strip() or 'query'} </search>"
        return f"<answer> {ANSWER} </answer>"

    async def sample(self, sampler, prompt: list[int], n: int, params: pytrio.SamplingParams,
                     question: str, turn: int) -> SampleResponse:
        """``n`` scripted sequences for ``prompt`` (the module docstring's rule)."""
        length = int(params.max_tokens)
        free = params.model_copy(update={"stop": []})
        first = await _request(sampler, prompt, n, free)
        action = list(self.tokenizer.encode(self.action_text(question, turn), add_special_tokens=False))
        sequences = []
        for i, seq in enumerate(first.sequences):
            tokens, logprobs = await self._fill(sampler, prompt, seq, length, free, i)
            keep = max(0, length - len(action))
            tokens = tokens[:keep] + action[: length - keep]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            sequences.append(SampleSequence(stop_reason="stop", tokens=tokens, text=text,
                                            logprobs=logprobs[:length]))
        return SampleResponse(sequences=sequences, input_tokens=len(prompt),
                              output_tokens=sum(len(s.tokens) for s in sequences))

    async def _fill(self, sampler, prompt, seq, length: int, params, row: int):
        """Tokens and log-probs of ``seq`` continued past early EOS stops to ``length``."""
        tokens, logprobs = list(seq.tokens), list(seq.logprobs)
        rounds = 0
        while len(tokens) < length and rounds < length:
            if seq.stop_reason == "stop" and tokens:
                tokens.pop(), logprobs.pop()  # the EOS that ended the row
            rounds += 1
            more = params.model_copy(update={"max_tokens": length - len(tokens),
                                             "seed": _refill_seed(params.seed, row, rounds)})
            seq = (await _request(sampler, prompt + tokens, 1, more)).sequences[0]
            tokens += list(seq.tokens)
            logprobs += list(seq.logprobs)
        return tokens[:length], logprobs[:length]


async def _request(sampler, tokens: list[int], n: int, params) -> SampleResponse:
    return await sampler.sample_async(prompt=pytrio.ModelInput.from_ints(list(tokens)),
                                      num_samples=n, sampling_params=params)


def _refill_seed(seed: int | None, row: int, rounds: int) -> int:
    """A distinct 31-bit seed per (request seed, row, refill round)."""
    return ((seed or 0) * 1_000_003 + row * 7919 + rounds) & 0x7FFFFFFF
