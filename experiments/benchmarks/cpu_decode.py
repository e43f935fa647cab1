"""CPU decode step of the HF sampler's model: peft (unmerged LoRA) vs merged weights, vs the
weight-streaming time measured on the same machine.

A decode step at a few rows reads every weight once; on a CPU that is memory-bound, so its
reference is the time to stream the model's weight bytes, measured here as one pass of
``torch.sum`` over a buffer of the same size. Random weights of the embedded model's shape
(SmolLM2-135M), float32 as on the CPU engine, a cache of ``--context`` tokens per row; medians
of ``--steps`` steps after a warm-up.

    uv run python experiments/benchmarks/cpu_decode.py --rows 8 --context 1200
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM


def smollm2_shape():
    return AutoConfig.for_model("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                tie_word_embeddings=True)


def decode_seconds(model, rows: int, context: int, steps: int) -> list[float]:
    """Seconds of each one-token step over ``rows`` rows with ``context`` cached tokens."""
    with torch.inference_mode():
        ids = torch.randint(0, model.config.vocab_size, (rows, context))
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, token = out.past_key_values, ids[:, -1:]
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            times.append(time.perf_counter() - start)
        return times[1:]


def stream_seconds(nbytes: int, repeats: int = 5) -> float:
    """Median seconds to read ``nbytes`` once (one reduction over a float32 buffer)."""
    buffer = torch.ones(nbytes // 4)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--context", type=int, default=1200)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lora-rank", type=int, default=8)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(smollm2_shape()).eval()
    merged = copy.deepcopy(base)
    peft = get_peft_model(base, LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank,
                                           target_modules="all-linear")).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in merged.parameters())
    ref = stream_seconds(weight_bytes)
    rows = {name: statistics.median(decode_seconds(m, args.rows, args.context, args.steps))
            for name, m in (("peft (unmerged LoRA)", peft), ("merged weights", merged))}
    print(f"\nCPU decode, SmolLM2-135M shape fp32, {args.rows} rows, {args.context} cached tokens, "
          f"{torch.get_num_threads()} threads; weights {weight_bytes / 1e6:.0f} MB")
    print(f"{'figure':<32} {'ms / step':>10} {'reference':<32} {'ms':>8} {'ratio':>7}")
    for name, seconds in rows.items():
        print(f"{name:<32} {seconds * 1e3:10.1f} {'stream the weights once':<32} {ref * 1e3:8.1f} "
              f"{seconds / ref:7.2f}")
    peft_s, merged_s = rows.values()
    print(f"{'merged weights':<32} {merged_s * 1e3:10.1f} {'peft (unmerged LoRA)':<32} {peft_s * 1e3:8.1f} "
          f"{merged_s / peft_s:7.2f}")
    return dict(rows=rows, stream_seconds=ref, weight_bytes=weight_bytes)


if __name__ == "__main__":
    main()
