"""The slot sampler against the simplest correct decode, on a tiny random Llama (CPU, float32).

The reference decode runs the HF model over the whole sequence for every token (no cache, no
batching) and picks tokens with the same counter-based selection; the slot sampler must give
the same tokens and log-probs whatever it batches, reuses, copies, refills or evicts.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from pytrio import ModelInput, SamplingParams
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.sampling.decode import StopCriteria
from searchr1.engines.local.model import LocalEngineConfig
from searchr1.engines.local.sampling.hf_sampler import LocalSamplingClient, _eos_ids, _row_seed
from searchr1.engines.local.sampling.slot_sampling import filter_logits, select_tokens, uniforms
from searchr1.engines.local.sampling.slot_table import SlotTable
from tests.conftest import char_level_tokenizer


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


@torch.no_grad()
def reference(model, tokenizer, prompt, n, params: SamplingParams):
    """Token-by-token decode over the full sequence, same selection rule and seeds."""
    strings = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
    stop = StopCriteria(_eos_ids(model, tokenizer), tuple(strings),
                        lambda t: tokenizer.decode(t, skip_special_tokens=False))
    out = []
    for i in range(n):
        seed = torch.tensor([_row_seed(params.seed or 0, i)])
        tokens, logprobs = [], []
        while len(tokens) < params.max_tokens:
            logits = model(torch.tensor([prompt + tokens])).logits[:, -1]
            tok, lp = select_tokens(
                logits, torch.tensor([params.temperature]), torch.tensor([params.top_k]),
                torch.tensor([params.top_p]), seed, torch.tensor([len(tokens)]),
                filtered=params.top_k > 0 or params.top_p < 1,
            )
            tokens.append(int(tok))
            logprobs.append(float(lp))
            if stop.hit(tokens):
                break
        out.append((tokens, logprobs))
    return out


def assert_same(response, expected) -> None:
    assert len(response.sequences) == len(expected)
    for seq, (tokens, logprobs) in zip(response.sequences, expected):
        assert seq.tokens == tokens
        np.testing.assert_allclose(seq.logprobs, logprobs, atol=1e-5)


# ----- selection ---------------------------------------------------------------------------
def test_uniforms_are_in_open_interval_and_depend_on_seed_and_counter():
    u = uniforms(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 1000)
    assert float(u.min()) > 0 and float(u.max()) < 1
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u, uniforms(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 1000))
    assert abs(float(u.mean()) - 0.5) < 0.03


def test_gumbel_sampling_follows_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(4000, 1)
    ones = torch.ones(4000)
    tokens, _ = select_tokens(logits, ones, -ones.long(), ones, torch.full((4000,), 5),
                              torch.arange(4000), filtered=False)
    freq = torch.bincount(tokens, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.03)


def test_greedy_topk1_and_tiny_topp_take_the_argmax_and_logprob_is_raw():
    logits = torch.randn(6, 50)
    temps = torch.tensor([0.0, 1.0, 1.0, 0.5, 1.0, 2.0])
    top_k = torch.tensor([-1, 1, -1, 1, -1, -1])
    top_p = torch.tensor([1.0, 1.0, 1e-6, 1.0, 1e-6, 1e-6])
    tokens, lps = select_tokens(logits, temps, top_k, top_p, torch.arange(6), torch.zeros(6, dtype=torch.long), True)
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.allclose(lps, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1))


def test_filter_keeps_topk_and_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, torch.tensor([-1]), torch.tensor([0.7])).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filter_logits(logits, torch.tensor([3]), torch.tensor([1.0])).isfinite()
    assert kept.tolist() == [[True, True, True, False]]


def test_a_rows_token_does_not_depend_on_the_other_rows():
    logits = torch.randn(3, 40)
    args = (torch.ones(3), -torch.ones(3, dtype=torch.long), torch.ones(3), torch.tensor([9, 8, 7]),
            torch.tensor([4, 5, 6]))
    alone, _ = select_tokens(logits[1:2], *(a[1:2] for a in args), filtered=False)
    together, _ = select_tokens(logits, *args, filtered=False)
    assert int(alone) == int(together[1])


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
