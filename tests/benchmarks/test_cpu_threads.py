"""The CPU-threads benchmark's table: each configuration against the reference of the same run."""

from __future__ import annotations

from tests.helpers.scripts import load_script


def test_table_gives_medians_and_ratios_against_the_reference():
    bench = load_script("experiments/benchmarks/cpu_threads.py")
    names = list(bench.CONFIGS)
    results = {name: [{"threads": 2 if i == 0 else 1, "decode_ms": 100.0 * (4 - i) + r,
                       "train_ms": 10.0} for r in (0, 1, 2)] for i, name in enumerate(names)}
    text = bench.table(results, ["decode_ms", "train_ms"], busy=2, load=(3.0, 2.0, 1.0))
    lines = text.splitlines()
    assert "2 busy loop(s) beside; load average at start 3.00" in lines[1]
    ref, one = lines[4], lines[5]
    assert ref.startswith("| torch default (reference) | 2 | 401.0 | 10.0 |") and ref.endswith("| 1.00 | 1.00 |")
    assert one.startswith("| 1 thread | 1 | 301.0 |") and "| 0.75 | 1.00 |" in one
    assert bench.CONFIGS[names[0]] == ({"OMP_WAIT_POLICY": ""}, "torch")  # OpenMP's own waiting
