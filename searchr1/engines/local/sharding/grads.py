"""Bucketed all-reduce of the trained parameters' gradients (the LoRA adapters, a critic).

Every rank's loss is already its share of the *global* loss (normalised by global token /
datum counts, ``docs/distributed.md``), so the global gradient is the plain **sum** of the
ranks' gradients — no division by the world size. Gradients are flattened into fp32 buckets
of ≤ ``bucket_mb`` MiB (few large messages instead of one per adapter matrix), reduced, and
copied back. A parameter without a gradient on this rank (an empty mini-batch share) takes
part as zeros and gets the reduced gradient, so every rank's optimizer steps every
parameter alike and the replicas stay identical.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def buckets(params: list[torch.nn.Parameter], bucket_mb: float) -> list[list[torch.nn.Parameter]]:
    """Consecutive parameters grouped so a bucket holds ≤ ``bucket_mb`` MiB of fp32 (≥ 1 each)."""
    limit = max(int(bucket_mb * 2**20 / 4), 1)
    out: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        if not out or size + p.numel() > limit:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel()
    return out


def all_reduce_grads(params: list[torch.nn.Parameter], bucket_mb: float = 25.0, group=None) -> None:
    """Sum ``p.grad`` over ranks in place (see module docstring); a no-op on one process."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    for bucket in buckets(params, bucket_mb):
        dev = bucket[0].device
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          .to(device=dev, dtype=torch.float32) for p in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        start = 0
        for p in bucket:
            part = flat[start:start + p.numel()].view_as(p).to(p.dtype)
            start += p.numel()
            if p.grad is None:
                p.grad = part.clone()
            else:
                p.grad.copy_(part)


def synced(dp):
    """The gradient all-reduce over ``dp``'s ranks for AdamW's ``grad_sync`` (a lost peer raises
    ``dp``'s named error), or None for one process. ``dp``: the job's data-parallel context."""
    if dp is None or not dp.active:
        return None

    def sync(params) -> None:
        with dp.guard("gradient all-reduce"):
            all_reduce_grads(list(params), dp.bucket_mb)

    return sync
