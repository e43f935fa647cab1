"""Seeded next-token selection shared by both samplers: temperature, top-k, top-p, Gumbel-max.

Both decoders (the HF batched decode and the slot sampler) pick tokens with ``select``, so a
seeded request draws the same tokens on either path and on either device, given the same
logits. The slot sampler runs it inside a captured CUDA graph, so it is pure tensor code with
fixed shapes: no Python branching on values and no ``torch.Generator`` per row (a graph
replays one RNG state).

Randomness is **counter based**: the uniform of vocabulary entry ``v`` for a row is a hash of
``(seed, position, v)``, where ``position`` is the index of the token being generated (0 for
the first). A row's token therefore depends only on its own logits, seed and position — never
on which rows share the batch, in what order, or how many decode steps ran before it joined.

Sampling is the Gumbel-max trick: ``argmax(logits / T + g)`` with ``g = -log(-log(u))`` draws
exactly from ``softmax(logits / T)``. Top-k and top-p set the entries outside the kept set to
``-inf`` first (top-p keeps the smallest prefix, in descending order, whose mass reaches ``p``
after the temperature; the top token always survives — as vLLM and HF ``generate``).
``T == 0`` is greedy: the raw argmax.

``vocab_limit`` (the tokenizer's length) keeps the pick among ids the tokenizer can decode: a
checkpoint's embedding table is often padded past it (Qwen2.5: 151,936 rows, 151,665 tokens),
and a model that puts mass on those rows (a random-weight one does) would emit ids no
tokenizer or server accepts. The returned log-prob stays over the full table, as the trainer
computes it.

The hash is murmur3's 32-bit finaliser on int64 tensors masked to 32 bits (int64 products of
two 32-bit numbers wrap, and the low 32 bits of a wrapped product are exact), so CPU and CUDA
give bit-identical uniforms.

Shapes: ``_B`` rows, ``_V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1
_MIX_V = 0x27D4EB2F
_KEY_SALT = 0x6A09E667


@dataclass(frozen=True)
class RowSampling:
    """Sampling parameters of one sequence; ``temperature == 0`` means greedy."""

    temperature: float = 1.0
    top_k: int = -1  # <= 0 disables top-k
    top_p: float = 1.0  # 1.0 disables nucleus filtering

    @property
    def filtered(self) -> bool:
        """Whether top-k or top-p truncates a sampled (non-greedy) distribution."""
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0)


def row_tensors(
    params: Sequence[RowSampling], seeds: Sequence[int], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(temperature_B, top_k_B, top_p_B, seeds_B)`` of rows, as ``select`` takes them."""
    return (
        torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
        torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        torch.tensor(list(seeds), dtype=torch.int64, device=device),
    )


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser on non-negative int64 values below 2**32."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def row_keys(seeds_B: torch.Tensor, positions_B: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from its 63-bit seed and its position (int64 tensors)."""
    lo, hi = seeds_B & _M32, (seeds_B >> 32) & _M32
    key = fmix32(lo ^ fmix32((hi + positions_B * _GOLDEN) & _M32))
    return fmix32((key + _KEY_SALT) & _M32)


def unit_interval(h: torch.Tensor) -> torch.Tensor:
    """32-bit hashes → float32 in (0, 1): the top 23 bits, centred in their bin.

    23 bits keep ``bits + 0.5`` exact in float32, so the largest value is ``1 - 2**-24``
    (24 bits would round it up to 1.0, an infinite Gumbel draw that wins regardless of logits).
    """
    return ((h >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def uniforms(seeds_B: torch.Tensor, positions_B: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[B, V]`` float32 uniforms strictly inside (0, 1), a pure function of the inputs."""
    v_V = torch.arange(vocab, device=seeds_B.device, dtype=torch.int64)
    h_BV = fmix32(row_keys(seeds_B, positions_B)[:, None] ^ ((v_V * _MIX_V) & _M32)[None, :])
    return unit_interval(h_BV)


def filter_logits(logits_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor) -> torch.Tensor:
    """``logits_BV`` with entries outside each row's top-k / top-p set replaced by ``-inf``.

    ``top_k_B <= 0`` keeps every entry; ``top_p_B >= 1`` disables nucleus filtering. The
    nucleus is measured on the logits as given (the caller divides by the temperature first).
    """
    vocab = logits_BV.shape[-1]
    sorted_BV, order_BV = torch.sort(logits_BV, dim=-1, descending=True)
    ranks_V = torch.arange(vocab, device=logits_BV.device)
    k_B = torch.where(top_k_B > 0, top_k_B, torch.full_like(top_k_B, vocab))
    drop_BV = ranks_V[None, :] >= k_B[:, None]
    probs_BV = torch.softmax(sorted_BV.masked_fill(drop_BV, float("-inf")), dim=-1)
    mass_before_BV = probs_BV.cumsum(dim=-1) - probs_BV
    nucleus_B1 = (top_p_B < 1.0)[:, None]  # p = 1 drops nothing, even where cumsum rounds to 1
    drop_BV = drop_BV | (nucleus_B1 & (mass_before_BV >= top_p_B[:, None]))
    drop_BV[:, 0] = False  # the top token always survives
    dropped_BV = torch.zeros_like(drop_BV).scatter(-1, order_BV, drop_BV)
    return logits_BV.masked_fill(dropped_BV, float("-inf"))


def select(
    logits_BV: torch.Tensor,
    temperature_B: torch.Tensor,
    top_k_B: torch.Tensor,
    top_p_B: torch.Tensor,
    seeds_B: torch.Tensor,
    positions_B: torch.Tensor,
    filtered: bool,
    vocab_limit: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns ``(tokens_B, raw_logprobs_B)``.

    ``raw_logprobs_B`` is log-softmax of the unmodified logits (temperature 1, no truncation)
    at the chosen token: the distribution a trainer recomputes, so a sampler/trainer mismatch
    measures numerics only. ``filtered`` selects the top-k/top-p path (a sort per step); pass
    False when no row truncates (it is a Python flag so a captured graph has no branch).
    ``vocab_limit > 0`` picks among the first ``vocab_limit`` ids only (a Python int too).
    """
    logits_BV = logits_BV.float()
    vocab = logits_BV.shape[-1]
    kept_BV = logits_BV[:, :vocab_limit] if 0 < vocab_limit < vocab else logits_BV
    greedy_B = temperature_B <= 0
    safe_t_B = torch.where(greedy_B, torch.ones_like(temperature_B), temperature_B)
    scaled_BV = kept_BV / safe_t_B[:, None]
    if filtered:
        scaled_BV = filter_logits(scaled_BV, top_k_B, top_p_B)
    u_BV = uniforms(seeds_B, positions_B, kept_BV.shape[-1])
    sampled_B = (scaled_BV - torch.log(-torch.log(u_BV))).argmax(dim=-1)
    tokens_B = torch.where(greedy_B, kept_BV.argmax(dim=-1), sampled_B)
    picked_B = logits_BV.gather(-1, tokens_B[:, None]).squeeze(-1)
    return tokens_B, picked_B - torch.logsumexp(logits_BV, dim=-1)
