"""``metrics.jsonl``: reopened on resume, unreadable lines are dropped with a warning, never fatal;
one line per step and one per eval, as the README's run-directory table says."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from searchr1.analysis.run_data import read_history
from searchr1.trackers.jsonl import METRICS_FILE, JsonlTracker

README = Path(__file__).resolve().parents[2] / "README.md"


def _row(step: int) -> bytes:
    return (json.dumps({"step": step, "reward/mean": 0.5}) + "\n").encode()


def test_a_line_with_a_byte_that_is_not_utf8_is_dropped_with_a_warning(tmp_path, caplog):
    bad = b'{"step": 2, "note": "caf\xe9"}\n'  # a cp1252 byte, as an editor on Windows saves it
    (tmp_path / METRICS_FILE).write_bytes(_row(1) + bad + _row(3))
    with caplog.at_level(logging.WARNING):
        tracker = JsonlTracker(tmp_path)
    offset = len(_row(1)) + bad.index(b"\xe9")
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"line 2: byte {offset} is not UTF-8" in warning and METRICS_FILE in warning
    tracker.log({"reward/mean": 0.7}, 4)
    tracker.finish()
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text("utf-8").splitlines()]
    assert [r["step"] for r in rows] == [1, 3, 4]


def test_a_torn_last_line_is_dropped_and_a_clean_file_is_left_alone(tmp_path, caplog):
    path = tmp_path / METRICS_FILE
    path.write_bytes(_row(1) + b'{"step": 2, "rew')  # killed mid-write
    with caplog.at_level(logging.WARNING):
        JsonlTracker(tmp_path).finish()
    assert path.read_bytes() == _row(1)
    assert "line 2: not JSON" in caplog.text
    caplog.clear()
    before = path.stat().st_mtime_ns
    JsonlTracker(tmp_path).finish()
    assert path.stat().st_mtime_ns == before and caplog.text == ""


def test_a_steps_train_line_and_its_eval_line_stay_apart_and_merge_by_step(tmp_path):
    tracker = JsonlTracker(tmp_path)
    tracker.log({"eval/em/macro": 0.5}, 0)  # the eval before training
    tracker.log({"reward/mean": 0.2, "train/loss": 1.0}, 1)
    tracker.log({"reward/mean": 0.3, "train/loss": 0.9}, 2)
    tracker.log({"eval/em/macro": 0.25, "time/eval": 3.0}, 2)  # the final eval, after step 2
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 2]
    assert not any("train/loss" in r and "eval/em/macro" in r for r in rows)
    merged = read_history(tmp_path / METRICS_FILE)
    assert merged.loc[2, "train/loss"] == 0.9 and merged.loc[2, "eval/em/macro"] == 0.25


def test_the_readme_describes_that_layout():
    (row,) = [line for line in README.read_text().splitlines() if line.startswith("| `metrics.jsonl` |")]
    assert "one line per step" in row and "one line per eval" in row and "merge them by `step`" in row
