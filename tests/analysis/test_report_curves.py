"""Learning-curve figures as claim metrics (``report.curves``): the figures by hand, and the
bootstrap on synthetic runs whose curves differ in a known way."""

from __future__ import annotations

import math

import numpy as np
import pytest

from searchr1.analysis.report import curves
from searchr1.analysis.report.__main__ import main
from searchr1.analysis.report.measures import collapse_count, largest_drop, steps_to_fraction
from tests.analysis.test_report import CLAIM, _claims_file, _questions, write_run

STEPS = np.array([0, 10, 20, 30])


def test_figures_by_hand_on_a_batch_of_curves():
    batch = np.array([[0.1, 0.5, 0.4, 0.5],     # 0.9 × 0.5 = 0.45: first reached at step 10
                      [0.2, 0.3, 0.35, 0.4],    # 0.36: only the last eval reaches it
                      [0.4, 0.6, 0.1, 0.0],     # final 0: undefined
                      [0.5, 0.5, 0.5, 0.5]])
    assert steps_to_fraction(batch, STEPS)[:2].tolist() == [10.0, 30.0]
    assert math.isnan(steps_to_fraction(batch, STEPS)[2]) and steps_to_fraction(batch, STEPS)[3] == 0
    assert largest_drop(batch) == pytest.approx([0.1, 0.0, 0.5, 0.0])
    # collapse at 0.5: 0.1 < 0.5 × 0.6 and 0.0 < 0.5 × 0.6 in row 3; none elsewhere
    assert collapse_count(batch, 0.5).tolist() == [0, 0, 2, 0]
    assert largest_drop(np.array([[0.3]])).tolist() == [0.0]


def test_interval_point_is_the_mean_of_each_seeds_figure():
    """Two seeds × two sources × four steps: the point is the mean of the seeds' own figures
    of their macro curves; the interval holds it."""
    strata = ["x", "x", "y", "y"]
    seed1 = np.array([[0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]], float)  # q × steps
    seed2 = np.array([[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1, 1]], float)
    values = np.stack([seed1, seed2])
    # macro curves: seed 1 (.0, .5, .75, 1.0) → 90 % of 1.0 first at step 30
    #               seed 2 (.25, .5, 1.0, 1.0) → first at step 20
    iv = curves.curve_interval([values], strata, STEPS, "curve/steps_to_90", n_resamples=300,
                               rng=np.random.default_rng(0))
    assert iv.point == pytest.approx(25.0) and iv.low <= 25.0 <= iv.high
    diff = curves.curve_interval([values, values[::-1]], strata, STEPS, "curve/max_drop",
                                 n_resamples=300, rng=np.random.default_rng(0))
    assert diff.point == 0.0 and diff.n_seeds == (2, 2)


def _sweep(root, ramp_a: int, ramp_b: int, seed: int = 0):
    """Three seeds an arm; each arm's lift rises linearly to 0.4 by step ``ramp`` and stays."""
    rng = np.random.default_rng(seed)
    questions = _questions(40, rng)
    for arm, ramp in (("grpo", ramp_a), ("lab", ramp_b)):
        for s in range(3):
            write_run(root / f"{arm}_s{s}", [f"advantage={arm}", f"seed={s}"], questions,
                      lambda step, r=ramp: 0.4 * min(step / r, 1.0), rng, steps=60)
    return root


SOONER = {**CLAIM, "claim": "the lab reaches its plateau sooner", "metric": "curve/steps_to_90",
          "direction": "b<a", "step": "common"}


def test_a_planted_head_start_is_found_and_a_null_one_is_not(tmp_path):
    """B reaches its plateau by step 10, A by 50: steps to 90 % differ by 20–45 steps and the
    claim is reproduced; with both at 30 it is inconclusive. The points equal the Learning
    curves table's means."""
    out = tmp_path / "fast"
    claims = _claims_file(tmp_path, SOONER)
    assert main([str(_sweep(tmp_path / "s1", 50, 10)), "--out", str(out), "--claims", str(claims),
                 "--resamples", "300", "--no-plots"]) == 0
    row = (out / "claims.md").read_text().splitlines()[2]
    assert "**reproduced**" in row and "curve/steps_to_90: B < A" in row
    diff = float(row.split("|")[5].split("[")[0])
    assert -45 <= diff <= -20
    results = (out / "results.md").read_text()
    learning = results.split("## Learning curves")[1]
    table_a = next(ln for ln in learning.splitlines() if ln.startswith("| A1 | "))
    assert row.split("|")[4].strip().startswith(table_a.split("|")[4].split("(")[0].strip() + " [")
    assert "## Claims over training" not in results  # a whole curve's figure has no per-step gaps

    out = tmp_path / "same"
    assert main([str(_sweep(tmp_path / "s2", 30, 30, seed=1)), "--out", str(out), "--claims",
                 str(claims), "--resamples", "300", "--no-plots"]) == 0
    assert "**inconclusive**" in (out / "claims.md").read_text()


def test_curve_claim_without_trajectories_uses_seeds_only(tmp_path):
    """Runs whose eval files are gone: the figures come from the logged macro EM."""
    root = _sweep(tmp_path / "s", 50, 10)
    for path in root.glob("*/eval/step_*/trajectories.jsonl"):
        path.unlink()
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out), "--claims", str(_claims_file(tmp_path, SOONER)),
                 "--resamples", "200", "--no-plots"]) == 0
    assert "(seeds only)" in (out / "claims.md").read_text()


def test_unknown_curve_metric_exits_2(tmp_path, capsys):
    root = _sweep(tmp_path / "s", 20, 20)
    bad = _claims_file(tmp_path, {**SOONER, "metric": "curve/area"})
    assert main([str(root), "--out", str(tmp_path / "o"), "--claims", str(bad), "--no-plots"]) == 2
    assert "unknown curve metric 'curve/area'" in capsys.readouterr().err
