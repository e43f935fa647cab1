"""A sweep whose every job is its own N-process torchrun group.

    python -m searchr1.distributed.sweep --nproc-per-node 2 [--dir DIR] -- rollout.group_size=2,4 seed=0,1

Hydra's own parser expands the overrides into jobs exactly as ``-m`` would (comma lists,
``range``, ``glob``); each job then runs as ``torchrun --standalone --nproc-per-node N -m
searchr1.main <job> hydra.run.dir=DIR/<i>``, one after the other, and a failed job does not
stop the sweep (its exit code is reported). ``DIR`` then has ``analysis.compare``'s layout.
Why a wrapper and not a Hydra launcher: Hydra only loads launchers from the
``hydra_plugins`` namespace package, and a launcher runs inside the sweeping process, which
must not itself be a rank.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def expand(overrides: list[str]) -> list[list[str]]:
    """The sweep's jobs, as Hydra's basic sweeper orders them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def job_command(nproc: int, job: list[str], run_dir: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *extra, "-m", "searchr1.main", *job,
            f"hydra.run.dir={run_dir}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--dir", default=time.strftime("outputs/multirun/%Y-%m-%d/%H-%M-%S"))
    ap.add_argument("--torchrun-arg", action="append", default=[], help="passed to torchrun")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    codes = []
    for i, job in enumerate(expand(args.overrides)):
        cmd = job_command(args.nproc_per_node, job, Path(args.dir) / str(i), args.torchrun_arg)
        print(f"[sweep] job {i}: {' '.join(job)}", flush=True)
        codes.append(subprocess.call(cmd))
    for i, code in enumerate(codes):
        print(f"[sweep] job {i}: exit {code}", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
