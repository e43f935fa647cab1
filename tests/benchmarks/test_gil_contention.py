"""The GIL-contention benchmark: one row per switch interval, and the interpreter's own put back."""

from __future__ import annotations

import json
import sys

from tests.helpers.scripts import load_script


def test_rows_per_interval_and_the_switch_interval_restored(tmp_path):
    bench = load_script("experiments/benchmarks/gil_contention.py")
    previous = sys.getswitchinterval()
    out = tmp_path / "r.json"
    result = bench.main(["--ops", "50", "--repeats", "3", "--intervals-ms", "2", "0.5", "--out", str(out)])
    assert sys.getswitchinterval() == previous
    assert [r["interval_ms"] for r in result["rows"]] == [2.0, 0.5]
    for row in result["rows"]:
        assert row["alone_ms"] > 0 and row["busy_main_ms"] > 0
        assert row["ratio"] == row["busy_main_ms"] / row["alone_ms"]
    assert json.loads(out.read_text())["rows"] == result["rows"]
