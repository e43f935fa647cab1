"""Runs as ``compare`` and the study report read them: overrides, per-step history, summary, status.

A run folder holds ``.hydra/overrides.yaml``, ``metrics.jsonl`` (one row per logged record:
train rows at steps 1…N, eval rows at the steps evaluated, step 0 the eval before training)
and, once the run has finished, ``summary.json``. ``status`` says whether the run completed:

- ``done``: a summary without ``stopped_reason``, and (when the config says how many steps
  were planned) all of them trained;
- ``unfinished (step k of N)``: no summary (killed, crashed, or still running), or fewer steps
  than planned;
- ``stopped at step k (reason)``: a summary written by a stop (a signal, a search outage, a
  failed checkpoint write).

Only a ``done`` run has finals: ``compare`` leaves the final columns of the others empty.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

RUN_MARKERS = ("metrics.jsonl", "summary.json", ".hydra/config.yaml")
SKIP_DIRS = {"wandb", "swanlog", "eval", "compare", ".hydra", "__pycache__"}
DONE = "done"
TRAIN_PREFIXES = ("reward/", "train/", "rollout/")


@dataclass
class RunData:
    """One run, wherever it came from: its overrides, per-step history and summary."""

    label: str
    source: str  # a folder, or ``wandb:<entity>/<project>/<run id>``
    overrides: dict[str, Any]
    history: pd.DataFrame  # index: step; columns: metric names
    summary: dict[str, Any]
    status: str = DONE  # see the module docstring

    @property
    def finished(self) -> bool:
        return self.status == DONE


def is_run_dir(path: Path) -> bool:
    return any((path / marker).is_file() for marker in RUN_MARKERS)


def _child_order(path: Path) -> tuple:
    """Numbered job folders in numeric order (``2`` before ``10``), then the rest by name."""
    return (not path.name.isdigit(), int(path.name) if path.name.isdigit() else 0, path.name)


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run folder at or below ``paths`` (a run's own subfolders are not searched)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if is_run_dir(path):
            found.append(path)
        elif path.is_dir():
            children = sorted((c for c in path.iterdir() if c.is_dir() and
                               c.name not in SKIP_DIRS and not c.name.startswith(".")),
                              key=_child_order)
            found.extend(find_run_dirs(children))
    return found


def typed_value(text: str) -> Any:
    """``"4"`` → 4, ``"1e-6"`` → 1e-06, anything else stays a string (quotes stripped)."""
    text = text.strip().strip("'\"")
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["+a.b=4", "~c"]`` → ``{"a.b": 4, "c": "<deleted>"}``; Hydra's own keys dropped."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.lstrip("+~")
        if not key or key.startswith("hydra."):
            continue
        parsed[key] = typed_value(value) if sep else "<deleted>"
    return parsed


def read_history(path: Path) -> pd.DataFrame:
    """``metrics.jsonl`` → one row per step (several lines of a step merged; bad lines skipped)."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
    if not rows:
        return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
    frame = pd.DataFrame(rows).groupby("step", sort=True).last()
    return frame.apply(pd.to_numeric, errors="coerce")


def trained_steps(history: pd.DataFrame) -> int:
    """The last step with train metrics (a step's row is logged after it trained), else 0."""
    cols = [c for c in history.columns if str(c).startswith(TRAIN_PREFIXES)]
    if not cols or not len(history.index):
        return 0
    rows = history[cols].notna().any(axis=1)
    return int(history.index[rows].max()) if rows.any() else 0


def status_of(summary: dict[str, Any] | None, history: pd.DataFrame, planned: int | None) -> str:
    """``done``, ``unfinished (step k of N)`` or ``stopped at step k (reason)``."""
    steps = summary.get("steps") if summary else None
    known = isinstance(steps, (int, float)) and not math.isnan(steps)
    done = int(steps) if known else trained_steps(history)  # the summary's count, if any
    of = f" of {planned}" if planned is not None else ""
    if summary and summary.get("stopped_reason"):
        return f"stopped at step {done}{of} ({summary['stopped_reason']})"
    if not summary or (planned is not None and known and done < planned):
        return f"unfinished (step {done}{of})"
    return DONE


def planned_steps(config: dict[str, Any]) -> int | None:
    """``trainer.steps`` of a training run's config (None for eval / sft runs or unknown)."""
    if str(config.get("mode", "train")).split(".")[-1] != "train":
        return None
    steps = (config.get("trainer") or {}).get("steps")
    return int(steps) if isinstance(steps, (int, float)) else None


def load_run(run_dir: Path, label: str) -> RunData:
    hydra = run_dir / ".hydra"
    overrides = yaml.safe_load((hydra / "overrides.yaml").read_text()) if (hydra / "overrides.yaml").is_file() else []
    config = yaml.safe_load((hydra / "config.yaml").read_text()) if (hydra / "config.yaml").is_file() else {}
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    history = read_history(run_dir / "metrics.jsonl")
    return RunData(label=label, source=str(run_dir), overrides=parse_overrides(overrides or []),
                   history=history, summary=summary or {},
                   status=status_of(summary, history, planned_steps(config or {})))


def load_local_runs(paths: Sequence[str | Path]) -> list[RunData]:
    """Runs under ``paths``, labelled by their path below the folders' common ancestor."""
    dirs = [d.resolve() for d in find_run_dirs(paths)]
    if len(dirs) <= 1:
        labels = [d.name for d in dirs]
    else:
        root = Path(os.path.commonpath(dirs))
        labels = [str(d.relative_to(root)) if d != root else d.name for d in dirs]
    return [load_run(d, label) for d, label in zip(dirs, labels)]
