"""LocalSamplingClient on a tiny random Llama with a char-level tokenizer (no network).

Reference results come from plain full forward passes (no cache, no padding), so the
tests check the batched, cached, left-padded decoder against the simplest correct code.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from pytrio import ModelInput, SamplingParams
from pytrio.errors.base import ValidationError
from pytrio.types.sample.sample_response import SampleResponse
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.sampling.request_queue import Batcher
from searchr1.engines.local.model import LocalEngineConfig
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient
from tests.conftest import char_level_tokenizer
from tests.helpers.reference_decode import reference_decode

PROMPTS = ["hello world", "the cat sat on", "a", "search: who wrote it?"]


@pytest.fixture(scope="module")
def tokenizer():
    """Char-level tokenizer: <pad>=0, <eos>=1, then lowercase letters and punctuation."""
    return char_level_tokenizer(" .,;:!?")


@pytest.fixture(scope="module")
def model(tokenizer):
    """Tiny random Llama; a wide init makes argmax margins large against float noise.

    The EOS row of the head is zeroed (EOS logit 0, below the max of the other 34), so
    greedy runs end only where a test asks them to.
    """
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    return model


def make_client(model, tokenizer, **cfg) -> LocalSamplingClient:
    cfg.setdefault("batch_window_ms", 50.0)
    return LocalSamplingClient(model, tokenizer, LocalEngineConfig(device="cpu", **cfg))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def full_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """log-softmax over the vocabulary at every position of one unpadded sequence."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def manual_greedy(model, prompt: list[int], steps: int) -> list[int]:
    """Argmax loop with a full forward pass per step (no cache)."""
    tokens = list(prompt)
    for _ in range(steps):
        tokens.append(int(full_logprobs(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def check_logprobs(model, prompt: list[int], sequence) -> None:
    """Sampler logprobs equal a separate full forward pass's log-softmax at the tokens."""
    logprobs = full_logprobs(model, prompt + sequence.tokens)
    expected = [logprobs[len(prompt) + i - 1, t].item() for i, t in enumerate(sequence.tokens)]
    assert sequence.logprobs == pytest.approx(expected, abs=1e-5)


GREEDY = SamplingParams(max_tokens=8, temperature=0)


async def test_greedy_matches_manual_argmax_and_logprobs(model, tokenizer):
    client = make_client(model, tokenizer)
    for text in PROMPTS:
        prompt = encode(tokenizer, text)
        response = await client.sample_async(ModelInput.from_ints(prompt), 1, GREEDY)
        assert isinstance(response, SampleResponse)
        (seq,) = response.sequences
        assert seq.tokens == manual_greedy(model, prompt, 8)
        assert seq.stop_reason == "length"
        assert seq.text == tokenizer.decode(seq.tokens, skip_special_tokens=True)
        check_logprobs(model, prompt, seq)
        assert response.input_tokens == len(prompt) and response.output_tokens == 8


async def test_sampled_logprobs_are_raw_model_logprobs(model, tokenizer):
    client = make_client(model, tokenizer)
    prompt = encode(tokenizer, PROMPTS[1])
    params = SamplingParams(max_tokens=10, temperature=0.7, top_p=0.9, top_k=5, seed=3)
    response = await client.sample_async(ModelInput.from_ints(prompt), 3, params)
    for seq in response.sequences:
        check_logprobs(model, prompt, seq)


async def test_stop_token_ids_end_with_stop(model, tokenizer):
    client = make_client(model, tokenizer)
    prompt = encode(tokenizer, PROMPTS[0])
    greedy = manual_greedy(model, prompt, 8)
    stop_id = greedy[3]
    params = SamplingParams(max_tokens=8, temperature=0, stop=[stop_id])
    (seq,) = (await client.sample_async(ModelInput.from_ints(prompt), 1, params)).sequences
    expected = greedy[: greedy.index(stop_id) + 1]
    assert seq.tokens == expected and seq.stop_reason == "stop"


async def test_stop_string_ends_after_completing_token(model, tokenizer):
    client = make_client(model, tokenizer)
    prompt = encode(tokenizer, PROMPTS[3])
    greedy = manual_greedy(model, prompt, 8)
    text = tokenizer.decode(greedy)
    stop = text[3:5]
    end = text.index(stop) + len(stop)  # chars == tokens for this tokenizer
    for form in (stop, [stop, "never-generated"]):
        params = SamplingParams(max_tokens=8, temperature=0, stop=form)
        (seq,) = (await client.sample_async(ModelInput.from_ints(prompt), 1, params)).sequences
        assert seq.tokens == greedy[:end] and seq.stop_reason == "stop"
        assert seq.text.endswith(stop)


async def test_eos_stops(model, tokenizer):
    prompt = encode(tokenizer, PROMPTS[0])
    greedy = manual_greedy(model, prompt, 8)
    eos_model = LlamaForCausalLM(model.config).eval()
    eos_model.load_state_dict(model.state_dict())
    eos_model.generation_config.eos_token_id = [greedy[2]]
    client = make_client(eos_model, tokenizer)
    (seq,) = (await client.sample_async(ModelInput.from_ints(prompt), 1, GREEDY)).sequences
    assert seq.tokens == greedy[: greedy.index(greedy[2]) + 1] and seq.stop_reason == "stop"


async def test_max_tokens_gives_length(model, tokenizer):
    client = make_client(model, tokenizer)
    params = SamplingParams(max_tokens=5, temperature=0)
    prompt = ModelInput.from_ints(encode(tokenizer, PROMPTS[2]))
    (seq,) = (await client.sample_async(prompt, 1, params)).sequences
    assert len(seq.tokens) == 5 and len(seq.logprobs) == 5 and seq.stop_reason == "length"


async def test_seed_reproducible_whatever_the_batch(model, tokenizer):
    prompt = ModelInput.from_ints(encode(tokenizer, PROMPTS[1]))
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1234)
    alone = await make_client(model, tokenizer).sample_async(prompt, 2, params)
    client = make_client(model, tokenizer)
    others = [
        client.sample_async(
            ModelInput.from_ints(encode(tokenizer, t)), 3, SamplingParams(max_tokens=4)
        )
        for t in PROMPTS
    ]
    batched, *_ = await asyncio.gather(client.sample_async(prompt, 2, params), *others)
    assert client.stats.batches == 1
    assert [s.tokens for s in batched.sequences] == [s.tokens for s in alone.sequences]
    other_seed = await client.sample_async(prompt, 2, params.model_copy(update={"seed": 99}))
    assert [s.tokens for s in other_seed.sequences] != [s.tokens for s in alone.sequences]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=12, temperature=1.0, seed=21),
    SamplingParams(max_tokens=12, temperature=0.7, top_k=5, top_p=0.9, seed=22),
    SamplingParams(max_tokens=30, temperature=1.0, seed=42, stop=["cc", "i "]),  # EOS, length, string
])
async def test_seeded_tokens_equal_a_select_loop_on_the_model_logits(model, tokenizer, params):
    """The batched, cached decode draws what ``select`` draws from full-forward logits.

    The reference (one sequence, no cache, ``select`` at each position with the row's seed,
    ``StopRule`` after each token) is also what the slot sampler is checked against, so a
    seeded CPU run here predicts the slot sampler's draw on the device.
    """
    client = make_client(model, tokenizer)
    prompt = encode(tokenizer, PROMPTS[1])
    others = [client.sample_async(ModelInput.from_ints(encode(tokenizer, t)), 2,
                                  SamplingParams(max_tokens=5, top_k=3)) for t in PROMPTS]
    response, *_ = await asyncio.gather(
        client.sample_async(ModelInput.from_ints(prompt), 3, params), *others)
    assert client.stats.batches == 1
    expected = reference_decode(model, tokenizer, prompt, 3, params)
    assert [s.tokens for s in response.sequences] == [tokens for tokens, _ in expected]
    for seq, (_, logprobs) in zip(response.sequences, expected):
        assert seq.logprobs == pytest.approx(logprobs, abs=1e-5)


async def test_num_samples_gives_distinct_rows(model, tokenizer):
    client = make_client(model, tokenizer)
    prompt = ModelInput.from_ints(encode(tokenizer, PROMPTS[0]))
    response = await client.sample_async(prompt, 4, SamplingParams(max_tokens=10, seed=5))
    assert len(response.sequences) == 4
    assert len({tuple(s.tokens) for s in response.sequences}) > 1
    assert response.output_tokens == sum(len(s.tokens) for s in response.sequences)


async def test_concurrent_requests_share_batches_and_match_alone(model, tokenizer):
    prompts = [ModelInput.from_ints(encode(tokenizer, t)) for t in PROMPTS]
    lengths = [1, 9, 3, 6]  # rows finish at different steps: exercises batch compaction
    params = [SamplingParams(max_tokens=n, temperature=0) for n in lengths]
    solo = make_client(model, tokenizer)
    alone = [await solo.sample_async(p, 2, s) for p, s in zip(prompts, params)]
    client = make_client(model, tokenizer)
    together = await asyncio.gather(
        *[client.sample_async(p, 2, s) for p, s in zip(prompts, params)]
    )
    assert client.stats.batches < len(prompts)
    assert client.stats.decode_calls == client.stats.batches
    for a, b in zip(alone, together):
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
        for x, y in zip(a.sequences, b.sequences):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


async def test_rows_beyond_max_batch_size_are_split(model, tokenizer):
    client = make_client(model, tokenizer, max_batch_size=2)
    prompt = encode(tokenizer, PROMPTS[0])
    response = await client.sample_async(ModelInput.from_ints(prompt), 5, GREEDY)
    assert client.stats.decode_calls == 3
    greedy = manual_greedy(model, prompt, 8)
    assert all(s.tokens == greedy for s in response.sequences)


async def test_top_k_one_and_tiny_top_p_equal_greedy(model, tokenizer):
    client = make_client(model, tokenizer)
    prompt = encode(tokenizer, PROMPTS[3])
    greedy = manual_greedy(model, prompt, 8)
    for params in (
        SamplingParams(max_tokens=8, top_k=1, seed=2),
        SamplingParams(max_tokens=8, top_p=1e-6, seed=2),
    ):
        (seq,) = (await client.sample_async(ModelInput.from_ints(prompt), 1, params)).sequences
        assert seq.tokens == greedy


async def test_compute_logprobs_matches_forward(model, tokenizer):
    client = make_client(model, tokenizer)
    prompts = [encode(tokenizer, t) for t in PROMPTS]
    results = await asyncio.gather(
        *[client.compute_logprobs_async(ModelInput.from_ints(p)) for p in prompts]
    )
    assert client.stats.batches == 1
    for prompt, got in zip(prompts, results):
        logprobs = full_logprobs(model, prompt)
        expected = [logprobs[i - 1, t].item() for i, t in enumerate(prompt) if i > 0]
        assert got[0] is None and got[1:] == pytest.approx(expected, abs=1e-5)
    alone = client.compute_logprobs(ModelInput.from_ints(prompts[0])).result(timeout=60)
    assert alone[0] is None and alone[1:] == pytest.approx(results[0][1:], abs=1e-5)


async def test_prompt_logprobs_in_sample(model, tokenizer):
    client = make_client(model, tokenizer)
    prompt = encode(tokenizer, PROMPTS[1])
    response = await client.sample_async(
        ModelInput.from_ints(prompt),
        1,
        GREEDY,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=3,
    )
    logprobs = full_logprobs(model, prompt)
    assert response.prompt_logprobs[0] is None and len(response.prompt_logprobs) == len(prompt)
    assert response.prompt_logprobs[1] == pytest.approx(logprobs[0, prompt[1]].item(), abs=1e-5)
    assert response.topk_prompt_logprobs[0] is None
    top = response.topk_prompt_logprobs[1]
    assert [t for t, _ in top] == logprobs[0].topk(3).indices.tolist()


def test_sync_sample_future(model, tokenizer):
    client = make_client(model, tokenizer, batch_window_ms=0.0)
    prompt = encode(tokenizer, PROMPTS[0])
    response = client.sample(ModelInput.from_ints(prompt), 1, GREEDY).result(timeout=60)
    assert response.sequences[0].tokens == manual_greedy(model, prompt, 8)
    client.close()


def test_invalid_requests_raise(model, tokenizer):
    client = make_client(model, tokenizer)
    with pytest.raises(ValidationError):
        client.sample(ModelInput.from_ints([]), 1, GREEDY)
    with pytest.raises(ValidationError):
        client.sample(ModelInput.from_ints([3]), 1, SamplingParams(max_tokens=0))
    with pytest.raises(ValidationError):
        client.sample(ModelInput.from_ints([3]), 1, SamplingParams(top_p=0.0))


def test_batcher_propagates_errors_and_restarts_after_idle():
    calls: list[list[int]] = []

    def run(payloads: list[int]) -> list[int]:
        calls.append(payloads)
        if -1 in payloads:
            raise RuntimeError("boom")
        return [p * 2 for p in payloads]

    batcher = Batcher(run, max_size=4, window_s=0.0, name="test", idle_s=0.05)
    assert batcher.submit(3, 1).result(timeout=5) == 6
    with pytest.raises(RuntimeError, match="boom"):
        batcher.submit(-1, 1).result(timeout=5)
    threading.Event().wait(0.2)  # the worker exits when idle …
    assert batcher._thread is None
    assert batcher.submit(5, 1).result(timeout=5) == 10  # … and restarts on demand
    batcher.close()
    with pytest.raises(RuntimeError):
        batcher.submit(1, 1)


async def test_padded_embedding_rows_are_never_sampled(tokenizer):
    """A checkpoint whose table is padded past the tokenizer (Qwen2.5: 151,936 vs 151,665) and
    that favours the padding rows still emits only ids the tokenizer decodes."""
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tokenizer) + 24, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False)
    padded = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        padded.lm_head.bias = None
        padded.lm_head.weight[len(tokenizer):] *= 50.0  # the padding rows' logits dominate
    client = make_client(padded, tokenizer)
    prompt = encode(tokenizer, PROMPTS[3])
    for params in (GREEDY, SamplingParams(max_tokens=16, temperature=1.0, seed=5)):
        response = await client.sample_async(ModelInput.from_ints(prompt), 4, params)
        for seq in response.sequences:
            assert seq.tokens and max(seq.tokens) < len(tokenizer)
            check_logprobs(padded, prompt, seq)


@pytest.mark.parametrize("budget", [8, 40])
async def test_chunked_prefill_equals_the_one_pass_prefill(model, tokenizer, monkeypatch, budget):
    """Prompts longer than a prefill chunk (several chunks, ragged left padding) decode the
    tokens and log-probs of an uncached forward over the whole sequence."""
    from searchr1.engines.local.sampling import decode

    monkeypatch.setattr(decode, "PREFILL_TOKENS", budget)
    monkeypatch.setattr(decode, "PREFILL_MIN_CHUNK", 1)
    client = make_client(model, tokenizer)
    prompts = [encode(tokenizer, text * 3) for text in PROMPTS]  # 3 … 63 tokens, 4 rows
    responses = await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, GREEDY)
                                       for p in prompts))
    for prompt, response in zip(prompts, responses, strict=True):
        (seq,) = response.sequences
        assert seq.tokens == manual_greedy(model, prompt, 8)
        check_logprobs(model, prompt, seq)


async def test_versioned_client_reuses_the_previous_turn_and_drops_it_after_an_update(model, tokenizer):
    """A client told the weights' version prefills a follow-up turn from the stored KV (same
    draws as a client without the store) and forgets the store once the version moves."""
    version = [0]
    client = make_client(model, tokenizer, prefix_cache_tokens=4096)
    client = LocalSamplingClient(model, tokenizer, client.engine_cfg, weights_version=lambda: version[0])
    plain = make_client(model, tokenizer)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5)
    prompt = encode(tokenizer, "search: who wrote the book on cats?")
    first = await client.sample_async(ModelInput.from_ints(prompt), 2, params)
    follow = prompt + first.sequences[0].tokens + encode(tokenizer, " result: a man did.")
    reused = await client.sample_async(ModelInput.from_ints(follow), 1, params)
    alone = await plain.sample_async(ModelInput.from_ints(follow), 1, params)
    assert client._prefix.hits == 1 and plain._prefix is None
    assert reused.sequences[0].tokens == alone.sequences[0].tokens
    assert reused.sequences[0].logprobs == pytest.approx(alone.sequences[0].logprobs, abs=1e-5)
    version[0] += 1
    follow2 = prompt + first.sequences[1].tokens + encode(tokenizer, " none.")
    await client.sample_async(ModelInput.from_ints(follow2), 1, params)
    assert client._prefix.hits == 1  # the second sequence's entry went with the old weights
