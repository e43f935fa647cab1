"""The step profiler's kernel table: which calls it profiles and how it sums their events."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tests.helpers.scripts import load_script


def _kernel_profile(calls):
    return load_script("experiments/benchmarks/profile_step.py").KernelProfile(calls)


def test_only_armed_calls_up_to_the_count_are_profiled_and_their_ops_summed():
    kp = _kernel_profile(2)
    a = torch.randn(64, 64)

    class Engine:
        def admit(self, n):
            for _ in range(n):
                torch.mm(a, a)
            return n

    admit = kp.wrap(Engine.admit)
    engine = Engine()
    assert admit(engine, 5) == 5 and kp.done == 0 and not kp.totals  # not armed: untouched
    kp.armed = True
    assert [admit(engine, n) for n in (3, 4, 7)] == [3, 4, 7]  # the third call is past the count
    assert kp.done == 2 and kp.wall > 0
    seconds, count = kp.totals["aten::mm"]
    assert count == 3 + 4 and seconds > 0  # CPU here: self CPU time of the two profiled calls
    assert kp.table().splitlines()[0].startswith("2 calls,")


def test_events_are_summed_by_name_in_seconds_and_empty_ones_skipped():
    kp = _kernel_profile(1)
    ev = lambda key, dev, cpu, count: SimpleNamespace(key=key, self_device_time_total=dev,  # noqa: E731
                                                      self_cpu_time_total=cpu, count=count)
    kp.add([ev("gemm", 1500.0, 5.0, 3), ev("copy", 0.0, 9.0, 1)], device=True)
    kp.add([ev("gemm", 500.0, 5.0, 1)], device=True)
    assert kp.totals == {"gemm": [0.002, 4]}  # µs → s; "copy" had no device time
    kp.add([ev("copy", 0.0, 9.0, 2)], device=False)
    assert kp.totals["copy"] == [9e-6, 2]
    kp.done, kp.wall = 1, 0.004
    row = kp.table().splitlines()[2]
    assert row.split()[:3] == ["2.00", "50.0%", "4.0"] and row.endswith("gemm")
