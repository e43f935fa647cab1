"""Time per arm (``report.timing`` and its ``results.md`` section) on hand-made runs whose
logged times are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from searchr1.analysis.report.__main__ import main
from searchr1.analysis.report.arms import group_arms
from searchr1.analysis.report.loading import load_runs
from searchr1.analysis.report.timing import arm_time
from tests.analysis.test_report import _questions, write_run


def add_times(run_dir, times: dict[str, dict[int, float]], wall_seconds: float | None = None):
    """Add ``times`` (key → step → seconds) to the run's metrics rows, and ``wall_seconds`` to
    its summary."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    for row in rows:
        row.update({k: by_step[row["step"]] for k, by_step in times.items() if row["step"] in by_step})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if wall_seconds is not None:
        summary = run_dir / "summary.json"
        summary.write_text(json.dumps({**json.loads(summary.read_text()), "wall_seconds": wall_seconds}))


def write_timed_study(root):
    """Arm grpo: a partial run (steps 1–3, no summary, no ``time/train``) and a finished one
    (steps 1–4, 600 s of wall time); arm lab: one finished run with no ``time/eval`` and no
    ``wall_seconds`` in its summary, whose first step is slow."""
    rng = np.random.default_rng(0)
    questions = _questions(2, rng)
    write_run(root / "grpo_s1", ["advantage=grpo", "seed=1"], questions, 0.0, rng, steps=3,
              configured=4, eval_every=2, summary=False)
    add_times(root / "grpo_s1", {"time/step_seconds": {1: 1.0, 2: 2.0, 3: 3.0},
                                 "time/rollout": {1: 0.5, 2: 1.0, 3: 4.5},
                                 "time/eval": {0: 10.0, 2: 20.0}})
    write_run(root / "grpo_s2", ["advantage=grpo", "seed=2"], questions, 0.0, rng, steps=4,
              configured=4, eval_every=2)
    add_times(root / "grpo_s2", {"time/step_seconds": {1: 4.0, 2: 5.0, 3: 6.0, 4: 7.0},
                                 "time/rollout": {1: 2.0, 2: 3.0, 3: 4.0, 4: 11.0},
                                 "time/train": {1: 1.0, 2: 2.0, 3: 3.0, 4: 2.0},
                                 "time/eval": {0: 30.0, 2: 40.0, 4: 80.0}}, wall_seconds=600.0)
    write_run(root / "lab_s1", ["advantage=lab", "seed=1"], questions, 0.0, rng, steps=4,
              configured=4, eval_every=2)
    add_times(root / "lab_s1", {"time/step_seconds": {1: 30.0, 2: 9.0, 3: 9.0, 4: 9.0}})
    return root


def test_arm_times_by_hand(tmp_path):
    """Per-run median step seconds 2 and 5.5 → 3.75 (2–5.5); rollout medians 1 and 3.5 → 2.25
    (means would give 2 and 5); train only from the run that logged it; eval the median of all
    five evals (30; their mean is 36, the median of run medians 27.5); wall only from the run
    with a summary; lab's slow first step leaves its median at 9."""
    grpo, lab = group_arms(load_runs([write_timed_study(tmp_path / "study")]))
    t = arm_time(grpo)
    assert (t.runs, t.step, t.step_low, t.step_high) == (2, 3.75, 2.0, 5.5)
    assert (t.rollout, t.train, t.eval) == (2.25, 2.0, 30.0)
    assert (t.wall_minutes, t.wall_runs) == (10.0, 1)
    t = arm_time(lab)
    assert (t.step, t.step_low, t.step_high) == (9.0, 9.0, 9.0)
    assert math.isnan(t.rollout) and math.isnan(t.train) and math.isnan(t.eval)
    assert math.isnan(t.wall_minutes) and t.wall_runs == 0  # a summary without wall_seconds


def test_run_without_summary_adds_no_wall_minutes(tmp_path):
    """The partial run logged 6 s of steps; without a summary it has no wall time, so the arm's
    wall minutes are the finished run's alone, and an arm of only such runs has none."""
    study = write_timed_study(tmp_path / "study")
    (study / "grpo_s2" / "summary.json").unlink()
    grpo = group_arms(load_runs([study]))[0]
    assert math.isnan(arm_time(grpo).wall_minutes) and arm_time(grpo).wall_runs == 0
    assert math.isfinite(arm_time(grpo).step)


def test_time_section_in_results(tmp_path):
    """The table after the Arms section: min–max of run medians, "—" for the arm without
    ``time/eval`` or ``wall_seconds``, and how many runs the wall minutes come from."""
    out = tmp_path / "report"
    assert main([str(write_timed_study(tmp_path / "study")), "--out", str(out), "--resamples", "100",
                 "--no-plots"]) == 0
    results = (out / "results.md").read_text()
    assert results.index("## Arms") < results.index("## Time per arm") < results.index("## Final eval")
    section = results.split("## Time per arm")[1].split("\n## ")[0]
    assert "| A1 | advantage=grpo | 2 | 3.75 (2–5.5) | 2.25 | 2 | 30 | 10.0 (1 of 2 runs) |" in section
    assert "| A2 | advantage=lab | 1 | 9 | — | — | — | — |" in section
    assert "depend on how many arms shared the GPU" in section


def test_no_time_logged_leaves_the_section_out(tmp_path):
    """Runs from before the trainer logged times: no section rather than a table of dashes."""
    rng = np.random.default_rng(1)
    write_run(tmp_path / "study" / "a", ["advantage=grpo", "seed=1"], _questions(2, rng), 0.0, rng,
              steps=0)
    out = tmp_path / "report"
    assert main([str(tmp_path / "study"), "--out", str(out), "--resamples", "100", "--no-plots"]) == 0
    assert "## Time per arm" not in (out / "results.md").read_text()


@pytest.mark.parametrize("value", ["600", float("nan"), True])
def test_wall_seconds_that_is_not_a_number_is_not_counted(tmp_path, value):
    study = write_timed_study(tmp_path / "study")
    add_times(study / "grpo_s2", {}, wall_seconds=value)
    grpo = group_arms(load_runs([study]))[0]
    assert arm_time(grpo).wall_runs == 0
