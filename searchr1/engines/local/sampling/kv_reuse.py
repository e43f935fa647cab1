"""The batched KV layout of rows that start from stored prefixes (``prefix_store.py``).

Row ``b`` reuses ``c_b`` cached tokens and prefills the other ``s_b`` of its prompt. The batch
is laid out as ``C = max c_b`` cache columns, each row's cached keys right-aligned in them,
then ``S = max s_b`` prompt columns, each row's rest left-padded in them:

    [pad][cached c_b][pad][rest s_b]   attention mask 0 on both pads

Position ids count each row's real tokens from 0 across both parts, so the rest sits at the
positions it has in the full prompt and the cached keys (rotated at their own positions when
stored) line up: the logits equal a full prefill's up to float rounding. Masked columns hold
zeros (any finite value works: they get zero attention weight).

Shapes: ``_B`` rows, ``_C`` cache columns, ``_S`` prompt columns, ``_L = C + S``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from searchr1.engines.local.sampling.prefix_store import Entry, PrefixStore


def reuse_layout(
    prompts: Sequence[Sequence[int]], reused: Sequence[tuple[int, Entry | None]], pad_id: int,
    device: torch.device, config: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
    """``(ids_BS, mask_BL, positions_BS, cache)``: the rest of every prompt, the mask over
    cache and prompt columns, the rest's position ids, and a cache holding the ``C`` columns."""
    cached = max((n for n, _ in reused), default=0)
    rests = [p[n:] for p, (n, _) in zip(prompts, reused, strict=True)]
    width = max(len(r) for r in rests)
    ids_BS = torch.full((len(rests), width), pad_id, dtype=torch.long)
    mask_BL = torch.zeros((len(rests), cached + width), dtype=torch.long)
    for b, ((n, _), rest) in enumerate(zip(reused, rests, strict=True)):
        ids_BS[b, width - len(rest):] = torch.tensor(rest, dtype=torch.long)
        mask_BL[b, cached - n: cached] = 1
        mask_BL[b, cached + width - len(rest):] = 1
    positions_BS = (mask_BL.cumsum(dim=-1) - 1).clamp_min(0)[:, cached:]
    cache = DynamicCache(config=config)
    if cached:
        for layer, (keys_BHCD, values_BHCD) in enumerate(_cached_columns(reused, cached, device)):
            cache.update(keys_BHCD, values_BHCD, layer)
    return ids_BS.to(device), mask_BL.to(device), positions_BS.to(device), cache


def _cached_columns(reused: Sequence[tuple[int, Entry | None]], cached: int, device: torch.device):
    """Per layer ``(keys_BHCD, values_BHCD)``: each entry's first ``n`` tokens right-aligned."""
    sample = next(e for _, e in reused if e is not None)
    for layer in range(len(sample.keys)):
        heads, _, dim = sample.keys[layer].shape
        shape = (len(reused), heads, cached, dim)
        keys = torch.zeros(shape, dtype=sample.keys[layer].dtype, device=device)
        values = torch.zeros(shape, dtype=sample.values[layer].dtype, device=device)
        for b, (n, entry) in enumerate(reused):
            if entry is not None and n:
                keys[b, :, cached - n:] = entry.keys[layer][:, :n]
                values[b, :, cached - n:] = entry.values[layer][:, :n]
        yield keys, values


def store_rows(store: PrefixStore, cache: DynamicCache, mask_BL: torch.Tensor,
               rows: Sequence[tuple[int, Sequence[int]]]) -> None:
    """``put`` each ``(batch position, tokens)``: the row's first ``len(tokens)`` unmasked
    columns of every layer (later columns are steps it rode along after finishing)."""
    for j, tokens in rows:
        index = mask_BL[j].nonzero().squeeze(-1)[: len(tokens)]
        if len(index) != len(tokens):
            continue  # not all of it was fed through the model
        keys = [layer.keys[j][:, index] for layer in cache.layers]
        values = [layer.values[j][:, index] for layer in cache.layers]
        store.put(list(tokens), keys, values)
