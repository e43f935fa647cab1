"""Claims about one arm (``arm:`` in the claims spec): one metric at two steps, or one
measure on two sources, each seed compared with itself — by hand, on synthetic runs with
planted effects, and the spec's errors."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.__main__ import main
from searchr1.analysis.report.arms import group_arms
from searchr1.analysis.report.loading import load_runs
from searchr1.analysis.report.measures import Settings, parse_metric, within_difference
from tests.analysis.test_report import _claims_file, _questions, write_run

ARM = {"advantage": "grpo"}


def test_contrast_weights_by_hand():
    """Stratum b's mean less stratum a's, per seed, then over seeds: (2 − 1) and (4 − 1)."""
    values = np.array([[1, 1, 2, 2, 2], [1, 1, 3, 4, 5]], dtype=float)
    strata = ["a", "a", "b", "b", "b"]
    iv = bs.hierarchical(values, strata, macro=True, contrast={"a": -1.0, "b": 1.0},
                         n_resamples=300, rng=np.random.default_rng(0))
    assert iv.point == pytest.approx(2.0)
    assert 1.0 <= iv.low <= iv.point <= iv.high <= 4.0  # a seed's contrast is 1 to 4 at most
    with pytest.raises(ValueError, match="do not name the strata"):
        bs.hierarchical(values, strata, macro=True, contrast={"a": -1.0}, n_resamples=100,
                        rng=np.random.default_rng(0))


def _one_arm(tmp_path, seeds, searches, n_per_source=30, steps=20):
    rng = np.random.default_rng(5)
    questions = _questions(n_per_source, rng)
    for s in seeds:
        write_run(tmp_path / "runs" / f"s{s}", ["advantage=grpo", f"seed={s}"], questions, 0.0, rng,
                  steps=steps, searches=lambda step, src, r, s=s: searches(step, src, r, s))
    return tmp_path / "runs"


def test_each_seed_is_compared_with_itself(tmp_path):
    """Seeds differ by 0, 3 and 6 searches throughout; training adds exactly one. Against
    itself each seed gains +1 on every question, so the interval is a point; the step-0
    spread across seeds (0 to 6) never enters it."""
    root = _one_arm(tmp_path, (0, 1, 2), lambda step, src, r, s: 1 + 3 * s + (step > 0))
    (arm,) = group_arms(load_runs([root]))
    metric = parse_metric("searches")
    est = within_difference(arm, (metric, 0), (metric, "final"), Settings(n_resamples=200))
    assert est.note == "" and est.steps == (0, 0, 0, 20, 20, 20)
    assert (est.interval.point, est.interval.low, est.interval.high) == pytest.approx((1.0, 1.0, 1.0))
    hops = within_difference(arm, (parse_metric("searches/world_1hop"), 20),
                             (parse_metric("searches/world_3hop"), 20), Settings(n_resamples=200))
    assert hops.interval.point == pytest.approx(0.0) and hops.interval.low == hops.interval.high == 0.0


def test_a_null_contrast_is_called_at_about_the_stated_rate():
    """Two sources with the same searches (1 or 2 at random), 2 seeds × 30 questions each:
    over 100 replications the 95 % interval excludes zero about 5 % of the time (≤ 10 %)."""
    rng = np.random.default_rng(2)
    strata = ["a"] * 30 + ["b"] * 30
    called = sum(bs.hierarchical(rng.integers(1, 3, size=(2, 60)).astype(float), strata, macro=True,
                                 contrast={"a": -1.0, "b": 1.0}, n_resamples=300, rng=rng).excludes_zero
                 for _ in range(100))
    assert called <= 10


def test_planted_rise_and_hop_gap_are_found(tmp_path):
    """Searches 1–2 at random, +1 from step 10 on, +1 on 3-hop questions."""
    def searches(step, src, rng, seed):
        return int(rng.integers(1, 3)) + (step >= 10) + (src == "world_3hop")

    root = _one_arm(tmp_path, (0, 1), searches)
    grpo = {"arm": ARM, "metric": "searches", "direction": "b>a"}
    claims = _claims_file(
        tmp_path,
        {**grpo, "claim": "searches rise", "a": {"step": 0}, "b": {"step": "final"}},
        {**grpo, "claim": "searches fall", "a": {"step": 0}, "b": {}, "direction": "b<a"},
        {**grpo, "claim": "3-hop above 1-hop", "a": {"metric": "searches/world_1hop"},
         "b": {"metric": "searches/world_3hop"}, "step": "common"})
    out = tmp_path / "report"
    assert main([str(root), "--out", str(out), "--claims", str(claims), "--resamples", "400"]) == 0
    table = (out / "claims.md").read_text()
    verdicts = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in table.splitlines()[2:]}
    assert verdicts == {"searches rise": "**reproduced**", "searches fall": "**opposite**", "3-hop above 1-hop": "**reproduced**"}
    assert "| searches: step final > step 0 |" in table
    assert "| searches/world_3hop > searches/world_1hop |" in table
    rise = next(line for line in table.splitlines() if line.startswith("| searches rise |"))
    assert 0.8 < float(rise.split("|")[5].split("[")[0]) < 1.2
    results = (out / "results.md").read_text()
    assert ("one arm, A1 [advantage=grpo, trainer.steps=20], each seed against itself: A = searches at step 0 (0), "
            "B = searches at step final (20)") in results
    with (out / "claim_gaps.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    rise_steps = [int(r["step"]) for r in rows if r["claim"] == "searches rise"]
    assert rise_steps == [10, 20]  # step 0 against itself is left out
    hop = [r for r in rows if r["claim"] == "3-hop above 1-hop"]
    assert [int(r["step"]) for r in hop] == [0, 10, 20] and {r["verdict"] for r in hop} == {"reproduced"}
    assert {r["metric"] for r in hop} == {"searches/world_3hop − searches/world_1hop"}


@pytest.mark.parametrize("side_a, side_b, expected", [
    ({"step": 0}, {"step": 0}, "measure the arm alike"),
    ({"seed": 1}, {"step": 10}, "sets only ['metric', 'step']"),
    ({"metric": "searches/world_1hop"}, {"metric": "em/world_3hop"}, "one measure of two sources"),
    ({"metric": "searches"}, {"metric": "searches/world_3hop"}, "one measure of two sources"),
    ({"metric": "curve/max_drop"}, {"step": 10}, "compares eval metrics"),
])
def test_bad_claims_about_one_arm_exit_2(tmp_path, capsys, side_a, side_b, expected):
    root = _one_arm(tmp_path, (0,), lambda step, src, r, s: 1, n_per_source=3, steps=10)
    claims = _claims_file(tmp_path, {"claim": "x", "arm": ARM, "a": side_a, "b": side_b,
                                     "metric": "searches", "direction": "b>a"})
    assert main([str(root), "--out", str(tmp_path / "out"), "--claims", str(claims),
                 "--resamples", "100", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "claim 1" in err and expected in err


def test_a_wandb_export_gives_each_runs_own_difference_over_seeds(tmp_path):
    """history.csv only (no trajectories): B − A is each run's logged B less its logged A,
    averaged over seeds, with a seeds-only interval — here +1.0, +0.5 and +0.6 at step 20."""
    import json

    import pandas as pd

    for i, (start, end) in enumerate([(2.0, 3.0), (2.5, 3.0), (1.8, 2.4)]):
        run = tmp_path / "export" / f"run{i}"
        run.mkdir(parents=True)
        pd.DataFrame({"_step": [0, 10, 20], "eval/em/macro": [0.3, 0.4, 0.5],
                      "eval/searches": [start, start + 0.1, end],
                      "eval/searches/world_1hop": [start, start, end - 0.2],
                      "eval/searches/world_3hop": [start, start, end + 0.2]}).to_csv(run / "history.csv")
        config = {"trainer": {"steps": 20}, "hydra": {"overrides": ["advantage=grpo", f"seed={i}"]}}
        (run / "config.json").write_text(json.dumps(config))
        (run / "summary.json").write_text(json.dumps({"eval/em/macro": 0.5}))
    (arm,) = group_arms(load_runs([tmp_path / "export"]))
    settings = Settings(n_resamples=300)
    rise = within_difference(arm, (parse_metric("searches"), 0), (parse_metric("searches"), "final"), settings)
    assert rise.note.startswith("seeds only") and rise.interval.method == "seeds only"
    assert rise.interval.point == pytest.approx((1.0 + 0.5 + 0.6) / 3)
    assert 0.5 <= rise.interval.low < rise.interval.high <= 1.0
    hops = within_difference(arm, (parse_metric("searches/world_1hop"), "final"),
                             (parse_metric("searches/world_3hop"), "final"), settings)
    assert hops.interval.point == pytest.approx(0.4) and hops.steps == (20,) * 6
