"""Console tracking: silent per step, a table of final metrics at the end.

Progress during training is the trainer's tqdm bar; printing every metric of every step as
well would bury it (and a sweep's job logs with it). The console gets the final summary,
and a one-line notice when the run failed (exit code 1) or stopped cleanly (its own exit
code and reason: 2 refused at start-up, 3 search outage, 4 stop signal, 5 checkpoint write).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

from searchr1.trackers.base import TRACKERS, RunInfo, Tracker


def format_summary(metrics: Mapping[str, Any]) -> str:
    """Aligned ``name  value`` lines, sorted by name; floats to 4 significant digits."""
    if not metrics:
        return "  (no summary metrics)"
    width = max(len(k) for k in metrics)
    lines = []
    for key in sorted(metrics):
        value = metrics[key]
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"  {key:<{width}}  {text}")
    return "\n".join(lines)


@TRACKERS.register("console")
class ConsoleTracker(Tracker):
    """Prints the final summary (and a failure notice) to ``stream`` (default: stdout)."""

    def __init__(self, title: str = "run", stream: TextIO | None = None) -> None:
        self.title = title
        self.stream = stream

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> ConsoleTracker:
        return cls(title=run_info.name)

    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Nothing: the trainer's progress bar is the per-step console output."""

    def summary(self, metrics: Mapping[str, float]) -> None:
        self._print(f"summary of {self.title}:\n{format_summary(metrics)}")

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        if exit_code == 0:
            return
        if reason:  # a clean stop (a signal, a search outage, a full disk) or a refused start
            self._print(f"run {self.title} stopped (exit code {exit_code}): {reason}")
        else:
            self._print(f"run {self.title} failed (exit code {exit_code})")
