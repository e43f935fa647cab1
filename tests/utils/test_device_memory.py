"""Per-step GPU memory metrics: GiB of the allocator's peaks, one window per call."""

from __future__ import annotations

import torch

from searchr1.utils import device_memory


def test_peaks_are_reported_in_gib_and_each_call_starts_a_new_window(monkeypatch) -> None:
    state = {"allocated": 3 * 2**30, "reserved": 5 * 2**29, "resets": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: state["allocated"] if d == 1 else -1)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: state["reserved"] if d == 1 else -1)

    def reset(d):
        state["resets"].append(d)
        state["allocated"] = state["reserved"] = 2**28

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    assert device_memory.step_peaks() == {"memory/peak_allocated_gib": 3.0, "memory/peak_reserved_gib": 2.5}
    assert state["resets"] == [1]
    assert device_memory.step_peaks() == {"memory/peak_allocated_gib": 0.25, "memory/peak_reserved_gib": 0.25}


def test_a_process_that_never_used_cuda_reports_nothing(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: (_ for _ in ()).throw(AssertionError("reset")))
    assert device_memory.step_peaks() == {}
