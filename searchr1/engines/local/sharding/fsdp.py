"""Full fine-tuning under torchrun: the trained model sharded with FSDP2 (``fully_shard``).

``ShardedMasters`` keeps two copies of the weights on each rank:

- ``root``: the trained model with ``fully_shard`` applied per decoder layer and at a root
  unit (``_PassRoot``, which holds the embeddings, the final norm and the head), on a 1-D
  device mesh over the job. Its parameters are ``DTensor`` shards (``Shard(0)``) of the fp32
  master weights; AdamW steps on them, so its moments are sharded too, and
  ``torch.distributed.checkpoint`` saves and loads them (``dcp.py``). Every pass that needs a
  gradient runs through it (``run``): FSDP2 all-gathers a unit's weights for its forward and
  backward and reduce-scatters its gradients after, freeing the full tensors in between.
- ``full``: the rank's full copy, which every pass without a gradient (the policy's old
  log-probs, the custom loss's first pass), the sampler and eval read (the KL reference is
  its own frozen full copy). After
  each optimizer step it is rebuilt from the shards (``DTensor.full_tensor``, an all-gather).

Gradient reduction is a **sum**: every rank's loss is already its share of the global loss
(normalised by the global totals of ``loop/update.py``), while FSDP2 averages by default;
``set_gradient_divide_factor(1.0)`` with ``set_force_sum_reduction_for_comms(True)`` makes
every unit's reduce-scatter a plain SUM (the factor alone would select NCCL's PREMUL_SUM). ``clip_grad_norm_`` over
the sharded gradients is the global norm (it all-reduces the shards' norms).

Lockstep: a unit's all-gather and reduce-scatter are collectives, so every rank must run the
same number of gradient passes. ``lockstep(n)`` (before a call's passes) takes the largest
count over the ranks, and a rank with fewer runs ``idle`` passes: a one-token forward through
every unit whose loss is multiplied by zero, so its backward reduce-scatters zeros. A rank
whose share of a mini-batch is empty calls ``lockstep(0)`` (the client's
``forward_backward_idle``).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from searchr1.engines.local.training.logprobs import causal_lm, output_weight
from searchr1.engines.local.training.recompute import decoder_layers


class _PassRoot(torch.nn.Module):
    """FSDP2's root unit: a call runs one pass ``fn(lm, *args)`` of the sharded model, so the
    root's weights (embeddings, norm, head) are gathered for it and reduced after its backward."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, fn, *args, **kwargs):
        return fn(self.lm, *args, **kwargs)


def _idle_pass(lm: torch.nn.Module) -> torch.Tensor:
    """A zero loss that still runs every unit: one token through the decoder and the head."""
    lm = causal_lm(lm)
    device = output_weight(lm).device
    hidden = lm.get_decoder()(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device),
                              use_cache=False).last_hidden_state
    return (hidden[0, 0] @ output_weight(lm).T).sum() * 0.0


class ShardedMasters:
    """FSDP2 shards of the trained weights, the full copy, and the lockstep of their passes."""

    def __init__(self, full: torch.nn.Module, device: torch.device | str = "cpu") -> None:
        if not dist.is_initialized():
            raise RuntimeError("ShardedMasters needs a joined process group (torchrun)")
        device = torch.device(device)
        self.full = full
        self.device = device
        self.mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        self.root = _PassRoot(copy.deepcopy(full))
        units = [*decoder_layers(self.root), self.root]  # outermost decoder layers first
        for unit in units:
            fully_shard(unit, mesh=self.mesh)
        for unit in units:  # sum, never average (module docstring)
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        whole = dict(full.named_parameters())
        shards = {n.removeprefix("lm."): p for n, p in self.root.named_parameters()}
        if whole.keys() != shards.keys():
            raise RuntimeError("fully_shard changed the parameter names: "
                               f"{sorted(set(whole) ^ set(shards))[:3]}")
        self.names = [n for n, p in whole.items() if p.requires_grad]
        self.pairs = [(whole[n], shards[n]) for n in self.names]
        self.sharded = self.root  # what get_state_dict / set_state_dict see
        self.idle_passes = 0  # run so far (the lockstep's padding)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The sharded master parameters (what the optimizer steps)."""
        return [s for _, s in self.pairs]

    def run(self, fn, *args, **kwargs):
        """One gradient pass ``fn(sharded lm, *args)`` through FSDP2's units."""
        return self.root(fn, *args, **kwargs)

    def lockstep(self, n_local: int) -> int:
        """The largest pass count of this call over the ranks (one all-reduce)."""
        t = torch.tensor([n_local], dtype=torch.int64,
                         device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def idle(self, n: int) -> None:
        """``n`` passes that run every unit with a zero loss (module docstring)."""
        for _ in range(n):
            self.run(_idle_pass).backward()
        self.idle_passes += n

    @torch.no_grad()
    def gather(self) -> None:
        """Rebuild the full weights from the shards (an all-gather per parameter)."""
        for whole, shard in self.pairs:
            whole.copy_(shard.full_tensor().to(whole.dtype))
