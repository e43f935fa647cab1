"""Bootstrap intervals over seeds and questions, and the verdict on a claimed direction.

Data are a matrix ``values[seed, question]`` (one row per seed of an arm, one column per
question of the eval set) and each question's stratum (its data source). The statistic of
one seed is a weighted mean of its per-stratum means: equal weights give the macro mean
(the lab's macro EM, mean over sources), weights proportional to the strata's sizes the
plain mean. The arm's statistic is the mean of its seeds' statistics.

- ``hierarchical``: resample seeds with replacement, then questions with replacement
  within each resampled seed and within each stratum (the eval set's per-source counts are
  fixed by design, so they stay fixed). Both sources of noise — training seed and the
  finite question set — enter the interval.
- ``paired``: the difference B − A on the same questions. Each resample draws one set of
  questions (within strata) shared by both arms and all their seeds — that sharing is the
  pairing, so a question's difficulty cancels out of the difference — and draws each
  arm's seeds independently (seed 1 of A and seed 1 of B are unrelated runs).
- ``seeds_only``: without per-question data, resample seeds (per-run values) only.

Resampling at both levels counts the per-answer (Bernoulli) noise twice — once through
the seeds, once through the questions — so the intervals are conservative: in a null
simulation (3 seeds × 120 questions) a 95 % paired interval excluded zero in about 1 % of
replications. A claim called reproduced is therefore a safe call; a small true effect may
stay inconclusive.

Intervals are percentile intervals of the resampled statistic. All resampling is
vectorised numpy, in chunks of resamples so memory stays bounded on large eval sets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CHUNK_ELEMENTS = 4_000_000
REPRODUCED, OPPOSITE, INCONCLUSIVE = "reproduced", "opposite", "inconclusive"
# an interval that excludes zero where an arm has fewer seeds than the report asks for
# (``Settings.min_seeds``): with one seed the seed-to-seed spread is not in the interval
FEW_SEEDS = "too few seeds"


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap interval; ``method`` says what was resampled."""

    point: float
    low: float
    high: float
    method: str  # "seeds × questions", "paired seeds × questions", "seeds only"
    n_seeds: int | tuple[int, int]
    n_questions: int | None = None

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


NAN_INTERVAL = Interval(math.nan, math.nan, math.nan, "no data", 0)


def strata_layout(strata: Sequence, macro: bool, contrast: dict[str, float] | None = None
                  ) -> tuple[list[np.ndarray], np.ndarray]:
    """Column indices of each stratum and its weight: equal for macro, by size otherwise, or
    as ``contrast`` gives them by stratum label (e.g. −1 and +1: one stratum's mean less
    another's)."""
    labels = np.asarray([str(s) for s in strata])
    names = list(dict.fromkeys(labels))
    cols = [np.flatnonzero(labels == s) for s in names]
    if contrast is not None:
        if set(contrast) != set(names):
            raise ValueError(f"contrast weights {sorted(contrast)} do not name the strata {sorted(names)}")
        return cols, np.array([float(contrast[s]) for s in names])
    sizes = np.array([len(c) for c in cols], dtype=float)
    weights = np.full(len(cols), 1.0 / len(cols)) if macro else sizes / sizes.sum()
    return cols, weights


def seed_statistic(values: np.ndarray, cols: list[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Each seed's weighted mean of per-stratum means (rows of ``values``)."""
    return sum(w * values[:, c].mean(axis=1) for c, w in zip(cols, weights))


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The central ``level`` interval of the resampled statistics."""
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(samples, [tail, 1.0 - tail])
    return float(low), float(high)


def chunk_sizes(n_resamples: int, per_resample: int) -> list[int]:
    """Resamples per chunk, so one chunk indexes at most ``CHUNK_ELEMENTS`` values."""
    size = max(1, CHUNK_ELEMENTS // max(per_resample, 1))
    return [min(size, n_resamples - start) for start in range(0, n_resamples, size)]


def _check(values: np.ndarray, strata: Sequence) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if values.ndim != 2 or values.shape[1] != len(strata) or values.size == 0:
        raise ValueError(f"values must be seeds × questions matching {len(strata)} strata, "
                         f"got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError("values hold NaN or infinity")
    return values


def _resampled_arm(values: np.ndarray, picks: list[np.ndarray], weights: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """One chunk: resample the arm's seeds, evaluate on the given question picks.

    ``picks[k]`` holds column indices shaped (b, 1, n_k) (shared by seeds) or (b, S, n_k).
    """
    b, n_seeds = picks[0].shape[0], values.shape[0]
    seeds = rng.integers(0, n_seeds, size=(b, n_seeds))[:, :, None]
    stat = sum(w * values[seeds, pick].mean(axis=2) for pick, w in zip(picks, weights))
    return stat.mean(axis=1)


def hierarchical(values: np.ndarray, strata: Sequence, *, macro: bool, n_resamples: int,
                 rng: np.random.Generator, level: float = 0.95,
                 contrast: dict[str, float] | None = None) -> Interval:
    """Mean over seeds of the (macro) mean — or of the ``contrast`` of stratum means (see
    ``strata_layout``); resample seeds, then questions within each seed and stratum."""
    values = _check(values, strata)
    cols, weights = strata_layout(strata, macro, contrast)
    n_seeds, n_q = values.shape
    samples = []
    for b in chunk_sizes(n_resamples, n_seeds * n_q):
        picks = [c[rng.integers(0, len(c), size=(b, n_seeds, len(c)))] for c in cols]
        samples.append(_resampled_arm(values, picks, weights, rng))
    low, high = percentile_interval(np.concatenate(samples), level)
    point = float(seed_statistic(values, cols, weights).mean())
    return Interval(point, low, high, "seeds × questions", n_seeds, n_q)


def paired(a: np.ndarray, b: np.ndarray, strata: Sequence, *, macro: bool, n_resamples: int,
           rng: np.random.Generator, level: float = 0.95) -> Interval:
    """B − A on the same questions: shared question resample, independent seed resamples."""
    a, b = _check(a, strata), _check(b, strata)
    cols, weights = strata_layout(strata, macro)
    n_q = a.shape[1]
    samples = []
    for size in chunk_sizes(n_resamples, (a.shape[0] + b.shape[0]) * n_q):
        picks = [c[rng.integers(0, len(c), size=(size, 1, len(c)))] for c in cols]
        samples.append(_resampled_arm(b, picks, weights, rng) - _resampled_arm(a, picks, weights, rng))
    low, high = percentile_interval(np.concatenate(samples), level)
    point = float(seed_statistic(b, cols, weights).mean() - seed_statistic(a, cols, weights).mean())
    return Interval(point, low, high, "paired seeds × questions", (a.shape[0], b.shape[0]), n_q)


def _seed_means(values: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    idx = rng.integers(0, len(values), size=(n_resamples, len(values)))
    return values[idx].mean(axis=1)


def seeds_only(values: Sequence[float], *, n_resamples: int, rng: np.random.Generator,
               level: float = 0.95) -> Interval:
    """Mean of per-run values; resample runs (seeds) only."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return NAN_INTERVAL
    low, high = percentile_interval(_seed_means(values, n_resamples, rng), level)
    return Interval(float(values.mean()), low, high, "seeds only", len(values))


def seeds_only_difference(a: Sequence[float], b: Sequence[float], *, n_resamples: int,
                          rng: np.random.Generator, level: float = 0.95) -> Interval:
    """Mean(B) − mean(A) of per-run values; each arm's seeds resampled independently."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not len(a) or not len(b):
        return NAN_INTERVAL
    diff = _seed_means(b, n_resamples, rng) - _seed_means(a, n_resamples, rng)
    low, high = percentile_interval(diff, level)
    return Interval(float(b.mean() - a.mean()), low, high, "seeds only", (len(a), len(b)))


def verdict(interval: Interval, direction: int) -> str:
    """Claimed sign ``direction`` (+1: B > A, −1: B < A) against the interval of B − A.

    Reproduced only when the interval excludes zero on the claimed side, opposite when it
    excludes zero on the other side, inconclusive otherwise (and when there is no data).
    """
    if math.isnan(interval.low) or not interval.excludes_zero:
        return INCONCLUSIVE
    return REPRODUCED if (interval.low > 0) == (direction > 0) else OPPOSITE
