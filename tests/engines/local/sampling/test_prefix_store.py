"""``PrefixStore``: longest shared prefix, take-once, the token budget and the weights' version."""

from __future__ import annotations

import torch

from searchr1.engines.local.sampling.prefix_store import MIN_REUSE, PrefixStore


def kv(n: int, layers: int = 2) -> list[torch.Tensor]:
    return [torch.full((1, n, 2), float(n)) for _ in range(layers)]


def put(store: PrefixStore, tokens: list[int]) -> None:
    store.put(tokens, kv(len(tokens)), kv(len(tokens)))


def test_take_picks_the_longest_shared_prefix_once():
    store = PrefixStore(max_tokens=1000)
    base = list(range(2, 2 + 40))
    put(store, base[:20])
    put(store, base[:30] + [99] * 5)
    reused, entry = store.take(base + [7])
    assert reused == 30 and len(entry.tokens) == 35
    assert len(store) == 1  # taken entries leave the store; the 20-token one remains
    reused, entry = store.take(base + [7])
    assert reused == 20 and len(entry.tokens) == 20 and len(store) == 0


def test_one_prompt_token_is_always_left_to_prefill():
    store = PrefixStore(max_tokens=1000)
    seq = list(range(2, 2 + 40))
    put(store, seq)
    reused, _ = store.take(seq)
    assert reused == len(seq) - 1


def test_short_prefixes_are_not_reused():
    store = PrefixStore(max_tokens=1000)
    seq = list(range(2, 2 + 40))
    put(store, seq)
    assert store.take(seq[: MIN_REUSE - 1] + [0] * 10) == (0, None)
    assert len(store) == 1  # not consumed


def test_budget_evicts_the_oldest_and_version_clears():
    store = PrefixStore(max_tokens=100)
    for start in (0, 100, 200):
        put(store, list(range(start, start + 40)))
    assert len(store) == 2 and store.tokens == 80
    assert store.take(list(range(0, 41)))[1] is None  # the first was evicted
    store.sync("v1")  # a first version: nothing older may stay
    assert len(store) == 0
    put(store, list(range(300, 340)))
    store.sync("v1")  # same weights: kept
    assert len(store) == 1
    store.sync("v2")
    assert len(store) == 0 and store.tokens == 0
