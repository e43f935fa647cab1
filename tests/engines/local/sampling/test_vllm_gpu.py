"""The vLLM sampler on a real GPU with real vLLM (skips without either): stops and cuts, raw
log-probs, a weight update seen by the next sample, sleep freeing memory and wake restoring it.

One vLLM engine per process (its sleep-mode allocator allows one), shared by the module's tests.
Run on the GPU machine: ``python -m pytest tests/engines/local/sampling/test_vllm_gpu.py``.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
from pytrio import ModelInput, SamplingParams
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.config import LocalEngineConfig, ModelConfig, VllmConfig
from searchr1.engines.local.memory import estimate_for
from searchr1.engines.local.sampling.pool import SamplerPool
from searchr1.engines.local.sampling.stops import LENGTH, STOP
from searchr1.engines.local.sampling.vllm_start import start_vllm
from tests.conftest import tiny_tokenizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                                reason="needs a CUDA GPU and vLLM")
STOPS = ["e", "t"]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    engine_cfg = LocalEngineConfig(sampler="vllm", max_seq_len=256, cache_dir=str(tmp_path_factory.mktemp("v")),
                                   vllm=VllmConfig(max_num_seqs=64, memory_utilization=0.25, enforce_eager=True))
    est = estimate_for(model, ModelConfig(tuning="lora", lora_rank=8), engine_cfg, None, 1024)
    worker, detok = start_vllm(model, tok, engine_cfg, est, torch.device("cuda"))
    assert detok  # a real tokenizer: vLLM matches the stop strings itself
    pool = SamplerPool(engine_cfg, tok)
    pool.attach_vllm(worker, detok)
    version = [0]
    client = pool.client(model, None, lambda: version[0])
    yield dict(model=model, tok=tok, worker=worker, client=client, version=version)
    worker.close()


def _sample(client, prompt: list[int], n: int, **params):
    return client.sample(ModelInput.from_ints(prompt), n, SamplingParams(**params)).result(timeout=120)


@torch.inference_mode()
def _hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens], device="cuda")
    logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return logp.gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()


def test_stops_end_where_the_slot_samplers_rule_ends_them(rig) -> None:
    tok, client = rig["tok"], rig["client"]
    prompt = tok.encode("question: who", add_special_tokens=False)
    out = _sample(client, prompt, 48, max_tokens=40, temperature=1.0, seed=3, stop=STOPS)
    rule_reasons = []
    for seq in out.sequences:
        text = tok.decode(seq.tokens, skip_special_tokens=False)
        ends_on_stop = any(text.endswith(s) for s in STOPS) or (seq.tokens and seq.tokens[-1] == 1)
        earlier = any(s in tok.decode(seq.tokens[:k], skip_special_tokens=False) for s in STOPS
                      for k in range(1, len(seq.tokens)))
        assert not earlier  # nothing before the end would have stopped the slot sampler
        assert seq.stop_reason == (STOP if ends_on_stop else LENGTH)
        assert ends_on_stop or len(seq.tokens) == 40
        rule_reasons.append(seq.stop_reason)
    assert STOP in rule_reasons  # the rule was exercised, not only the length cap


def test_logprobs_are_the_raw_models_whatever_the_temperature(rig) -> None:
    prompt = rig["tok"].encode("the answer is", add_special_tokens=False)
    out = _sample(rig["client"], prompt, 4, max_tokens=24, temperature=0.6, top_p=0.9, seed=1)
    for seq in out.sequences:
        ref = _hf_logprobs(rig["model"], prompt, seq.tokens)
        assert (ref - torch.tensor(seq.logprobs)).abs().mean() < 0.05  # bf16 kernels; a temperature-0.6
        # distribution would differ by far more (its log-probs are the raw ones ÷ 0.6, renormalised)


def test_the_same_seed_draws_the_same_tokens(rig) -> None:
    prompt = rig["tok"].encode("seeded", add_special_tokens=False)
    a = _sample(rig["client"], prompt, 3, max_tokens=16, temperature=1.0, seed=5)
    b = _sample(rig["client"], prompt, 3, max_tokens=16, temperature=1.0, seed=5)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]


def test_a_weight_update_shows_in_the_next_sample(rig) -> None:
    model, client = rig["model"], rig["client"]
    prompt = rig["tok"].encode("update", add_special_tokens=False)
    before = _sample(client, prompt, 1, max_tokens=16, temperature=0.0).sequences[0]
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight) * 0.5)  # the optimizer step
    rig["version"][0] += 1
    pushes = rig["worker"].stats.pushes
    after = _sample(client, prompt, 1, max_tokens=16, temperature=0.0).sequences[0]
    assert rig["worker"].stats.pushes == pushes + 1
    assert after.tokens != before.tokens
    ref = _hf_logprobs(model, prompt, after.tokens)  # the new weights' log-probs, not the old ones'
    assert (ref - torch.tensor(after.logprobs)).abs().mean() < 0.05


def test_sleep_frees_memory_and_the_next_request_restores_it(rig) -> None:
    worker, client = rig["worker"], rig["client"]
    prompt = rig["tok"].encode("sleep", add_special_tokens=False)
    _sample(client, prompt, 2, max_tokens=8, temperature=1.0, seed=2)
    torch.cuda.synchronize()
    free_awake = torch.cuda.mem_get_info()[0]
    worker.request_sleep()
    for _ in range(200):
        if worker.asleep:
            break
        time.sleep(0.05)
    assert worker.asleep
    free_asleep = torch.cuda.mem_get_info()[0]
    assert free_asleep - free_awake > 0.10 * torch.cuda.get_device_properties(0).total_memory  # KV pool of 0.25
    out = _sample(client, prompt, 2, max_tokens=8, temperature=1.0, seed=2)
    assert not worker.asleep and all(s.tokens for s in out.sequences)
    assert torch.cuda.mem_get_info()[0] < free_asleep - 0.10 * torch.cuda.get_device_properties(0).total_memory
