"""Full fine-tuning under torchrun: FSDP2 (``fully_shard``) holds the sharded training state.

``ShardedMasters`` keeps two views of the trained weights on each rank:

- ``sharded``: a copy of the model with ``fully_shard`` applied per decoder layer and at the
  root, on a 1-D device mesh over the whole job. Its parameters are ``DTensor`` shards
  (``Shard(0)``) of the fp32 master weights; AdamW steps on them, so its moments are
  sharded too, and ``torch.distributed.checkpoint`` saves and loads them (``dcp.py``).
- ``compute``: the rank's full model, the one every forward, backward, reference-free
  sampling pass and eval reads. After each optimizer step it is rebuilt from the shards
  (``DTensor.full_tensor``, an all-gather), so each rank samples with the updated weights.

Why the passes run on the gathered copy and not through the FSDP module's own hooks: those
hooks make every forward and backward of a decoder layer a collective (all-gather before,
reduce-scatter after), so every rank would have to run the same number of passes in the same
order. Here they do not: each rank packs its own datums into its own micro-batches, a rank
whose share of a mini-batch is empty runs no pass at all, the old/reference log-prob passes
score only the rank's own datums, and sampling (which runs the same model) is per rank. The
collectives are therefore placed where every rank is in step: the optimizer step.

``reduce_grads`` (called by AdamW before clipping) turns each full gradient into its shard:
a ``Partial("sum")`` DTensor redistributed to the parameter's placement — a reduce-scatter
that **sums** (every rank's loss is already its share of the global loss, normalised by the
global totals of ``loop/update.py``; FSDP's own backward reduce-scatter averages by default,
``set_reduce_scatter_divide_factor(1.0)`` would make it a sum on the hook path, unused here). A parameter without a
gradient on this rank (an empty share) takes part as zeros. ``clip_grad_norm_`` over the
sharded gradients is then the global norm (it all-reduces the shards' norms).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers (``fully_shard`` units), outermost first."""
    from searchr1.engines.local.training.recompute import decoder_layers as found

    return found(model)


class ShardedMasters:
    """FSDP2 shards of ``compute``'s weights, with the gradient and weight collectives."""

    def __init__(self, compute: torch.nn.Module, device: torch.device | str = "cpu") -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedMasters needs a joined process group (torchrun)")
        device = torch.device(device)
        self.compute = compute
        self.mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        self.sharded = copy.deepcopy(compute)
        for layer in decoder_layers(self.sharded):
            fully_shard(layer, mesh=self.mesh)
        fully_shard(self.sharded, mesh=self.mesh)
        full = dict(compute.named_parameters())
        shards = dict(self.sharded.named_parameters())
        if full.keys() != shards.keys():
            raise RuntimeError("fully_shard changed the parameter names: "
                               f"{sorted(set(full) ^ set(shards))[:3]}")
        self.names = [n for n, p in full.items() if p.requires_grad]
        self.pairs = [(full[n], shards[n]) for n in self.names]

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The sharded master parameters (what the optimizer steps)."""
        return [s for _, s in self.pairs]

    def reduce_grads(self, _params=None) -> None:
        """Sum every rank's full gradient into this rank's shard of it; clear the full ones."""
        for full, shard in self.pairs:
            grad = full.grad if full.grad is not None else torch.zeros_like(full)
            partial = DTensor.from_local(grad.to(shard.dtype), self.mesh, [Partial("sum")],
                                         run_check=False)
            shard.grad = partial.redistribute(self.mesh, shard.placements)
            full.grad = None

    @torch.no_grad()
    def gather(self) -> None:
        """Rebuild the full weights from the shards (an all-gather per parameter)."""
        for full, shard in self.pairs:
            full.copy_(shard.full_tensor().to(full.dtype))

    def local_bytes(self) -> int:
        """Bytes of this rank's master shards."""
        return sum(s.to_local().numel() * s.element_size() for s in self.params)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t`` (``t`` itself unless a DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A replicated or sharded DTensor as a plain tensor (``t`` itself otherwise)."""
    return t.full_tensor() if isinstance(t, DTensor) else t
