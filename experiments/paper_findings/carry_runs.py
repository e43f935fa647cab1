"""Archive the unfinished arms of a study so they resume on another machine (or session).

    python experiments/paper_findings/carry_runs.py STUDY OUT [--max-mb 16]

For every run folder in STUDY without ``summary.json`` and with a complete checkpoint, writes
``OUT/resume_<arm>.tgz``: the run's logs, config and metrics, its eval summaries, and only its
newest complete checkpoint (the loop's folder, the engine state and the sampler weights it
names). Eval and training trajectory files are left out: the study's ``study.tgz`` carries the
eval files, and a resumed run appends to the metrics it finds. Unpacked into the study folder
on the new machine (``tar xzf resume_<arm>.tgz -C STUDY``), ``trainer.resume=auto`` continues
from that checkpoint. An archive over ``--max-mb`` (the device's per-file limit) is refused
with its size, so nothing is silently left behind.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from searchr1.loop.checkpoint import checkpoint_dir, newest_state

SKIPPED_NAMES = {"trajectories.jsonl", "checkpoints", "wandb", "swanlog"}


def run_files(run: Path) -> list[Path]:
    """The files of ``run`` to carry (paths relative to its parent), newest checkpoint only."""
    state = newest_state(run)
    if state is None:
        return []
    keep = [p for p in run.rglob("*") if p.is_file()
            and not SKIPPED_NAMES.intersection(p.relative_to(run).parts)
            and not p.name.endswith(".html")]
    for root in (checkpoint_dir(run, state.step), Path(state.engine_state), Path(state.sampler_weights)):
        keep += [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else [root]
    return sorted({p.relative_to(run.parent) for p in keep})


def carry(study: Path, out: Path, max_bytes: int) -> list[Path]:
    """Write one archive per unfinished arm with a checkpoint; returns the archives."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for run in sorted(p for p in study.iterdir() if p.is_dir() and (p / "metrics.jsonl").is_file()):
        if (run / "summary.json").is_file():
            continue
        files = run_files(run)
        if not files:
            print(f"{run.name}: no complete checkpoint, it restarts from step 0", file=sys.stderr)
            continue
        target = out / f"resume_{run.name}.tgz"
        with tarfile.open(target, "w:gz") as tar:
            for rel in files:
                tar.add(study / rel, arcname=rel.as_posix())
        size = target.stat().st_size
        if size > max_bytes:
            target.unlink()
            raise SystemExit(f"{run.name}: its resume archive is {size / 2**20:.1f} MB, over "
                             f"{max_bytes / 2**20:.0f} MB; not written")
        print(f"{run.name}: {target} ({size / 2**20:.1f} MB, {len(files)} files)")
        written.append(target)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-mb", type=float, default=16.0)
    args = parser.parse_args()
    carry(args.study, args.out, int(args.max_mb * 2**20))


if __name__ == "__main__":
    main()
