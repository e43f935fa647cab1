"""CPU threads under load: torch's default thread team against one thread, passive waiting and
``engine.threads=auto``, on a quiet machine and beside busy loops.

Two modes, each printing a table (figure, the reference measured in the same run, ratio;
medians over ``--rounds`` rounds that take the configurations in turn, so drift hits all alike):

- kernels (default): in a fresh process per configuration, a decode step (``--rows`` rows,
  ``--context`` cached tokens) and a LoRA forward + backward (``--train-tokens`` tokens) of
  the embedded model's shape (SmolLM2-135M widths, ``--layers`` of its 30 layers, random
  weights, float32 as on the CPU engine);
- ``--main``: the smoke preset's step-0 eval through the entry point
  (``python -m searchr1.main experiment=smoke trainer.steps=0``): ``time/eval`` from its
  ``metrics.jsonl`` and the whole process's wall time.

The reference is what a run did before ``engine.threads``: torch's default team (one thread
per core) with OpenMP's default waiting (``OMP_WAIT_POLICY=`` set empty, which libgomp reads
as its default after saying the value is invalid). ``--busy 0,2`` repeats everything with 0
and then 2 busy loops (``while True: pass``) beside it; the machine's own load is printed with
each condition, as the figures mean nothing without it.

    uv run python experiments/benchmarks/cpu_threads.py --busy 0,2 --rounds 3
    uv run python experiments/benchmarks/cpu_threads.py --main --busy 0,2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WAIT = ""  # OpenMP's own waiting (libgomp: an invalid value keeps its default)
# name → (environment, engine.threads): the reference first
CONFIGS = {
    "torch default (reference)": ({"OMP_WAIT_POLICY": DEFAULT_WAIT}, "torch"),
    "1 thread": ({"OMP_WAIT_POLICY": "PASSIVE"}, "1"),
    "torch's count, passive wait": ({"OMP_WAIT_POLICY": "PASSIVE"}, "torch"),
    "auto (the default)": ({"OMP_WAIT_POLICY": "PASSIVE"}, "auto"),
}


def child(args: argparse.Namespace) -> None:
    """One configuration's kernels in this process; prints one JSON line."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from searchr1.utils import cpu_threads

    threads = cpu_threads.apply(args.threads, "auto")
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                               num_hidden_layers=args.layers, num_attention_heads=9,
                               num_key_value_heads=3, tie_word_embeddings=True)
    model = get_peft_model(AutoModelForCausalLM.from_config(cfg),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    decode, train = [], []
    with torch.inference_mode():
        ids = torch.randint(0, cfg.vocab_size, (args.rows, args.context))
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, token = out.past_key_values, ids[:, -1:]
        for _ in range(args.steps + 1):
            start = time.perf_counter()
            cache = model(input_ids=token, past_key_values=cache, use_cache=True,
                          logits_to_keep=1).past_key_values
            decode.append(time.perf_counter() - start)
    ids = torch.randint(0, cfg.vocab_size, (1, args.train_tokens))
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        train.append(time.perf_counter() - start)
    print(json.dumps({"threads": threads, "decode_ms": statistics.median(decode[1:]) * 1e3,
                      "train_ms": statistics.median(train[1:]) * 1e3}))


def run_kernels(name: str, args: argparse.Namespace) -> dict:
    env, threads = CONFIGS[name]
    cmd = [sys.executable, __file__, "--child", "--threads", threads, "--rows", str(args.rows),
           "--context", str(args.context), "--train-tokens", str(args.train_tokens),
           "--layers", str(args.layers), "--steps", str(args.steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(env))
    if out.returncode:
        raise SystemExit(f"{name}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_main(name: str, args: argparse.Namespace) -> dict:
    env, threads = CONFIGS[name]
    with tempfile.TemporaryDirectory(prefix="cpu-threads-") as tmp:
        cmd = [sys.executable, "-m", "searchr1.main", "experiment=smoke", "trainer.steps=0",
               f"engine.threads={threads}", f"hydra.run.dir={tmp}/run", *args.overrides]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(env))
        wall = time.perf_counter() - start
        if out.returncode:
            raise SystemExit(f"{name}: exit {out.returncode}\n{out.stderr[-2000:]}")
        rows = [json.loads(line) for line in Path(tmp, "run", "metrics.jsonl").read_text().splitlines()]
    evals = [r["time/eval"] for r in rows if "time/eval" in r]
    threads_line = [ln for ln in out.stdout.splitlines() + out.stderr.splitlines() if "CPU threads:" in ln]
    used = int(threads_line[-1].split("CPU threads:")[1].split()[0]) if threads_line else -1
    return {"threads": used, "eval_s": evals[0], "wall_s": wall, "evals": len(evals)}


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    return {**env, **extra}


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def measure(args: argparse.Namespace, busy: int) -> dict[str, list[dict]]:
    """Every configuration ``--rounds`` times, in turn, with ``busy`` loops running beside."""
    loops = busy_loops(busy)
    try:
        time.sleep(2 if busy else 0)
        results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        for _ in range(args.rounds):
            for name in CONFIGS:
                results[name].append((run_main if args.main else run_kernels)(name, args))
        return results
    finally:
        for p in loops:
            p.kill()
            p.wait()


def table(results: dict[str, list[dict]], figures: list[str], busy: int, load: tuple) -> str:
    ref_name = next(iter(CONFIGS))
    med = {n: {f: statistics.median(r[f] for r in rs) for f in figures} for n, rs in results.items()}
    lines = [f"\n{busy} busy loop(s) beside; load average at start {load[0]:.2f} / {load[1]:.2f} "
             f"/ {load[2]:.2f} (1 / 5 / 15 min); {len(os.sched_getaffinity(0))} cores; "
             f"medians of {len(results[ref_name])}",
             f"| figure | threads | {' | '.join(figures)} | reference | "
             f"{' | '.join(f'ref {f}' for f in figures)} | {' | '.join(f'ratio {f}' for f in figures)} |",
             "|---|---:|" + "---:|" * len(figures) + "---|" + "---:|" * (2 * len(figures))]
    for name, m in med.items():
        threads = sorted({r["threads"] for r in results[name]})
        lines.append(f"| {name} | {'/'.join(map(str, threads))} | "
                     + " | ".join(f"{m[f]:.1f}" for f in figures) + f" | {ref_name} | "
                     + " | ".join(f"{med[ref_name][f]:.1f}" for f in figures) + " | "
                     + " | ".join(f"{m[f] / med[ref_name][f]:.2f}" for f in figures) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--main", action="store_true", help="time the smoke preset's step-0 eval instead")
    ap.add_argument("--busy", default="0,2", help="busy loops beside, per condition (0,2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4, help="kernels: decode rows (4)")
    ap.add_argument("--context", type=int, default=600, help="kernels: cached tokens per row (600)")
    ap.add_argument("--train-tokens", type=int, default=256, help="kernels: tokens trained (256)")
    ap.add_argument("--layers", type=int, default=8, help="kernels: layers of the 30 (8)")
    ap.add_argument("--steps", type=int, default=5, help="kernels: timed repeats per figure (5)")
    ap.add_argument("--out", help="write the raw results as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="--main: more overrides for the entry point")
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return {}
    figures = ["eval_s", "wall_s"] if args.main else ["decode_ms", "train_ms"]
    report = {}
    for busy in (int(b) for b in args.busy.split(",")):
        load = os.getloadavg()
        results = measure(args, busy)
        print(table(results, figures, busy, load), flush=True)
        report[str(busy)] = {"load": load, "results": results}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
