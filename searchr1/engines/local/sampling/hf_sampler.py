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
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
from pytrio.errors.base import ValidationError
from pytrio.types.forward.model_input import ModelInput
from pytrio.types.future.api_future import APIFuture
from pytrio.types.sample.sample_response import SampleResponse
from pytrio.types.sample.sample_sequence import SampleSequence
from pytrio.types.sample.sampling_params import SamplingParams

from searchr1.engines.local.sampling.request_queue import Batcher
from searchr1.engines.local.sampling.decode import PromptScores, Row, decode_rows, score_prompts
from searchr1.engines.local.model import LocalEngineConfig
from searchr1.engines.local.sampling.slot_engine import SlotEngine, SlotSeq, WeightsSource
from searchr1.engines.local.sampling import slot_model
from searchr1.engines.local.sampling.prefix_store import PrefixStore
from searchr1.engines.local.sampling.select import RowSampling
from searchr1.engines.local.sampling.stops import StopRule

DEFAULT_MAX_TOKENS = 512  # cap used when a request leaves max_tokens unset
_DEFAULT_PARAMS = SamplingParams()
_INVALID = "validation.invalid_sampling_request"  # pytrio's error code for bad params


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
        weights_version=None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.engine_cfg = engine_cfg or LocalEngineConfig()
        self.stats = SamplerStats()
        self._model_lock = model_lock
        self._versioned = weights_version
        self._weights_version = weights_version or (lambda: 0)
        # turns reuse the KV of the turn before only where the weights' changes are known
        self._prefix = (PrefixStore(self.engine_cfg.prefix_cache_tokens)
                        if weights_version is not None else None)
        self.slots = _slot_engine(model, self.engine_cfg, _eos_ids(model, tokenizer), len(tokenizer))
        self._rng = random.Random(self.engine_cfg.seed)  # seeds for requests without one
        self._pad_id = _pad_id(tokenizer)
        self._eos_ids = _eos_ids(model, tokenizer)
        self._batcher: Batcher[_Request, SampleResponse | list[float | None]] = Batcher(
            run=self._run_batch,
            max_size=self.engine_cfg.max_batch_size,
            window_s=self.engine_cfg.batch_window_ms / 1000.0,
            name="local-sampler",
        )

    def with_model(self, model) -> LocalSamplingClient:
        """A new client on ``model`` with this client's tokenizer and engine config."""
        return LocalSamplingClient(model, self.tokenizer, self.engine_cfg, self._model_lock,
                                   self._weights_version)

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
        if num_samples < 1:
            raise ValidationError("num_samples must be >= 1", code=_INVALID)
        tokens = _prompt_tokens(prompt)
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
        request = _Request(_prompt_tokens(prompt), [], 0, True, False)
        return APIFuture(self._batcher.submit(request, size=1))

    def _rows(self, prompt: list[int], n: int, params: SamplingParams) -> list[Row]:
        """Expand a request into ``n`` rows with validated params and per-row seeds."""
        sampling = _row_sampling(params)
        max_tokens = DEFAULT_MAX_TOKENS if params.max_tokens is None else params.max_tokens
        if max_tokens <= 0:
            raise ValidationError("sampling_params.max_tokens must be > 0", code=_INVALID)
        stop = self._stop_rule(params.stop).capped(max_tokens)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        return [Row(prompt, sampling, stop, seed=_row_seed(seed, i)) for i in range(n)]

    def _sample_slots(self, prompt: list[int], n: int, params: SamplingParams, return_text: bool) -> Future:
        """Queue ``n`` sequences on the slot sampler; the future resolves to a SampleResponse."""
        rows = self._rows(prompt, n, params)
        cap = self.slots.length_cap(len(prompt))
        if cap < 1:
            raise ValidationError(
                f"prompt of {len(prompt)} tokens does not fit engine.max_seq_len="
                f"{self.slots.max_len}", code=_INVALID,
            )
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

    def _stop_rule(self, stop: str | Sequence[str] | Sequence[int] | None) -> StopRule:
        """Stop token ids (plus EOS) or stop strings from ``SamplingParams.stop``."""
        items = [stop] if isinstance(stop, str) else list(stop or [])
        if all(isinstance(s, str) for s in items) and items:
            strings = tuple(s for s in items if s)
            return StopRule(self._eos_ids, strings, self._decode_raw)
        if all(isinstance(s, int) for s in items):
            return StopRule(self._eos_ids | frozenset(items))
        raise ValidationError("sampling_params.stop mixes strings and token ids", code=_INVALID)

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

    def _sequence(self, row: Row, return_text: bool) -> SampleSequence:
        """One finished row as a pytrio ``SampleSequence``."""
        assert row.stop_reason is not None
        text = self.tokenizer.decode(row.tokens, skip_special_tokens=True) if return_text else None
        return SampleSequence(
            stop_reason=row.stop_reason, tokens=row.tokens, text=text, logprobs=row.logprobs
        )


def _prompt_tokens(prompt: ModelInput) -> list[int]:
    """Token ids of a text-only, non-empty prompt."""
    if prompt.has_images:
        raise ValidationError(
            "the local engine does not support image chunks", code="validation.images_unsupported"
        )
    tokens = prompt.to_ints()
    if not tokens:
        raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
    return tokens


def _row_sampling(params: SamplingParams) -> RowSampling:
    """Validate temperature, top-k and top-p."""
    if params.temperature < 0:
        raise ValidationError("temperature must be >= 0", code=_INVALID)
    if not 0 < params.top_p <= 1:
        raise ValidationError("top_p must be in (0, 1]", code=_INVALID)
    return RowSampling(float(params.temperature), int(params.top_k), float(params.top_p))


def _row_seed(seed: int, index: int) -> int:
    """63-bit seed of sequence ``index`` of a request seeded with ``seed``."""
    mixed = np.random.SeedSequence([seed & (2**63 - 1), index]).generate_state(2, dtype=np.uint32)
    return (int(mixed[0]) << 32 | int(mixed[1])) & (2**63 - 1)


_SLOT_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _slot_engine(model, cfg: LocalEngineConfig, eos_ids: frozenset[int],
                 vocab_limit: int = 0) -> SlotEngine | None:
    """The slot sampler serving ``model``'s weights (shared by its policy and base views).

    None when the HF path is configured (``engine.sampler=hf``, or ``auto`` on CPU) or the
    architecture is not one the slot decoder implements.
    """
    if cfg.sampler not in ("auto", "slots", "hf"):
        raise ValueError(f"engine.sampler={cfg.sampler!r}; valid: auto, slots, hf")
    if getattr(cfg, "decode_attention", "grouped") not in ("grouped", "flex"):
        raise ValueError(f"engine.decode_attention={cfg.decode_attention!r}; valid: grouped, flex")
    device = next(model.parameters()).device
    wanted = cfg.sampler == "slots" or (cfg.sampler == "auto" and device.type == "cuda")
    if not wanted:
        return None
    if not slot_model.supports(model):
        if cfg.sampler == "slots":
            raise ValueError("engine.sampler=slots supports llama, qwen2 and qwen3 models only")
        return None
    base, _ = slot_model.unwrap(model)
    engines = _SLOT_ENGINES.setdefault(base, {})
    key = (cfg.kv_slots, cfg.max_seq_len, cfg.cuda_graphs, getattr(cfg, "compile_decode", False),
           getattr(cfg, "compact_decode", False), cfg.sync_every, getattr(cfg, "admit_every", 3),
           getattr(cfg, "compile_prefill", False), getattr(cfg, "prefill_graphs", False),
           getattr(cfg, "decode_attention", "grouped"), eos_ids, vocab_limit)
    if key not in engines:
        dtype = getattr(base, "searchr1_sample_dtype", base.dtype)  # full: bf16 copy of fp32 masters
        engines[key] = SlotEngine(model, cfg, eos_ids, device, dtype, vocab_limit)
    return engines[key]


def slot_engines_of(model) -> list[SlotEngine]:
    """The slot samplers serving ``model``'s weights (for sleeping between phases)."""
    return list(_SLOT_ENGINES.get(slot_model.unwrap(model)[0], {}).values())


def share_slot_engines(model, other) -> None:
    """Let ``other`` (a same-shaped model, e.g. the frozen reference) use ``model``'s slot pools.

    The pool folds whichever weights a request brings, so one pool serves both: no second
    KV cache in GPU memory.
    """
    base, other_base = slot_model.unwrap(model)[0], slot_model.unwrap(other)[0]
    _SLOT_ENGINES[other_base] = _SLOT_ENGINES.setdefault(base, {})


def _pad_id(tokenizer) -> int:
    """Token id used on padded positions (never attended to; any valid id works)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def _eos_ids(model, tokenizer) -> frozenset[int]:
    """EOS ids from the tokenizer and the model's generation config (int or list)."""
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for value in (tokenizer.eos_token_id, getattr(generation, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return frozenset(ids)
