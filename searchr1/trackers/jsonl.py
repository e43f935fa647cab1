"""Local, dependency-free tracking: ``metrics.jsonl`` per step, ``summary.json`` at the end.

These two files are the run-directory contract ``searchr1.compare`` reads, so every run
has them whatever else is enabled. Each line is flushed as soon as it is written: a job
that crashes keeps every step it logged.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from searchr1.trackers.base import TRACKERS, RunInfo, Tracker

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"


def _plain(value: Any) -> Any:
    """A JSON-safe scalar: numpy numbers become Python ones, NaN/inf become ``None``."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, or ``{}`` when it is missing or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@TRACKERS.register("jsonl")
class JsonlTracker(Tracker):
    """Appends ``{"step": N, **metrics}`` lines to ``<run_dir>/metrics.jsonl``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115 - open for the run

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> JsonlTracker:
        return cls(run_info.run_dir)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def summary(self, metrics: Mapping[str, float]) -> None:
        """Merge into ``summary.json`` (keeping keys others wrote there), atomically."""
        path = self.run_dir / SUMMARY_FILE
        merged = _read_json(path)
        merged.update({k: _plain(v) for k, v in metrics.items()})
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def finish(self, exit_code: int = 0) -> None:
        if not self._file.closed:
            self._file.close()
