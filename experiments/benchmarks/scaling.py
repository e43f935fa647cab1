"""Data-parallel scaling: step time and throughput at 1 … N processes, weak and strong.

Each point is a real training run of ``python -m searchr1.main`` (1 process: the plain
single-process path, the reference) or ``torchrun --standalone --nproc-per-node N -m
searchr1.main`` (N > 1), reading the per-step ``time/step_seconds`` from ``metrics.jsonl``;
the first step (warm-up) is dropped and the others summarised by their median.

- **weak scaling**: a fixed per-rank batch, ``--questions-per-rank`` × N questions per step;
  efficiency = throughput(N) / (N · throughput(1)) = t(1) / t(N).
- **strong scaling**: a fixed global batch of ``--global-questions``; efficiency =
  t(1) / (N · t(N)) (the speed-up over N).

Throughput is trajectories per second: questions × ``--group`` / median step seconds. Runs
with the same (N, questions) are measured once and shared by both tables. Every process gets
``OMP_NUM_THREADS = --threads`` (default: the machine's cores ÷ N, so the 1-process reference
may use every core): on a CPU machine the figures are bound by its cores.

    python experiments/benchmarks/scaling.py --nprocs 1,2 -- experiment=smoke engine.device=cpu
    python experiments/benchmarks/scaling.py --nprocs 1,2,4,8 --questions-per-rank 8 --global-questions 64 \\
        --group 5 -- experiment=paper_grpo_world          # GPUs: one rank per GPU

Arguments after ``--`` are Hydra overrides passed to every run.
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


def run(nproc: int, questions: int, args, out_dir: Path) -> list[float]:
    """One training run; its per-step seconds (training rows only)."""
    overrides = [f"trainer.steps={args.steps}", f"trainer.questions_per_step={questions}",
                 f"rollout.group_size={args.group}", "trainer.save_every=0",
                 "eval.before_training=false", f"eval.max_questions={nproc}",
                 f"hydra.run.dir={out_dir}", *args.overrides]
    if nproc == 1:
        cmd = [sys.executable, "-m", "searchr1.main", *overrides]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", "searchr1.main", *overrides]
    threads = args.threads or max(1, (os.cpu_count() or 1) // nproc)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL if args.quiet else None)
    print(f"[scaling] N={nproc} questions={questions}: {time.perf_counter() - t0:.0f} s wall "
          f"({threads} threads per process)", flush=True)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["time/step_seconds"] for r in rows if "time/step_seconds" in r]


def median_after_first(seconds: list[float]) -> float:
    return statistics.median(seconds[1:] or seconds)


def table(kind: str, points: dict, nprocs: list[int], questions_for, group: int) -> list[dict]:
    """Rows of one scaling table: figure, the 1-process reference, the ratio."""
    out = []
    ref_q = questions_for(1)
    t_ref = median_after_first(points[(1, ref_q)])
    for n in nprocs:
        q = questions_for(n)
        t = median_after_first(points[(n, q)])
        thr, thr_ref = q * group / t, ref_q * group / t_ref
        eff = thr / (n * thr_ref) if kind == "weak" else t_ref / (n * t)
        out.append({"kind": kind, "nproc": n, "questions": q, "trajectories": q * group,
                    "step_s": t, "traj_per_s": thr, "ref_step_s": t_ref, "ref_traj_per_s": thr_ref,
                    "efficiency": eff, "steps_measured": max(len(points[(n, q)]) - 1, 1)})
    return out


def print_table(rows: list[dict]) -> None:
    print("| scaling | N | questions × group | step s (median) | trajectories/s | 1-process step s "
          "| 1-process trajectories/s | efficiency |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kind']} | {r['nproc']} | {r['trajectories']} | {r['step_s']:.2f} | "
              f"{r['traj_per_s']:.3f} | {r['ref_step_s']:.2f} | {r['ref_traj_per_s']:.3f} | "
              f"**{r['efficiency']:.2f}** |")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", default="1,2", help="process counts, comma-separated (1 first)")
    ap.add_argument("--questions-per-rank", type=int, default=2, help="weak scaling: per rank")
    ap.add_argument("--global-questions", type=int, default=0,
                    help="strong scaling: global (default: questions-per-rank × the largest N)")
    ap.add_argument("--group", type=int, default=2, help="trajectories per question")
    ap.add_argument("--steps", type=int, default=4, help="steps per run (the first is dropped)")
    ap.add_argument("--threads", type=int, default=0, help="OMP threads per process (0: cores ÷ N)")
    ap.add_argument("--kinds", default="weak,strong")
    ap.add_argument("--quiet", action="store_true", help="hide the runs' own output")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    args = ap.parse_args(argv)
    args.overrides = overrides
    nprocs = sorted({int(n) for n in args.nprocs.split(",")} | {1})
    g = args.global_questions or args.questions_per_rank * nprocs[-1]
    bad = [n for n in nprocs if g % n]
    if bad:
        ap.error(f"--global-questions {g} does not divide over N = {bad}")
    kinds = args.kinds.split(",")
    questions = {"weak": lambda n: args.questions_per_rank * n, "strong": lambda n: g}
    needed = sorted({(n, questions[k](n)) for k in kinds for n in nprocs})
    points: dict = {}
    with tempfile.TemporaryDirectory(prefix="scaling-") as tmp:
        for i, (n, q) in enumerate(needed):
            points[(n, q)] = run(n, q, args, Path(tmp) / str(i))
    rows = [r for k in kinds for r in table(k, points, nprocs, questions[k], args.group)]
    print(f"\noverrides: {' '.join(overrides) or '(none)'}; {args.steps} steps per run, medians "
          f"of steps 2…{args.steps}; cores: {os.cpu_count()}")
    print_table(rows)
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv, "overrides": overrides,
                                        "raw_step_seconds": {f"{n}x{q}": s for (n, q), s in points.items()},
                                        "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
