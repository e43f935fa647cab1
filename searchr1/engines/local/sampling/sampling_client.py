"""``LocalSamplingClient``: PyTRIO's sampling surface, served in-process by torch.

The rollout code talks to ``pytrio.SamplingClient``; this class answers the same calls
(``sample_async``, ``sample``, ``compute_logprobs_async``, ``compute_logprobs``,
``get_tokenizer``) with pytrio's own response types, from a local transformers model.

Concurrent requests are packed into shared forward passes: each call becomes a job on a
``Batcher`` queue; one worker thread gathers jobs for ``batch_window_ms`` (up to
``max_batch_size`` sequences), decodes all their sequences together (``decode_rows``) and
resolves the callers' futures, while their event loop stays free for searches.

Two decoders serve ``sample``: the **slot sampler** (``slot_engine.py``: a fixed pool of KV
slots, continuous batching, prefix reuse across turns, CUDA-graph decode; the default on CUDA for
Llama-family models) and the **HF batched decode** below (``decode.py``; the default on CPU,
where a fixed-shape pool would compute idle slots for nothing; a turn reuses the KV of the
turn before it through ``prefix_store.py`` when the client is given ``weights_version``).
``engine.sampler`` chooses.
``compute_logprobs`` always runs the HF model (batched prompt scoring).

Departures from the remote service, on purpose:
- ``max_tokens=None`` means ``DEFAULT_MAX_TOKENS`` instead of an error.
- logprobs are the raw model's (temperature 1, no top-k/top-p), see ``sample_async``.
- ``seed`` makes a request reproducible whatever it is batched with, and on either decoder:
  sequence ``i`` of a request draws with its own seed derived from ``(seed, i)``, through the
  counter-based selection both decoders share (``select.py``).
"""

from __future__ import annotations

import random
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
from pytrio.types.forward.model_input import ModelInput
from pytrio.types.future.api_future import APIFuture
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence
from pytrio.types.sample.sampling_params import SamplingParams

from searchr1.engines.local.sampling.request_queue import Batcher
from searchr1.engines.local.sampling.decode import PromptScores, Row, decode_rows, score_prompts
from searchr1.engines.local.model import LocalEngineConfig
from searchr1.engines.local.sampling import slot_model
from searchr1.engines.local.sampling.slot_engine import SlotEngine, SlotSeq, WeightsSource
from searchr1.engines.local.sampling.prefix_store import PrefixStore
from searchr1.engines.local.sampling.requests import (eos_ids_of, prompt_tokens, row_specs, stop_rule,
                                                      too_long)

_DEFAULT_PARAMS = SamplingParams()


@dataclass
class SamplerStats:
    """Counters of the work done, for tests and benchmarks (written by the worker only)."""

    batches: int = 0  # batched runs of the worker (one per packed batch)
    decode_calls: int = 0  # batched decode loops (a batch above max_batch_size needs several)
    forward_passes: int = 0  # model forward passes, prefill and decode steps together
    requests: int = 0  # jobs served
    rows: int = 0  # sequences decoded
    tokens: int = 0  # tokens picked so far, counted at every decode step (progress bars read it)


@dataclass
class _Request:
    """A validated request as the worker sees it."""

    prompt: list[int]
    rows: list[Row]  # empty for compute_logprobs
    topk_prompt_logprobs: int
    score_prompt: bool
    return_text: bool


class LocalSamplingClient:
    """In-process stand-in for ``pytrio.SamplingClient`` with request batching.

    ``model`` is held by reference: a peft model whose adapters the trainer updates (or
    disables) is sampled as it is at the moment each batch runs. Pass a shared
    ``threading.Lock``-like ``model_lock`` if another thread may mutate the weights
    while a batch decodes.
    """

    def __init__(
        self, model, tokenizer, engine_cfg: LocalEngineConfig | None = None, model_lock=None,
        weights_version=None, slots: SlotEngine | None | str = "own",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.engine_cfg = engine_cfg or LocalEngineConfig()
        self.stats = SamplerStats()
        self._model_lock = model_lock
        self._weights_version = weights_version or (lambda: 0)
        # turns reuse the KV of the turn before only where the weights' changes are known
        self._prefix = (PrefixStore(self.engine_cfg.prefix_cache_tokens)
                        if weights_version is not None else None)
        self._eos_ids = eos_ids_of(model, tokenizer)
        # the slot sampler: the service's pool hands one in (or None for the HF decode); a client
        # made on its own ("own") builds one when the config asks for it (tests, benchmarks)
        self.slots = build_slot_engine(model, self.engine_cfg, self._eos_ids, len(tokenizer)) \
            if slots == "own" else slots
        self._rng = random.Random(self.engine_cfg.seed)  # seeds for requests without one
        self._pad_id = _pad_id(tokenizer)
        self._batcher: Batcher[_Request, SampleResponse | list[float | None]] = Batcher(
            run=self._run_batch,
            max_size=self.engine_cfg.max_batch_size,
            window_s=self.engine_cfg.batch_window_ms / 1000.0,
            name="local-sampler",
        )

    def get_tokenizer(self):
        """The tokenizer of the sampled model."""
        return self.tokenizer

    def close(self) -> None:
        """Stop the worker thread after the queued requests (it is a daemon anyway)."""
        self._batcher.close()

    async def sample_async(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = _DEFAULT_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> SampleResponse:
        """Generate ``num_samples`` sequences continuing ``prompt``.

        ``SampleSequence.logprobs`` are log-softmax of the raw model logits (temperature 1,
        no top-p/top-k truncation) at each sampled token: the distribution the trainer
        computes, so a sampler/trainer logprob mismatch measures numerics only. Sequences
        end with stop_reason "stop" on a stop token id, a stop string (matched on the
        decoded generation; the completing token is included) or EOS, and "length" at
        ``max_tokens``. ``text`` is decoded without special tokens.
        """
        return await self.sample(
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            topk_prompt_logprobs,
            return_text,
        )

    def sample(
        self,
        prompt: ModelInput,
        num_samples: int = 1,
        sampling_params: SamplingParams = _DEFAULT_PARAMS,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        return_text: bool = True,
    ) -> APIFuture[SampleResponse]:
        """Queue a sampling request; the future's ``.result()`` (or ``await``) gives the response."""
        tokens = prompt_tokens(prompt)
        score = include_prompt_logprobs or topk_prompt_logprobs > 0
        if self.slots is not None and not score:
            return APIFuture(self._sample_slots(tokens, num_samples, sampling_params, return_text))
        rows = self._rows(tokens, num_samples, sampling_params)
        request = _Request(tokens, rows, max(0, topk_prompt_logprobs), score, return_text)
        return APIFuture(self._batcher.submit(request, size=num_samples))

    async def compute_logprobs_async(self, prompt: ModelInput) -> list[float | None]:
        """Logprob of each prompt token under the model; the first is None (no prefix)."""
        return await self.compute_logprobs(prompt)

    def compute_logprobs(self, prompt: ModelInput) -> APIFuture[list[float | None]]:
        """Queue a prompt-scoring request; it is batched with concurrent sampling requests."""
        request = _Request(prompt_tokens(prompt), [], 0, True, False)
        return APIFuture(self._batcher.submit(request, size=1))

    def _rows(self, prompt: list[int], n: int, params: SamplingParams) -> list[Row]:
        """Expand a request into ``n`` rows with validated params and per-row seeds."""
        specs = row_specs(params, n, self._eos_ids, self._decode_raw, lambda: self._rng.getrandbits(63))
        return [Row(prompt, r.sampling, r.stop, seed=r.seed) for r in specs]

    def _sample_slots(self, prompt: list[int], n: int, params: SamplingParams, return_text: bool) -> Future:
        """Queue ``n`` sequences on the slot sampler; the future resolves to a SampleResponse."""
        rows = self._rows(prompt, n, params)
        cap = self.slots.length_cap(len(prompt))
        if cap < 1:
            raise too_long(len(prompt), self.slots.max_len)
        tokens = np.asarray(prompt, dtype=np.int64)
        seqs = [
            SlotSeq(tokens, r.sampling, r.seed, r.stop.capped(min(r.stop.max_tokens, cap)))
            for r in rows
        ]
        source = WeightsSource(self.model, self._weights_version, self._model_lock)
        done: Future = Future()

        def respond(inner: Future) -> None:
            if done.cancelled():  # the caller gave up (e.g. a sibling request of a gather failed)
                return
            if inner.exception() is not None:
                done.set_exception(inner.exception())
                return
            sequences = [
                SampleSequence(
                    stop_reason=s.stop_reason, tokens=s.tokens, logprobs=s.logprobs,
                    text=self.tokenizer.decode(s.tokens, skip_special_tokens=True) if return_text else None,
                )
                for s in inner.result()
            ]
            done.set_result(SampleResponse(sequences=sequences, input_tokens=len(prompt),
                                           output_tokens=sum(len(s.tokens) for s in sequences)))

        self.slots.submit(seqs, source).add_done_callback(respond)
        return done

    def _decode_raw(self, tokens: list[int]) -> str:
        """Decode with special tokens kept, so stop strings can match them too."""
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def _run_batch(self, requests: list[_Request]) -> list[SampleResponse | list[float | None]]:
        """Worker side: score prompts, decode every row in chunks, build the responses."""
        with self._model_lock or nullcontext():
            scores = self._score([r for r in requests if r.score_prompt])
            rows = [row for r in requests for row in r.rows]
            size = self.engine_cfg.max_batch_size
            if self._prefix is not None:
                self._prefix.sync(self._weights_version())
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                self.stats.forward_passes += decode_rows(
                    self.model, chunk, self._pad_id, len(self.tokenizer), self._prefix,
                    on_step=self._count_tokens)
                self.stats.decode_calls += 1
        self.stats.batches += 1
        self.stats.requests += len(requests)
        self.stats.rows += len(rows)
        return [self._respond(r, scores.get(id(r))) for r in requests]

    def _count_tokens(self, n: int) -> None:
        self.stats.tokens += n

    def _score(self, requests: list[_Request]) -> dict[int, PromptScores]:
        """Prompt logprobs for the requests that asked, in one padded pass."""
        if not requests:
            return {}
        topk = max(r.topk_prompt_logprobs for r in requests)
        results = score_prompts(self.model, [r.prompt for r in requests], self._pad_id, topk)
        self.stats.forward_passes += 1
        return {id(r): s for r, s in zip(requests, results, strict=True)}

    def _respond(
        self, request: _Request, scores: PromptScores | None
    ) -> SampleResponse | list[float | None]:
        """The pytrio response of one request (a bare logprob list for compute_logprobs)."""
        if not request.rows:
            assert scores is not None
            return scores.logprobs
        sequences = [self._sequence(row, request.return_text) for row in request.rows]
        response = SampleResponse(
            sequences=sequences,
            input_tokens=len(request.prompt),
            output_tokens=sum(len(s.tokens) for s in sequences),
        )
        if scores is not None:
            response.prompt_logprobs = scores.logprobs
            k = request.topk_prompt_logprobs
            if k > 0:
                response.topk_prompt_logprobs = [t if t is None else t[:k] for t in scores.topk]
        return response

    def tokens_picked(self) -> int:
        """Tokens picked so far, counted per decode step (``engines.base.CountsTokens``)."""
        return self.stats.tokens

    def _sequence(self, row: Row, return_text: bool) -> SampleSequence:
        """One finished row as a pytrio ``SampleSequence``."""
        assert row.stop_reason is not None
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True) if return_text else None
        return SampleSequence(
            stop_reason=row.stop_reason, tokens=row.tokens, text=text, logprobs=row.logprobs
        )


def build_slot_engine(model, cfg: LocalEngineConfig, eos_ids: frozenset[int],
                      vocab_limit: int = 0) -> SlotEngine | None:
    """A slot sampler for ``model``'s weights, or None where the HF decode serves.

    ``engine.sampler=slots`` wants one (an error for an architecture the slot decoder lacks);
    ``auto`` takes one on CUDA for a supported architecture; ``hf`` and ``vllm`` take none.
    """
    device = next(model.parameters()).device
    wanted = cfg.sampler == "slots" or (cfg.sampler == "auto" and device.type == "cuda")
    if not wanted:
        return None
    if not slot_model.supports(model):
        if cfg.sampler == "slots":
            raise ValueError("engine.sampler=slots supports llama, qwen2 and qwen3 models only")
        return None
    base, _ = slot_model.unwrap(model)
    dtype = getattr(base, "searchr1_sample_dtype", base.dtype)  # full: bf16 copy of fp32 masters
    return SlotEngine(model, cfg, eos_ids, device, dtype, vocab_limit)


def _pad_id(tokenizer) -> int:
    """Token id used on padded positions (never attended to; any valid id works)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0
