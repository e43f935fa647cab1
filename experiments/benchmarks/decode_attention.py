"""Benchmark: one decode step's attention, the slot sampler's kernel vs block-sparse FlexAttention.

The slot sampler's decode attention (``slot_model._grouped_attention``) reads every row's keys
up to the step's length bucket (a power of two ≥ the furthest live context) and materialises
float32 scores, so at the paper's contexts a step reads far more than the rows' own keys
(``docs/sampler.md``). This measures, for one layer of a named shape (``shapes.py``) and rows of
mixed context lengths in a pool like the sampler's (``[slots, kv_heads, max_len + 1, head_dim]``):

- reference: ``_grouped_attention`` over the bucket, with the sampler's boolean mask;
- figure: ``torch.nn.attention.flex_attention`` (compiled) over the same pool slice, with a
  ``BlockMask`` built from the rows' lengths, so blocks past a row's context are skipped, and
  grouped-query heads (``enable_gqa``);
- bound: the bytes of the keys and values the rows need (their own contexts) at 4.8 TB/s.

It prints the median ms per call (``--repeats`` CUDA-event timings), the ratio to the
reference, each against the bound, the block mask's build time (the sampler would rebuild it
once per decode window), and the largest |difference| between the two outputs.

    python experiments/benchmarks/decode_attention.py --shape qwen2_5_3b --rows 128 512 --context 1700 --max-len 4096
    uv run python experiments/benchmarks/decode_attention.py --device cpu --shape tiny --rows 4 --context 60 --max-len 128 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from searchr1.engines.local.sampling.slot_decode import attention_bucket
from searchr1.engines.local.sampling.slot_model import _grouped_attention
from searchr1.engines.local.shapes import SHAPES, shape_config

HBM_BYTES_PER_S = 4.8e12  # H200


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median ms of ``fn()`` (CUDA events on a GPU, wall time on a CPU), after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def one_case(shape: str, rows: int, context: int, max_len: int, device, dtype, repeats: int) -> dict:
    cfg = shape_config(shape)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = cfg.hidden_size // heads
    g = torch.Generator().manual_seed(rows)
    # contexts spread like a rollout's: uniform in [context / 4, 7 context / 4], within a slot
    lengths = torch.randint(max(1, context // 4), min(max_len, 7 * context // 4) + 1, (rows,), generator=g)
    length = attention_bucket(int(lengths.max()), max_len)
    pool_k = torch.randn(rows, kv_heads, max_len + 1, head_dim, generator=g).to(device, dtype)
    pool_v = torch.randn(rows, kv_heads, max_len + 1, head_dim, generator=g).to(device, dtype)
    q = torch.randn(rows, 1, heads, head_dim, generator=g).to(device, dtype)
    lengths = lengths.to(device)
    keys, values = pool_k[:, :, :length], pool_v[:, :, :length]
    allowed = (torch.arange(length, device=device)[None, None, :] < lengths[:, None, None])  # [B, 1, L]
    scale = head_dim ** -0.5

    def reference():
        return _grouped_attention(q, keys, values, allowed, scale)

    def visible(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    t0 = time.perf_counter()
    block_mask = create_block_mask(visible, rows, None, 1, length, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    mask_ms = (time.perf_counter() - t0) * 1e3
    flex = torch.compile(flex_attention, dynamic=False)
    q_bnd = q.transpose(1, 2)  # [B, N, 1, D]

    def figure():
        out = flex(q_bnd, keys, values, block_mask=block_mask, scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(rows, 1, heads * head_dim)

    with torch.inference_mode():
        diff = float((figure().float() - reference().float()).abs().max())
        ref_ms, fig_ms = timed(reference, device, repeats), timed(figure, device, repeats)
    needed = int(lengths.sum()) * kv_heads * head_dim * 2 * torch.finfo(dtype).bits // 8  # K and V
    bound_ms = needed / HBM_BYTES_PER_S * 1e3
    return {"shape": shape, "rows": rows, "mean_context": float(lengths.float().mean()), "bucket": length,
            "reference_ms": ref_ms, "flex_ms": fig_ms, "bound_ms": bound_ms, "block_mask_ms": mask_ms,
            "max_abs_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen2_5_3b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--context", type=int, default=1700, help="mean context of the rows")
    ap.add_argument("--max-len", type=int, default=4096, help="a slot's length (the bucket's cap)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = [one_case(args.shape, r, args.context, args.max_len, device, dtype, args.repeats) for r in args.rows]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"decode attention, one layer of {args.shape}, {name}, {dtype}, medians of {args.repeats}\n")
    print("| rows | mean context / bucket | flex ms | reference ms | ratio | bound ms | flex / bound | "
          "reference / bound | block mask ms | max abs diff |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rows']} | {r['mean_context']:.0f} / {r['bucket']} | {r['flex_ms']:.3f} | "
              f"{r['reference_ms']:.3f} | {r['flex_ms'] / r['reference_ms']:.2f} | {r['bound_ms']:.3f} | "
              f"{r['flex_ms'] / r['bound_ms']:.1f} | {r['reference_ms'] / r['bound_ms']:.1f} | "
              f"{r['block_mask_ms']:.1f} | {r['max_abs_diff']:.2e} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
