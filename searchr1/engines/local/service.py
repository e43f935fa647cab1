"""``engine=local``: the in-process service client (PyTRIO ``ServiceClient`` surface).

Loads the model and tokenizer once. Sampling clients and the training client share that one
model object: the policy sampler samples the live weights. The base sampler (eval of the
untrained model, KL reference logprobs) runs the same weights with the adapters switched off
under ``model.tuning=lora`` (no second copy), and the frozen copy of the initial weights under
``full`` (its slot sampler shares the policy's KV pool). On CUDA the start-up memory estimate
(``memory.py``) sizes ``engine.kv_slots`` when it is null and refuses, with exit 2, a run that
cannot fit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from searchr1.engines.base import DataParallelGroup, LoopLimits
from searchr1.engines.local.config import LocalEngineConfig, ModelConfig, Sampler
from searchr1.engines.local.model import load_model, load_tokenizer, resolve_device
from searchr1.engines.local import memory
from searchr1.engines.local.phases import Phases
from searchr1.engines.local.sampling.vllm_start import start_vllm
from searchr1.engines.local.sampling.pool import SamplerPool
from searchr1.engines.local.sharding.grads import synced
from searchr1.engines.local.training.client import LocalTrainingClient
from searchr1.engines.local.training.logprobs import DEFAULT_CHUNK
from searchr1.engines.local.training.setup import build_trainable
from searchr1.startup.errors import StartupError
from searchr1.utils import cpu_threads


class AdaptersDisabled(torch.nn.Module):
    """A view of a peft model whose forward runs with the LoRA adapters switched off."""

    searchr1_adapters_off = True  # read by the slot sampler, which folds weights itself

    def __init__(self, peft_model) -> None:
        super().__init__()
        self.inner = peft_model

    def forward(self, *args, **kwargs):
        with self.inner.disable_adapter():
            return self.inner(*args, **kwargs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)


class LocalService:
    """One model in this process, behind ``ServiceClient``-style factory methods."""

    def __init__(self, engine_cfg: LocalEngineConfig, model_cfg: ModelConfig, run_dir,
                 limits: LoopLimits | None = None, dp: DataParallelGroup | None = None) -> None:
        self.engine_cfg = engine_cfg
        self.model_cfg = model_cfg
        self.run_dir = Path(run_dir)
        self.limits = limits or LoopLimits()  # the loop's micro-batch limits and overlap
        self.dp = dp  # the job's data parallelism (None: one process)
        self.parallel = dp is not None and dp.active  # under torchrun: this rank's GPU, gradient sums
        self.device = (resolve_device(engine_cfg.device, dp.local_rank) if self.parallel
                       else resolve_device(engine_cfg.device))
        cpu_threads.apply(engine_cfg.threads, engine_cfg.interop_threads)  # before any torch work
        self.tokenizer = load_tokenizer(model_cfg, engine_cfg.cache_dir)
        self.model = load_model(model_cfg, self.device, model_cfg.dtype, engine_cfg.cache_dir)
        self.training: LocalTrainingClient | None = None
        self._base_sampler = None
        estimate = None
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            if engine_cfg.memory_fraction is not None:
                index = torch.cuda.current_device() if self.device.index is None else self.device.index
                torch.cuda.set_per_process_memory_fraction(engine_cfg.memory_fraction, index)  # an index: torch refuses "cuda"
            usable = memory.usable_bytes(free, total, engine_cfg.memory_fraction)
            estimate = memory.estimate_for(self.model, model_cfg, engine_cfg,
                                           self.limits.max_padded_tokens_per_microbatch, DEFAULT_CHUNK)
            self.engine_cfg = plan_memory(estimate, engine_cfg, usable, self._rank_trajectories())
        elif engine_cfg.kv_slots is None:
            self.engine_cfg = dataclasses.replace(engine_cfg, kv_slots=memory.CPU_KV_SLOTS)
        self.samplers = SamplerPool(self.engine_cfg, self.tokenizer)  # one engine for every client
        if self.engine_cfg.sampler == Sampler.vllm:
            if estimate is None:
                raise StartupError("searchr1: engine.sampler=vllm needs a CUDA GPU; on CPU use "
                                   "engine.sampler=auto (the HF decode)")
            if self.parallel:
                raise StartupError("searchr1: engine.sampler=vllm runs in one process for now; under "
                                   "torchrun use engine.sampler=slots")
            if self.limits.overlapped_rollout:  # vLLM sleeps while training
                raise StartupError("searchr1: engine.sampler=vllm sleeps while the update runs, so it "
                                   "cannot sample the next rollout meanwhile: use trainer.max_staleness=0 "
                                   "or engine.sampler=slots")
            self.samplers.attach_vllm(*start_vllm(self.model, self.tokenizer, self.engine_cfg, estimate,
                                                  self.device))

    def _rank_trajectories(self) -> int:
        """A training rollout's trajectories on this process (its share under torchrun); 0 = unknown."""
        n = self.limits.rollout_trajectories
        return -(-n // self.dp.world) if self.parallel and n else n

    def get_tokenizer(self):
        return self.tokenizer

    def create_sampling_client(self, model_path: str | None = None):
        """Base model (adapters off) when ``model_path`` is None, else saved sampler weights."""
        if model_path is not None:
            if self.training is None:
                self.create_lora_training_client(self.model_cfg.lora_rank, seed=0)
            return self.training.create_sampling_client(model_path)
        if self._base_sampler is None:
            if self.training is None:
                self._base_sampler = self.samplers.client(self.model)
            elif self.training.tuning == "full":  # the frozen copy, served by the policy's engine
                self._base_sampler = self.samplers.client(self.training.trainable.reference)
            else:
                view = AdaptersDisabled(self.training.model)
                self._base_sampler = self.samplers.client(view, model_lock=self.training.model_lock)
        return self._base_sampler

    def create_lora_training_client(self, rank: int, seed: int, base_model: str | None = None):
        """The training client of ``model.tuning``: LoRA of ``rank`` on all linear layers, or
        every weight under ``full`` (``rank`` unused). ``base_model`` must be the loaded one."""
        if base_model not in (None, self.model_cfg.name, self.model_cfg.hf_id):
            raise ValueError(f"engine=local has {self.model_cfg.hf_id} loaded, not {base_model}")
        if self.training is not None:
            raise RuntimeError("engine=local supports one training client per process")
        e = self.engine_cfg
        shard = self.parallel and self.model_cfg.tuning == "full"  # FSDP2 (sharding/fsdp.py)
        trainable = build_trainable(
            self.model, self.model_cfg.tuning, rank=rank, alpha=self.model_cfg.lora_alpha, seed=seed,
            device=self.device, shard=shard, lora_compute=self.model_cfg.lora_compute,
        )
        phases = Phases(e.sleep_between_phases or e.sampler == Sampler.vllm, e.offload_optimizer_during_rollout,
                        self.samplers.sleep, release_host_memory=self.device.type == "cpu")
        self.training = LocalTrainingClient(
            trainable, self.tokenizer, model_name=self.model_cfg.name,
            checkpoint_dir=self.run_dir / "checkpoints" / "engine",
            max_batch_datums=self.limits.max_datums_per_microbatch,
            max_batch_tokens=self.limits.max_padded_tokens_per_microbatch,
            engine_cfg=e, samplers=self.samplers, offload_optimizer=e.offload_optimizer, phases=phases,
            grad_sync=synced(self.dp), recompute=e.activation_checkpointing, dp=self.dp,
            compile_layers=e.compile_layers,
        )
        self._base_sampler = None  # the base view must now switch the adapters off
        return self.training

    def create_training_client_from_state_with_optimizer(self, path: str):
        client = self.create_lora_training_client(self.model_cfg.lora_rank, seed=0)
        client.load_state_with_optimizer(path).result()
        return client


def plan_memory(est: memory.Estimate, engine_cfg: LocalEngineConfig, free_bytes: int,
                trajectories: int = 0) -> LocalEngineConfig:
    """``engine_cfg`` with ``kv_slots`` sized when null: the most that fit ``free_bytes``, and no
    more than ``memory.pool_cap(trajectories)`` (a rollout's trajectories on this process; 0 =
    unknown); raises ``StartupError`` (exit 2, one paragraph) when the estimate does not fit."""
    slots = engine_cfg.kv_slots
    if slots is None:
        slots = memory.auto_kv_slots(est, free_bytes, memory.pool_cap(trajectories))
    if engine_cfg.memory_check:
        message = memory.problem(est, slots, free_bytes)
        if message is not None:
            raise StartupError(message)
    return dataclasses.replace(engine_cfg, kv_slots=max(1, slots))
