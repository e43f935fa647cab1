"""Benchmark: LoRA ``forward_backward`` (packed, chunked log-probs) versus the naive padded loop.

Both run on the same peft model and the same data in one process: ``--sequences`` datums
(default 64) of lengths uniform in [``--min-len``, ``--max-len``] (seeded; default 1k–2k,
tiny model 64–128), loss ``importance_sampling``. The figure is ``LocalTrainingClient``'s
default path (sequences packed without padding, target log-probs in chunks); the reference
is today's former path (right-padded micro-batches, full-vocabulary fp32 logits,
``layout="padded", logits_chunk=None``). Both micro-batch at ``--micro-tokens`` tokens; if
a path runs out of memory there, its cap is halved until it fits (reported as micro_tokens). Then,
on CUDA, one packed micro-batch of ``--check-tokens`` tokens (default 65,536) is run alone
to show it fits, with its peak memory.

Prints medians of ``--repeats`` runs after a warm-up, and writes JSON to ``--out``:

    uv run python experiments/benchmarks/train_throughput.py --model tiny --device cpu
    uv run python experiments/benchmarks/train_throughput.py --model embedded --device cuda --out train.json
    uv run python experiments/benchmarks/train_throughput.py --model qwen2.5-1.5b-random --device cuda
    uv run python experiments/benchmarks/train_throughput.py --model embedded --device cuda --compile-layers

``--compile-layers`` turns on the figure's ``engine.compile_layers`` (the reference stays the
eager padded loop; the warm-up run absorbs the compilation).

MFU uses ``searchr1/engines/local/training/flops.py``'s LoRA FLOP count against ``--peak-flops``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch
from pytrio.types import Datum, ModelInput, TensorData

from searchr1.engines.local.training import flops
from searchr1.engines.local.model import (
    LocalEngineConfig,
    ModelConfig,
    load_model,
    resolve_device,
    resolve_dtype,
)
from searchr1.engines.local.training.client import LocalTrainingClient, create_lora_training_client

GIB = 2**30


def build_model(name: str, device: torch.device, dtype: torch.dtype, cache_dir: str) -> torch.nn.Module:
    """The base model for ``--model`` (random ones are seeded; nothing is downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if name == "embedded":
        cfg = ModelConfig()
        return load_model(cfg, device, dtype, cache_dir)
    if name == "tiny":
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
        return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    config = Qwen2Config(  # Qwen2.5-1.5B's sizes
        vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32_768,
        rope_theta=1_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
    )
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(dtype=dtype).eval()


class _VocabOnly:
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def make_data(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[Datum]:
    """``n`` pre-shifted datums with lengths uniform in [lo, hi]; advantages ±1 per datum."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(n):
        length = int(torch.randint(lo, hi + 1, (), generator=g))
        tokens = torch.randint(0, vocab, (length + 1,), generator=g).tolist()
        advantage = 1.0 if float(torch.rand((), generator=g)) < 0.5 else -1.0
        old = (-1.0 - 4.0 * torch.rand(length, generator=g)).tolist()
        data.append(Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
            "target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[length]),
            "logprobs": TensorData(data=old, dtype="float32", shape=[length]),
            "advantages": TensorData(data=[advantage] * length, dtype="float32", shape=[length]),
        }))
    return data


def padding_waste(client: LocalTrainingClient, data: list[Datum]) -> float:
    """Fraction of the micro-batches' token slots that are padding."""
    plan = client.passes.plan(data, "importance_sampling", False)
    batches = list(client.passes.batches(plan, False))
    slots = sum(getattr(b, "input_ids_BS", getattr(b, "input_ids_1T", None)).numel() for b in batches)
    return 1.0 - sum(n for b in batches for n in b.lengths_B) / slots


def timed(client: LocalTrainingClient, data: list[Datum], device: torch.device) -> dict[str, float]:
    """One forward_backward: seconds, tokens/s, peak memory (CUDA), MFU (CUDA)."""
    client.model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    out = client.forward_backward(data, "importance_sampling").result()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    lengths = [len(d.model_input) for d in data]
    run = {"seconds": seconds, "tokens_per_second": sum(lengths) / seconds,
           "loss_sum": out.metrics["loss_sum"]}
    if device.type == "cuda":
        run["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        work = flops.step_flops(client.passes.shape, lengths, backward=True)
        run["mfu"] = flops.mfu(work, seconds, client.passes.peak_flops)
    return run


def measure(client: LocalTrainingClient, data: list[Datum], device: torch.device, repeats: int) -> dict:
    """Medians over ``repeats`` runs after one warm-up."""
    timed(client, data, device)
    runs = [timed(client, data, device) for _ in range(repeats)]
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    out["padding_waste"] = padding_waste(client, data)
    return out


def measure_path(model, tokenizer, data, device, args, **layout) -> dict:
    """One path (``layout`` = client keywords), halving its micro-batch cap on out-of-memory."""
    cap = args.micro_tokens
    while True:
        client = LocalTrainingClient(model, tokenizer, max_batch_datums=None, max_batch_tokens=cap,
                                     peak_flops=args.peak_flops, **layout)
        try:
            return {**measure(client, data, device, args.repeats), "micro_tokens": cap}
        except torch.cuda.OutOfMemoryError:
            model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            if cap <= 2 * args.max_len:
                return {"error": f"out of memory down to {cap} tokens per micro-batch", "micro_tokens": cap}
            cap //= 2


def check_one_micro_batch(model, tokenizer, device, args) -> dict:
    """One packed micro-batch of ``--check-tokens`` tokens: does it fit, at what peak memory."""
    if device.type != "cuda":
        return {"skipped": "CPU"}
    per = args.max_len
    data = make_data(args.check_tokens // per, per, per, len(tokenizer), args.seed + 1)
    client = LocalTrainingClient(model, tokenizer, max_batch_datums=None, max_batch_tokens=args.check_tokens,
                                 peak_flops=args.peak_flops)
    try:
        run = timed(client, data, device)
    except torch.cuda.OutOfMemoryError as err:
        return {"tokens": args.check_tokens, "fits": False, "error": str(err).splitlines()[0]}
    return {"tokens": sum(len(d.model_input) for d in data), "fits": True, **run}


def table(fig: dict, ref: dict) -> str:
    """Markdown table: figure / reference / ratio."""
    rows = [("tokens / s", "tokens_per_second", 1.0), ("peak memory GiB", "peak_memory_gib", 1.0),
            ("padding waste %", "padding_waste", 100.0), ("MFU %", "mfu", 100.0),
            ("seconds", "seconds", 1.0), ("micro-batch tokens", "micro_tokens", 1.0),
            ("loss sum (same data: must agree)", "loss_sum", 1.0)]
    lines = ["| measure | packed + chunked (figure) | naive padded (reference) | ratio |",
             "|---|---|---|---|"]
    for name, key, scale in rows:
        a, b = fig.get(key), ref.get(key)
        cell = lambda v: "n/a" if v is None else f"{v * scale:,.2f}"  # noqa: E731
        ratio = "n/a" if a is None or b in (None, 0) else f"{a / b:.2f}"
        lines.append(f"| {name} | {cell(a)} | {cell(b)} | {ratio} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["embedded", "tiny", "qwen2.5-1.5b-random"], default="tiny")
    parser.add_argument("--device", default="auto", help="cuda | cpu | auto")
    parser.add_argument("--dtype", default="auto", help="auto = bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=None, help="default 1024 (tiny: 64)")
    parser.add_argument("--max-len", type=int, default=None, help="default 2048 (tiny: 128)")
    parser.add_argument("--micro-tokens", type=int, default=64_000, help="tokens per micro-batch, both paths")
    parser.add_argument("--check-tokens", type=int, default=65_536, help="the one-micro-batch check (CUDA)")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--peak-flops", type=float, default=flops.H200_BF16_PEAK)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=LocalEngineConfig().cache_dir)
    parser.add_argument("--compile-layers", action="store_true",
                        help="the figure's client compiles its decoder layers (engine.compile_layers)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    tiny = args.model == "tiny"
    args.min_len = args.min_len or (64 if tiny else 1024)
    args.max_len = args.max_len or (128 if tiny else 2048)
    return args


def main() -> None:
    args = parse_args()
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    base = build_model(args.model, device, dtype, args.cache_dir)
    tokenizer = _VocabOnly(base.config.vocab_size)
    model = create_lora_training_client(base, tokenizer, args.rank, 2 * args.rank, args.seed, device).model
    data = make_data(args.sequences, args.min_len, args.max_len, len(tokenizer), args.seed)
    fig = measure_path(model, tokenizer, data, device, args,  # the defaults: packed, chunked
                       compile_layers=args.compile_layers)
    ref = measure_path(model, tokenizer, data, device, args, layout="padded", logits_chunk=None)
    check = check_one_micro_batch(model, tokenizer, device, args)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"model={args.model} device={gpu} dtype={dtype} sequences={args.sequences} "
          f"figure_compile_layers={args.compile_layers} "
          f"lengths={args.min_len}-{args.max_len} micro_tokens={args.micro_tokens} "
          f"repeats={args.repeats} (medians)\n")
    print(table(fig, ref))
    print(f"\none packed micro-batch: {json.dumps(check)}")
    if args.out:
        result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device": gpu,
                  "args": vars(args), "figure": fig, "reference": ref, "one_micro_batch": check,
                  "ratio_tokens_per_second": fig["tokens_per_second"] / ref["tokens_per_second"]
                  if "tokens_per_second" in ref else None}
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
