"""Sampler throughput: the slot sampler vs transformers ``generate`` (naive and static-cache compiled).

Each configuration sends ``rows`` concurrent requests of ``--new-tokens`` tokens (temperature 1)
and counts generated tokens per second of wall time, median of ``--repeats`` after one warm-up
run (the warm-up includes CUDA-graph capture, reported separately). References, in the same run
and on the same model: a left-padded ``model.generate`` (dynamic KV cache) and, at
``--static-rows``, ``generate(cache_implementation="static")``, which transformers compiles
(``torch.compile``, CUDA graphs) on its first call (that call's time reported). The bound is the lower of two: a
decode step streams the weights and every row's keys and values (at the mean context) once
at 4.8 TB/s, and it costs 2 FLOPs per matmul weight and row at 989 TFLOP/s (bf16 dense).

    python experiments/benchmarks/sampler_throughput.py --model smollm2-random --rows 32 128 512
    python experiments/benchmarks/sampler_throughput.py --model embedded --device cpu --rows 4 --new-tokens 16

Models: ``embedded`` (SmolLM2-135M from the package), ``smollm2-random`` (the same shapes,
random weights, no file needed), ``qwen2.5-1.5b-random`` / ``qwen2.5-3b-random`` (those shapes,
random). ``--prompt-tokens`` sets each row's context before it decodes (64 by default; the
paper's turns decode at ~1.7k):

    python experiments/benchmarks/sampler_throughput.py --model qwen2.5-3b-random --rows 128 512 --prompt-tokens 1700 --static-rows --no-naive
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch
from pytrio import ModelInput, SamplingParams
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from searchr1.engines.local.model import LocalEngineConfig, ModelConfig, load_model, load_tokenizer
from searchr1.engines.local.sampling.hf_sampler import LocalSamplingClient
from searchr1.engines.local.sampling.slot_model import Dims
from searchr1.engines.local.training import flops
from searchr1.engines.local.shapes import shape_config

SHAPES = {
    "smollm2-random": lambda: LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0, tie_word_embeddings=True,
        max_position_embeddings=8192, rms_norm_eps=1e-5),
    "qwen2.5-1.5b-random": lambda: Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6),
    "qwen2.5-3b-random": lambda: shape_config("qwen2_5_3b"),  # searchr1/engines/local/shapes.py
}
HBM_BYTES_PER_S = 4.8e12  # H200
PEAK_FLOPS = flops.H200_BF16_PEAK


class _Tok:
    """Stand-in tokenizer for random models: decodes ids to a string of numbers."""

    eos_token_id = None
    pad_token_id = 0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def __len__(self) -> int:  # the sampler keeps picks below the tokenizer's length
        return self.vocab

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def load(name: str, device: torch.device):
    if name == "embedded":
        cfg = ModelConfig()
        return load_model(cfg, device, "auto", "~/.cache/searchr1"), load_tokenizer(cfg, "~/.cache/searchr1")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):  # drawn where it runs: seconds, not minutes, for billions of weights
        model = AutoModelForCausalLM.from_config(SHAPES[name](), dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    return model, _Tok(model.config.vocab_size)


def prompts(rows: int, vocab: int, length: int = 64) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(10, vocab - 10, (rows, length), generator=g).tolist()


def run_slots(client: LocalSamplingClient, batch: list[list[int]], new: int) -> tuple[float, int]:
    params = [SamplingParams(max_tokens=new, temperature=1.0, seed=i) for i in range(len(batch))]

    async def go():
        return await asyncio.gather(*(client.sample_async(ModelInput.from_ints(p), 1, sp)
                                      for p, sp in zip(batch, params)))

    t0 = time.perf_counter()
    out = asyncio.run(go())
    return time.perf_counter() - t0, sum(len(r.sequences[0].tokens) for r in out)


@torch.inference_mode()
def run_generate(model, batch: list[list[int]], new: int, **kw) -> tuple[float, int]:
    ids = torch.tensor(batch, device=model.device)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                         min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0, **kw)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, (out.shape[1] - ids.shape[1]) * ids.shape[0]


@torch.inference_mode()
def logprob_mismatch(model, client: LocalSamplingClient, batch: list[list[int]], new: int, rows: int = 8) -> float:
    """Mean |sampler logprob − HF forward logprob| over the sampled tokens of ``rows`` sequences."""
    diffs = []
    for prompt in batch[:rows]:
        seq = client.sample(ModelInput.from_ints(prompt), 1, SamplingParams(max_tokens=new, temperature=1.0, seed=0)).result().sequences[0]
        ids = torch.tensor([prompt + seq.tokens], device=model.device)
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
        ref = logp.gather(-1, ids[0, len(prompt):, None]).squeeze(-1).cpu()
        diffs.append((ref - torch.tensor(seq.logprobs)).abs())
    return float(torch.cat(diffs).mean())


def profile_call(fn) -> str:
    """torch.profiler's table of one call, top device ops (kernels replayed by CUDA graphs included)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70)


def median_rate(fn, repeats: int) -> tuple[float, float]:
    """(tokens/s median over repeats, seconds of the first, warm-up call)."""
    t_first, _ = fn()
    rates = []
    for _ in range(repeats):
        seconds, tokens = fn()
        rates.append(tokens / seconds)
    return statistics.median(rates), t_first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-random", choices=["embedded", *SHAPES])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=64,
                    help="prompt length per row (the paper's turns decode at ~1.7k tokens of context)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--static-rows", type=int, nargs="*", default=[128], help="rows for the compiled static-cache reference")
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument("--decode-attention", nargs="+", default=["grouped"], choices=["grouped", "flex"],
                    help="engine.decode_attention of the slot sampler; several: each is timed, the first "
                         "is the reference of the others' ratio")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, profile one more call per configuration (torch.profiler: top device ops)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    model, tokenizer = load(args.model, device)
    vocab = model.config.vocab_size
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    matmul_weights = flops.matmul_weights(model)  # 2 FLOPs each per decoded token
    dims = Dims.of(model.config)
    kv_bytes = dims.layers * 2 * dims.kv_heads * dims.head_dim * 2  # bf16 K and V per token
    results = []
    for rows, attention in ((r, a) for r in args.rows for a in args.decode_attention):
        cfg = LocalEngineConfig(sampler="slots", kv_slots=rows, decode_attention=attention,
                                max_seq_len=args.prompt_tokens + args.new_tokens + 16, sync_every=16)
        client = LocalSamplingClient(model, tokenizer, cfg)
        batch = prompts(rows, vocab, args.prompt_tokens)
        ours, first = median_rate(lambda: run_slots(client, batch, args.new_tokens), args.repeats)
        row = {"rows": rows, "decode_attention": attention, "slots_tok_s": ours, "slots_first_call_s": first,
               "capture_s": client.slots.stats.capture_seconds,
               "bound_tok_s": rows * HBM_BYTES_PER_S / weight_bytes,
               "compute_bound_tok_s": PEAK_FLOPS / (2 * matmul_weights),
               # each decode step also reads every row's keys and values, at the mean context
               "kv_bound_tok_s": rows * HBM_BYTES_PER_S / (weight_bytes + rows * kv_bytes * (
                   args.prompt_tokens + args.new_tokens / 2)),
               "logprob_mismatch": logprob_mismatch(model, client, batch, min(args.new_tokens, 64))}
        if not args.no_naive and attention == args.decode_attention[0]:
            row["naive_tok_s"], _ = median_rate(lambda: run_generate(model, batch, args.new_tokens), 1)
        if rows in args.static_rows and device.type == "cuda" and attention == args.decode_attention[0]:
            try:  # transformers compiles the forward itself for a static cache (its first call)
                row["static_tok_s"], row["static_first_call_s"] = median_rate(
                    lambda: run_generate(model, batch, args.new_tokens, cache_implementation="static"), 2)
            except Exception as error:  # noqa: BLE001 - a reference failing must not lose the run
                row["static_error"] = f"{type(error).__name__}: {str(error)[:200]}"
        if args.profile and device.type == "cuda":
            row["profile"] = profile_call(lambda: run_slots(client, batch, args.new_tokens))
            print(row["profile"])
        client.slots.close()
        results.append(row)
        print(json.dumps(row), flush=True)
    print(f"\nsampler throughput, {args.model}, {args.device}, {args.prompt_tokens}-token prompts, "
          f"{args.new_tokens} new tokens per row (tokens/s, medians); bound = the lower of streaming the "
          f"weights and the rows' keys and values at the mean context once per step at 4.8 TB/s, and "
          f"2 FLOPs per weight and token at {PEAK_FLOPS / 1e12:.0f} TFLOP/s")
    ref = args.decode_attention[0]
    print(f"{'rows':>5} {'attention':>9} {'slots':>10} {'vs ' + ref:>10} {'naive':>10} {'ratio':>6} {'static':>10} "
          f"{'ratio':>6} {'bound':>11} {'of bound':>8} {'capture s':>9} {'|Δlogp|':>8}")
    for r in results:
        naive, static = r.get("naive_tok_s"), r.get("static_tok_s")
        base = next(b["slots_tok_s"] for b in results if b["rows"] == r["rows"] and b["decode_attention"] == ref)
        bound = min(r["kv_bound_tok_s"], r["compute_bound_tok_s"])  # the compute bound does not grow with rows
        fmt = lambda v: f"{v:10.0f}" if v else f"{'-':>10}"  # noqa: E731
        ratio = lambda v: f"{r['slots_tok_s'] / v:6.2f}" if v else f"{'-':>6}"  # noqa: E731
        print(f"{r['rows']:>5} {r['decode_attention']:>9} {r['slots_tok_s']:10.0f} {r['slots_tok_s'] / base:10.2f} "
              f"{fmt(naive)} {ratio(naive)} {fmt(static)} {ratio(static)} {bound:11.0f} "
              f"{r['slots_tok_s'] / bound:8.3f} {r['capture_s']:9.1f} {r['logprob_mismatch']:8.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "device": args.device, "decode_attention": args.decode_attention, "gpu": torch.cuda.get_device_name(0)
                       if device.type == "cuda" else None, "date": time.strftime("%Y-%m-%d"), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
