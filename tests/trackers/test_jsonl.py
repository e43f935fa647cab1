"""``metrics.jsonl`` reopened on resume: unreadable lines are dropped with a warning, never fatal."""

from __future__ import annotations

import json
import logging

from searchr1.trackers.jsonl import METRICS_FILE, JsonlTracker


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
