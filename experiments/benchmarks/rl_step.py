"""A full RL step on the embedded world: rollout, reference scoring, update — with its split.

Runs the real entry point (``python -m searchr1.main``) for ``--steps`` steps of
``--questions`` × ``--group`` trajectories (default 16 × 8 = 128, the paper's GRPO algorithm
at world size) and reads the per-step times from ``metrics.jsonl``; the first step (graph
capture, compile) is reported apart and the rest summarised by medians. The reference, in the
same run, is the same configuration with the HF batched sampler (``engine.sampler=hf``, the
engine before the slot sampler) for ``--reference-steps`` steps.

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
    ap.add_argument("--reference-steps", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rl_step-"))
    ours = summary(run(args.steps, args.questions, args.group, args.overrides, root / "slots"))
    ref = {}
    if args.reference_steps:
        ref = summary(run(args.reference_steps, args.questions, args.group,
                          [*args.overrides, "engine.sampler=hf"], root / "hf"))
    n = args.questions * args.group
    print(f"\nRL step, {n} trajectories ({args.questions} × {args.group}), medians of steps 2.. "
          f"(step 1 = {ours['first_step_seconds']:.1f} s incl. capture)")
    print(f"{'metric':<32} {'slots':>10} {'hf sampler':>11} {'ratio':>7}")
    for key in KEYS:
        if key in ours:
            r = ref.get(key)
            ratio = f"{r / ours[key]:7.2f}" if r and ours[key] and key.startswith("time/") else f"{'':>7}"
            print(f"{key:<32} {ours[key]:10.3f} {(f'{r:11.3f}' if r is not None else f'{chr(45):>11}')} {ratio}")
    if args.out:
        Path(args.out).write_text(json.dumps({"slots": ours, "hf": ref, "overrides": args.overrides,
                                              "date": time.strftime("%Y-%m-%d")}, indent=1))


if __name__ == "__main__":
    main()
