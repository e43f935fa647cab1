"""Sharded training state of full fine-tuning under torchrun, with ``torch.distributed.checkpoint``.

A state folder holds DCP's files (``.metadata`` from the coordinator, one ``__<rank>_0.distcp``
per rank with its shards of the fp32 masters and of AdamW's moments, as
``get_state_dict(sharded model, optimizer)`` names them) and one ``rank_<r>.pt`` per rank
(step count, world size, that rank's torch RNG states). It is written crash-safely like every
local checkpoint (``engines/local/training/checkpoint.py: write_atomically``): rank 0 makes
the temp sibling ``.<name>.*`` and broadcasts its path, every rank writes its part into it,
and after a barrier rank 0 syncs and renames it into place; a second barrier keeps every
rank behind the rename (none runs past a checkpoint it could not resume from). A kill
before the rename leaves the previous state folder, and the temp one is an orphan that
``loop/checkpoint.py: clean_orphans`` removes on resume (test hook ``shard_mid_write``: a rank
killed with its DCP shard written, its rank file not yet).

Resume needs the same number of processes (each rank reads its own RNG file; DCP itself could
re-shard the tensors onto another N, but the data split and the RNG streams would differ);
the loop records that number in ``trainer_state.json`` and refuses another before the model
loads (``loop/checkpoint.py: resolve_resume``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from searchr1.engines.local.training.checkpoint import (restore_rng_state, rng_state, step_of,
                                                       write_atomically)
from searchr1.utils.faults import crash_point


def rank_file(rank: int) -> str:
    return f"rank_{rank}.pt"


def save(dp, masters, optimizer: torch.optim.Optimizer, final_dir: Path, step: int,
         overwrite: bool) -> int:
    """Every rank: write the sharded state into ``final_dir`` (atomically); its size in bytes."""

    def write(tmp: Path | None) -> None:
        tmp = Path(dp.broadcast(None if tmp is None else str(tmp)))
        model_sd, optim_sd = get_state_dict(masters.sharded, optimizer)
        with dp.guard("sharded checkpoint save"):
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        crash_point("shard_mid_write", step_of(Path(final_dir).name))  # test hook: shards written
        torch.save({"step": step, "world": dp.world, "rng": rng_state()}, tmp / rank_file(dp.rank))
        dp.barrier()  # every rank's files are in the temp folder

    if dp.is_rank0:
        size = write_atomically(Path(final_dir), overwrite, write)
    else:
        write(None)
        size = 0
    dp.barrier()  # the folder is in place
    return int(dp.broadcast(size))


def _rank_state(dp, directory: Path) -> dict:
    path = Path(directory) / rank_file(dp.rank)
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no sharded state of rank {dp.rank} "
                                f"({rank_file(dp.rank)}); was it saved by a {dp.world}-process run?")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if int(state["world"]) != dp.world:
        raise ValueError(f"{directory} was saved by {state['world']} processes, this job has "
                         f"{dp.world}: resume with --nproc-per-node {state['world']}")
    return state


def load(dp, masters, optimizer: torch.optim.Optimizer | None, directory: Path) -> int:
    """Every rank: load the masters (and the optimizer's state when given) from ``directory``,
    rebuild the full weights, restore this rank's RNG states; returns the saved step count."""
    directory = Path(directory)
    extra = _rank_state(dp, directory)
    if optimizer is None:
        model_sd, _ = get_state_dict(masters.sharded, [])
        with dp.guard("sharded checkpoint load"):
            dcp.load({"model": model_sd}, checkpoint_id=str(directory))
        set_model_state_dict(masters.sharded, model_sd, options=StateDictOptions(strict=True))
    else:
        model_sd, optim_sd = get_state_dict(masters.sharded, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        with dp.guard("sharded checkpoint load"):
            dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(masters.sharded, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        restore_rng_state(extra["rng"])
    with dp.guard("weight all-gather"):
        masters.gather()
    return int(extra["step"])
