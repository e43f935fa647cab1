"""Local, dependency-free tracking: ``metrics.jsonl`` per step, ``summary.json`` at the end.

These two files are the run-directory contract ``searchr1.analysis.compare`` reads, so every run
has them whatever else is enabled. Each line is flushed as soon as it is written: a job
that crashes keeps every step it logged.

Rows are keyed by step: a row logged for a step that already has a row with any of the same
metric names replaces it (the file is rewritten atomically), so a resumed run that redoes a
step never leaves two rows for it, while a step's train row and its eval row (disjoint names)
live side by side. A line torn by a kill mid-write is dropped when the file is reopened, and so
(with a warning naming it) is a line that is not JSON or holds a byte that is not UTF-8.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from searchr1.trackers.base import TRACKERS, RunInfo, Tracker

log = logging.getLogger(__name__)

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


def _read_rows(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of a metrics file, and a note per line dropped because it could not be read
    (torn by a kill, or holding a byte that is not UTF-8)."""
    if not path.is_file():
        return [], []
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    offset = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        start, offset = offset, offset + len(raw) + 1
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            notes.append(f"line {lineno}: byte {start + err.start} is not UTF-8")
            continue
        except ValueError:
            if raw.strip():
                notes.append(f"line {lineno}: not JSON")
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, notes


def _ends_a_line(path: Path) -> bool:
    """Whether ``path`` is missing, empty or ends with a newline (not cut mid-line)."""
    if not path.is_file() or path.stat().st_size == 0:
        return True
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``rows`` atomically (temp file + rename)."""
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


@TRACKERS.register("jsonl")
class JsonlTracker(Tracker):
    """Appends ``{"step": N, **metrics}`` lines to ``<run_dir>/metrics.jsonl``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        rows, dropped = _read_rows(self.path)
        if dropped:
            log.warning("%s: dropped the line(s) that could not be read (%s); the other rows "
                        "are kept", self.path, "; ".join(dropped))
        if dropped or not _ends_a_line(self.path):  # the lines appended next stand alone
            _write_rows(self.path, rows)
        self._names: dict[int, list[frozenset[str]]] = {}
        for row in rows:
            self._names.setdefault(row.get("step"), []).append(frozenset(row) - {"step"})
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> JsonlTracker:
        return cls(run_info.run_dir)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        names = frozenset(row) - {"step"}
        if any(names & earlier for earlier in self._names.get(row["step"], [])):
            self._drop(row["step"], names)
        self._names.setdefault(row["step"], []).append(names)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def _drop(self, step: int, names: frozenset[str]) -> None:
        """Remove the rows of ``step`` sharing a metric name with ``names`` (a redone step)."""
        self._file.close()
        rows, _ = _read_rows(self.path)
        keep = [r for r in rows if r.get("step") != step or not names & (frozenset(r) - {"step"})]
        _write_rows(self.path, keep)
        self._names[step] = [n for n in self._names[step] if not names & n]
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run

    def summary(self, metrics: Mapping[str, float]) -> None:
        """Merge into ``summary.json`` (keeping keys others wrote there), atomically."""
        path = self.run_dir / SUMMARY_FILE
        merged = _read_json(path)
        merged.update({k: _plain(v) for k, v in metrics.items()})
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        if not self._file.closed:
            self._file.close()
