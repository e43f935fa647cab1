"""Token selection for the slot sampler: per-row temperature / top-k / top-p / seed, no host sync.

The slot sampler decodes every slot of its pool in one captured CUDA graph, so selection must be
pure tensor code with fixed shapes: no Python branching on values, no ``torch.Generator`` per row
(a graph replays one RNG state). Randomness is therefore *counter based*: the uniform number of
vocabulary entry ``v`` for a row is a hash of ``(seed_row, counter_row, v)``, where ``counter``
is the index of the token being generated. A row's tokens depend only on its own logits, seed and
position in its generation — never on which other rows share the batch or on how many decode
steps ran before it was admitted — so a seeded request is reproducible, and a plain reference
decode (tests) reproduces it token for token.

Sampling is the Gumbel-max trick: ``argmax(logits / T + g)`` with ``g = -log(-log(u))`` draws
exactly from ``softmax(logits / T)``. Top-k and top-p set the logits outside the kept set to
``-inf`` first (top-p keeps the smallest prefix, in descending order, whose mass reaches ``p``;
the top token always survives — as vLLM and HF ``generate``). ``T == 0`` is greedy.

The hash is murmur3's 32-bit finaliser on int64 tensors masked to 32 bits (int64 products of
two 32-bit numbers wrap, and the low 32 bits of a wrapped product are exact), so CPU and CUDA
give identical uniforms.

Shapes: ``_B`` rows, ``_V`` vocabulary.
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1
_MIX_V = 0x27D4EB2F


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser on non-negative int64 values below 2**32."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def row_keys(seeds_B: torch.Tensor, counters_B: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from its 63-bit seed and its token counter (int64 tensors)."""
    lo, hi = seeds_B & _M32, (seeds_B >> 32) & _M32
    key = fmix32(lo ^ fmix32((hi + counters_B * _GOLDEN) & _M32))
    return fmix32((key + 0x6A09E667) & _M32)


def uniforms(seeds_B: torch.Tensor, counters_B: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B, V]`` float32 uniforms strictly inside (0, 1), a pure function of the inputs."""
    v_V = torch.arange(vocab, device=seeds_B.device, dtype=torch.int64)
    h_BV = fmix32(row_keys(seeds_B, counters_B)[:, None] ^ ((v_V * _MIX_V) & _M32)[None, :])
    return ((h_BV >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def filter_logits(logits_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor) -> torch.Tensor:
    """``logits_BV`` with entries outside each row's top-k / top-p set replaced by ``-inf``.

    ``top_k_B <= 0`` keeps every entry; ``top_p_B >= 1`` disables nucleus filtering. The
    temperature is applied before the nucleus is measured (the caller divides first).
    """
    vocab = logits_BV.shape[-1]
    sorted_BV, order_BV = torch.sort(logits_BV, dim=-1, descending=True)
    ranks_V = torch.arange(vocab, device=logits_BV.device)
    k_B = torch.where(top_k_B > 0, top_k_B, torch.full_like(top_k_B, vocab))
    drop_BV = ranks_V[None, :] >= k_B[:, None]
    probs_BV = torch.softmax(sorted_BV.masked_fill(drop_BV, float("-inf")), dim=-1)
    mass_before_BV = probs_BV.cumsum(dim=-1) - probs_BV
    drop_BV = drop_BV | (mass_before_BV >= top_p_B[:, None])
    drop_BV[:, 0] = False  # the top token always survives
    dropped_BV = torch.zeros_like(drop_BV).scatter(-1, order_BV, drop_BV)
    return logits_BV.masked_fill(dropped_BV, float("-inf"))


def select_tokens(
    logits_BV: torch.Tensor,
    temperature_B: torch.Tensor,
    top_k_B: torch.Tensor,
    top_p_B: torch.Tensor,
    seeds_B: torch.Tensor,
    counters_B: torch.Tensor,
    filtered: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns ``(tokens_B, raw_logprobs_B)``.

    ``raw_logprobs_B`` is log-softmax of the unmodified logits (temperature 1, no truncation)
    at the chosen token: the distribution a trainer recomputes, so a sampler/trainer mismatch
    measures numerics only. ``filtered`` selects the top-k/top-p path (a sort per step); pass
    False when no row truncates.
    """
    logits_BV = logits_BV.float()
    greedy_B = temperature_B <= 0
    scaled_BV = logits_BV / torch.where(greedy_B, torch.ones_like(temperature_B), temperature_B)[:, None]
    if filtered:
        scaled_BV = filter_logits(scaled_BV, top_k_B, top_p_B)
    u_BV = uniforms(seeds_B, counters_B, logits_BV.shape[-1])
    sampled_B = (scaled_BV - torch.log(-torch.log(u_BV))).argmax(dim=-1)
    tokens_B = torch.where(greedy_B, logits_BV.argmax(dim=-1), sampled_B)
    picked_B = logits_BV.gather(-1, tokens_B[:, None]).squeeze(-1)
    return tokens_B, picked_B - torch.logsumexp(logits_BV, dim=-1)
