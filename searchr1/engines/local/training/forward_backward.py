"""Forward and backward passes of the local trainer over pytrio's planned batches.

Inputs are validated and chunked by pytrio's public ``plan_training_batch`` (the same datums
fail the same way on both engines) and its ``GradientAccumulationTotals`` are the loss
denominators, so processing micro-batches one by one with gradient accumulation gives exactly
the full logical batch's gradient. Micro-batches are not pytrio's chunks: ``layout="packed"``
packs all samples end to end into runs of ≤ ``max_tokens`` tokens (``packing.py``);
``layout="padded"`` right-pads each chunk (split so rows × longest ≤ ``max_tokens``). Target
log-probs come from the decoder's hidden states in chunks of ``logits_chunk`` positions
(``logprobs.py``); ``logits_chunk=None`` materialises full logits.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable, Iterator

import torch
from pytrio.client.training_batch import TrainingBatchPlan, plan_training_batch
from pytrio.errors.base import ValidationError
from pytrio.model.limits import TrainingLimits
from pytrio.types import Datum, ForwardBackwardOutput

from searchr1.engines.local.training import flops
from searchr1.engines.local.training.compiled import compiled_layers
from searchr1.engines.local.training.logprobs import causal_lm, default_chunk, packed_logprobs, padded_logprobs
from searchr1.engines.local.training.recompute import recompute_layers, recomputes
from searchr1.engines.local.training.packing import PackedBatch, pack_samples, split_by_tokens
from searchr1.engines.local.training.padded import (
    PaddedBatch,
    pad_samples,
    split_by_padded_tokens,
    target_logprobs,
)
from searchr1.engines.local.training.setup import Trainable
from searchr1.utils.tensor_data import tensor_data
from searchr1.losses.policy import POLICY_LOSSES, finalize_metrics, validate_loss_config

Batch = PaddedBatch | PackedBatch


def call_custom_loss(loss_fn: Callable, data: list[Datum], logprobs: list[torch.Tensor],
                     loss_fn_config: dict[str, object] | None):
    """``loss_fn(data, logprobs[, config])``: the config is passed only when one is given and
    the function's signature takes a third argument (pytrio's documented custom-loss contract)."""
    if loss_fn_config is not None:
        try:
            inspect.signature(loss_fn).bind(data, logprobs, loss_fn_config)
        except (TypeError, ValueError):
            return loss_fn(data, logprobs)
        return loss_fn(data, logprobs, loss_fn_config)
    return loss_fn(data, logprobs)


class Passes:
    """Forward / backward / reference passes of one ``Trainable`` (see module docstring)."""

    def __init__(self, trainable: Trainable, limits: TrainingLimits, vocab_size: int, *,
                 max_tokens: int | None, layout: str, logits_chunk: int | str | None,
                 peak_flops: float, recompute: bool | None = None, compile_layers: bool = False) -> None:
        if layout not in ("packed", "padded"):
            raise ValueError(f"layout must be packed or padded, got {layout!r}")
        if logits_chunk != "auto" and logits_chunk is not None and (
                not isinstance(logits_chunk, int) or logits_chunk < 1):
            raise ValueError(f"logits_chunk must be ≥ 1, 'auto' or None, got {logits_chunk!r}")
        self.trainable = trainable
        self.layout, self.peak_flops = layout, peak_flops
        self.limits, self.vocab_size, self.max_tokens = limits, vocab_size, max_tokens
        first = next(trainable.model.parameters())
        self.device = first.device
        self.dtype = torch.promote_types(first.dtype, torch.float32)  # loss math ≥ fp32
        if logits_chunk == "auto":  # 4096 on CUDA, a 64 MiB budget of logits on CPU
            rows = causal_lm(trainable.model).get_output_embeddings().weight.shape[0]
            logits_chunk = default_chunk(self.device, rows, self.dtype)
        self.logits_chunk: int | None = logits_chunk  # type: ignore[assignment]
        # decoder layers keep only their inputs for backward (default: on CPU, where host
        # memory is what runs out)
        self.recompute = recomputes(recompute, self.device)
        self.compile_layers = compile_layers  # torch.compile of the decoder layers (compiled.py)
        self.shape = flops.model_shape(trainable.model)

    def plan(self, data: list[Datum], loss_fn: str, auto_shift: bool) -> TrainingBatchPlan:
        return plan_training_batch(data, loss_fn=loss_fn, auto_shift=auto_shift, limits=self.limits,
                                   tokenizer_vocab_size=self.vocab_size)

    def batches(self, plan: TrainingBatchPlan, auto_shift: bool) -> Iterator[Batch]:
        """Micro-batches in datum order."""
        cap = self.max_tokens
        if self.layout == "packed":
            samples = [s for chunk in plan.chunks for s in chunk.samples]
            for part in split_by_tokens(samples, cap):
                yield pack_samples(part, auto_shift, self.device, self.dtype)
            return
        for chunk in plan.chunks:
            for part in split_by_padded_tokens(chunk.samples, cap):
                yield pad_samples(part, auto_shift, self.device, self.dtype)

    def logprobs(self, batch: Batch, auto_shift: bool, model: torch.nn.Module | None = None,
                 entropy: bool = False):
        """Target logprobs, flat: one entry per label slot of ``batch`` (0 where inactive);
        with ``entropy``, a pair whose second is the exact entropy per slot. A gradient pass
        of a sharded model (FSDP2) runs through its units; other passes read the full copy."""
        masters = self.trainable.masters
        if model is None and masters is not None and torch.is_grad_enabled():
            return masters.run(self._logprobs, batch, auto_shift, entropy)
        return self._logprobs(self.trainable.model if model is None else model, batch, auto_shift,
                              entropy)

    def lockstep(self, n_local: int) -> int:
        """Sharded model: pad this call to the ranks' largest number of gradient passes
        (``sharding/fsdp.py``); returns the idle passes to run after the real ones."""
        masters = self.trainable.masters
        return 0 if masters is None else masters.lockstep(n_local) - n_local

    def idle(self, n: int) -> None:
        if n:
            self.trainable.masters.idle(n)

    def _logprobs(self, model: torch.nn.Module, batch: Batch, auto_shift: bool, entropy: bool):
        with (self.trainable.autocast(), compiled_layers(model, self.compile_layers),
              recompute_layers(model, self.recompute, self.trainable.autocast)):
            if isinstance(batch, PackedBatch):
                chunk = self.logits_chunk or batch.labels_T.numel()
                return packed_logprobs(model, batch, self.dtype, chunk, entropy)
            if self.logits_chunk is None and not entropy:
                return target_logprobs(model, batch, auto_shift, self.dtype).flatten()
            chunk = self.logits_chunk or batch.targets_BS.numel()
            return padded_logprobs(model, batch, auto_shift, self.dtype, chunk, entropy)

    def reference(self, data: list[Datum], auto_shift: bool) -> list[torch.Tensor]:
        """Target logprobs of the KL reference (frozen copy or adapters off), CPU [L] per datum."""
        plan = self.plan(data, "cross_entropy", auto_shift)
        model = self.trainable.reference_model()
        with torch.no_grad(), self.trainable.reference_context():
            return [lp for b in self.batches(plan, auto_shift)
                    for lp in b.rows(self.logprobs(b, auto_shift, model).cpu())]

    def run(self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, object] | None,
            auto_shift: bool, backward: bool) -> ForwardBackwardOutput:
        """A built-in loss over the logical batch; gradients accumulate when ``backward``."""
        start = flops.clock(self.device)
        plan = self.plan(data, loss_fn, auto_shift)
        spec = POLICY_LOSSES.get(plan.chunks[0].loss_fn)
        scalars = validate_loss_config(plan.chunks[0].loss_fn, loss_fn_config)
        denominator = float(max(getattr(plan.totals, spec.denominator), 1))
        outputs, sums, batches = [], defaultdict(float), []
        micro = list(self.batches(plan, auto_shift))
        idle = self.lockstep(len(micro)) if backward else 0
        for batch in micro:
            with torch.set_grad_enabled(backward):
                logp_T = self.logprobs(batch, auto_shift)
                loss, chunk_sums = spec.fn(logp_T, batch.sampling_logprobs_T, batch.advantages_T,
                                           batch.weights_T, denominator, **scalars)
            if backward:
                loss.backward()
            outputs += [{"logprobs": tensor_data(lp)} for lp in batch.rows(logp_T.detach().cpu())]
            for key, value in chunk_sums.items():
                sums[key] += value
            batches.append(batch)
        self.idle(idle)
        metrics = finalize_metrics(sums)
        metrics.update(self.throughput(batches, start, backward))
        return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics)

    def custom(self, data: list[Datum], loss_fn: Callable,
               loss_fn_config: dict[str, object] | None) -> ForwardBackwardOutput:
        """The exact gradient of a user loss of per-datum logprobs, one micro-batch graph at a time.

        ∇θ L = Σ_t ∂L/∂logp_t · ∇θ logp_t: the loss sees detached leaves, its gradient with
        respect to them is then pushed through the model micro-batch by micro-batch.
        """
        start = flops.clock(self.device)
        batches = list(self.batches(self.plan(data, "cross_entropy", auto_shift=False), False))
        ent = bool(getattr(loss_fn, "wants_entropy", False))  # also pass the exact entropies
        separable = getattr(loss_fn, "separable", None)
        if separable is not None:
            return self._separable(separable, batches, ent, start)
        with torch.no_grad():
            outs = [self.logprobs(b, False, entropy=ent) for b in batches]
        logps = [lp for b, o in zip(batches, outs) for lp in b.rows(o[0] if ent else o)]
        leaves = [lp.clone().requires_grad_(True) for lp in logps]
        ent_leaves = ([h.clone().requires_grad_(True) for b, o in zip(batches, outs) for h in b.rows(o[1])]
                      if ent else [])
        if ent:
            loss, custom_metrics = loss_fn(data, leaves, entropy_D=ent_leaves)
        else:
            loss, custom_metrics = call_custom_loss(loss_fn, data, leaves, loss_fn_config)
        loss.backward()
        if any(leaf.grad is None for leaf in leaves):
            raise ValidationError(
                "Custom loss output has no gradients. Ensure loss_fn returns a tensor with gradients.",
                code="validation.missing_custom_loss_gradient",
            )
        idle = self.lockstep(len(batches))
        grads = iter(leaf.grad for leaf in leaves)
        ent_grads = iter(torch.zeros_like(h) if h.grad is None else h.grad for h in ent_leaves)
        for batch in batches:
            grad_T = batch.scatter_rows([next(grads) for _ in batch.lengths_B])  # type: ignore[misc]
            if ent:
                grad_h_T = batch.scatter_rows([next(ent_grads) for _ in batch.lengths_B])  # type: ignore[misc]
                logp_T, ent_T = self.logprobs(batch, False, entropy=True)
                (logp_T * grad_T + ent_T * grad_h_T).sum().backward()
            else:
                (self.logprobs(batch, False) * grad_T).sum().backward()
        self.idle(idle)
        token_count = float(sum(int(b.active_T.sum()) for b in batches))
        metrics = {"loss": float(loss.detach()), "token_count": token_count, **custom_metrics}
        metrics.update(self.throughput(batches, start, backward=True))
        outputs = [{"logprobs": tensor_data(lp)} for lp in logps]
        return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics)

    def _separable(self, objective, batches: list[Batch], ent: bool, start: float) -> ForwardBackwardOutput:
        """A loss that is a sum over datums (``losses.objective.SeparableObjective``): each
        micro-batch's forward keeps its graph only for its own part of the loss, whose
        backward runs at once — one gradient pass per micro-batch and no scoring pass; the
        gradient is the same as ``custom``'s."""
        idle = self.lockstep(len(batches))
        sums: dict[str, torch.Tensor] = {}
        logps: list[torch.Tensor] = []
        first = 0
        for batch in batches:
            indices = list(range(first, first + len(batch.lengths_B)))
            first += len(indices)
            with torch.enable_grad():
                out = self.logprobs(batch, False, entropy=ent)
                logp_T, ent_T = out if ent else (out, None)
                rows = batch.rows(logp_T, detach=False)
                loss, part_sums = objective.part(indices, rows, batch.rows(ent_T, detach=False) if ent else None)
            if loss.requires_grad:
                loss.backward()
            logps += [r.detach().cpu() for r in rows]
            for key, value in part_sums.items():
                sums[key] = sums[key] + value if key in sums else value
        self.idle(idle)
        token_count = float(sum(int(b.active_T.sum()) for b in batches))
        part_metrics = objective.metrics(sums)
        metrics = {"loss": part_metrics.get("loss_mean", 0.0), "token_count": token_count, **part_metrics}
        metrics.update(self.throughput(batches, start, backward=True))
        outputs = [{"logprobs": tensor_data(lp)} for lp in logps]
        return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics)

    def throughput(self, batches: list, start: float, backward: bool) -> dict[str, float]:
        lengths = [n for b in batches for n in b.lengths_B]
        seconds = flops.clock(self.device) - start
        return flops.throughput_metrics(self.shape, lengths, seconds, backward, self.device,
                                        self.peak_flops)
