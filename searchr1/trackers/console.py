"""Console tracking: a progress bar while training, a table of final metrics at the end.

Per step the console shows only a tqdm bar (its postfix carries a few headline metrics);
everything else goes to the files and dashboards. tqdm hides the bar when stderr is not a
terminal, so a sweep's job logs stay readable.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from searchr1.trackers.base import TRACKERS, RunInfo, Tracker, coerce_options


@dataclass
class ConsoleConfig:
    """Options of the ``console`` tracker."""

    total_key: str | None = "trainer.steps"  # dotted config path holding the step count
    show: list[str] = field(default_factory=lambda: ["reward/mean", "eval/em/macro"])


def _lookup(cfg: Mapping, dotted: str | None) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``, or ``None`` when any part is missing."""
    node: Any = cfg
    for part in (dotted or "").split("."):
        if not part or not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def format_summary(metrics: Mapping[str, Any]) -> str:
    """Aligned ``name  value`` lines, sorted by name; floats to 4 significant digits."""
    if not metrics:
        return "(no summary metrics)"
    width = max(len(k) for k in metrics)
    lines = []
    for key in sorted(metrics):
        value = metrics[key]
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"  {key:<{width}}  {text}")
    return "\n".join(lines)


@TRACKERS.register("console")
class ConsoleTracker(Tracker):
    """A tqdm bar per step, the final summary printed on ``summary``."""

    def __init__(self, total: int | None = None, show: list[str] | None = None,
                 stream: TextIO | None = None, title: str = "run") -> None:
        self.total = total
        self.show = list(show or [])
        self.stream = stream
        self.title = title
        self._bar = None
        self._last_step: int | None = None

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> "ConsoleTracker":
        opts = coerce_options(options, ConsoleConfig)
        total = _lookup(cfg_dict, opts.total_key)
        return cls(total=total if isinstance(total, int) else None, show=opts.show,
                   title=run_info.name)

    def _out(self) -> TextIO:
        return self.stream or sys.stdout

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc="steps", unit="step", disable=None,
                             dynamic_ncols=True)
        if self._last_step is None or step > self._last_step:
            self._bar.update(1 if self._last_step is None else step - self._last_step)
            self._last_step = step
        shown = {k: v for k, v in metrics.items() if k in self.show}
        if shown:
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)

    def summary(self, metrics: Mapping[str, float]) -> None:
        self._close_bar()
        print(f"summary of {self.title}:\n{format_summary(metrics)}", file=self._out(), flush=True)

    def finish(self, exit_code: int = 0) -> None:
        self._close_bar()
        if exit_code != 0:
            print(f"run {self.title} failed (exit code {exit_code})", file=self._out(), flush=True)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
