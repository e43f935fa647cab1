"""Benchmark: one admission round's prefill, eager vs ``engine.compile_prefill``.

The RL step's profile (README, "Where the step's time goes") puts half of the rollout in the
slot sampler's eager prefill, as host time. This times ``slot_model.forward_hidden`` — the call
``SlotEngine._prefill`` makes per chunk — on a random-weight model of a named shape (``searchr1/engines/local/shapes.py``), for rounds
of ``--rows`` rows × ``--width`` new tokens each, reading an attention length of ``--length``
(the world step: tens of rows of a few hundred tokens, 2,048-token slots). Per round it reports
the median over ``--repeats`` of

- host ms: until ``forward_hidden`` returns (what the sampler thread spends dispatching), and
- wall ms: until the device has finished too (``torch.cuda.synchronize``),

for the eager layers (the reference) and the compiled ones (the figure, after one warm-up call
per shape, which compiles once for every shape), with the ratio; and the top-level ``aten`` ops
a round dispatches (torch.profiler; a compiled half counts as its own call, the kernels it
launches do not). Every shape is run alternately eager and compiled, so both see the same
clocks.

    python experiments/benchmarks/prefill_rounds.py                       # CUDA, SmolLM2 shape
    uv run python experiments/benchmarks/prefill_rounds.py --device cpu --rows 4 --width 32 --length 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from searchr1.engines.local.sampling.slot_model import KVCache, SlotWeights, compiled_layer_fns, forward_hidden
from searchr1.engines.local.shapes import SHAPES, shape_config


def round_inputs(rows: int, width: int, start: int, device: torch.device):
    """A round of ``rows`` rows, each prefilling ``width`` tokens at positions ``start …``."""
    g = torch.Generator().manual_seed(rows * 1_000 + width)
    ids = torch.randint(0, 1_000, (rows, width), generator=g)
    pos = (torch.arange(width) + start).repeat(rows, 1)
    return ids.to(device), pos.to(device), pos.clone().to(device), torch.arange(rows, device=device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_round(w, cache, inputs, length, fns, device) -> tuple[float, float]:
    sync(device)
    start = time.perf_counter()
    forward_hidden(w, cache, *inputs, length, fns)
    host = time.perf_counter() - start
    sync(device)
    return host, time.perf_counter() - start


def dispatched_ops(w, cache, inputs, length, fns) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward_hidden(w, cache, *inputs, length, fns)
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2_135m", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--width", type=int, nargs="+", default=[64, 300])
    ap.add_argument("--length", type=int, default=2048, help="attention length (the slot's bucket)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(args.shape), dtype=dtype).eval()
    w = SlotWeights(model, device, dtype, args.length)
    cache = KVCache(w.dims, max(args.rows), args.length, device, dtype)
    compiled = compiled_layer_fns(dynamic=True)
    rows_out = []
    with torch.inference_mode():
        for rows in args.rows:
            for width in args.width:
                inputs = round_inputs(rows, width, args.length - width - 1, device)
                compile_s = time_round(w, cache, inputs, args.length, compiled, device)[1]
                time_round(w, cache, inputs, args.length, None, device)  # eager warm-up
                runs = {"eager": [], "compiled": []}
                for _ in range(args.repeats):
                    runs["eager"].append(time_round(w, cache, inputs, args.length, None, device))
                    runs["compiled"].append(time_round(w, cache, inputs, args.length, compiled, device))
                med = {k: [statistics.median(r[i] for r in v) * 1e3 for i in (0, 1)] for k, v in runs.items()}
                rows_out.append({
                    "rows": rows, "width": width, "length": args.length, "first_call_s": compile_s,
                    "eager_host_ms": med["eager"][0], "eager_wall_ms": med["eager"][1],
                    "compiled_host_ms": med["compiled"][0], "compiled_wall_ms": med["compiled"][1],
                    "eager_ops": dispatched_ops(w, cache, inputs, args.length, None),
                    "compiled_ops": dispatched_ops(w, cache, inputs, args.length, compiled),
                })
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"shape={args.shape} device={name} dtype={dtype} length={args.length} "
          f"repeats={args.repeats} (medians)\n")
    print("| rows × width | host ms compiled | host ms eager (reference) | ratio | wall ms compiled | "
          "wall ms eager | ratio | aten ops compiled / eager | first compiled call s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows_out:
        print(f"| {r['rows']} × {r['width']} | {r['compiled_host_ms']:.2f} | {r['eager_host_ms']:.2f} | "
              f"{r['compiled_host_ms'] / r['eager_host_ms']:.2f} | {r['compiled_wall_ms']:.2f} | "
              f"{r['eager_wall_ms']:.2f} | {r['compiled_wall_ms'] / r['eager_wall_ms']:.2f} | "
              f"{r['compiled_ops']} / {r['eager_ops']} | {r['first_call_s']:.1f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "args": vars(args), "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
