"""Host arrays to the device without waiting for the device.

A plain ``torch.from_numpy(a).to("cuda")`` copies from pageable memory and synchronizes the
stream: the host waits for every kernel queued before it. An admission queued behind a decode
window (``engine.admit_behind_window``) must not wait for that window, so its inputs go through
pinned memory with a non-blocking copy (the caching host allocator keeps the pinned block until
the copy has run). On the CPU this is the plain conversion.
"""

from __future__ import annotations

import numpy as np
import torch


def pinned(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (an array or a list) as a host tensor a copy to ``device`` need not wait for:
    in pinned memory when the device is a GPU."""
    host = torch.from_numpy(values) if isinstance(values, np.ndarray) else torch.tensor(values)
    if dtype is not None:
        host = host.to(dtype)
    return host.pin_memory() if device.type == "cuda" else host


def upload(values, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` (an array or a list) as a tensor on ``device``, queued without a host wait."""
    return pinned(values, device, dtype).to(device, non_blocking=True)
