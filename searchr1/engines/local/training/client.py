"""The local engine's training client: pytrio's ``TrainingClient`` surface, in-process.

A peft LoRA model (adapters on every linear layer of the base model) is trained with
torch. Each call mirrors pytrio 0.2.9: inputs are validated and chunked by pytrio's own
``plan_training_batch`` (so the same datums fail the same way on both engines), and its
``GradientAccumulationTotals`` are the loss denominators, so processing the chunks one by
one with gradient accumulation gives exactly the full logical batch's gradient. Gradients
accumulate across calls until ``optim_step`` (AdamW), as on pytrio.

Departures from the remote engine, all deliberate:
- work runs eagerly in the caller's thread; futures come back already resolved;
- ``forward_backward_custom`` backpropagates the user's loss exactly (Tinker's semantics);
  pytrio's remote path re-expresses it as a cross_entropy surrogate whose normalisation
  by total_active_tokens is undocumented;
- ``save_weights_and_get_sampling_client`` returns a client over the *live* model (no copy
  per step); ``create_sampling_client(path)`` loads a checkpoint into a separate copy;
- the reference policy is the same model with adapters off (``compute_reference_logprobs``);
- micro-batches are not pytrio's chunks: with ``layout="packed"`` (default) all samples of
  the call are packed end to end into runs of ≤ ``max_batch_tokens`` tokens (no padding,
  ``packing.py``); ``layout="padded"`` right-pads each pytrio chunk (split further so rows
  × longest ≤ ``max_batch_tokens``). Target log-probs come from the decoder's hidden
  states in chunks of ``logits_chunk`` positions (``logprobs.py``); ``logits_chunk=None``
  materialises full logits (the old path, kept as the benchmark's reference). None of this
  changes a number beyond float rounding: the denominators are the logical call's totals.

``forward_backward`` metrics add ``tokens_per_second`` (the call's tokens over its wall
time) and, on CUDA, ``mfu`` (model FLOPs utilisation against ``peak_flops``; the FLOP
count is in ``flops.py``). ``weights_version`` counts changes of the adapter weights
(optimizer steps and loads) so a sampler holding its own merged copy knows when to refold.
"""

from __future__ import annotations

import copy
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from pytrio.types import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    OptimStepResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
    TensorData,
)
from pytrio.client.builders.training import build_trainer_save_payload
from pytrio.client.training import CustomLossFn, _invoke_custom_loss
from pytrio.client.training_batch import TrainingBatchPlan, plan_training_batch
from pytrio.errors.base import ValidationError
from pytrio.model.limits import TrainingLimits
from transformers import PreTrainedModel

from searchr1.engines.local.training import checkpoint as ckpt
from searchr1.engines.local.training import flops
from searchr1.engines.local.training.padded import (
    PaddedBatch,
    pad_samples,
    split_by_padded_tokens,
    target_logprobs,
)
from searchr1.engines.local.futures import AsyncTwins, LocalFuture, completed
from searchr1.engines.local.training.logprobs import DEFAULT_CHUNK, packed_logprobs, padded_logprobs
from searchr1.engines.local.training.packing import PackedBatch, pack_samples, split_by_tokens
from searchr1.losses.policy import POLICY_LOSSES, finalize_metrics, validate_loss_config


def create_lora_training_client(
    base_model: PreTrainedModel,
    tokenizer: object,
    rank: int,
    alpha: float,
    seed: int,
    device: str | torch.device = "cpu",
    **client_kwargs: object,
) -> LocalTrainingClient:
    """Wrap ``base_model`` (in place) with LoRA on all linear layers and return a client.

    The adapters' random init draws from a forked RNG seeded with ``seed``: the same seed
    gives the same adapters, and the caller's global RNG is left untouched. lm_head is not
    adapted (peft's "all-linear" excludes the output layer). ``client_kwargs`` go to
    ``LocalTrainingClient``.
    """
    device = torch.device(device)
    base_model.to(device)
    lora = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    forked = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        model = get_peft_model(base_model, lora)
    return LocalTrainingClient(model, tokenizer, **client_kwargs)  # type: ignore[arg-type]


class LocalTrainingClient(AsyncTwins):
    """pytrio ``TrainingClient`` over an in-process peft LoRA model (see module docstring)."""

    def __init__(
        self,
        model: PeftModel,
        tokenizer: object,
        *,
        model_name: str = "local",
        checkpoint_dir: str | Path | None = None,
        max_batch_datums: int | None = 32,
        max_batch_tokens: int | None = 64_000,
        max_seq_len: int | None = None,
        engine_cfg: object | None = None,
        layout: str = "packed",
        logits_chunk: int | None = DEFAULT_CHUNK,
        peak_flops: float = flops.H200_BF16_PEAK,
    ) -> None:
        if layout not in ("packed", "padded"):
            raise ValueError(f"layout must be packed or padded, got {layout!r}")
        if logits_chunk is not None and logits_chunk < 1:
            raise ValueError(f"logits_chunk must be ≥ 1 or None, got {logits_chunk}")
        self.layout, self.logits_chunk, self.peak_flops = layout, logits_chunk, peak_flops
        self.weights_version = 0  # +1 whenever the adapter weights change
        self.model = model.eval()  # no dropout: a datum's logprobs do not depend on the batch
        self.tokenizer = tokenizer
        self.model_id = model_name
        self.engine_cfg = engine_cfg
        self.checkpoint_dir = Path(checkpoint_dir or tempfile.mkdtemp(prefix="searchr1-ckpt-"))
        self._limits = TrainingLimits(max_batch_datums, max_batch_tokens, max_seq_len)
        self._max_padded_tokens = max_batch_tokens
        self._vocab_size = len(tokenizer)  # type: ignore[arg-type]
        first = next(model.parameters())
        self._device = first.device
        self._dtype = torch.promote_types(first.dtype, torch.float32)  # loss math ≥ fp32
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._optimizer = torch.optim.AdamW(self._params)
        self.step = 0
        self.last_grad_norm: float | None = None
        self.model_lock = threading.Lock()  # shared with the sampler's worker thread
        self._sampling_client: object | None = None
        self._shape = flops.model_shape(model)

    # ----- forward / backward -------------------------------------------------------------
    def forward(
        self, data: list[Datum], loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None, auto_shift: bool = False,
    ) -> LocalFuture[ForwardBackwardOutput]:
        """Loss and per-datum target logprobs without gradients."""
        with self.model_lock:
            return completed(self._run(data, loss_fn, loss_fn_config, auto_shift, backward=False))

    def forward_backward(
        self, data: list[Datum], loss_fn: str = "cross_entropy",
        loss_fn_config: dict[str, object] | None = None, auto_shift: bool = False,
    ) -> LocalFuture[ForwardBackwardOutput]:
        """Forward and backward over the logical batch; gradients accumulate in the adapters."""
        with self.model_lock:
            return completed(self._run(data, loss_fn, loss_fn_config, auto_shift, backward=True))

    def forward_backward_custom(
        self, data: list[Datum], loss_fn: CustomLossFn, loss_fn_config: dict[str, object] | None = None
    ) -> LocalFuture[ForwardBackwardOutput]:
        """pytrio's custom-loss contract: ``loss_fn(data, logprobs_D)`` → (loss, metrics).

        The user's function receives one leaf tensor of target logprobs per datum (shape
        [L], 0 where the label is −100). Its gradient with respect to those logprobs is then
        pushed through the model chunk by chunk (∇θ L = Σ_t ∂L/∂logp_t · ∇θ logp_t), which
        is the exact gradient of L while keeping only one micro-batch's graph in memory.
        """
        with self.model_lock:
            return completed(self._custom(data, loss_fn, loss_fn_config))

    def compute_reference_logprobs(self, data: list[Datum], auto_shift: bool = False) -> list[torch.Tensor]:
        """Target logprobs of the frozen base model (adapters off), one CPU [L] tensor per datum."""
        plan = self._plan(data, "cross_entropy", auto_shift)
        with self.model_lock, torch.no_grad(), self.model.disable_adapter():
            batches = self._batches(plan, auto_shift)
            return [lp for b in batches for lp in b.rows(self._logprobs(b, auto_shift).cpu())]

    def _custom(
        self, data: list[Datum], loss_fn: CustomLossFn, loss_fn_config: dict[str, object] | None
    ) -> ForwardBackwardOutput:
        start = flops.clock(self._device)
        plan = self._plan(data, "cross_entropy", auto_shift=False)
        batches = list(self._batches(plan, auto_shift=False))
        with torch.no_grad():
            logps = [lp for b in batches for lp in b.rows(self._logprobs(b, False))]
        leaves = [lp.clone().requires_grad_(True) for lp in logps]
        loss, custom_metrics = _invoke_custom_loss(loss_fn, data, leaves, loss_fn_config)
        loss.backward()
        if any(leaf.grad is None for leaf in leaves):
            raise ValidationError(
                "Custom loss output has no gradients. Ensure loss_fn returns a tensor with gradients.",
                code="validation.missing_custom_loss_gradient",
            )
        grads = iter(leaf.grad for leaf in leaves)
        for batch in batches:
            grad_T = batch.scatter_rows([next(grads) for _ in batch.lengths_B])  # type: ignore[misc]
            (self._logprobs(batch, False) * grad_T).sum().backward()
        token_count = float(sum(int(b.active_T.sum()) for b in batches))
        metrics = {"loss": float(loss.detach()), "token_count": token_count, **custom_metrics}
        metrics.update(self._throughput(batches, start, backward=True))
        outputs = [{"logprobs": TensorData.from_torch(lp)} for lp in logps]
        return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics)

    # ----- optimizer -----------------------------------------------------------------------
    def optim_step(self, adam_params: AdamParams) -> LocalFuture[OptimStepResponse]:
        """One AdamW step on the accumulated gradients, then clear them.

        ``grad_clip_norm`` 0 turns clipping off. Metrics: ``grad_norm`` (global L2 norm
        before clipping), ``learning_rate`` and ``step`` (steps taken so far).
        """
        with self.model_lock:
            metrics = self._optim_step(adam_params)
        return completed(OptimStepResponse(metrics=metrics))

    def _optim_step(self, adam_params: AdamParams) -> dict[str, float]:
        for group in self._optimizer.param_groups:
            group.update(
                lr=adam_params.learning_rate, betas=(adam_params.beta1, adam_params.beta2),
                eps=adam_params.eps, weight_decay=adam_params.weight_decay,
            )
        grads = [p.grad for p in self._params if p.grad is not None]
        if adam_params.grad_clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self._params, adam_params.grad_clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.weights_version += 1
        self.last_grad_norm = float(norm)
        return {"grad_norm": self.last_grad_norm, "learning_rate": adam_params.learning_rate,
                "step": float(self.step)}

    # ----- checkpoints ---------------------------------------------------------------------
    def save_state(
        self, name: str, ttl_seconds: int | None = None, overwrite: bool = False
    ) -> LocalFuture[SaveWeightsResponse]:
        """Atomically save adapters + optimizer + step + RNG under ``checkpoint_dir/state/name``.

        ``name`` follows pytrio's rules (spaces become hyphens); ``ttl_seconds`` is accepted
        for parity and ignored: local checkpoints never expire.
        """
        path = self.checkpoint_dir / "state" / _checkpoint_name(name)

        def write(tmp: Path) -> None:
            ckpt.save_adapters(self.model, tmp)
            ckpt.save_trainer_state(tmp, self._optimizer.state_dict(), self.step)

        with self.model_lock:
            size = ckpt.write_atomically(path, overwrite, write)
        return completed(SaveWeightsResponse(path=str(path), model=self.model_id, size=size))

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None
    ) -> LocalFuture[SaveWeightsForSamplerResponse]:
        """Atomically save the adapters alone under ``checkpoint_dir/sampler/name``."""
        path = self.checkpoint_dir / "sampler" / _checkpoint_name(name)
        with self.model_lock:
            size = ckpt.write_atomically(path, True, lambda tmp: ckpt.save_adapters(self.model, tmp))
        return completed(SaveWeightsForSamplerResponse(path=str(path), model=self.model_id, size=size))

    def load_state(self, path: str) -> LocalFuture[dict[str, object]]:
        """Load adapter weights; the optimizer starts fresh and the step count at 0."""
        with self.model_lock:
            ckpt.load_adapters(self.model, Path(path))
            self._optimizer = torch.optim.AdamW(self._params)
            self.step = 0
            self.weights_version += 1
        return completed({})

    def load_state_with_optimizer(self, path: str) -> LocalFuture[dict[str, object]]:
        """Load adapters, AdamW state, step count and RNG states: training resumes exactly."""
        state = ckpt.load_trainer_state(Path(path))
        with self.model_lock:
            ckpt.load_adapters(self.model, Path(path))
            self._optimizer = torch.optim.AdamW(self._params)
            self._optimizer.load_state_dict(state["optimizer"])
            self._optimizer.zero_grad(set_to_none=True)
            self.step = int(state["step"])
            self.weights_version += 1
            ckpt.restore_rng_state(state["rng"])
        return completed({})

    # ----- sampling ------------------------------------------------------------------------
    def save_weights_and_get_sampling_client(self, name: str | None = None) -> object:
        """A ``LocalSamplingClient`` over the live adapters (also saved to disk if ``name``).

        It holds the model by reference and samples the weights as they are when each of
        its batches runs (``model_lock`` keeps a batch and a training call apart), so one
        client is made and returned on every call: no copy and no new thread per step.
        """
        from searchr1.engines.local.sampling.hf_sampler import LocalSamplingClient

        if name is not None:
            self.save_weights_for_sampler(name)
        if self._sampling_client is None:
            self._sampling_client = LocalSamplingClient(
                self.model, self.tokenizer, self.engine_cfg, model_lock=self.model_lock,
                weights_version=lambda: self.weights_version,
            )
        return self._sampling_client

    def create_sampling_client(self, model_path: str) -> object:
        """A ``LocalSamplingClient`` over a copy of the model holding ``model_path``'s adapters."""
        from searchr1.engines.local.sampling.hf_sampler import LocalSamplingClient

        with self.model_lock:
            snapshot = copy.deepcopy(self.model)
        ckpt.load_adapters(snapshot, Path(model_path))
        return LocalSamplingClient(snapshot, self.tokenizer, self.engine_cfg)

    def get_tokenizer(self) -> object:
        return self.tokenizer

    # ----- internals -----------------------------------------------------------------------
    def _plan(self, data: list[Datum], loss_fn: str, auto_shift: bool) -> TrainingBatchPlan:
        return plan_training_batch(
            data, loss_fn=loss_fn, auto_shift=auto_shift, limits=self._limits,
            tokenizer_vocab_size=self._vocab_size,
        )

    def _batches(self, plan: TrainingBatchPlan, auto_shift: bool) -> Iterator[PaddedBatch | PackedBatch]:
        """Micro-batches in datum order (see the module docstring)."""
        if self.layout == "packed":
            samples = [s for chunk in plan.chunks for s in chunk.samples]
            for part in split_by_tokens(samples, self._max_padded_tokens):
                yield pack_samples(part, auto_shift, self._device, self._dtype)
            return
        for chunk in plan.chunks:
            for part in split_by_padded_tokens(chunk.samples, self._max_padded_tokens):
                yield pad_samples(part, auto_shift, self._device, self._dtype)

    def _logprobs(self, batch: PaddedBatch | PackedBatch, auto_shift: bool) -> torch.Tensor:
        """Target logprobs, flat: one entry per label slot of ``batch`` (0 where inactive)."""
        if isinstance(batch, PackedBatch):
            chunk = self.logits_chunk or batch.labels_T.numel()
            return packed_logprobs(self.model, batch, self._dtype, chunk)
        if self.logits_chunk is None:
            return target_logprobs(self.model, batch, auto_shift, self._dtype).flatten()
        return padded_logprobs(self.model, batch, auto_shift, self._dtype, self.logits_chunk)

    def _throughput(self, batches: list, start: float, backward: bool) -> dict[str, float]:
        lengths = [n for b in batches for n in b.lengths_B]
        seconds = flops.clock(self._device) - start
        return flops.throughput_metrics(
            self._shape, lengths, seconds, backward, self._device, self.peak_flops
        )

    def _run(
        self, data: list[Datum], loss_fn: str, loss_fn_config: dict[str, object] | None,
        auto_shift: bool, backward: bool,
    ) -> ForwardBackwardOutput:
        start = flops.clock(self._device)
        plan = self._plan(data, loss_fn, auto_shift)
        spec = POLICY_LOSSES.get(plan.chunks[0].loss_fn)
        scalars = validate_loss_config(plan.chunks[0].loss_fn, loss_fn_config)
        denominator = float(max(getattr(plan.totals, spec.denominator), 1))
        outputs, sums, batches = [], defaultdict(float), []
        for batch in self._batches(plan, auto_shift):
            with torch.set_grad_enabled(backward):
                logp_T = self._logprobs(batch, auto_shift)
                loss, chunk_sums = spec.fn(
                    logp_T, batch.sampling_logprobs_T, batch.advantages_T, batch.weights_T,
                    denominator, **scalars,
                )
            if backward:
                loss.backward()
            outputs += [{"logprobs": TensorData.from_torch(lp)} for lp in batch.rows(logp_T.detach().cpu())]
            for key, value in chunk_sums.items():
                sums[key] += value
            batches.append(batch)
        metrics = finalize_metrics(sums)
        metrics.update(self._throughput(batches, start, backward))
        return ForwardBackwardOutput(loss_fn_outputs=outputs, metrics=metrics)


def _checkpoint_name(name: str) -> str:
    """pytrio's checkpoint-name rules (spaces → hyphens, charset, 200-char cap)."""
    return build_trainer_save_payload(name, None).name

