"""Small fakes for rollout tests: a char-level protocol, a scripted sampler, a slow retriever."""

from __future__ import annotations

import asyncio
import re
import time

from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence

from searchr1.protocols.base import Action, ActionKind, Observation, Protocol
from searchr1.retrievers.base import Document, Retriever


def enc(text: str) -> list[int]:
    return [ord(c) for c in text]


def dec(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


class CharProtocol(Protocol):
    """``S:query;`` searches, ``A:answer;`` answers; observations are ``[doc ids]``."""

    stop = [";"]

    def initial_prompt(self, question: str) -> list[int]:
        return enc(f"Q:{question}|")

    def parse_action(self, text: str) -> Action:
        m = re.match(r"^([SA]):(.*);$", text)
        if not m:
            return Action(ActionKind.INVALID, error="no action")
        if m.group(1) == "S":
            return Action(ActionKind.SEARCH, query=m.group(2))
        return Action(ActionKind.ANSWER, answer=m.group(2))

    def observation_tokens(self, sampled, observation: Observation, max_tokens: int):
        if observation.invalid:
            text = "[invalid]"
        elif observation.error:
            text = "[error]"
        else:
            text = "[" + ",".join(d.id for d in observation.documents) + "]"
        return enc(text)[:max_tokens], text[:max_tokens]

    def final_answer(self, turn_texts):
        for t in reversed(turn_texts):
            a = self.parse_action(t)
            if a.kind is ActionKind.ANSWER:
                return a.answer
        return None

    def is_valid_format(self, turn_texts, observations=None) -> bool:
        return all(self.parse_action(t).kind is not ActionKind.INVALID for t in turn_texts)


class ScriptedSampler:
    """Replies from a script: ``script(prompt_text, sample_index) -> reply text``.

    Every sampled token gets logprob −(its position in the reply + 1)/10 so tests can
    check logprobs travel to the right places. Records every call.
    """

    def __init__(self, script, delay: float = 0.0) -> None:
        self.script = script
        self.delay = delay
        self.calls: list[tuple[str, int]] = []

    async def sample_async(self, prompt, num_samples=1, sampling_params=None):
        text = dec(prompt.to_ints())
        self.calls.append((text, num_samples))
        if self.delay:
            await asyncio.sleep(self.delay)
        seqs = []
        for i in range(num_samples):
            reply = self.script(text, i)
            limit = sampling_params.max_tokens if sampling_params else None
            stop_reason = "stop"
            if limit is not None and len(reply) > limit:
                reply, stop_reason = reply[:limit], "length"
            toks = enc(reply)
            seqs.append(
                SampleSequence(
                    stop_reason=stop_reason,
                    tokens=toks,
                    text=reply,
                    logprobs=[-(k + 1) / 10 for k in range(len(toks))],
                )
            )
        return SampleResponse(sequences=seqs)


class SlowRetriever(Retriever):
    """Returns one document per query after ``delay`` seconds; logs (start, end) times."""

    def __init__(self, delay: float = 0.05, fail_on: str | None = None) -> None:
        super().__init__()
        self.delay = delay
        self.fail_on = fail_on
        self.spans: list[tuple[float, float]] = []

    async def _search(self, queries, topk):
        start = time.perf_counter()
        await asyncio.sleep(self.delay)
        self.spans.append((start, time.perf_counter()))
        if self.fail_on is not None and self.fail_on in queries:
            raise RuntimeError("backend down")
        return [[Document(id=f"d-{q}", title=q, text=f"about {q}")] for q in queries]
