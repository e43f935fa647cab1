"""Time per arm: each arm's step, rollout, train and eval seconds from its runs' own
``metrics.jsonl`` (``time/*``) and the wall minutes of its runs that wrote ``summary.json``.

A value no run logged is NaN (older runs have no ``time/eval``; a running one no summary).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from searchr1.analysis.report.loading import Arm, Run

STEP, ROLLOUT, TRAIN, EVAL = "time/step_seconds", "time/rollout", "time/train", "time/eval"


@dataclass(frozen=True)
class ArmTime:
    """One arm's times; NaN where none of its runs logged the value."""

    runs: int
    step: float  # median over runs of each run's median step seconds
    step_low: float  # least and greatest of those per-run medians
    step_high: float
    rollout: float  # median over runs of each run's median, as for step
    train: float
    eval: float  # median over every eval of every run (seconds per eval)
    wall_minutes: float  # median over runs whose summary has wall_seconds
    wall_runs: int  # how many runs that is

    def logged(self) -> bool:
        """Whether any time at all was logged."""
        return any(math.isfinite(v) for v in (self.step, self.rollout, self.train, self.eval,
                                              self.wall_minutes))


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else math.nan


def run_medians(runs: Sequence[Run], key: str) -> list[float]:
    """Each run's median of ``key``, for the runs that logged it."""
    return [_median(values) for r in runs if len(values := r.series(key))]


def wall_seconds(run: Run) -> float:
    """``summary.wall_seconds``, NaN without a summary or without that number in it."""
    value = (run.summary or {}).get("wall_seconds")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else math.nan


def arm_time(arm: Arm) -> ArmTime:
    """The arm's times (``ArmTime``)."""
    steps = run_medians(arm.runs, STEP)
    walls = [w / 60 for r in arm.runs if math.isfinite(w := wall_seconds(r))]
    return ArmTime(runs=len(arm.runs), step=_median(steps),
                   step_low=min(steps, default=math.nan), step_high=max(steps, default=math.nan),
                   rollout=_median(run_medians(arm.runs, ROLLOUT)),
                   train=_median(run_medians(arm.runs, TRAIN)),
                   eval=_median([v for r in arm.runs for v in r.series(EVAL)]),
                   wall_minutes=_median(walls), wall_runs=len(walls))
