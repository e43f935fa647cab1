"""Model FLOPs of a LoRA or full forward/backward, for tokens/s and MFU (model FLOPs utilisation).

For a micro-batch of samples with lengths Lᵢ (T = Σ Lᵢ tokens):

    F_fwd  = 2·(N_base + N_lora)·T + A                 forward
    F_bwd  = 2·(N_base + N_lora)·T + 2·A + 2·N_lora·T  backward
    A      = Σᵢ 2·Lᵢ²·d_attn·n_layers                  causal attention (QKᵀ and PV, half the pairs)

N_base counts the weights of every frozen linear layer the tokens pass through, lm_head
included (a tied head still costs a matmul); embeddings are a lookup and cost nothing.
N_lora counts the adapters. The backward of a frozen linear only propagates the
activation gradient (one matmul of the forward's size); only the adapters also get a
weight gradient (the 2·N_lora·T term). Attention's backward has two matmuls per forward
matmul (both operands are activations), hence 2·A. So the usual 6·N·T, which charges a
weight gradient to every parameter, overstates a LoRA step by about 1.5×. Under full fine-tuning every linear weight gets its
weight gradient too (+2·N_base·T), which gives back the usual 6·N·T (plus attention).

Recomputation is not counted (model FLOPs, not hardware FLOPs): the chunked log-probs
recompute each chunk's logits in backward, which this formula does not charge.
MFU = FLOPs / (seconds × peak). The peak is a parameter: H200 bf16 dense is ≈ 989e12
on the datasheet, ≈ 790e12 measured on a large matmul.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

H200_BF16_PEAK = 989e12


@dataclass(frozen=True)
class Card:
    """A GPU's datasheet bounds: memory bandwidth and dense bf16 throughput."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops: float


#: datasheet figures (SXM parts); a card not listed gets the H200's, named as a guess
CARDS = {"H200": Card("H200", 4.8e12, 989e12), "H100": Card("H100", 3.35e12, 989e12),
         "A100": Card("A100", 2.0e12, 312e12)}


def card(device_name: str | None = None) -> Card:
    """The bounds of the card named ``device_name`` (this process's CUDA device when None)."""
    if device_name is None:
        device_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    for key, found in CARDS.items():
        if key in device_name.upper():
            return Card(device_name, found.hbm_bytes_per_s, found.bf16_flops)
    guess = CARDS["H200"]
    return Card(f"{device_name} (unknown: H200 bounds assumed)", guess.hbm_bytes_per_s, guess.bf16_flops)


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs to know about a model."""

    base_linear_params: int  # frozen linear weights, lm_head included
    lora_params: int  # trainable adapter weights
    attention_width: int  # n_heads × head_dim
    layers: int
    full: bool = False  # full fine-tuning: the base linears are trained (weight gradients)


def matmul_weights(model: torch.nn.Module) -> int:
    """Parameters used in matmuls per token: all, less the input embedding when it is not tied to
    the LM head (a lookup). 2 FLOPs each per decoded or scored token."""
    total = sum(p.numel() for p in model.parameters())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return total if tied else total - model.get_input_embeddings().weight.numel()


def model_shape(model: torch.nn.Module) -> ModelShape:
    """Count base linear weights (a tied head once) and LoRA adapter weights of a causal LM."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    base: dict[int, int] = {}
    for name, module in lm.named_modules():
        if isinstance(module, torch.nn.Linear) and "lora_" not in name:
            base[id(module.weight)] = module.weight.numel()
    lora = sum(p.numel() for name, p in lm.named_parameters() if "lora_" in name)
    cfg = lm.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    full = lora == 0 and any(m.weight.requires_grad for m in lm.modules() if isinstance(m, torch.nn.Linear))
    return ModelShape(sum(base.values()), lora, cfg.num_attention_heads * head_dim,
                      cfg.num_hidden_layers, full)


def attention_flops(shape: ModelShape, lengths: Sequence[int]) -> float:
    """Forward FLOPs of causal attention over samples of the given lengths."""
    return float(sum(2 * n * n for n in lengths)) * shape.attention_width * shape.layers


def step_flops(shape: ModelShape, lengths: Sequence[int], backward: bool) -> float:
    """Model FLOPs of a forward (and backward) over samples of the given lengths."""
    tokens = float(sum(lengths))
    attn = attention_flops(shape, lengths)
    forward = 2.0 * (shape.base_linear_params + shape.lora_params) * tokens + attn
    if not backward:
        return forward
    weight_grads = shape.lora_params + (shape.base_linear_params if shape.full else 0)
    return 2.0 * forward + attn + 2.0 * weight_grads * tokens


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Fraction of ``peak_flops`` achieved; ``peak_flops`` must be positive."""
    if peak_flops <= 0 or seconds <= 0:
        raise ValueError(f"peak_flops and seconds must be positive, got {peak_flops}, {seconds}")
    return flops / (seconds * peak_flops)


def clock(device: torch.device) -> float:
    """Wall clock once ``device``'s queued work is done (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def throughput_metrics(
    shape: ModelShape, lengths: Sequence[int], seconds: float, backward: bool,
    device: torch.device, peak_flops: float,
) -> dict[str, float]:
    """``tokens_per_second`` always; ``mfu`` on CUDA only (the peak is a GPU's)."""
    out = {"tokens_per_second": sum(lengths) / seconds}
    if device.type == "cuda":
        out["mfu"] = mfu(step_flops(shape, lengths, backward), seconds, peak_flops)
    return out
