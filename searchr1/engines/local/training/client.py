"""The local engine's training client: pytrio's ``TrainingClient`` surface, in-process.

A thin surface over three parts: ``forward_backward.Passes`` (planning, micro-batches,
log-probs, losses, the custom-loss gradient), ``optimizer.AdamW`` (clipping, the step,
state offload) and ``checkpoint`` (atomic saves). The trained model comes from
``setup.build_trainable``: LoRA adapters (default) or every weight (``model.tuning=full``).

Departures from the remote engine, all deliberate:
- work runs eagerly in the caller's thread; futures come back already resolved;
- ``forward_backward_custom`` backpropagates the user's loss exactly (Tinker's semantics);
- ``save_weights_and_get_sampling_client`` returns a client over the *live* model (no copy
  per step); ``create_sampling_client(path)`` loads a checkpoint into a separate copy;
- the reference policy (``compute_reference_logprobs``) is the model with adapters off
  (LoRA), or the frozen copy that ``freeze_reference`` takes after a warm start (a second
  adapter under LoRA, the weight copy under full).

``forward_backward`` metrics add ``tokens_per_second`` and, on CUDA, ``mfu`` (``flops.py``).
``weights_version`` counts changes of the trained weights (optimizer steps and loads) so a
sampler holding its own copy knows when to refresh it. ``phases`` (``phases.py``) is told
when training work starts and when a rollout's sampler is handed out, to time-share memory.
"""

from __future__ import annotations

import copy
import tempfile
import threading
from pathlib import Path

import torch
from pytrio.client.builders.training import build_trainer_save_payload
from pytrio.model.limits import TrainingLimits
from pytrio.types import (
    AdamParams,
    APIFuture,
    Datum,
    ForwardBackwardOutput,
    OptimStepResponse,
    SaveWeightsForSamplerResponse,
    SaveWeightsResponse,
)
from transformers import PreTrainedModel

from searchr1.engines.base import EngineCapabilities
from searchr1.engines.local.config import LocalEngineConfig
from searchr1.engines.local.futures import completed
from searchr1.engines.local.sampling.pool import SamplerPool
from searchr1.engines.local.phases import Phases
from searchr1.engines.local.sharding import dcp
from searchr1.engines.local.training import checkpoint as ckpt
from searchr1.engines.local.training import flops
from searchr1.engines.local.training.forward_backward import Passes
from searchr1.engines.local.training.optimizer import AdamW
from searchr1.engines.local.training.setup import Trainable, build_trainable


def create_lora_training_client(
    base_model: PreTrainedModel, tokenizer: object, rank: int, alpha: float, seed: int,
    device: str | torch.device = "cpu", **client_kwargs: object,
) -> LocalTrainingClient:
    """Wrap ``base_model`` (in place) with LoRA on all linear layers and return a client.

    The same seed gives the same adapters; lm_head is not adapted (peft's "all-linear").
    """
    trainable = build_trainable(base_model, "lora", rank=rank, alpha=alpha, seed=seed, device=device)
    return LocalTrainingClient(trainable, tokenizer, **client_kwargs)  # type: ignore[arg-type]


class LocalTrainingClient:
    """pytrio ``TrainingClient`` over an in-process model (see module docstring)."""

    def __init__(
        self, model: Trainable | torch.nn.Module, tokenizer: object, *, model_name: str = "local",
        checkpoint_dir: str | Path | None = None, max_batch_datums: int | None = 32,
        max_batch_tokens: int | None = 64_000, max_seq_len: int | None = None,
        engine_cfg: object | None = None, samplers=None, layout: str = "packed",
        logits_chunk: int | str | None = "auto", peak_flops: float = flops.H200_BF16_PEAK,
        offload_optimizer: bool = False, phases: Phases | None = None, grad_sync=None,
        recompute: bool | None = None, dp=None, compile_layers: bool = False,
    ) -> None:
        if layout not in ("packed", "padded"):
            raise ValueError(f"layout must be packed or padded, got {layout!r}")
        self.trainable = model if isinstance(model, Trainable) else Trainable(model, "lora")
        self.model = self.trainable.model.eval()  # no dropout: logprobs do not depend on the batch
        self.tokenizer, self.model_id, self.engine_cfg = tokenizer, model_name, engine_cfg
        # the service's sampler pool (one engine for the policy, the base view and snapshots);
        # a client made on its own gets a pool of its own
        self.samplers = samplers or SamplerPool(engine_cfg or LocalEngineConfig(), tokenizer)
        self.checkpoint_dir = Path(checkpoint_dir or tempfile.mkdtemp(prefix="searchr1-ckpt-"))
        limits = TrainingLimits(max_batch_datums, max_batch_tokens, max_seq_len)
        self.passes = Passes(self.trainable, limits, len(tokenizer),  # type: ignore[arg-type]
                             max_tokens=max_batch_tokens, layout=layout, logits_chunk=logits_chunk,
                             peak_flops=peak_flops, recompute=recompute, compile_layers=compile_layers)
        self.dp = dp  # a sharded state (FSDP2) saves and loads collectively through it
        self.masters = self.trainable.masters
        if self.masters is not None:  # AdamW steps the FSDP2 shards; the full copy follows
            self.optimizer = AdamW(self.masters.params, offload=offload_optimizer,
                                   after_step=self._gather)
        else:
            self.optimizer = AdamW(self.trainable.params, offload=offload_optimizer, grad_sync=grad_sync)
        self.phases = phases or Phases()
        self.phases.optimizer = self.optimizer
        self.weights_version = 0  # +1 whenever the trained weights change
        self.model_lock = threading.Lock()  # shared with the sampler's worker thread
        self._sampling_client: object | None = None

    @property
    def tuning(self) -> str:
        return self.trainable.tuning

    @property
    def capabilities(self) -> EngineCapabilities:
        """In process: blocking calls, the KL reference's log-probs here, a freezable reference;
        sharded state (collective saves and idle passes) under FSDP2 (``engines/base.py``)."""
        return EngineCapabilities(in_process=True, reference_logprobs=True, freeze_reference=True,
                                  sharded_state=self.masters is not None)

    def _gather(self) -> None:
        with self.dp.guard("weight all-gather"):
            self.masters.gather()

    @property
    def step(self) -> int:
        return self.optimizer.step_count

    @property
    def last_grad_norm(self) -> float | None:
        return self.optimizer.last_grad_norm

    # ----- forward / backward -------------------------------------------------------------
    def forward(self, data: list[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: dict[str, object] | None = None,
                auto_shift: bool = False) -> APIFuture[ForwardBackwardOutput]:
        """Loss and per-datum target logprobs without gradients."""
        with self._training():
            return completed(self.passes.run(data, loss_fn, loss_fn_config, auto_shift, backward=False))

    def forward_backward(self, data: list[Datum], loss_fn: str = "cross_entropy",
                         loss_fn_config: dict[str, object] | None = None,
                         auto_shift: bool = False) -> APIFuture[ForwardBackwardOutput]:
        """Forward and backward over the logical batch; gradients accumulate until ``optim_step``."""
        with self._training():
            return completed(self.passes.run(data, loss_fn, loss_fn_config, auto_shift, backward=True))

    def forward_backward_custom(self, data: list[Datum], loss_fn,
                                loss_fn_config: dict[str, object] | None = None
                                ) -> APIFuture[ForwardBackwardOutput]:
        """pytrio's custom-loss contract: ``loss_fn(data, logprobs_D)`` → (loss, metrics), exact gradient."""
        with self._training():
            return completed(self.passes.custom(data, loss_fn, loss_fn_config))

    def forward_backward_idle(self) -> None:
        """Sharded model (FSDP2), a rank with no datums in this mini-batch: run the idle passes
        that match the other ranks' gradient passes (their collectives need every rank)."""
        if self.masters is not None:
            with self._training(), self.dp.guard("FSDP2 gradient passes"):
                self.passes.idle(self.passes.lockstep(0))

    def compute_reference_logprobs(self, data: list[Datum], auto_shift: bool = False) -> list[torch.Tensor]:
        """Target logprobs of the KL reference policy, one CPU [L] tensor per datum."""
        with self._training():
            return self.passes.reference(data, auto_shift)

    def freeze_reference(self) -> None:
        """Make the KL reference the weights as they are now: called once, after the warm
        start, so the reference is the policy RL starts from (``reference.py``)."""
        with self.model_lock:
            self.trainable.freeze_reference()

    # ----- optimizer -----------------------------------------------------------------------
    def optim_step(self, adam_params: AdamParams) -> APIFuture[OptimStepResponse]:
        """One AdamW step on the accumulated gradients (clipped at ``grad_clip_norm``; 0 = off)."""
        with self._training():
            metrics = self.optimizer.step(adam_params)
            self.weights_version += 1
        return completed(OptimStepResponse(metrics=metrics))

    # ----- checkpoints ---------------------------------------------------------------------
    def save_state(self, name: str, ttl_seconds: int | None = None,
                   overwrite: bool = False) -> APIFuture[SaveWeightsResponse]:
        """Atomically save weights + optimizer + step + RNG under ``checkpoint_dir/state/name``.

        ``ttl_seconds`` is accepted for parity and ignored: local checkpoints never expire.
        """
        path = self.checkpoint_dir / "state" / _checkpoint_name(name)
        if self.masters is not None:  # every rank writes its shards (sharding/dcp.py)
            with self.model_lock:
                size = dcp.save(self.dp, self.masters, self.optimizer.torch, path, self.step, overwrite)
            return completed(SaveWeightsResponse(path=str(path), model=self.model_id, size=size))

        def write(tmp: Path) -> None:
            ckpt.save_weights(self.model, tmp, self.tuning)
            ckpt.save_trainer_state(tmp, self.optimizer.state_dict(), self.step)

        with self.model_lock:
            size = ckpt.write_atomically(path, overwrite, write)
        return completed(SaveWeightsResponse(path=str(path), model=self.model_id, size=size))

    def save_weights_for_sampler(self, name: str,
                                 ttl_seconds: int | None = None) -> APIFuture[SaveWeightsForSamplerResponse]:
        """Atomically save what a sampler loads (adapters, or an HF folder under full)."""
        path = self.checkpoint_dir / "sampler" / _checkpoint_name(name)
        with self.model_lock:
            size = ckpt.write_atomically(
                path, True, lambda tmp: ckpt.save_sampler_weights(self.model, self.tokenizer, tmp, self.tuning))
        return completed(SaveWeightsForSamplerResponse(path=str(path), model=self.model_id, size=size))

    def load_state(self, path: str) -> APIFuture[dict[str, object]]:
        """Load the trained weights; the optimizer starts fresh and the step count at 0."""
        with self.model_lock:
            if self.masters is not None:
                dcp.load(self.dp, self.masters, None, Path(path))
            else:
                ckpt.load_weights(self.model, Path(path), self.tuning)
            self.optimizer.reset()
            self.weights_version += 1
        return completed({})

    def load_state_with_optimizer(self, path: str) -> APIFuture[dict[str, object]]:
        """Load weights, AdamW state, step count and RNG states: training resumes exactly."""
        if self.masters is not None:
            with self.model_lock:
                self.optimizer.reset()
                step = dcp.load(self.dp, self.masters, self.optimizer.torch, Path(path))
                self.optimizer.step_count = step
                self.optimizer.torch.zero_grad(set_to_none=True)
                self.weights_version += 1
            return completed({})
        state = ckpt.load_trainer_state(Path(path))
        with self.model_lock:
            ckpt.load_weights(self.model, Path(path), self.tuning)
            self.optimizer.load_state_dict(state["optimizer"], int(state["step"]))
            self.weights_version += 1
            ckpt.restore_rng_state(state["rng"])
        return completed({})

    # ----- sampling ------------------------------------------------------------------------
    def save_weights_and_get_sampling_client(self, name: str | None = None) -> object:
        """A ``LocalSamplingClient`` over the live weights (also saved to disk if ``name``).

        It holds the model by reference and samples the weights as they are when each of its
        batches runs (``model_lock`` keeps a batch and a training call apart); one client is
        made and returned on every call. Handing it out starts a rollout phase.
        """
        if name is not None:
            self.save_weights_for_sampler(name)
        if self._sampling_client is None:
            self._sampling_client = self.samplers.client(self.model, self.model_lock,
                                                         weights_version=lambda: self.weights_version)
        self.phases.rollout()
        return self._sampling_client

    def create_sampling_client(self, model_path: str) -> object:
        """A sampling client over a copy of the model holding ``model_path``'s weights."""
        with self.model_lock:
            snapshot = copy.deepcopy(self.model)
        if self.tuning == "lora":
            ckpt.load_adapters(snapshot, Path(model_path))
        else:
            ckpt.load_hf_weights(snapshot, Path(model_path))
        return self.samplers.client(snapshot)

    def get_tokenizer(self) -> object:
        return self.tokenizer

    def _training(self):
        """Hold the model lock and mark the training phase (the sampler may release memory)."""
        self.phases.training()
        return self.model_lock


def _checkpoint_name(name: str) -> str:
    """pytrio's checkpoint-name rules (spaces → hyphens, charset, 200-char cap)."""
    return build_trainer_save_payload(name, None).name
