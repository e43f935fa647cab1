"""What the report measures: eval metrics of an arm at a step with intervals, B − A between
arms, and each run's learning-curve figures (final EM, steps to 90 %, drops, collapses).

A metric is named as in the claims spec: ``em/macro`` (mean over sources, the lab's macro
EM), ``em/micro`` (mean over questions), ``em/<source>``, ``format_rate``, ``searches``,
``searches/<source>``, ``turns``. A step is ``final`` (each run's last eval), ``common``
(the last eval step every compared run reached — use it for partial arms) or a number.

Per-question rows (``eval/step_<N>/trajectories.jsonl``) give the hierarchical and paired
bootstraps; when any compared run lacks them at its step, the estimate falls back to the
runs' logged values (``eval/...`` in the history) with intervals over seeds only, and
its ``note`` says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.loading import Arm, ReportInputError, Run

SOURCE_METRIC = re.compile(r"^(em|searches)/(.+)$")
PLAIN_METRICS = {"em/macro": ("em", True, "eval/em/macro"), "em/micro": ("em", False, "eval/em/micro"),
                 "format_rate": ("format", False, "eval/format_rate"),
                 "searches": ("searches", False, "eval/searches"), "turns": ("turns", False, "eval/turns")}
HISTORY_SOURCE = re.compile(r"^eval/em/(.+)$")
NINETY = 0.9


@dataclass(frozen=True)
class Metric:
    """A per-question column, optionally one source only, macro- or plain-averaged."""

    name: str
    column: str
    source: str | None
    macro: bool
    history_key: str


def parse_metric(name: str) -> Metric:
    if name in PLAIN_METRICS:
        column, macro, key = PLAIN_METRICS[name]
        return Metric(name, column, None, macro, key)
    if match := SOURCE_METRIC.match(name):
        return Metric(name, match.group(1), match.group(2), False, f"eval/{name}")
    raise ReportInputError(f"unknown metric {name!r}: use one of {', '.join(PLAIN_METRICS)}, "
                           "em/<source> or searches/<source>.")


@dataclass(frozen=True)
class Settings:
    """Bootstrap settings: every interval uses a fresh generator seeded with ``seed``."""

    n_resamples: int = 2000
    seed: int = 0
    level: float = 0.95
    collapse_fraction: float = 0.5
    min_seeds: int = 2  # fewer seeds in an arm: a decisive interval is called FEW_SEEDS

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


@dataclass(frozen=True)
class Estimate:
    interval: bs.Interval
    steps: tuple[int | None, ...]  # the eval step used, per run
    note: str = ""


# ------------------------------------------------------------------- steps and values


def eval_steps(run: Run, metric: Metric, per_question: bool) -> list[int]:
    """Steps with an eval of ``metric``: trajectory files, or logged history values."""
    if per_question:
        return sorted(run.questions)
    return [int(s) for s in run.series(metric.history_key).index]


def resolve_steps(runs: Sequence[Run], metric: Metric, step: str | int,
                  per_question: bool) -> list[int | None]:
    """The eval step each run is measured at (None: the run has no such eval)."""
    available = [eval_steps(r, metric, per_question) for r in runs]
    if step == "final":
        return [steps[-1] if steps else None for steps in available]
    if step == "common":
        shared = set.intersection(*map(set, available)) if available else set()
        step = max(shared) if shared else -1
    return [int(step) if int(step) in steps else None for steps in available]


def common_step(runs: Sequence[Run], metric: Metric) -> int | None:
    """The last eval step every run reached (trajectory steps when all runs have them)."""
    per_question = all(r.questions for r in runs)
    shared = set.intersection(*(set(eval_steps(r, metric, per_question)) for r in runs)) if runs else set()
    return max(shared) if shared else None


def _rows(run: Run, step: int, metric: Metric) -> pd.DataFrame:
    rows = run.questions[step]
    return rows[rows["source"] == metric.source] if metric.source else rows


def per_question_ready(runs: Sequence[Run], steps: Sequence[int | None], metric: Metric) -> str:
    """'' when every run has usable per-question rows at its step, else the reason why not."""
    for run, step in zip(runs, steps):
        if step is None or step not in run.questions:
            return f"{run.label} has no eval trajectories{'' if step is None else f' at step {step}'}"
        rows = _rows(run, step, metric)
        if not len(rows) or rows[metric.column].isna().any():
            return f"{run.label}'s trajectories lack {metric.name} at step {step}"
    return ""


def question_matrices(groups: Sequence[Sequence[tuple[Run, int]]], metric: Metric
                      ) -> tuple[list[np.ndarray], list[str]]:
    """Seeds × questions matrices over the question ids every run shares, and their sources."""
    frames = [[_rows(r, s, metric).set_index("id") for r, s in group] for group in groups]
    ids = sorted(set.intersection(*(set(f.index) for group in frames for f in group)))
    if not ids:
        return [], []
    mats = [np.stack([f.loc[ids, metric.column].to_numpy(float) for f in group]) for group in frames]
    return mats, frames[0][0].loc[ids, "source"].astype(str).tolist()


def logged_value(run: Run, step: int | None, metric: Metric) -> float:
    """The run's logged ``eval/...`` value at ``step``, else one computed from its trajectories."""
    if step is None:
        return math.nan
    series = run.series(metric.history_key)
    if step in series.index:
        return float(series.loc[step])
    if step in run.questions and len(rows := _rows(run, step, metric)):
        if metric.macro:
            return float(rows.groupby("source")[metric.column].mean().mean())
        return float(rows[metric.column].mean())
    return math.nan


# ------------------------------------------------------------------- arm and difference


def _fallback_steps(runs: Sequence[Run], metric: Metric, step: str | int) -> list[int | None]:
    steps = resolve_steps(runs, metric, step, per_question=False)
    if all(s is None for s in steps):  # no logged history: trajectory files still give values
        steps = resolve_steps(runs, metric, step, per_question=True)
    return steps


def arm_estimate(arm: Arm, metric: Metric, step: str | int, settings: Settings) -> Estimate:
    """The arm's mean of ``metric`` over seeds with a hierarchical (or seeds-only) interval."""
    steps = resolve_steps(arm.runs, metric, step, per_question=True)
    why = per_question_ready(arm.runs, steps, metric)
    if not why:
        (mat,), strata = question_matrices([list(zip(arm.runs, steps))], metric)
        if len(strata):
            interval = bs.hierarchical(mat, strata, macro=metric.macro, rng=settings.rng(),
                                       n_resamples=settings.n_resamples, level=settings.level)
            return Estimate(interval, tuple(steps))
        why = "its seeds share no question"
    steps = _fallback_steps(arm.runs, metric, step)
    values = [logged_value(r, s, metric) for r, s in zip(arm.runs, steps)]
    interval = bs.seeds_only(values, n_resamples=settings.n_resamples, rng=settings.rng(),
                             level=settings.level)
    return Estimate(interval, tuple(steps), f"seeds only: {why}")


def difference(a: Arm, b: Arm, metric: Metric, step: str | int, settings: Settings) -> Estimate:
    """B − A on the same questions (paired bootstrap), else over seeds only."""
    runs = [*a.runs, *b.runs]
    steps = resolve_steps(runs, metric, step, per_question=True)
    why = per_question_ready(runs, steps, metric)
    if not why:
        pairs = list(zip(runs, steps))
        mats, strata = question_matrices([pairs[:len(a.runs)], pairs[len(a.runs):]], metric)
        if len(strata):
            interval = bs.paired(mats[0], mats[1], strata, macro=metric.macro, rng=settings.rng(),
                                 n_resamples=settings.n_resamples, level=settings.level)
            return Estimate(interval, tuple(steps))
        why = "the arms share no question"
    steps = _fallback_steps(runs, metric, step)
    values = [logged_value(r, s, metric) for r, s in zip(runs, steps)]
    interval = bs.seeds_only_difference(values[:len(a.runs)], values[len(a.runs):], rng=settings.rng(),
                                        n_resamples=settings.n_resamples, level=settings.level)
    return Estimate(interval, tuple(steps), f"seeds only: {why}")


def _side(pairs: list[tuple[Run, int]], metric: Metric) -> tuple[np.ndarray | None, list[str]]:
    """One side of a within-arm contrast: its seeds × questions matrix and question sources."""
    mats, strata = question_matrices([pairs], metric)
    return (mats[0] if strata else None), strata


def within_difference(arm: Arm, a: tuple[Metric, str | int], b: tuple[Metric, str | int],
                      settings: Settings) -> Estimate:
    """B − A of two measurements of one arm, each seed against itself: one metric at two
    steps (the same questions: per-question differences, resampled as one arm), or two
    sources' metrics (different questions: a −1/+1 contrast of the two sources' means, each
    resampled within its seed). Without per-question rows, each run's logged B − A over seeds.
    """
    (metric_a, step_a), (metric_b, step_b) = a, b
    steps_a = resolve_steps(arm.runs, metric_a, step_a, per_question=True)
    steps_b = resolve_steps(arm.runs, metric_b, step_b, per_question=True)
    why = (per_question_ready(arm.runs, steps_a, metric_a)
           or per_question_ready(arm.runs, steps_b, metric_b))
    if not why:
        side_a, side_b = list(zip(arm.runs, steps_a)), list(zip(arm.runs, steps_b))
        if metric_a == metric_b:
            mats, strata = question_matrices([side_a, side_b], metric_a)
            values, contrast = (mats[1] - mats[0], None) if strata else (None, None)
        else:
            (mat_a, ids_a), (mat_b, ids_b) = _side(side_a, metric_a), _side(side_b, metric_b)
            values = np.hstack([mat_a, mat_b]) if len(ids_a) and len(ids_b) else None
            strata, contrast = ["a"] * len(ids_a) + ["b"] * len(ids_b), {"a": -1.0, "b": 1.0}
        if values is not None:
            interval = bs.hierarchical(values, strata, macro=metric_a.macro, contrast=contrast,
                                       rng=settings.rng(), n_resamples=settings.n_resamples,
                                       level=settings.level)
            return Estimate(interval, (*steps_a, *steps_b))
        why = "its seeds share no question"
    steps_a = _fallback_steps(arm.runs, metric_a, step_a)
    steps_b = _fallback_steps(arm.runs, metric_b, step_b)
    values = [logged_value(r, sb, metric_b) - logged_value(r, sa, metric_a)
              for r, sa, sb in zip(arm.runs, steps_a, steps_b)]
    interval = bs.seeds_only(values, n_resamples=settings.n_resamples, rng=settings.rng(),
                             level=settings.level)
    return Estimate(interval, (*steps_a, *steps_b), f"seeds only: {why}")


def sources(arms: Sequence[Arm]) -> list[str]:
    """Data sources seen in trajectories or ``eval/em/<source>`` logs, sorted."""
    found = {s for arm in arms for run in arm.runs for rows in run.questions.values()
             for s in rows["source"].unique()}
    found |= {m.group(1) for arm in arms for run in arm.runs for key in run.history.columns
              if (m := HISTORY_SOURCE.match(str(key)))}
    return sorted(found - {"macro", "micro"})


# ------------------------------------------------------------------- learning curves


def macro_series(run: Run) -> pd.Series:
    """Macro EM by eval step: the logged ``eval/em/macro``, else computed from trajectories."""
    series = run.series("eval/em/macro")
    if len(series):
        return series.sort_index()
    metric = parse_metric("em/macro")
    return pd.Series({s: logged_value(run, s, metric) for s in sorted(run.questions)}, dtype=float)


@dataclass(frozen=True)
class Curve:
    """One run's learning-curve figures (NaN when undefined)."""

    final: float
    final_step: float
    steps_to_90: float
    max_drop: float
    collapses: int
    evals: int


def steps_to_fraction(curves: np.ndarray, steps: np.ndarray, fraction: float = NINETY) -> np.ndarray:
    """First step whose value is ≥ ``fraction`` × the last value, along the last axis; NaN
    where the last value is not above 0."""
    curves = np.asarray(curves, dtype=float)
    final = curves[..., -1]
    first = (curves >= fraction * final[..., None]).argmax(axis=-1)  # the last index always holds
    return np.where(final > 0, np.asarray(steps, dtype=float)[first], math.nan)


def largest_drop(curves: np.ndarray) -> np.ndarray:
    """The largest fall between consecutive values along the last axis, 0 if none falls."""
    curves = np.asarray(curves, dtype=float)
    if curves.shape[-1] < 2:
        return np.zeros(curves.shape[:-1])
    return np.maximum((curves[..., :-1] - curves[..., 1:]).max(axis=-1), 0.0)


def collapse_count(curves: np.ndarray, fraction: float) -> np.ndarray:
    """Values below ``fraction`` × the best earlier value (when that best is above 0)."""
    curves = np.asarray(curves, dtype=float)
    best = np.maximum.accumulate(curves, axis=-1)[..., :-1]
    return ((curves[..., 1:] < fraction * best) & (best > 0)).sum(axis=-1)


def curve_figures(series: pd.Series, collapse_fraction: float) -> Curve:
    """Figures of a macro-EM-by-step series.

    - final: the last eval's value; steps_to_90: the first eval step whose value is at least
      90 % of the final one (undefined when the final is 0) — how fast the arm gets there;
    - max_drop: the largest fall between two consecutive evals (0 if it never falls);
    - collapses: evals whose value is below ``collapse_fraction`` × the best earlier value
      (only once that best is above 0) — how often training lost most of what it had.
    """
    values, steps = series.to_numpy(float), series.index.to_numpy()
    if not len(values):
        return Curve(math.nan, math.nan, math.nan, math.nan, 0, 0)
    return Curve(final=float(values[-1]), final_step=float(steps[-1]),
                 steps_to_90=float(steps_to_fraction(values, steps)),
                 max_drop=float(largest_drop(values)),
                 collapses=int(collapse_count(values, collapse_fraction)), evals=len(values))
