"""Building the trained model: LoRA adapters or every weight (``model.tuning``), and its reference.

``build_trainable`` is the one place a trained model is constructed, so a data-parallel
wrapper (DDP / FSDP2) can hook it. Under ``lora`` the base weights stay frozen and the KL
reference is the same model with the adapters switched off (no copy); under ``full`` every
parameter is trained and the reference is a frozen copy of the initial weights.

Precision under ``full`` (docs/full_finetuning.md): the trained weights are kept in fp32
(master weights; AdamW's moments and the gradients follow them) and the forward runs under
bf16 autocast on CUDA — at the paper's learning rate (1e-6) a bf16 weight would swallow
most updates, since bf16 resolves only 2⁻⁸ relative steps. On CPU everything is fp32.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedModel

TUNINGS = ("lora", "full")


@dataclass
class Trainable:
    """A model to train, its trained parameters and how to reach the KL reference."""

    model: torch.nn.Module
    tuning: str
    reference: torch.nn.Module | None = None  # full: the frozen copy; lora: None (adapters off)
    compute_dtype: torch.dtype | None = None  # autocast dtype of the forward (None = params')
    masters: object | None = None  # full under torchrun: FSDP2 shards (distributed/fsdp.py)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def reference_model(self) -> torch.nn.Module:
        return self.model if self.reference is None else self.reference

    def reference_context(self):
        """Context in which ``reference_model()`` computes the reference policy."""
        if self.reference is None:
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    def autocast(self):
        """bf16 autocast around forwards of fp32 master weights on CUDA; else nothing."""
        device = next(self.model.parameters()).device
        if self.compute_dtype is None or device.type != "cuda":
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=self.compute_dtype)


def build_trainable(
    base_model: PreTrainedModel, tuning: str, *, rank: int, alpha: float, seed: int,
    device: str | torch.device = "cpu", shard: bool = False,
) -> Trainable:
    """Move ``base_model`` to ``device`` and make it trainable (in place) as ``tuning`` says.

    Activation checkpointing is not set here: transformers' switch acts in training mode only
    and the trainer keeps its model in eval mode, so ``training/recompute.py`` does it.

    ``shard`` (full under torchrun): the fp32 masters and their optimizer state are FSDP2
    shards over the job (``distributed/fsdp.py``); ``model`` stays the rank's full copy.
    """
    if tuning not in TUNINGS:
        raise ValueError(f"model.tuning={tuning!r}; valid: {', '.join(TUNINGS)}")
    device = torch.device(device)
    base_model.to(device)
    if tuning == "lora":
        return Trainable(_with_lora(base_model, rank, alpha, seed, device), "lora")
    trainable = _full(base_model)
    if shard:
        from searchr1.distributed.fsdp import ShardedMasters

        trainable.masters = ShardedMasters(trainable.model, device)
    return trainable


def _with_lora(base_model: PreTrainedModel, rank: int, alpha: float, seed: int, device: torch.device):
    """LoRA on all linear layers; the init draws from a forked RNG seeded with ``seed``."""
    lora = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        return get_peft_model(base_model, lora)


def _full(model: PreTrainedModel) -> Trainable:
    """Every weight trained in fp32; the reference a frozen copy in the sampling dtype."""
    sample_dtype = next(model.parameters()).dtype
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    compute = None
    if sample_dtype in (torch.bfloat16, torch.float16):  # fp32 masters, compute in the load dtype
        model.float()
        compute = sample_dtype
    model.requires_grad_(True)
    model.searchr1_sample_dtype = sample_dtype  # the slot sampler's buffers keep the load dtype
    return Trainable(model, "full", reference=reference, compute_dtype=compute)
