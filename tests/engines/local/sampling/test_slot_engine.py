"""The slot sampler against the simplest correct decode, on a tiny random Llama (CPU, float32).

The reference decode runs the HF model over the whole sequence for every token (no cache, no
batching) and picks tokens with the same counter-based selection; the slot sampler must give
the same tokens and log-probs whatever it batches, reuses, copies, refills or evicts — and the
same tokens as the HF batched decode, which shares the selection and the stop rule.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from pytrio import ModelInput, SamplingParams
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.model import LocalEngineConfig
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient
from searchr1.engines.local.sampling.slot_table import SlotTable
from tests.conftest import char_level_tokenizer
from tests.helpers.reference_decode import reference_decode as reference


@pytest.fixture(scope="module")
def tokenizer():
    return char_level_tokenizer(" .,;:!?<>/")


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.3, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # EOS logit low: sequences end where a test asks
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    return model


def slots_client(model, tokenizer, **kw) -> LocalSamplingClient:
    cfg = LocalEngineConfig(sampler="slots", **{"kv_slots": 4, "max_seq_len": 160, "sync_every": 3, **kw})
    return LocalSamplingClient(model, tokenizer, cfg)


def assert_same(response, expected) -> None:
    assert len(response.sequences) == len(expected)
    for seq, (tokens, logprobs) in zip(response.sequences, expected):
        assert seq.tokens == tokens
        np.testing.assert_allclose(seq.logprobs, logprobs, atol=1e-5)


# ----- the engine vs the reference -------------------------------------------------------
@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=12, temperature=1.0, seed=3),
    SamplingParams(max_tokens=12, temperature=0.7, top_k=5, top_p=0.9, seed=4),
    SamplingParams(max_tokens=12, temperature=0.0),
])
def test_samples_equal_reference_decode(model, tokenizer, params):
    client = slots_client(model, tokenizer)
    prompt = tokenizer.encode("hello world")
    response = client.sample(ModelInput.from_ints(prompt), 3, params).result()
    assert_same(response, reference(model, tokenizer, prompt, 3, params))


def test_stop_strings_end_where_the_reference_ends(model, tokenizer):
    client = slots_client(model, tokenizer, sync_every=5)
    prompt = tokenizer.encode("abc")
    found = 0
    for seed in range(8):
        params = SamplingParams(max_tokens=30, temperature=1.0, seed=seed, stop=["a", "zz"])
        response = client.sample(ModelInput.from_ints(prompt), 2, params).result()
        assert_same(response, reference(model, tokenizer, prompt, 2, params))
        found += sum(s.stop_reason == "stop" for s in response.sequences)
    assert found > 0  # the stop strings did fire in some sequences


def test_next_turn_reuses_the_slot_and_matches_a_fresh_decode(model, tokenizer):
    client = slots_client(model, tokenizer)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
    first = tokenizer.encode("who wrote it?")
    turn1 = client.sample(ModelInput.from_ints(first), 2, params).result()
    stats = client.slots.stats
    prefill_before, reused_before = stats.prefill_tokens, stats.reused_tokens
    observation = tokenizer.encode(" <info> paris </info> ")
    second = first + turn1.sequences[0].tokens + observation
    turn2 = client.sample(ModelInput.from_ints(second), 1, params).result()
    assert_same(turn2, reference(model, tokenizer, second, 1, params))
    assert stats.reused_tokens - reused_before == len(first) + len(turn1.sequences[0].tokens) - 1
    assert stats.prefill_tokens - prefill_before == len(observation)


def test_a_rewritten_turn_rewinds_its_own_slot_and_matches_a_fresh_decode(model, tokenizer):
    """The scripted policy's case: the turn's last tokens are overwritten before the next turn."""
    client = slots_client(model, tokenizer)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11)
    first = tokenizer.encode("who wrote it?")
    turn1 = client.sample(ModelInput.from_ints(first), 2, params).result()
    stats, table = client.slots.stats, client.slots.table
    slot = int(np.flatnonzero(table.kv_len == len(first) + len(turn1.sequences[0].tokens) - 1)[0])
    reused_before, copied_before = stats.reused_tokens, stats.copied_tokens
    kept = turn1.sequences[0].tokens[:6]
    second = first + kept + tokenizer.encode("</s> <info> x </info>")
    turn2 = client.sample(ModelInput.from_ints(second), 1, params).result()
    assert_same(turn2, reference(model, tokenizer, second, 1, params))
    assert stats.copied_tokens == copied_before  # nothing copied: the slot was rewound in place
    assert stats.reused_tokens - reused_before == len(first) + len(kept)
    assert table.prompt_len[slot] == len(second)  # the same slot holds the trajectory


def test_more_sequences_than_slots_refill_and_evict(model, tokenizer):
    import asyncio

    client = slots_client(model, tokenizer, kv_slots=2)
    prompts = [tokenizer.encode(t) for t in ("alpha", "beta beta", "gamma.", "delta?", "epsilon")]
    params = [SamplingParams(max_tokens=4 + 3 * i, temperature=1.0, seed=i) for i in range(5)]

    async def all_requests():
        return await asyncio.gather(*(
            client.sample_async(ModelInput.from_ints(p), 2, sp) for p, sp in zip(prompts, params)
        ))

    responses = asyncio.run(all_requests())
    for prompt, sp, response in zip(prompts, params, responses):
        assert_same(response, reference(model, tokenizer, prompt, 2, sp))
    assert client.slots.table.evicted_tokens > 0


def draw_staggered(client, model, tokenizer, rows: int, long_tokens: int) -> list:
    """Two long rows (seed 2: no EOS) beside short rows of staggered lengths, all queued at once,
    so slots free at different windows; every draw is checked against the reference decode."""
    import asyncio

    prompts = [tokenizer.encode(t) for t in ("alpha", "q0 ")]
    prompts += [tokenizer.encode(f"q{i} {'x' * (i % 7)}") for i in range(2, rows)]
    params = [SamplingParams(max_tokens=long_tokens if i < 2 else 2 + i % 5, temperature=1.0,
                             seed=2 if i < 2 else i) for i in range(rows)]

    async def all_requests():
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(prompts, params)))

    responses = asyncio.run(all_requests())
    for prompt, sp, response in zip(prompts, params, responses):
        assert_same(response, reference(model, tokenizer, prompt, 1, sp))
    return responses


def test_admitting_every_few_windows_draws_the_same_tokens_in_fewer_rounds(model, tokenizer):
    """Short rows of staggered lengths free a slot almost every window while long ones keep the
    pool busy; ``admit_every=3`` gathers those refills into fewer rounds (at most one per three
    windows while rows decode), and no draw changes (a row's tokens never depend on batching)."""
    rounds = {}
    for admit_every in (1, 3):
        client = slots_client(model, tokenizer, kv_slots=4, sync_every=2, admit_every=admit_every)
        responses = draw_staggered(client, model, tokenizer, rows=18, long_tokens=40)
        assert len(responses[0].sequences[0].tokens) >= 20  # the long rows did keep the pool busy
        rounds[admit_every] = client.slots.stats.admissions
    assert rounds[3] < rounds[1], rounds


def test_admitting_behind_the_window_draws_the_same_tokens(model, tokenizer, monkeypatch):
    """``admit_behind_window``: while rows decode, their window is launched first and the
    admission queued behind it; its read-back finishes only the rows it decoded (a row admitted
    behind it starts next window), and every draw is the reference's, at either admission rate."""
    from searchr1.engines.local.sampling.slot_engine import SlotEngine

    order: list[str] = []
    for name in ("_launch_window", "_admit", "_sync"):
        method = getattr(SlotEngine, name)

        def spy(self, *args, _method=method, _name=name, **kwargs):
            order.append(_name)
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(SlotEngine, name, spy)
    for admit_every in (1, 3):
        order.clear()
        client = slots_client(model, tokenizer, kv_slots=4, sync_every=2, admit_every=admit_every,
                              admit_behind_window=True)
        draw_staggered(client, model, tokenizer, rows=14, long_tokens=30)
        stats = client.slots.stats
        assert 0 < stats.admitted_behind < stats.admissions  # the first round had nothing live
        behind = [i for i in range(len(order) - 2) if order[i : i + 3] == ["_launch_window", "_admit", "_sync"]]
        assert len(behind) == stats.admitted_behind, order


def test_a_compiled_prefill_draws_what_the_eager_one_draws(model, tokenizer):
    """``compile_prefill``: admission rounds of different row counts and widths (prompts of 1-14
    tokens, later turns prefilling only their new tokens) run one shape-generic compiled layer,
    and every token and log-prob equals the reference decode's."""
    import asyncio

    texts = ["a", "who wrote it?", "hello world, again", "q", "the river and the town"]
    prompts = [tokenizer.encode(t) for t in texts]
    params = [SamplingParams(max_tokens=5 + i, temperature=1.0, seed=30 + i) for i in range(len(texts))]
    from searchr1.engines.local.sampling.slot_model import LayerFns

    client = slots_client(model, tokenizer, kv_slots=6, compile_prefill=True)
    compiled, calls = client.slots._prefill_fns, []
    assert compiled is not None

    def counted(fn):
        def call(*args):
            calls.append(args[0].shape[:2])  # (rows, width) of the round
            return fn(*args)
        return call

    client.slots._prefill_fns = LayerFns(counted(compiled.pre), compiled.post)

    async def turn(prompt_list):
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(prompt_list, params)))

    first = asyncio.run(turn(prompts))
    for prompt, sp, response in zip(prompts, params, first):
        assert_same(response, reference(model, tokenizer, prompt, 1, sp))
    # second turns: the first turn's prompt + its tokens + an observation (a prefix hit, so only
    # the new tokens prefill, in rows of other widths)
    second = [p + r.sequences[0].tokens + tokenizer.encode(" obs" * (1 + i))
              for i, (p, r) in enumerate(zip(prompts, first))]
    for prompt, sp, response in zip(second, params, asyncio.run(turn(second))):
        assert_same(response, reference(model, tokenizer, prompt, 1, sp))
    assert client.slots.stats.admissions >= 2 and client.slots.stats.reused_tokens > 0
    assert len(set(calls)) >= 2  # the compiled layers ran the prefills, in rounds of other shapes


def test_padded_prefill_rounds_draw_what_the_reference_draws(model, tokenizer):
    """``prefill_graphs`` on CPU: admission rounds run at bucketed rows × widths (eagerly: no
    graphs here), over two turns with prefix reuse, and every token and log-prob equals the
    reference decode's."""
    import asyncio

    from searchr1.engines.local.sampling.slot_model import EAGER, LayerFns

    texts = ["a", "who wrote it?", "hello world, again", "q", "the river and the town"]
    prompts = [tokenizer.encode(t) for t in texts]
    params = [SamplingParams(max_tokens=5 + i, temperature=1.0, seed=50 + i) for i in range(len(texts))]
    client = slots_client(model, tokenizer, kv_slots=6, prefill_graphs=True)
    shapes = []

    def pre(*args):
        shapes.append(tuple(args[0].shape[:2]))
        return EAGER.pre(*args)

    client.slots._prefill_fns = LayerFns(pre, EAGER.post)

    async def turn(prompt_list):
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(prompt_list, params)))

    first = asyncio.run(turn(prompts))
    second = [p + r.sequences[0].tokens + tokenizer.encode(" obs" * (1 + i))
              for i, (p, r) in enumerate(zip(prompts, first))]
    for prompt_list, responses in ((prompts, first), (second, asyncio.run(turn(second)))):
        for prompt, sp, response in zip(prompt_list, params, responses):
            assert_same(response, reference(model, tokenizer, prompt, 1, sp))
    assert shapes and client.slots.stats.reused_tokens > 0
    from searchr1.engines.local.sampling.prefill import rows_bucket, width_bucket

    for rows, width in shapes:
        assert rows == rows_bucket(rows) and width == width_bucket(width) and width >= 16, shapes


def test_a_failing_prefill_capture_falls_back_to_the_eager_prefill(model, tokenizer):
    """A capture that raises (not out-of-memory) is logged once and the prefill runs eagerly from
    then on, with the reference's draws."""
    import asyncio

    class Failing:
        calls = 0

        def run(self, *args):
            Failing.calls += 1
            raise RuntimeError("operation not permitted when stream is capturing")

    prompts = [tokenizer.encode(t) for t in ("abc", "who wrote it?")]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=90 + i) for i in range(2)]
    client = slots_client(model, tokenizer, prefill_graphs=True)
    client.slots._prefill_graphs = Failing()

    async def all_requests():
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(prompts, params)))

    for _ in range(2):
        for prompt, sp, response in zip(prompts, params, asyncio.run(all_requests())):
            assert_same(response, reference(model, tokenizer, prompt, 1, sp))
    assert Failing.calls == 1 and client.slots._prefill_graphs is None


def test_flex_decode_attention_draws_what_the_reference_draws(model, tokenizer):
    """``decode_attention=flex``: rows at different positions (one past a 128-key block) and a
    refill into a used slot (stale keys beyond the new row's position) draw the reference's
    tokens and log-probs."""
    import asyncio

    prompts = [tokenizer.encode(t) for t in ("a", "x" * 125, "who wrote it?", "q")]
    params = [SamplingParams(max_tokens=8 + i, temperature=1.0, seed=70 + i) for i in range(4)]
    client = slots_client(model, tokenizer, kv_slots=3, decode_attention="flex")
    assert client.slots._flex is not None
    masks, build = [], client.slots._flex.build

    def recording(pos_B, length):
        masks.append((pos_B.clone(), client.slots.state.pos.clone()))
        return build(pos_B, length)

    client.slots._flex.build = recording

    async def all_requests():
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(prompts, params)))

    for prompt, sp, response in zip(prompts, params, asyncio.run(all_requests())):
        assert_same(response, reference(model, tokenizer, prompt, 1, sp))
    seen, state = torch.stack([m for m, _ in masks]), torch.stack([p for _, p in masks])
    assert int(seen.max()) >= 128  # a row decoded past the first key block
    # a finished row's slot, not live while others decode, reads one block, not its old context
    assert bool(((seen == 0) & (state > 0)).any())


def test_hf_decode_and_slot_sampler_draw_the_same_tokens(model, tokenizer):
    """Same seeded requests, batched together on each path: identical tokens and endings.

    Plain, truncated (top-k/top-p) and greedy rows share each batch, and stop strings end some
    sequences mid-window on the slot side, so selection and the stop rule are both exercised.
    """
    import asyncio

    prompts = [tokenizer.encode(t) for t in ("abc", "who wrote it?", "hello world")]
    params = [
        SamplingParams(max_tokens=20, temperature=1.0, seed=7, stop=["a", "zz"]),
        SamplingParams(max_tokens=14, temperature=0.8, top_k=6, top_p=0.9, seed=8),
        SamplingParams(max_tokens=9, temperature=0.0, stop=[3, 4]),
    ]
    hf = LocalSamplingClient(model, tokenizer, LocalEngineConfig(sampler="hf", batch_window_ms=50.0))
    slots = slots_client(model, tokenizer, sync_every=4)

    async def run(client):
        return await asyncio.gather(*(
            client.sample_async(ModelInput.from_ints(p), 3, sp) for p, sp in zip(prompts, params)
        ))

    got_hf, got_slots = asyncio.run(run(hf)), asyncio.run(run(slots))
    assert hf.slots is None and hf.stats.batches == 1
    endings = []
    for a, b in zip(got_hf, got_slots):
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
        assert [s.stop_reason for s in a.sequences] == [s.stop_reason for s in b.sequences]
        endings += [s.stop_reason for s in a.sequences]
    assert {"stop", "length"} <= set(endings)


def test_a_mostly_idle_pool_decodes_only_its_live_rows_with_the_same_draws(model, tokenizer):
    """3 live rows in a 32-slot pool: steps run over 8 rows (live + idle padding), and every
    token and log-prob still equals the reference decode; with compaction off the pool runs whole."""
    import asyncio

    prompts = [tokenizer.encode(t) for t in ("abc", "who wrote it?", "hello world")]
    params = [SamplingParams(max_tokens=6 + 5 * i, temperature=1.0, seed=20 + i, stop=["zz"]) for i in range(3)]
    # later turns land in slots other than 0..2, so live slots are not the first rows of the pool
    warm = [tokenizer.encode(t) for t in ("x", "yy", "zzz", "q")]

    async def run(client):
        await asyncio.gather(*(client.sample_async(ModelInput.from_ints(w), 1, SamplingParams(max_tokens=2, seed=1))
                               for w in warm))
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(prompts, params)))

    for compact in (True, False):
        client = slots_client(model, tokenizer, kv_slots=32, compact_decode=compact)
        got = asyncio.run(run(client))
        for prompt, sp, response in zip(prompts, params, got):
            assert_same(response, reference(model, tokenizer, prompt, 1, sp))
        stats = client.slots.stats
        assert (stats.compacted_windows == stats.windows) if compact else stats.compacted_windows == 0
        assert stats.windows > 0


def test_compacted_rows_are_live_slots_padded_with_idle_ones(model, tokenizer):
    engine = slots_client(model, tokenizer, kv_slots=64, compact_decode=True).slots
    assert engine._rows(3) == 8 and engine._rows(17) == 64  # 32 rows > 64 / 3: the whole pool
    engine._live = {40: None, 5: None, 63: None}
    index = engine._index(8).tolist()
    assert index[:3] == [5, 40, 63] and len(set(index)) == 8 and not {40, 5, 63} & set(index[3:])
    assert engine._index(64) is None
    engine._live = {}
    assert slots_client(model, tokenizer, kv_slots=64).slots._rows(3) == 64  # off by default


def test_prompt_longer_than_a_slot_is_refused(model, tokenizer):
    from pytrio.errors.base import ValidationError

    client = slots_client(model, tokenizer, max_seq_len=8)
    with pytest.raises(ValidationError, match="max_seq_len"):
        client.sample(ModelInput.from_ints(tokenizer.encode("a long prompt here")), 1, SamplingParams(max_tokens=2))


def test_lora_update_is_folded_into_the_sampler(model, tokenizer):
    """After the adapters change (version bump), samples equal a model with merged weights."""
    base = copy.deepcopy(model)
    torch.manual_seed(1)
    peft = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    version = {"v": 0}
    cfg = LocalEngineConfig(sampler="slots", kv_slots=4, max_seq_len=160, sync_every=3)
    client = LocalSamplingClient(peft, tokenizer, cfg, weights_version=lambda: version["v"])
    prompt = tokenizer.encode("hello world")
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5)
    before = client.sample(ModelInput.from_ints(prompt), 2, params).result()
    assert_same(before, reference(model, tokenizer, prompt, 2, params))  # B = 0: base weights
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    version["v"] += 1
    after = client.sample(ModelInput.from_ints(prompt), 2, params).result()
    merged = copy.deepcopy(peft).merge_and_unload()
    assert_same(after, reference(merged, tokenizer, prompt, 2, params))
    assert [s.tokens for s in after.sequences] != [s.tokens for s in before.sequences]


# ----- host bookkeeping -------------------------------------------------------------------
def test_slot_table_extends_copies_and_evicts_least_recently_used():
    table = SlotTable(slots=3, max_len=64)
    none = np.zeros(3, dtype=bool)
    a = np.arange(40)
    p = table.place(a, none)
    assert (p.slot, p.reused, p.copy_from) == (0, 0, None)
    table.occupy(0, a)
    table.release(0, a, [100, 101, 102])
    nxt = np.concatenate([a, [100, 101, 102, 7, 8]])
    ext = table.place(nxt, none)
    assert (ext.slot, ext.reused, ext.copy_from) == (0, 42, None)  # extends in place
    table.occupy(0, nxt)
    other = np.concatenate([a[:30], [55] * 10])
    cp = table.place(other, none)
    assert cp.copy_from == 0 and cp.reused == 30 and cp.slot != 0


def test_slot_table_rewinds_only_inside_its_own_output():
    table = SlotTable(slots=3, max_len=64)
    none = np.zeros(3, dtype=bool)
    a = np.arange(40)
    table.occupy(0, a)
    table.release(0, a, [100, 101, 102, 103, 104])  # holds a + [100 … 103]: 44 tokens
    # continues a and two output tokens, then differs: slot 0 rewinds to 42 in place
    rewound = table.place(np.concatenate([a, [100, 101, 9, 9]]), none)
    assert (rewound.slot, rewound.reused, rewound.copy_from) == (0, 42, None)
    assert table.evicted_tokens == 2
    # the same prompt with the whole output rewritten shares none of it: copy, slot 0 kept
    fresh = table.place(np.concatenate([a, [200, 9]]), none)
    assert fresh.slot != 0 and (fresh.reused, fresh.copy_from) == (40, 0)
    # another question on the same template diverges inside slot 0's prompt: copy, slot 0 kept
    other = table.place(np.concatenate([a[:30], [55] * 10]), none)
    assert other.slot != 0 and (other.reused, other.copy_from) == (30, 0)
    # a busy slot is never rewound
    table.occupy(0, np.concatenate([a, [100, 101, 9, 9]]))
    busy = table.place(np.concatenate([a, [100, 101, 7]]), none)
    assert busy.slot != 0 and busy.copy_from == 0

