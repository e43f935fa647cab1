"""Schema of ``distributed`` (torch-free): collective timeout, backend, gradient buckets.

Only read under ``torchrun`` (``WORLD_SIZE`` > 1); a plain run is one process and ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from searchr1.utils.schema import one_of


@dataclass
class DistributedConfig:
    """Data-parallel settings (``docs/distributed.md``)."""

    backend: str = one_of("auto", ("auto", "nccl", "gloo"))  # auto (nccl on CUDA, gloo on CPU) | nccl | gloo
    timeout_s: float = 600.0  # a collective waiting longer fails the job, naming the silent rank
    bucket_mb: float = 25.0  # gradient all-reduce bucket size (MiB of fp32)
