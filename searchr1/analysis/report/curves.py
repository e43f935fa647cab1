"""Learning-curve figures as claim metrics, with bootstrap intervals.

A claim about how an arm learns, not where it ends ("GRPO converges faster", "PPO is more
stable"), is a claim about a figure of each run's macro-EM curve:

- ``curve/steps_to_90``: the first eval step whose macro EM is at least 0.9 × the curve's
  last value (undefined when that is 0): how soon the run reaches its plateau;
- ``curve/max_drop``: the largest fall of macro EM between two consecutive evals (0 if it
  never falls): how much the run ever loses at once;
- ``curve/collapses``: evals below ``collapse_fraction`` × the best earlier eval (once that
  best is above 0): how often it loses most of what it had.

The arm's value is the mean over its seeds. Its interval resamples the way the claims table's
do (``bootstrap``): seeds with replacement, and questions within each data source, the same
questions at every step of a curve (a question's difficulty persists through training), so a
resampled curve is the curve the run would have drawn on another draw of the eval set. For
B − A both arms share each resample's questions. Each curve ends at the claim's step
(``final`` and ``common`` both mean the last eval every run of both arms reached), so a
partial arm is compared on the steps it has.

A maximum over evals grows under resampling (question noise adds falls), so one arm's
``max_drop`` interval sits above its point; in B − A the bias is alike on both sides.
Without per-question files the interval is over seeds only, from the logged macro EM.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.loading import Arm, ReportInputError, Run
from searchr1.analysis.report.measures import (Estimate, Settings, collapse_count, common_step,
                                               largest_drop, macro_series, parse_metric,
                                               steps_to_fraction)

CURVE_METRICS = ("curve/steps_to_90", "curve/max_drop", "curve/collapses")
DIGITS = {"curve/steps_to_90": 1, "curve/collapses": 2}  # printed digits (default 3)


def is_curve_metric(name: str) -> bool:
    return name.startswith("curve/")


def check_curve_metric(name: str) -> str:
    if name not in CURVE_METRICS:
        raise ReportInputError(f"unknown curve metric {name!r}: use one of {', '.join(CURVE_METRICS)}.")
    return name


# ------------------------------------------------------------------- figures of curves


def figure(name: str, curves: np.ndarray, steps: np.ndarray, collapse_fraction: float) -> np.ndarray:
    """The curve metric ``name`` of each curve (last axis: evals at ``steps``)."""
    if name == "curve/steps_to_90":
        return steps_to_fraction(curves, steps)
    if name == "curve/max_drop":
        return largest_drop(curves)
    return collapse_count(curves, collapse_fraction).astype(float)


# ------------------------------------------------------------------- bootstrap of curves


def _arm_curves(values: np.ndarray, seeds: np.ndarray, picks: list[np.ndarray],
                weights: np.ndarray) -> np.ndarray:
    """Resampled macro curves: ``values`` seeds × questions × steps, ``seeds`` (b, S), picks
    per stratum (b, 1 or S, n_k) → (b, S, steps)."""
    return sum(w * values[seeds[:, :, None], pick].mean(axis=2) for pick, w in zip(picks, weights))


def _arm_figure(values, picks, weights, rng, name, steps, fraction) -> np.ndarray:
    seeds = rng.integers(0, values.shape[0], size=(picks[0].shape[0], values.shape[0]))
    per_seed = figure(name, _arm_curves(values, seeds, picks, weights), steps, fraction)
    with warnings.catch_warnings():  # a resample whose every seed is undefined gives NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(per_seed, axis=1)


def _point(values: np.ndarray, cols, weights, name, steps, fraction) -> float:
    curves = sum(w * values[:, c, :].mean(axis=1) for c, w in zip(cols, weights))  # seeds × steps
    per_seed = figure(name, curves, steps, fraction)
    return float(np.nanmean(per_seed)) if np.isfinite(per_seed).any() else math.nan


def _finite_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of the defined resamples (NaN: every seed's figure undefined)."""
    samples = samples[np.isfinite(samples)]
    return bs.percentile_interval(samples, level) if len(samples) else (math.nan, math.nan)


def curve_interval(arms: Sequence[np.ndarray], strata: Sequence, steps: Sequence[int], name: str, *,
                   n_resamples: int, rng: np.random.Generator, level: float = 0.95,
                   collapse_fraction: float = 0.5) -> bs.Interval:
    """One arm (``arms`` = [values]): its figure with a seeds × questions interval. Two arms
    ([A, B]): B − A, questions shared by both in each resample (paired), seeds independent.
    Each ``values`` is seeds × questions × steps (macro over ``strata``)."""
    arms = [np.asarray(v, dtype=float) for v in arms]
    if any(v.ndim != 3 or v.shape[1] != len(strata) or v.shape[2] != len(steps) for v in arms):
        raise ValueError(f"values must be seeds × {len(strata)} questions × {len(steps)} steps")
    cols, weights = bs.strata_layout(strata, macro=True)
    steps = np.asarray(steps)
    paired = len(arms) == 2
    per_resample = sum(v.size for v in arms)
    samples = []
    for size in bs.chunk_sizes(n_resamples, per_resample):
        width = 1 if paired else arms[0].shape[0]
        picks = [c[rng.integers(0, len(c), size=(size, width, len(c)))] for c in cols]
        stats = [_arm_figure(v, picks, weights, rng, name, steps, collapse_fraction) for v in arms]
        samples.append(stats[1] - stats[0] if paired else stats[0])
    low, high = _finite_interval(np.concatenate(samples), level)
    points = [_point(v, cols, weights, name, steps, collapse_fraction) for v in arms]
    point = points[1] - points[0] if paired else points[0]
    n_seeds = (arms[0].shape[0], arms[1].shape[0]) if paired else arms[0].shape[0]
    method = "paired seeds × questions" if paired else "seeds × questions"
    return bs.Interval(point, low, high, method, n_seeds, len(strata))


# ------------------------------------------------------------------- arms and claims


def last_step(arms: Sequence[Arm], step: str | int) -> int | None:
    """Where the compared curves end: a step number as given, else the last shared eval."""
    if isinstance(step, int):
        return step
    return common_step([r for arm in arms for r in arm.runs], parse_metric("em/macro"))


def curve_tensors(arms: Sequence[Arm], end: int) -> tuple[list[np.ndarray], list[str], list[int]]:
    """Seeds × questions × steps EM per arm over the steps every run has up to ``end`` and the
    question ids every run and step shares; empty when some run lacks per-question files."""
    runs = [r for arm in arms for r in arm.runs]
    if not all(r.questions for r in runs):
        return [], [], []
    steps = sorted(set.intersection(*(set(r.questions) for r in runs)))
    steps = [s for s in steps if s <= end]
    frames = {(id(r), s): r.questions[s].set_index("id") for r in runs for s in steps}
    ids = sorted(set.intersection(*(set(f.index) for f in frames.values()))) if frames else []
    if not steps or not ids:
        return [], [], []
    tensors = [np.stack([np.stack([frames[(id(r), s)].loc[ids, "em"].to_numpy(float) for s in steps],
                                  axis=1) for r in arm.runs]) for arm in arms]
    if not all(np.isfinite(t).all() for t in tensors):
        return [], [], []
    sources = frames[(id(runs[0]), steps[0])].loc[ids, "source"].astype(str).tolist()
    return tensors, sources, steps


def _logged_figures(run: Run, name: str, end: int | None, fraction: float) -> float:
    series = macro_series(run)
    series = series[series.index <= end] if end is not None else series
    if not len(series):
        return math.nan
    return float(figure(name, series.to_numpy(float), series.index.to_numpy(), fraction))


def curve_estimate(arms: Sequence[Arm], name: str, step: str | int, settings: Settings,
                   end: int | None = None) -> Estimate:
    """The curve metric of one arm, or B − A of two, with its interval (curves cut at ``end``,
    default: ``last_step`` of these arms)."""
    end = last_step(arms, step) if end is None else end
    tensors, sources, steps = curve_tensors(arms, end if end is not None else -1)
    kwargs = dict(n_resamples=settings.n_resamples, rng=settings.rng(), level=settings.level)
    if tensors and len(steps) >= 1:
        interval = curve_interval(tensors, sources, steps, name, collapse_fraction=settings.collapse_fraction,
                                  **kwargs)
        return Estimate(interval, tuple([steps[-1]] * sum(len(a.runs) for a in arms)))
    values = [[_logged_figures(r, name, end, settings.collapse_fraction) for r in arm.runs] for arm in arms]
    interval = (bs.seeds_only(values[0], **kwargs) if len(arms) == 1
                else bs.seeds_only_difference(values[0], values[1], **kwargs))
    return Estimate(interval, tuple([end] * sum(len(a.runs) for a in arms)),
                    "seeds only: some run has no per-question eval files at every step")

