"""Start data parallelism from ``torchrun``'s environment; without it, one plain process.

``torchrun --nproc-per-node N -m searchr1.main …`` (multi-node: ``--nnodes``,
``--rdzv-backend c10d --rdzv-endpoint HOST:PORT``) sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``MASTER_ADDR``/``MASTER_PORT``; ``init`` joins the process group with the
configured collective timeout (NCCL on CUDA, gloo on CPU) and returns the ``DataParallel``
context. The local engine then takes this rank's GPU, ``cuda:LOCAL_RANK``, for
``engine.device=auto`` (``engines/local/model.py: resolve_device``).
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from searchr1.distributed.context import SINGLE, DataParallel
from searchr1.distributed.split import check_split
from searchr1.startup.errors import exit_with


def world_from_env(env=os.environ) -> tuple[int, int, int]:
    """(rank, world size, local rank) set by torchrun; (0, 1, 0) without it."""
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def under_torchrun(env=os.environ) -> bool:
    return int(env.get("WORLD_SIZE", 1)) > 1


def backend_for(name: str, device: str) -> str:
    """``auto`` → nccl when this rank trains on CUDA (``engine.device`` auto with a GPU, or
    cuda…), else gloo."""
    if name != "auto":
        return name
    on_cuda = torch.cuda.is_available() if device == "auto" else str(device).startswith("cuda")
    return "nccl" if on_cuda else "gloo"


def init(dist_cfg, device: str = "auto", env=os.environ) -> DataParallel:
    """Join torchrun's process group (idempotent); ``SINGLE`` without torchrun."""
    rank, world, local_rank = world_from_env(env)
    if world <= 1:
        return SINGLE
    backend = backend_for(dist_cfg.backend, device)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=dist_cfg.timeout_s),
                                rank=rank, world_size=world)
    return DataParallel(rank, world, local_rank, dist_cfg.timeout_s, dist_cfg.bucket_mb)


def shutdown() -> None:
    """Leave the process group (a clean exit of every rank)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def startup_problems(cfg, world: int) -> list[str]:
    """Distributed settings that cannot work, each one line with its fix (empty = fine)."""
    if world <= 1:
        return []
    out = []
    if cfg.engine.name != "local":
        out.append(f"engine={cfg.engine.name} under torchrun: the remote engine scales on its own "
                   f"service; launch it with plain `python -m searchr1.main` (one process).")
    mode = str(getattr(cfg.mode, "value", cfg.mode))
    if mode != "train":
        out.append(f"mode={mode} under torchrun: only mode=train runs data-parallel; run "
                   f"mode={mode} as one process.")
    split = check_split(int(cfg.trainer.questions_per_step), world)
    if split:
        out.append(split)
    if cfg.warmstart.name == "oracle_sft":
        out.append("warmstart=oracle_sft under torchrun: the supervised warm start is one-process; "
                   "make it once with `python -m searchr1.main mode=sft warmstart=oracle_sft`, then "
                   "start RL from it (warmstart=embedded or its saved adapter).")
    if int(cfg.trainer.max_staleness) != 0:
        out.append("trainer.max_staleness=1 under torchrun: overlapped rollouts are one-process "
                   "only; use trainer.max_staleness=0.")
    return out


def rank_argv(argv: list[str], env=os.environ) -> list[str]:
    """Command-line overrides for this rank: a rank other than 0 keeps Hydra's own output
    (``.hydra/``, the job log) in a private temp folder and takes rank 0's run directory
    after joining (``join``), so N processes never write one file."""
    rank, world, _ = world_from_env(env)
    if world <= 1 or rank == 0:
        return argv
    scratch = tempfile.mkdtemp(prefix=f"searchr1-rank{rank}-")
    return [a for a in argv if a.partition("=")[0].lstrip("+") != "hydra.run.dir"] + [
        f"hydra.run.dir={scratch}", "hydra.output_subdir=null"]


def multirun_problem(argv: list[str], env=os.environ) -> str | None:
    """A Hydra multirun started by torchrun: each job must be its own torchrun group."""
    if under_torchrun(env) and any(a in ("-m", "--multirun") for a in argv):
        return ("searchr1: `-m` (a sweep) under torchrun would run every job in every rank "
                "at once. Run `python -m searchr1.distributed.sweep --nproc-per-node N -- "
                "<the sweep's overrides>`, which starts each job as its own torchrun group "
                "(docs/distributed.md).")
    return None


def join(cfg, hydra_run_dir):
    """(``DataParallel``, the run directory) of this rank: rank 0 checks the distributed
    settings (exit 2 with the fix) before anyone joins; every rank then uses rank 0's
    Hydra run directory."""
    rank, world, _ = world_from_env()
    if rank == 0:
        found = startup_problems(cfg, world)
        if found:
            lines = "\n".join(f"  - {p}" for p in found)
            exit_with(f"searchr1: cannot start this {world}-process run:\n{lines}")
    dp = init(cfg.distributed, cfg.engine.device)
    return dp, Path(dp.broadcast(str(hydra_run_dir)))
