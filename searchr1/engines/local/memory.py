"""Start-up GPU memory estimate of the local engine, and ``engine.kv_slots`` sized from it.

One step has three phases, each with its own resident set (bytes; N = parameters):

- rollout:  weights + optimizer moments (unless offloaded) + reference + sampler copy + KV pool
- training: weights + gradients + moments (unless offloaded) + reference + sampler copy
            + activations of one micro-batch + KV pool (unless the sampler sleeps)
- step:     weights + gradients + moments + reference + sampler copy + KV pool (unless asleep)

Weights: full = 4·N (fp32 masters), LoRA = N·b (b = bytes of the load dtype) + adapters.
Gradients and AdamW's two moments follow the trained weights. Reference: full = N·b (a frozen
copy), LoRA = 0 (adapters off). Sampler copy (slot sampler) = N·b. KV per slot =
layers · 2 · kv_heads · head_dim · (max_seq_len + 1) · b. Activations per micro-batch token
(SwiGLU decoder, flash attention, 16-bit): layers · 2·(6h + q/k/v width + 4i) bytes without
checkpointing, layers · 2h + one layer's worth with it (LoRA with ``model.lora_compute=float32``
on a 16-bit base adds 4 bytes per element of every adapted linear's input: ``lora_input_width``),
plus the chunked log-prob head
(chunk · vocab · ``HEAD_BYTES_PER_LOGIT`` = 12 bytes: fp32 logits, their softmax or gradient, and
logsumexp's own temporary; ``training/logprobs.py``). The estimate is for refusing a run
that cannot fit before step 1, not an allocator model; ``HEADROOM`` keeps 10 % back for the
allocator's fragmentation, CUDA graphs and workspaces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from searchr1.engines.local.config import Sampler
from searchr1.engines.local.sampling import slot_model
from searchr1.engines.local.training.logprobs import HEAD_BYTES_PER_LOGIT
from searchr1.engines.local.training.recompute import recomputes
from searchr1.utils.device_memory import GIB

HEADROOM = 0.90  # share of free memory the estimate may plan for


@dataclass(frozen=True)
class Arch:
    """What the estimate needs of a model: its sizes and parameter count."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, config, params: int) -> "Arch":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(params, config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                   config.num_attention_heads, config.num_key_value_heads, head_dim, config.vocab_size)


@dataclass(frozen=True)
class Plan:
    """The options that change the estimate."""

    tuning: str  # lora | full
    dtype_bytes: int  # bytes per element of the load (sampling) dtype
    lora_params: int  # adapter parameters (0 under full)
    micro_tokens: int  # tokens of one training micro-batch
    logits_chunk: int
    activation_checkpointing: bool
    offload_optimizer: bool  # engine.offload_optimizer: moments on the host between steps
    offload_in_rollout: bool  # engine.offload_optimizer_during_rollout
    sleep_between_phases: bool
    slot_sampler: bool
    max_seq_len: int
    lora_fp32_inputs: bool = False  # model.lora_compute=float32 on a 16-bit base: fp32 input copies


@dataclass(frozen=True)
class Estimate:
    """Bytes per component; ``peak(kv_slots)`` is the largest phase."""

    weights: int
    grads: int
    moments: int
    reference: int
    sampler_copy: int
    activations: int
    kv_per_slot: int
    plan: Plan
    arch: Arch | None = None  # what it was computed for (re-estimates under another plan)

    def phases(self, kv_slots: int) -> dict[str, int]:
        p, kv = self.plan, self.kv_per_slot * kv_slots
        shared = self.weights + self.reference + self.sampler_copy
        moments_train = 0 if p.offload_optimizer else self.moments
        moments_roll = 0 if (p.offload_optimizer or p.offload_in_rollout) else self.moments
        kv_train = 0 if p.sleep_between_phases else kv
        return {"rollout": shared + moments_roll + kv,
                "training": shared + self.grads + moments_train + self.activations + kv_train,
                "step": shared + self.grads + self.moments + kv_train}

    def peak(self, kv_slots: int) -> int:
        return max(self.phases(kv_slots).values())


def estimate(arch: Arch, plan: Plan) -> Estimate:
    """The per-component byte counts of the module docstring."""
    b = plan.dtype_bytes
    if plan.tuning == "full":
        weights, trained = 4 * arch.params, 4 * arch.params
        reference = arch.params * b
    else:
        weights, trained = (arch.params + plan.lora_params) * b, plan.lora_params * b
        reference = 0
    qkv = (arch.heads + 2 * arch.kv_heads) * arch.head_dim
    per_layer = 2 * (6 * arch.hidden + qkv + 4 * arch.intermediate)
    if plan.tuning != "full" and plan.lora_fp32_inputs:
        per_layer += 4 * lora_input_width(arch)
    if plan.activation_checkpointing:
        per_token = arch.layers * 2 * arch.hidden + per_layer
    else:
        per_token = arch.layers * per_layer
    logits = min(plan.logits_chunk, plan.micro_tokens) * arch.vocab * HEAD_BYTES_PER_LOGIT
    kv_per_slot = arch.layers * 2 * arch.kv_heads * arch.head_dim * (plan.max_seq_len + 1) * b
    return Estimate(
        weights=weights, grads=trained, moments=2 * trained, reference=reference,
        sampler_copy=arch.params * b if plan.slot_sampler else 0,
        activations=per_token * plan.micro_tokens + logits,
        kv_per_slot=kv_per_slot if plan.slot_sampler else 0, plan=plan, arch=arch,
    )


def lora_input_width(arch: Arch) -> int:
    """Elements per token of the inputs of one layer's adapted linears (``all-linear``: q, k, v,
    gate and up read the hidden state, o the attention output, down the MLP's): under
    ``model.lora_compute=float32`` peft casts each to fp32 and autograd keeps the copy."""
    return 5 * arch.hidden + arch.heads * arch.head_dim + arch.intermediate


def usable_bytes(free: int, total: int, fraction: float | None) -> int:
    """Bytes this process may plan for: the free memory, capped at ``fraction`` of the whole
    GPU (``engine.memory_fraction``; the allocator is capped to the same share)."""
    if fraction is None:
        return free
    if not 0 < fraction <= 1:
        raise ValueError(f"engine.memory_fraction={fraction} must be in (0, 1]")
    return min(free, int(fraction * total))


MAX_AUTO_SLOTS = 1024  # engine.kv_slots=null never sizes a larger pool
POOL_ROUND = 8  # a pool sized to the rollout is a multiple of this many slots


def pool_cap(trajectories: int) -> int:
    """The largest pool ``engine.kv_slots=null`` sizes for a rollout of ``trajectories`` (0 =
    unknown): those trajectories rounded up to a multiple of ``POOL_ROUND``. A decode step
    computes every slot of the pool, live or idle, so slots beyond the rollout's trajectories
    cost time and hold nothing a rollout needs (a trajectory's turns keep their slot,
    ``slot_table``); an evaluation with more questions queues for slots (continuous batching)."""
    if trajectories <= 0:
        return MAX_AUTO_SLOTS
    return min(MAX_AUTO_SLOTS, -(-trajectories // POOL_ROUND) * POOL_ROUND)


def auto_kv_slots(est: Estimate, free_bytes: int, cap: int = MAX_AUTO_SLOTS) -> int:
    """Most slots (≤ ``cap``) whose every phase fits in ``HEADROOM`` of ``free_bytes``; 0 if none."""
    budget = int(free_bytes * HEADROOM)
    if est.kv_per_slot == 0:
        return cap if est.peak(0) <= budget else 0
    return _largest(lambda slots: est.peak(slots) <= budget, 0, cap)


def _largest(fits, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with ``fits(n)`` for a ``fits`` true up to some n (the peak grows
    with n), by bisection; 0 when even ``lo`` does not fit."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo if fits(lo) else 0


def largest_micro_tokens(est: Estimate, kv_slots: int, free_bytes: int) -> int:
    """The largest ``trainer.max_padded_tokens_per_microbatch`` below the plan's at which every
    phase fits in ``HEADROOM`` of ``free_bytes`` (rounded down to a multiple of 128 above 128);
    0 if none does, or the estimate has no architecture to redo itself with."""
    if est.arch is None:
        return 0
    budget = int(free_bytes * HEADROOM)
    fits = lambda n: estimate(est.arch, replace(est.plan, micro_tokens=n)).peak(kv_slots) <= budget  # noqa: E731
    n = _largest(fits, 1, est.plan.micro_tokens - 1)
    return n - n % 128 if n > 128 else n


def problem(est: Estimate, kv_slots: int, free_bytes: int) -> str | None:
    """One paragraph naming what needs how much and which option to change, or None if it fits."""
    budget = int(free_bytes * HEADROOM)
    phases = est.phases(kv_slots)
    if kv_slots >= 1 and max(phases.values()) <= budget:
        return None
    worst = max(phases, key=phases.get)  # type: ignore[arg-type]
    p = est.plan
    parts = [f"weights {_gib(est.weights)}", f"gradients {_gib(est.grads)}",
             f"AdamW moments {_gib(est.moments)}", f"KL reference copy {_gib(est.reference)}",
             f"sampler weights {_gib(est.sampler_copy)}",
             f"activations of one micro-batch of {p.micro_tokens} tokens {_gib(est.activations)}",
             f"KV cache {kv_slots} slots × {_gib(est.kv_per_slot)}"]
    fixes = []
    if p.tuning == "full":
        fixes.append("model.tuning=lora")
    if p.tuning != "full" and p.lora_fp32_inputs:
        fixes.append("model.lora_compute=base")
    if not p.activation_checkpointing:
        fixes.append("engine.activation_checkpointing=true")
    if not p.offload_optimizer:
        fixes.append("engine.offload_optimizer=true")
    if not p.sleep_between_phases and p.slot_sampler:
        fixes.append("engine.sleep_between_phases=true")
    micro = largest_micro_tokens(est, kv_slots, free_bytes) if worst == "training" else 0
    fixes.append(f"trainer.max_padded_tokens_per_microbatch={micro} (the largest that fits as it is)" if micro
                 else "a smaller trainer.max_padded_tokens_per_microbatch")
    fixes.append("a larger engine.memory_fraction (if set)")
    if p.slot_sampler:
        fixes.append("fewer engine.kv_slots (null sizes them to fit)")
    return (f"searchr1: this run does not fit the GPU: its {worst} phase needs "
            f"{_gib(phases[worst])} of the {_gib(free_bytes)} available ({int(HEADROOM * 100)} % usable: "
            f"{_gib(budget)}) — {', '.join(parts)}. Try {', '.join(fixes)}.")


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


CPU_KV_SLOTS = 160  # kv_slots=null without a GPU to measure (the slot sampler is CUDA's)


def estimate_for(model, model_cfg, engine_cfg, micro_tokens: int, logits_chunk: int) -> Estimate:
    """The estimate of a loaded HF ``model`` under the run's config slices; ``micro_tokens``:
    ``trainer.max_padded_tokens_per_microbatch``."""
    params = sum(p.numel() for p in model.parameters())
    element = next(model.parameters()).element_size()
    lora = 0
    if model_cfg.tuning != "full":
        heads = {id(m) for m in (model.get_output_embeddings(),)}
        lora = sum(model_cfg.lora_rank * (m.in_features + m.out_features) for m in model.modules()
                   if isinstance(m, torch.nn.Linear) and id(m) not in heads)
    slots = slot_model.supports(model) and engine_cfg.sampler in (Sampler.slots, Sampler.auto)
    plan = Plan(
        tuning=model_cfg.tuning, dtype_bytes=element, lora_params=lora,
        micro_tokens=int(micro_tokens), logits_chunk=logits_chunk,
        activation_checkpointing=recomputes(engine_cfg.activation_checkpointing, next(model.parameters()).device),
        offload_optimizer=engine_cfg.offload_optimizer,
        offload_in_rollout=engine_cfg.offload_optimizer_during_rollout,
        sleep_between_phases=engine_cfg.sleep_between_phases, slot_sampler=slots,
        max_seq_len=engine_cfg.max_seq_len,
        lora_fp32_inputs=(model_cfg.tuning != "full" and element < 4
                          and getattr(model_cfg, "lora_compute", "base") == "float32"),
    )
    return estimate(Arch.of(model.config, params), plan)
