"""The decode step's row count (the step itself is tested through the engine: test_slot_engine.py)."""

from __future__ import annotations

from searchr1.engines.local.sampling.slot_decode import compacted_rows


def test_rows_are_powers_of_two_then_multiples_of_64_within_a_third_of_the_pool():
    assert [compacted_rows(n, 400) for n in (1, 8, 9, 33, 64, 65, 128, 129)] == [8, 8, 16, 64, 64, 128, 128, 400]
    assert compacted_rows(17, 64) == 64 and compacted_rows(10, 64) == 16  # 32 · 3 > 64 ≥ 16 · 3
    assert compacted_rows(0, 24) == 8 and compacted_rows(1, 23) == 23  # 8 · 3 > 23
