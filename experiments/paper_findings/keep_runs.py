"""Copy a study's run folders into ``runs/`` beside this file, keeping what the report reads.

    python experiments/paper_findings/keep_runs.py outputs/paper_findings

Kept per run: ``metrics.jsonl``, ``summary.json``, ``.hydra/{config,overrides}.yaml``, the
sampler log's last lines, and per eval step its ``summary.json`` and a slim
``trajectories.jsonl.gz`` (per question: id, source, gold and given answer, reward, scores, end
reason, searches, tokens and each turn's action and query; the passages and texts are dropped,
gzipped: a 100-step arm is ~0.5 MB instead of ~20 MB). Training trajectories and
checkpoints are not kept. ``python -m searchr1.analysis.report runs`` reads the result.
A kept run is not replaced by one that logged fewer steps (a run restarted from step 0;
``--force`` does), and a resumed run keeps the per-question files of its earlier evals.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

RUN_FILES = ("metrics.jsonl", "summary.json", ".hydra/config.yaml", ".hydra/overrides.yaml")
RECORD_KEYS = ("id", "question", "golden_answers", "data_source", "group_index", "answer",
               "reward", "scores", "end_reason", "num_searches", "num_tokens")
LOG_LINES = 40


def slim_record(rec: dict) -> dict:
    out = {k: rec[k] for k in RECORD_KEYS if k in rec}
    out["turns"] = [{"action": t.get("action"), "query": t.get("query")} for t in rec.get("turns") or []]
    return out


def keep_run(src: Path, dst: Path) -> None:
    for name in RUN_FILES:
        if (src / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, dst / name)
    for step in sorted((src / "eval").glob("step_*")):
        out = dst / "eval" / step.name
        out.mkdir(parents=True, exist_ok=True)
        if (step / "summary.json").is_file():
            shutil.copy2(step / "summary.json", out / "summary.json")
        if (step / "trajectories.jsonl").is_file():
            lines = []
            for line in (step / "trajectories.jsonl").read_text(encoding="utf-8").splitlines():
                try:
                    lines.append(json.dumps(slim_record(json.loads(line))))
                except json.JSONDecodeError:
                    continue  # a line cut short when the run stopped
            data = ("\n".join(lines) + "\n").encode("utf-8")
            (out / "trajectories.jsonl.gz").write_bytes(gzip.compress(data, mtime=0))
    log = src.parent / f"{src.name}.log"
    if log.is_file():  # the arm's stdout: how it ended (a traceback, a stop signal)
        text = log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()
        (dst / "tail.log").write_text("\n".join(text[-LOG_LINES:]) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", type=Path, help="the study folder (run_study.sh's R)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "runs")
    parser.add_argument("--force", action="store_true", help="replace kept runs that got further")
    args = parser.parse_args()
    runs = sorted(p for p in args.study.iterdir() if p.is_dir() and (p / "metrics.jsonl").is_file())
    if not runs:
        raise SystemExit(f"{args.study}: no run folder with a metrics.jsonl")
    for run in runs:
        replace_run(run, args.out / run.name, force=args.force)


def last_step(run: Path) -> int:
    """The highest step ``run``'s metrics.jsonl logged (-1 when none)."""
    steps = [-1]
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                steps.append(int(json.loads(line).get("step", -1)))
            except (json.JSONDecodeError, TypeError, ValueError):
                continue
    return max(steps)


def replace_run(src: Path, dst: Path, force: bool = False) -> None:
    """Replace the kept copy ``dst`` by ``src``'s, unless ``src`` got less far (``force`` does).

    A run resumed on another machine has the summaries of its earlier evals but not their
    per-question files (they came back with an earlier pack); those are kept from ``dst``.
    """
    if dst.exists() and not force and last_step(src) < last_step(dst):
        print(f"{src}: step {last_step(src)} is behind the kept copy's {last_step(dst)}; kept "
              "(a restarted run: --force replaces it)")
        return
    fresh = dst.with_name(f".{dst.name}.new")
    if fresh.exists():
        shutil.rmtree(fresh)
    keep_run(src, fresh)
    if dst.exists():
        for old in sorted((dst / "eval").glob("step_*")):
            new = fresh / "eval" / old.name
            if (old / "trajectories.jsonl.gz").is_file() and not (new / "trajectories.jsonl.gz").is_file():
                new.mkdir(parents=True, exist_ok=True)
                shutil.copy2(old / "trajectories.jsonl.gz", new / "trajectories.jsonl.gz")
                if not (new / "summary.json").is_file() and (old / "summary.json").is_file():
                    shutil.copy2(old / "summary.json", new / "summary.json")
        shutil.rmtree(dst)
    fresh.rename(dst)
    print(f"{src} -> {dst}")


if __name__ == "__main__":
    main()
