"""A sampling request as every local sampler reads it: prompt ids, validated params, row seeds, stops.

``LocalSamplingClient`` (HF decode, slot sampler) and ``VllmSamplingClient`` take the same pytrio
``SamplingParams`` and must agree on what they mean: the same validation errors, the same seed
for sequence ``i`` of a request, the same stop rule (``stops.py``) and the same length cap. This
module is that agreement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pytrio.errors.base import ValidationError
from pytrio.types.forward.model_input import ModelInput
from pytrio.types.sample.sampling_params import SamplingParams

from searchr1.engines.local.sampling.select import RowSampling
from searchr1.engines.local.sampling.stops import StopRule

DEFAULT_MAX_TOKENS = 512  # cap used when a request leaves max_tokens unset
INVALID = "validation.invalid_sampling_request"  # pytrio's error code for bad params


@dataclass(frozen=True)
class RowSpec:
    """One sequence of a request: how to choose its tokens, when it ends, its own seed."""

    sampling: RowSampling
    stop: StopRule
    seed: int  # 63-bit


def prompt_tokens(prompt: ModelInput) -> list[int]:
    """Token ids of a text-only, non-empty prompt."""
    if prompt.has_images:
        raise ValidationError(
            "the local engine does not support image chunks", code="validation.images_unsupported"
        )
    tokens = prompt.to_ints()
    if not tokens:
        raise ValidationError("prompt cannot be empty", code="validation.empty_prompt")
    return tokens


def row_sampling(params: SamplingParams) -> RowSampling:
    """Validate temperature, top-k and top-p."""
    if params.temperature < 0:
        raise ValidationError("temperature must be >= 0", code=INVALID)
    if not 0 < params.top_p <= 1:
        raise ValidationError("top_p must be in (0, 1]", code=INVALID)
    return RowSampling(float(params.temperature), int(params.top_k), float(params.top_p))


def row_seed(seed: int, index: int) -> int:
    """63-bit seed of sequence ``index`` of a request seeded with ``seed``."""
    mixed = np.random.SeedSequence([seed & (2**63 - 1), index]).generate_state(2, dtype=np.uint32)
    return (int(mixed[0]) << 32 | int(mixed[1])) & (2**63 - 1)


def stop_rule(stop: str | Sequence[str] | Sequence[int] | None, eos_ids: frozenset[int],
              decode_raw: Callable[[list[int]], str]) -> StopRule:
    """Stop token ids (plus EOS) or stop strings from ``SamplingParams.stop``."""
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if all(isinstance(s, str) for s in items) and items:
        strings = tuple(s for s in items if s)
        return StopRule(eos_ids, strings, decode_raw)
    if all(isinstance(s, int) for s in items):
        return StopRule(eos_ids | frozenset(items))
    raise ValidationError("sampling_params.stop mixes strings and token ids", code=INVALID)


def row_specs(params: SamplingParams, n: int, eos_ids: frozenset[int],
              decode_raw: Callable[[list[int]], str], fallback_seed: Callable[[], int]) -> list[RowSpec]:
    """The ``n`` rows of a request: validated sampling, the stop rule capped at ``max_tokens``,
    and per-row seeds from the request's seed (or ``fallback_seed()`` when it has none)."""
    if n < 1:
        raise ValidationError("num_samples must be >= 1", code=INVALID)
    sampling = row_sampling(params)
    max_tokens = DEFAULT_MAX_TOKENS if params.max_tokens is None else params.max_tokens
    if max_tokens <= 0:
        raise ValidationError("sampling_params.max_tokens must be > 0", code=INVALID)
    stop = stop_rule(params.stop, eos_ids, decode_raw).capped(max_tokens)
    seed = params.seed if params.seed is not None else fallback_seed()
    return [RowSpec(sampling, stop, row_seed(seed, i)) for i in range(n)]


def too_long(prompt_len: int, max_len: int) -> ValidationError:
    """The error of a prompt that leaves no room to generate in ``engine.max_seq_len``."""
    return ValidationError(f"prompt of {prompt_len} tokens does not fit engine.max_seq_len={max_len}",
                           code=INVALID)


def eos_ids_of(model, tokenizer) -> frozenset[int]:
    """EOS ids from the tokenizer and the model's generation config (int or list)."""
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)  # HF models only; a view may lack it
    for value in (tokenizer.eos_token_id, getattr(generation, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return frozenset(ids)
