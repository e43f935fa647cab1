"""sampler_throughput's cold call: where the slot sampler's time goes (admission vs decode) and
which kernels its prefill chunks run (``--kernels``), on a tiny random Llama on CPU."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.sampling import prefill, slot_engine
from tests.helpers.scripts import load_script


def test_the_cold_call_splits_admission_from_decode_and_profiles_only_its_prefill_chunks(monkeypatch):
    # restored after the test: the profile rebinds the engine's prefill runners
    monkeypatch.setattr(slot_engine, "run_eager", slot_engine.run_eager)
    monkeypatch.setattr(prefill.PrefillGraphs, "run", prefill.PrefillGraphs.run)
    bench = load_script("experiments/benchmarks/sampler_throughput.py")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256)).eval()
    model.generation_config.eos_token_id = None
    tokenizer = bench._Tok(64)
    kernels = bench.prefill_kernel_profile(8)
    rows, prompt, new = 6, 40, 8
    client = bench.slots_client(model, tokenizer, rows, "grouped", prompt + new + 16)
    batch = bench.prompts(rows, 64, prompt)
    row = bench.measure(client, batch, new, 1, client.slots.table.invalidate,
                        lambda: client.slots.stats.capture_seconds, 64, kernels, client.slots.stats)
    try:
        assert row["cold_tok_s"] == rows * new / row["cold_s"]
        # both parts of the cold call were measured, and together they fit inside it
        assert row["cold_admit_s"] > 0 and row["cold_decode_s"] > 0
        assert row["cold_admit_s"] + row["cold_decode_s"] <= row["cold_s"]
        # armed for the cold call only: the warm-up's chunk came before it and the uncached repeats'
        # after it. The cold call's 240 tokens take one or two chunks (a prompt whose first ids a
        # warm-up slot holds continues that slot: not fresh, so cut apart) in one or two rounds
        assert 1 <= row["cold_prefill_chunks"] <= 4
        assert kernels.done == row["cold_prefill_chunks"] and not kernels.armed
        seconds, count = kernels.totals["aten::linear"]
        # per chunk: q/k/v, o, gate/up and down in the first layer; the last only its q/k/v (a
        # prefill stops after the last keys)
        assert count == (4 + 1) * kernels.done and seconds > 0
        kernels.reset()
        assert kernels.done == 0 and not kernels.totals
    finally:
        client.slots.close()
