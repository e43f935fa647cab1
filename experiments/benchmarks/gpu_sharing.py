"""Processes sharing one GPU: time-sliced (the default) against NVIDIA MPS, against one alone.

A study runs several arms side by side on one GPU (``experiments/paper_findings/run_study.sh``).
Without MPS the GPU time-slices between the processes' contexts, so one arm's small kernels
never overlap another's; under MPS (the CUDA Multi-Process Service: a daemon through which the
clients' kernels share the GPU at once) they do. This runs ``--copies`` copies of a benchmark
(default ``sampler_throughput.py``, which writes ``slots_tok_s`` to its ``--out`` JSON) three
ways, one after the other, and prints per-copy and aggregate throughput:

- ``alone``: one copy (the reference);
- ``time-sliced``: the copies at once, no MPS;
- ``mps``: the copies at once, through an MPS daemon this script starts in a private pipe
  directory (``CUDA_MPS_PIPE_DIRECTORY``, so no other process on the machine joins it) and stops
  after.

    python experiments/benchmarks/gpu_sharing.py --copies 2 -- --model smollm2-random --rows 128 --repeats 2 --static-rows --no-naive

Arguments after ``--`` go to every copy (each gets its own ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTROL = "nvidia-cuda-mps-control"


@contextlib.contextmanager
def mps_daemon(directory: Path, control: str = CONTROL) -> Iterator[dict[str, str]]:
    """An MPS control daemon whose pipes and logs live in ``directory``; yields the environment
    its clients need. Stopped (``quit``) on exit, also when the block raises."""
    if shutil.which(control) is None:
        raise RuntimeError(f"MPS needs {control} on PATH (it ships with the NVIDIA driver); not found")
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **env}
    subprocess.run([control, "-d"], env=full, check=True)
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", text=True, env=full, check=False)


def run_copies(copies: int, bench: Path, args: list[str], workdir: Path, env: dict[str, str]) -> dict:
    """``copies`` processes of ``bench`` at once; their figures and the wall time of the batch."""
    outs = [workdir / f"copy{i}.json" for i in range(copies)]
    logs = [open(workdir / f"copy{i}.log", "w") for i in range(copies)]  # noqa: SIM115 - closed below
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(bench), *args, "--out", str(out)], stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ, **env}) for out, log in zip(outs, logs)]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    for log in logs:
        log.close()
    if any(codes):
        bad = codes.index(next(c for c in codes if c))
        tail = (workdir / f"copy{bad}.log").read_text()[-2000:]
        raise RuntimeError(f"copy {bad} exited with {codes[bad]}:\n{tail}")
    rates = [statistics.median(r["slots_tok_s"] for r in json.loads(o.read_text())["results"]) for o in outs]
    return {"copies": copies, "per_copy_tok_s": rates, "aggregate_tok_s": sum(rates), "wall_s": wall}


def table(rows: dict[str, dict]) -> str:
    alone = rows["alone"]["aggregate_tok_s"]
    lines = [f"{'mode':12s} {'copies':>6s} {'per copy tok/s (median)':>24s} {'aggregate':>10s} "
             f"{'vs alone':>8s} {'wall s':>7s}"]
    for mode, r in rows.items():
        lines.append(f"{mode:12s} {r['copies']:6d} {statistics.median(r['per_copy_tok_s']):24.0f} "
                     f"{r['aggregate_tok_s']:10.0f} {r['aggregate_tok_s'] / alone:8.2f} {r['wall_s']:7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--bench", default=str(HERE / "sampler_throughput.py"),
                    help="a script taking --out and writing {'results': [{'slots_tok_s': ...}]}")
    ap.add_argument("--modes", nargs="+", default=["alone", "time-sliced", "mps"],
                    choices=["alone", "time-sliced", "mps"])
    ap.add_argument("--control", default=CONTROL, help="the MPS control binary")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("args", nargs="*", help="arguments for every copy (after --)")
    args = ap.parse_args(argv)
    if "alone" not in args.modes:
        args.modes.insert(0, "alone")  # the reference of every ratio
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-sharing-", dir="/tmp") as tmp:
        for mode in args.modes:
            work = Path(tmp) / mode
            work.mkdir()
            copies = 1 if mode == "alone" else args.copies
            if mode == "mps":
                with mps_daemon(Path(tmp) / "mps", args.control) as env:
                    rows[mode] = run_copies(copies, Path(args.bench), args.args, work, env)
            else:
                rows[mode] = run_copies(copies, Path(args.bench), args.args, work, {})
            print(f"{mode}: {json.dumps(rows[mode])}", flush=True)
    print(f"\n{args.copies} copies of {Path(args.bench).name} {' '.join(args.args)}")
    print(table(rows))
    result = {"copies": args.copies, "bench": Path(args.bench).name, "args": args.args, "rows": rows,
              "date": time.strftime("%Y-%m-%d")}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
