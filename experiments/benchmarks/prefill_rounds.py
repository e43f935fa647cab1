"""Benchmark: one admission round's prefill — eager, ``engine.compile_prefill``, ``engine.prefill_graphs``.

The RL step's profile (README, "Where the step's time goes") puts half of the rollout in the
slot sampler's eager prefill, as host time. This times the engine's own prefill path
(``sampling/prefill.py``: a round cut into chunks, then one forward per chunk, the host-to-device
copies included) on a random-weight model of a named shape (``searchr1/engines/local/shapes.py``),
for rounds of ``--rows`` rows × ``--width`` new tokens each, reading an attention length of
``--length`` (the world step: tens of rows of a few hundred tokens, 2,048-token slots). Per
round it reports the median over ``--repeats`` of

- host ms: until the round's calls return (what the sampler thread spends dispatching), and
- wall ms: until the device has finished too (``torch.cuda.synchronize``),

for the eager layers (the reference), the shape-generic compiled layers and, on CUDA, the
padded chunks replayed as captured graphs (``PrefillGraphs``; widths and row counts rounded up to
the engine's buckets, so a 300-token round computes 384 columns), each with its ratio to the
reference, and the top-level ``aten`` ops an eager and a compiled round dispatch
(torch.profiler). The modes alternate on every repeat, so they see the same clocks; the first
call of each (compile, capture) is reported apart.

    python experiments/benchmarks/prefill_rounds.py                       # CUDA, SmolLM2 shape
    uv run python experiments/benchmarks/prefill_rounds.py --device cpu --rows 4 --width 32 --length 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from searchr1.engines.local.sampling.prefill import PrefillGraphs, chunks, run_eager
from searchr1.engines.local.sampling.slot_model import KVCache, SlotWeights, compiled_layer_fns
from searchr1.engines.local.sampling.slot_types import SlotStats
from searchr1.engines.local.shapes import SHAPES, shape_config


def round_rows(rows: int, width: int, start: int) -> list[tuple[int, np.ndarray, int]]:
    """A round of ``rows`` rows (slots 0 …), each prefilling ``width`` tokens at positions ``start …``."""
    g = np.random.default_rng(rows * 1_000 + width)
    return [(slot, g.integers(0, 1_000, width).astype(np.int64), start) for slot in range(rows)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_round(run, device) -> tuple[float, float]:
    """(host s, wall s) of one round."""
    sync(device)
    start = time.perf_counter()
    run()
    host = time.perf_counter() - start
    sync(device)
    return host, time.perf_counter() - start


def dispatched_ops(run) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
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
    graphs = PrefillGraphs(device, torch.cuda.graph_pool_handle(), SlotStats()) if device.type == "cuda" else None
    rows_out = []
    with torch.inference_mode():
        for rows in args.rows:
            for width in args.width:
                round_ = round_rows(rows, width, args.length - width - 1)
                plain = list(chunks(round_, args.length, padded=False))
                modes = {"eager": lambda: [run_eager(c, w, cache, None, device) for c in plain],
                         "compiled": lambda: [run_eager(c, w, cache, compiled, device) for c in plain]}
                if graphs is not None:
                    modes["graphed"] = lambda: [graphs.run(c, w, cache, None)
                                                for c in chunks(round_, args.length, padded=True)]
                first = {k: time_round(run, device)[1] for k, run in modes.items()}  # compile, capture
                runs = {k: [] for k in modes}
                for _ in range(args.repeats):
                    for k, run in modes.items():
                        runs[k].append(time_round(run, device))
                out = {"rows": rows, "width": width, "length": args.length,
                       "eager_ops": dispatched_ops(modes["eager"]), "compiled_ops": dispatched_ops(modes["compiled"])}
                for k, v in runs.items():
                    out[f"{k}_host_ms"] = statistics.median(r[0] for r in v) * 1e3
                    out[f"{k}_wall_ms"] = statistics.median(r[1] for r in v) * 1e3
                    out[f"{k}_first_call_s"] = first[k]
                rows_out.append(out)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"shape={args.shape} device={name} dtype={dtype} length={args.length} "
          f"repeats={args.repeats} (medians)\n")
    figures = [m for m in ("compiled", "graphed") if f"{m}_host_ms" in rows_out[0]]
    head = "| rows × width | host ms eager (reference) | wall ms eager |"
    for m in figures:
        head += f" host ms {m} | ratio | wall ms {m} | ratio | first {m} call s |"
    print(head + " aten ops compiled / eager |")
    print("|---|" + "---:|" * (2 + 5 * len(figures) + 1))
    for r in rows_out:
        line = f"| {r['rows']} × {r['width']} | {r['eager_host_ms']:.2f} | {r['eager_wall_ms']:.2f} |"
        for m in figures:
            line += (f" {r[f'{m}_host_ms']:.2f} | {r[f'{m}_host_ms'] / r['eager_host_ms']:.2f} |"
                     f" {r[f'{m}_wall_ms']:.2f} | {r[f'{m}_wall_ms'] / r['eager_wall_ms']:.2f} |"
                     f" {r[f'{m}_first_call_s']:.1f} |")
        print(line + f" {r['compiled_ops']} / {r['eager_ops']} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": name, "args": vars(args), "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
