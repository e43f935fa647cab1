"""GPU memory per RL step, as metrics: what the caching allocator held at its peak.

``step_peaks()`` returns ``memory/peak_allocated_gib`` (the most bytes live tensors held) and
``memory/peak_reserved_gib`` (the most the allocator had taken from the driver: live tensors,
its cached free blocks and their fragmentation) since the previous call, then starts the next
window. A step's window covers its training phase and the rollout that overlaps it. These are
the numbers to size ``engine.memory_fraction`` by when several runs share one GPU, and to hold
the start-up estimate (``engines/local/memory.py``) against. In a process that has not used
CUDA (a CPU run, or a run whose engine is remote) it returns nothing.
"""

from __future__ import annotations

import torch

GIB = 1024 ** 3


def step_peaks() -> dict[str, float]:
    """The peaks since the last call on this process's current CUDA device, then reset."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    device = torch.cuda.current_device()
    peaks = {"memory/peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
             "memory/peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB}
    torch.cuda.reset_peak_memory_stats(device)
    return peaks
