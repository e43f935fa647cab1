"""A full RL step on the embedded world: rollout, reference scoring, update — with its split.

Runs the real entry point (``python -m searchr1.main``) for ``--steps`` steps of
``--questions`` × ``--group`` trajectories (default 16 × 8 = 128, the paper's GRPO algorithm
at world size) and reads the per-step times from ``metrics.jsonl``; the first step (graph
capture, compile) is reported apart and the rest summarised by medians. ``--engines`` names the
samplers to run (``engine.sampler``), one run each, one after the other in this call; the first
is the reference of the ratios and runs ``--steps`` steps, the others ``--reference-steps``
(default: as many). By default the engine of ``auto`` against the HF batched decode.

    python experiments/benchmarks/rl_step.py --steps 6 --engines slots vllm -- warmstart=embedded
    python experiments/benchmarks/rl_step.py --steps 6 -- warmstart=oracle_sft
    python experiments/benchmarks/rl_step.py --steps 2 --questions 2 --group 2 --reference-steps 0 -- experiment=smoke

Arguments after ``--`` are passed to every run as Hydra overrides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from searchr1.utils.provenance import provenance

KEYS = ("time/step_seconds", "time/rollout", "time/reference", "time/train", "rollout/sampled_tokens",
        "train/datums", "rollout/degenerate_group_rate", "train/logprob_mismatch", "train/mfu")


def run(steps: int, questions: int, group: int, extra: list[str], out_dir: Path) -> list[dict]:
    """One training run; returns its per-step metric rows (eval rows dropped)."""
    overrides = [
        "experiment=paper_grpo_world", f"trainer.steps={steps}", f"trainer.questions_per_step={questions}",
        f"rollout.group_size={group}", "eval.before_training=false", "eval.max_questions=1",
        "trainer.save_every=0", f"hydra.run.dir={out_dir}", *extra,
    ]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "searchr1.main", *overrides], check=True)
    print(f"run finished in {time.perf_counter() - t0:.0f} s: {' '.join(overrides)}", flush=True)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/step_seconds" in r]


def summary(rows: list[dict]) -> dict:
    """First step apart, medians of the others (or of the only one)."""
    later = rows[1:] or rows
    med = {k: statistics.median(r[k] for r in later if k in r) for k in KEYS if any(k in r for r in later)}
    med["first_step_seconds"] = rows[0]["time/step_seconds"] if rows else float("nan")
    med["steps"] = len(rows)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--reference-steps", type=int, default=None, help="steps of the engines after the first")
    ap.add_argument("--engines", nargs="+", default=["auto", "hf"], choices=["auto", "slots", "hf", "vllm"])
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rl_step-"))
    results = {}
    for i, engine in enumerate(args.engines):
        steps = args.steps if i == 0 or args.reference_steps is None else args.reference_steps
        if steps:
            results[engine] = summary(run(steps, args.questions, args.group,
                                          [*args.overrides, f"engine.sampler={engine}"], root / engine))
    first = args.engines[0]
    n = args.questions * args.group
    print(f"\nRL step, {n} trajectories ({args.questions} × {args.group}), medians of steps 2.. "
          f"(step 1: " + ", ".join(f"{e} {r['first_step_seconds']:.1f} s" for e, r in results.items())
          + "); ratio = engine / " + first)
    print(f"{'metric':<32} " + " ".join(f"{e:>10}" for e in results) + "  ratios")
    for key in KEYS:
        values = [r.get(key) for r in results.values()]
        base = results[first].get(key)
        ratios = " ".join(f"{v / base:.2f}" if v is not None and base else "-" for v in values)
        print(f"{key:<32} " + " ".join(f"{v:10.3f}" if v is not None else f"{'-':>10}" for v in values)
              + f"  {ratios}")
    if args.out:
        Path(args.out).write_text(json.dumps({**results, "overrides": args.overrides, **provenance()}, indent=1))


if __name__ == "__main__":
    main()
