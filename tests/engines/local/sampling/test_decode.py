"""``decode_rows`` with a ``PrefixStore``: a turn that starts from the stored KV of the turn
before decodes the same tokens and log-probs as a decode that prefills its whole prompt."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.sampling.decode import Row, decode_rows
from searchr1.engines.local.sampling.prefix_store import PrefixStore
from searchr1.engines.local.sampling.select import RowSampling
from searchr1.engines.local.sampling.stops import StopRule

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    """Tiny random Llama in float64, so reuse and no-reuse differ far below any argmax margin."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, tie_word_embeddings=False)
    return LlamaForCausalLM(config).to(torch.float64).eval()


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(2, VOCAB) for _ in range(n)]


def rows_for(prompts: list[list[int]], max_tokens: int = 12, temperature: float = 1.0) -> list[Row]:
    """Seeded rows; EOS is id 1 (a stop token), so some rows end early."""
    return [Row(p, RowSampling(temperature), StopRule(frozenset({1})).capped(max_tokens), seed=100 + i)
            for i, p in enumerate(prompts)]


def assert_same(got: list[Row], want: list[Row]) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.tokens == w.tokens and g.stop_reason == w.stop_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-9)


def next_prompts(rng: random.Random, rows: list[Row], cut: dict[int, int]) -> list[list[int]]:
    """Each row's context for its next turn: prompt, sampled tokens (the first ``cut[b]``
    only, as a protocol that cuts a turn would) and an observation of its own length."""
    return [r.prompt + r.tokens[: cut.get(b, len(r.tokens))] + tokens(rng, 20 + 7 * b)
            for b, r in enumerate(rows)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_second_turn_from_stored_prefix_equals_full_prefill(model, temperature):
    rng = random.Random(1)
    store = PrefixStore(max_tokens=10_000)
    first = rows_for([tokens(rng, n) for n in (30, 45, 17)], temperature=temperature)
    decode_rows(model, first, pad_id=0, store=store)
    assert len(store) == 3  # every finished row left its sequence
    prompts = next_prompts(rng, first, cut={1: 3}) + [tokens(rng, 25)]  # a cut turn; a new row
    reused = rows_for(prompts, temperature=temperature)
    fresh = rows_for(prompts, temperature=temperature)
    decode_rows(model, reused, pad_id=0, store=store)
    decode_rows(model, fresh, pad_id=0)
    assert_same(reused, fresh)
    assert store.hits == 3  # the new row had nothing to reuse
    expected = [len(first[0].prompt) + len(first[0].tokens) - 1, len(first[1].prompt) + 3,
                len(first[2].prompt) + len(first[2].tokens) - 1]
    assert store.reused_tokens == sum(expected)


def test_third_turn_chains_and_compaction_stores_early_finishers(model):
    """Rows finishing before the batch is compacted are stored too, and turn 3 reuses turn 2."""
    rng = random.Random(2)
    store = PrefixStore(max_tokens=10_000)
    caps = [2, 3, 20, 20]  # two rows stop early: the batch is compacted without them
    first = [Row(tokens(rng, 20 + b), RowSampling(1.0), StopRule(frozenset({1})).capped(c), seed=b)
             for b, c in enumerate(caps)]
    decode_rows(model, first, pad_id=0, store=store)
    assert len(store) == 4
    rows = first
    for _ in range(2):
        prompts = next_prompts(rng, rows, cut={})
        reused, fresh = rows_for(prompts), rows_for(prompts)
        decode_rows(model, reused, pad_id=0, store=store)
        decode_rows(model, fresh, pad_id=0)
        assert_same(reused, fresh)
        rows = reused
    assert store.hits == 8


def test_rows_sharing_a_prompt_are_prefilled_once(model):
    """A group's first turn: one prefill row per distinct prompt, same draws as separate decodes."""
    rng = random.Random(3)
    a, b = tokens(rng, 33), tokens(rng, 21)
    prompts = [a, a, b, a, b]
    widths: list[int] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: widths.append(o.shape[0]))
    try:
        shared = rows_for(prompts)
        decode_rows(model, shared, pad_id=0)
    finally:
        hook.remove()
    assert widths[0] == 2  # the prefill ran on the two distinct prompts
    alone = [rows_for(prompts)[i] for i in range(len(prompts))]
    for row in alone:
        decode_rows(model, [row], pad_id=0)
    assert_same(shared, alone)
    assert len({tuple(r.tokens) for r in shared}) > 2  # copies still draw with their own seeds


def test_changed_weights_drop_the_store(model):
    rng = random.Random(4)
    store = PrefixStore(max_tokens=10_000)
    store.sync(0)
    first = rows_for([tokens(rng, 30)])
    decode_rows(model, first, pad_id=0, store=store)
    store.sync(1)  # an optimizer step: the stored keys are of the old weights
    assert len(store) == 0
    decode_rows(model, rows_for(next_prompts(rng, first, cut={})), pad_id=0, store=store)
    assert store.hits == 0
