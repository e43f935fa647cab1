"""Prefill chunks (``engine.prefill_graphs``): padded shapes, and padding that changes no key."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.sampling.prefill import (PrefillGraphs, chunks, power_of_two, rows_bucket,
                                                     run_eager, width_bucket)
from searchr1.engines.local.sampling.slot_model import KVCache, SlotWeights
from searchr1.engines.local.sampling.slot_types import SlotStats

MAX_LEN = 96


def rows_of(lengths: list[int], seed: int = 0) -> list[tuple[int, np.ndarray, int]]:
    """Rows ``(slot, new tokens, first position)``: slot i gets ``lengths[i]`` tokens at 3 + i."""
    rng = np.random.default_rng(seed)
    return [(i, rng.integers(1, 50, n).astype(np.int64), 3 + i) for i, n in enumerate(lengths)]


def test_power_of_two_rounds_up_from_a_floor():
    assert [power_of_two(n) for n in (1, 2, 3, 8, 9)] == [1, 2, 4, 8, 16]
    assert power_of_two(5, 16) == 16 and power_of_two(17, 16) == 32


def test_buckets_are_powers_of_two_then_multiples():
    assert [width_bucket(n) for n in (1, 16, 17, 100, 128, 129, 300, 384, 385)] == \
        [16, 16, 32, 128, 128, 256, 384, 384, 512]
    assert [rows_bucket(n) for n in (1, 3, 5, 8, 9, 17, 24)] == [1, 4, 8, 8, 16, 24, 24]


def test_padded_chunks_have_bucketed_shapes_and_write_padding_to_scratch():
    rows = rows_of([5, 20, 3])
    (chunk,) = chunks(rows, MAX_LEN, padded=True)
    assert chunk.ids.shape == (4, 32)  # 3 rows → 4, longest 20 → 32
    assert chunk.tokens == 28
    by_slot = {slot: (tokens, start) for slot, tokens, start in rows}
    for r, slot in enumerate(chunk.slots[:3]):
        tokens, start = by_slot[int(slot)]
        k = len(tokens)
        assert chunk.ids[r, :k].tolist() == tokens.tolist()
        assert chunk.write[r, :k].tolist() == list(range(start, start + k))
        assert (chunk.write[r, k:] == MAX_LEN).all()  # padded positions: the scratch column
        assert (chunk.pos[r, k:] == start + k - 1).all()
    assert chunk.slots[0] == 1  # longest first
    assert chunk.slots[3] == chunk.slots[0] and (chunk.write[3] == MAX_LEN).all()  # padded row
    assert chunk.length == min(128, MAX_LEN)


def test_unpadded_chunks_keep_exact_shapes():
    (chunk,) = chunks(rows_of([5, 20, 3]), MAX_LEN, padded=False)
    assert chunk.ids.shape == (3, 20) and chunk.tokens == 28


@pytest.mark.parametrize("padded", [False, True])
def test_a_round_over_the_budget_is_cut_and_every_token_is_written_once(padded):
    lengths = [9, 30, 17, 2, 25, 30, 1, 12]
    parts = list(chunks(rows_of(lengths), MAX_LEN, padded, budget=64))
    assert len(parts) > 1
    assert all(c.ids.size <= 64 for c in parts)
    written = [(int(c.slots[r]), int(col)) for c in parts for r in range(len(c.slots))
               for col in c.write[r] if col != MAX_LEN]
    assert len(written) == len(set(written)) == sum(lengths) == sum(c.tokens for c in parts)


def test_many_wide_rows_fill_chunks_of_a_row_bucket_within_the_budget():
    parts = list(chunks(rows_of([300] * 70), 2048, padded=True, budget=16_384))
    assert [c.ids.shape for c in parts] == [(40, 384), (32, 384)]  # 16,384 // 384 = 42 → 40; 30 → 32
    assert [c.tokens for c in parts] == [40 * 300, 30 * 300]


def test_a_width_over_the_budget_falls_back_to_its_exact_width():
    (chunk,) = chunks(rows_of([40]), MAX_LEN, padded=True, budget=48)
    assert chunk.ids.shape == (1, 40)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      initializer_range=0.3)
    return LlamaForCausalLM(cfg).eval()


def filled_cache(tiny, padded: bool) -> KVCache:
    weights = SlotWeights(tiny, torch.device("cpu"), torch.float32, MAX_LEN)
    cache = KVCache(weights.dims, 4, MAX_LEN, "cpu", torch.float32)
    with torch.inference_mode():
        for chunk in chunks(rows_of([5, 20, 3], seed=1), MAX_LEN, padded):
            run_eager(chunk, weights, cache, None, "cpu")
    return cache


def test_padding_changes_no_key_or_value_a_slot_holds(tiny):
    plain, padded = filled_cache(tiny, False), filled_cache(tiny, True)
    for a, b in zip([*plain.k, *plain.v], [*padded.k, *padded.v]):
        torch.testing.assert_close(a[:, :, :MAX_LEN], b[:, :, :MAX_LEN], rtol=0, atol=1e-6)
    assert any(float(t[:, :, 3:8].abs().sum()) > 0 for t in plain.k)  # the rows were written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_replayed_prefill_graphs_write_what_the_eager_prefill_writes(tiny):
    device = torch.device("cuda")
    model = copy.deepcopy(tiny).to(device)
    weights = SlotWeights(model, device, torch.float32, MAX_LEN)
    caches = [KVCache(weights.dims, 4, MAX_LEN, device, torch.float32) for _ in range(2)]
    stats = SlotStats()
    graphs = PrefillGraphs(device, torch.cuda.graph_pool_handle(), stats)
    with torch.inference_mode():
        for seed in (1, 2, 3):  # the same shape again: replayed, not captured
            for chunk in chunks(rows_of([5, 20, 3], seed=seed), MAX_LEN, True):
                run_eager(chunk, weights, caches[0], None, device)
                graphs.run(chunk, weights, caches[1], None)
            for a, b in zip([*caches[0].k, *caches[0].v], [*caches[1].k, *caches[1].v]):
                torch.testing.assert_close(a[:, :, :MAX_LEN], b[:, :, :MAX_LEN], rtol=0, atol=1e-5)
    assert len(graphs) == 1 and stats.graphs == 1 and stats.prefill_replays == 3


def fresh_rows(lengths: list[int], seed: int = 4) -> list[tuple[int, np.ndarray, int]]:
    """Rows of fresh prompts: slot i gets ``lengths[i]`` tokens from position 0."""
    return [(slot, tokens, 0) for slot, tokens, _ in rows_of(lengths, seed)]


def test_fresh_rows_are_cut_apart_and_a_chunk_is_fresh_only_when_every_row_starts_at_zero(monkeypatch):
    assert all(c.fresh for c in chunks(fresh_rows([5, 20, 3]), MAX_LEN, padded=True))
    # a row continuing its slot at 7 (longer than one fresh row) is cut apart: the fresh rows keep
    # a fresh chunk of their own, each chunk as wide as its own longest row
    mixed = [*fresh_rows([5, 20]), (2, np.arange(1, 12), 7)]
    cut = list(chunks(mixed, MAX_LEN, padded=False))
    assert [(c.fresh, c.ids.shape, sorted(c.slots.tolist())) for c in cut] == [(True, (2, 20), [0, 1]),
                                                                               (False, (1, 11), [2])]
    monkeypatch.setattr("searchr1.engines.local.sampling.prefill.CAUSAL_FRESH", False)
    assert [(c.fresh, c.ids.shape) for c in chunks(mixed, MAX_LEN, padded=False)] == [(False, (3, 20))]
    assert not any(c.fresh for c in chunks(fresh_rows([5, 20, 3]), MAX_LEN, padded=True))


@pytest.mark.parametrize("padded", [False, True])
def test_a_fresh_chunk_attends_causally_and_writes_what_the_masked_prefill_writes(tiny, padded, monkeypatch):
    """The causal kernel over the chunk's own keys against the boolean mask over the slots read back,
    with stale keys left in the slots beyond the new rows (the mask must skip them, causal never sees
    them). Layer 2's keys depend on layer 1's attention, so equal keys there mean equal attention."""
    import searchr1.engines.local.sampling.prefill as prefill

    weights = SlotWeights(tiny, torch.device("cpu"), torch.float32, MAX_LEN)
    rows = fresh_rows([5, 20, 3])
    caches = []
    for causal in (True, False):
        monkeypatch.setattr(prefill, "CAUSAL_FRESH", causal)
        cache = KVCache(weights.dims, 4, MAX_LEN, "cpu", torch.float32)
        for t in (*cache.k, *cache.v):
            t.normal_(generator=torch.Generator().manual_seed(9))  # stale keys everywhere
        with torch.inference_mode():
            (chunk,) = chunks(rows, MAX_LEN, padded)
            assert chunk.fresh is causal
            run_eager(chunk, weights, cache, None, "cpu")
        caches.append(cache)
    for slot, tokens, _ in rows:
        n = len(tokens)
        for a, b in zip([*caches[0].k, *caches[0].v], [*caches[1].k, *caches[1].v]):
            torch.testing.assert_close(a[slot, :, :n], b[slot, :, :n], rtol=0, atol=1e-5)
    # and the keys are the prompt's: not the stale draw, which both started from
    stale = KVCache(weights.dims, 4, MAX_LEN, "cpu", torch.float32)
    stale.k[1].normal_(generator=torch.Generator().manual_seed(9))
    assert float((caches[0].k[1][1, :, :20] - stale.k[1][1, :, :20]).abs().max()) > 0.1


def test_a_prefill_stops_the_last_layer_after_its_keys_and_writes_what_a_full_forward_writes(tiny):
    from searchr1.engines.local.sampling.slot_model import forward_hidden

    weights = SlotWeights(tiny, torch.device("cpu"), torch.float32, MAX_LEN)
    (chunk,) = chunks(rows_of([5, 20, 3], seed=5), MAX_LEN, padded=False)
    caches = [KVCache(weights.dims, 4, MAX_LEN, "cpu", torch.float32) for _ in range(2)]
    args = lambda: [torch.from_numpy(a) for a in (chunk.ids, chunk.pos, chunk.write, chunk.slots)]  # noqa: E731
    with torch.inference_mode():
        hidden = forward_hidden(weights, caches[0], *args(), chunk.length)
        assert forward_hidden(weights, caches[1], *args(), chunk.length, kv_only=True) is None
    assert hidden.shape == (3, 20, 32)
    for a, b in zip([*caches[0].k, *caches[0].v], [*caches[1].k, *caches[1].v]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert float(caches[1].v[-1][1, :, 4:24].abs().sum()) > 0  # the last layer's values were written
