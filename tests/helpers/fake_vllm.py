"""A fake of vLLM at the boundary the sampler uses (``searchr1/engines/local/sampling/vllm_api.py``).

``FakeVllmApi`` has ``VllmApi``'s methods; its engine (``FakeLLMEngine``) keeps vLLM's contract
as the sampler relies on it: requests added with token-id prompts and per-request params,
``step()`` advancing every running request by one token and returning the finished ones, stop
ids and stop strings ending a request (the completing token kept), ``max_tokens`` ending it with
"length", a prefix cache that serves a prompt's known prefix, ``sleep``/``wake_up`` by tags and
in-place weight loads. Its "model" draws token ``t`` of a sequence from the request's seed, the
position and the loaded weights' version, so a weight update shows in the next sample and the
same seed gives the same tokens whatever the batch. Every call is logged in ``calls``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from searchr1.engines.local.sampling.vllm_api import Completion


@dataclass
class _Running:
    rid: str
    prompt: list[int]
    params: SimpleNamespace
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached: int = 0


class FakeLLMEngine:
    """vLLM's ``LLMEngine`` as far as the sampler's worker calls it."""

    def __init__(self, api: "FakeVllmApi") -> None:
        self.api = api
        self.running: dict[str, _Running] = {}
        self.weights_version: int | None = None  # None: dummy weights (never pushed)
        self.asleep_tags: set[str] = set()
        self.prefix: set[tuple[int, ...]] = set()
        self.fail_next_step = False

    def add_request(self, rid: str, prompt: dict, params: SimpleNamespace) -> None:
        tokens = list(prompt["prompt_token_ids"])
        cached = max((n for n in range(len(tokens), 0, -1) if tuple(tokens[:n]) in self.prefix), default=0)
        self.running[rid] = _Running(rid, tokens, params, cached=cached)
        self.api.calls.append(("add", rid))

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def step(self) -> list[SimpleNamespace]:
        if self.asleep_tags:
            raise RuntimeError("fake vLLM: stepped while asleep")
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("fake vLLM: device error")
        self.api.steps += 1
        time.sleep(self.api.step_delay)
        finished = []
        for run in list(self.running.values()):
            token = self.api.draw(run.params.seed, run.prompt, len(run.tokens), self.weights_version)
            run.tokens.append(token)
            run.logprobs.append(-0.01 * (token % 97) - 0.5)
            reason = self._ending(run)
            if reason is not None:
                del self.running[run.rid]
                self.prefix.add(tuple(run.prompt + run.tokens))
                finished.append(SimpleNamespace(request_id=run.rid, finished=True, reason=reason, run=run))
        return finished

    def _ending(self, run: _Running) -> str | None:
        p = run.params
        if run.tokens[-1] in p.stop_token_ids:
            return "stop"
        if p.stop and p.detokenize:
            text = self.api.decode(run.tokens)
            if any(s in text for s in p.stop):
                return "stop"
        return "length" if len(run.tokens) >= p.max_tokens else None

    def abort_request(self, rids: list[str]) -> None:
        for rid in rids:
            self.running.pop(rid, None)
        self.api.calls.append(("abort", tuple(rids)))

    def sleep(self, level: int = 1) -> None:
        self.asleep_tags = {"weights", "kv_cache"}
        if level == 2:
            self.weights_version = -1  # the weights are gone: garbage until loaded again
        self.api.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.asleep_tags -= set(tags or ["weights", "kv_cache"])
        self.api.calls.append(("wake_up", tuple(tags or ())))

    def reset_prefix_cache(self) -> bool:
        self.prefix.clear()
        self.api.calls.append(("reset_prefix_cache",))
        return True


class FakeVllmApi:
    """``VllmApi``'s methods over ``FakeLLMEngine``."""

    version = "fake"

    def __init__(self, vocab: int = 50, decode=None) -> None:
        self.vocab = vocab
        self.decode = decode or (lambda ids: " ".join(map(str, ids)))
        self.calls: list[tuple] = []
        self.steps = 0
        self.step_delay = 0.0  # seconds a step takes (a slower engine keeps requests in flight)
        self.args: dict | None = None
        self.engine: FakeLLMEngine | None = None

    def open_engine(self, args: dict) -> FakeLLMEngine:
        self.args = args
        self.engine = FakeLLMEngine(self)
        return self.engine

    def sampling_params(self, **kw) -> SimpleNamespace:
        return SimpleNamespace(**kw)

    @staticmethod
    def prompt(tokens: list[int]) -> dict:
        return {"prompt_token_ids": tokens}

    def completion(self, output) -> Completion:
        run = output.run
        return Completion(output.request_id, list(run.tokens), list(run.logprobs), output.reason, run.cached)

    def load_weights(self, engine: FakeLLMEngine, weights) -> None:
        if engine.asleep_tags & {"weights"}:
            raise RuntimeError("fake vLLM: weights loaded while their memory is asleep")
        named = dict(weights)
        engine.weights_version = int(sum(float(t.sum()) for t in named.values()) * 1000) % 10_007
        self.calls.append(("load_weights", len(named)))

    def draw(self, seed: int | None, prompt: list[int], position: int, weights: int | None) -> int:
        """The fake model: a token from (seed, prompt, position, weights) only."""
        rng = random.Random(hash((seed if seed is not None else -1, tuple(prompt), position, weights)))
        return rng.randrange(1, self.vocab)
