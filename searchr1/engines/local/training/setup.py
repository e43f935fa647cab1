"""Building the trained model: LoRA adapters or every weight (``model.tuning``), and its reference.

``build_trainable`` is the one place a trained model is constructed, so a data-parallel
wrapper (DDP / FSDP2) can hook it. Under ``lora`` the base weights stay frozen and the KL
reference is the same model with the adapters switched off (no copy) until ``freeze_reference``
(after a warm start) copies the adapters into a frozen second adapter (``reference.py``);
under ``full`` every parameter is trained and the reference is a frozen copy of the weights.

Precision under ``full`` (docs/full_finetuning.md): the trained weights are kept in fp32
(master weights; AdamW's moments and the gradients follow them) and the forward runs under
bf16 autocast on CUDA — at the paper's learning rate (1e-6) a bf16 weight would swallow
most updates, since bf16 resolves only 2⁻⁸ relative steps. On CPU everything is fp32.

Precision under ``lora`` (``model.lora_compute``): the adapters are fp32 parameters either
way. ``float32`` is peft's default: every adapted layer casts its activations to fp32, runs
the two small matmuls there and casts back (a third of the train phase's device time went
to those casts). ``base`` runs them under autocast in the base model's dtype instead, with
peft's input cast switched off; gradients still accumulate into the fp32 parameters.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedModel

from searchr1.engines.local.config import LoraCompute, Tuning
from searchr1.engines.local.sharding.fsdp import ShardedMasters
from searchr1.engines.local.training import reference as lora_reference
from searchr1.utils.schema import member


@dataclass
class Trainable:
    """A model to train, its trained parameters and how to reach the KL reference."""

    model: torch.nn.Module
    tuning: Tuning
    reference: torch.nn.Module | None = None  # full: the frozen copy; lora: None (same model)
    compute_dtype: torch.dtype | None = None  # autocast dtype of the forward (None = params')
    masters: object | None = None  # full under torchrun: FSDP2 shards (sharding/fsdp.py)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def reference_model(self) -> torch.nn.Module:
        return self.model if self.reference is None else self.reference

    def reference_context(self):
        """Context in which ``reference_model()`` computes the reference policy: under LoRA the
        frozen reference adapter when there is one, else the adapters switched off."""
        if self.reference is not None:
            return contextlib.nullcontext()
        if lora_reference.has(self.model):
            return lora_reference.active(self.model)
        return self.model.disable_adapter()

    @torch.no_grad()
    def freeze_reference(self) -> None:
        """Make the KL reference the weights as they are now (the policy RL starts from)."""
        if self.reference is None:
            lora_reference.freeze(self.model)
            return
        for ref, live in zip(self.reference.parameters(), self.model.parameters(), strict=True):
            ref.copy_(live)

    def autocast(self):
        """Autocast to ``compute_dtype`` around the training forwards (full: fp32 masters on
        CUDA; lora_compute=base: the adapters, with peft's input cast off); else nothing."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        device = next(self.model.parameters()).device
        stack.enter_context(torch.autocast(device.type, dtype=self.compute_dtype))
        if self.tuning is Tuning.lora:
            from peft.helpers import disable_input_dtype_casting

            stack.enter_context(disable_input_dtype_casting(self.model))
        return stack


def build_trainable(
    base_model: PreTrainedModel, tuning: Tuning | str, *, rank: int, alpha: float, seed: int,
    device: str | torch.device = "cpu", shard: bool = False, lora_compute: LoraCompute | str = "base",
) -> Trainable:
    """Move ``base_model`` to ``device`` and make it trainable (in place) as ``tuning`` says.

    Activation checkpointing is not set here: transformers' switch acts in training mode only
    and the trainer keeps its model in eval mode, so ``training/recompute.py`` does it.

    ``shard`` (full under torchrun): the fp32 masters and their optimizer state are FSDP2
    shards over the job (``sharding/fsdp.py``); ``model`` stays the rank's full copy.
    """
    tuning = member(Tuning, tuning, "model.tuning")  # a member already when it came from the config
    lora_compute = member(LoraCompute, lora_compute, "model.lora_compute")
    device = torch.device(device)
    base_model.to(device)
    if tuning is Tuning.lora:
        base_dtype = next(base_model.parameters()).dtype
        low = base_dtype in (torch.bfloat16, torch.float16) and lora_compute is LoraCompute.base
        return Trainable(_with_lora(base_model, rank, alpha, seed, device), Tuning.lora,
                         compute_dtype=base_dtype if low else None)
    trainable = _full(base_model)
    if shard:
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
        return peft_model(base_model, lora)


def peft_model(base_model: PreTrainedModel, lora: LoraConfig):
    """``get_peft_model``, without the ``FutureWarning`` transformers raises when peft reads its
    deprecated ``is_gradient_checkpointing`` (peft's business; every run's log carried it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
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
    return Trainable(model, Tuning.full, reference=reference, compute_dtype=compute)
