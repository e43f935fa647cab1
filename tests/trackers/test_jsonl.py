"""``metrics.jsonl``: one line per step and one per eval, as the README's run-directory table says."""

from __future__ import annotations

import json
from pathlib import Path

from searchr1.analysis.run_data import read_history
from searchr1.trackers.jsonl import JsonlTracker

README = Path(__file__).resolve().parents[2] / "README.md"


def test_a_steps_train_line_and_its_eval_line_stay_apart_and_merge_by_step(tmp_path):
    tracker = JsonlTracker(tmp_path)
    tracker.log({"eval/em/macro": 0.5}, 0)  # the eval before training
    tracker.log({"reward/mean": 0.2, "train/loss": 1.0}, 1)
    tracker.log({"reward/mean": 0.3, "train/loss": 0.9}, 2)
    tracker.log({"eval/em/macro": 0.25, "time/eval": 3.0}, 2)  # the final eval, after step 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 2]
    assert not any("train/loss" in r and "eval/em/macro" in r for r in rows)
    merged = read_history(tmp_path / "metrics.jsonl")
    assert merged.loc[2, "train/loss"] == 0.9 and merged.loc[2, "eval/em/macro"] == 0.25


def test_the_readme_describes_that_layout():
    (row,) = [line for line in README.read_text().splitlines() if line.startswith("| `metrics.jsonl` |")]
    assert "one line per step" in row and "one line per eval" in row and "merge them by `step`" in row
