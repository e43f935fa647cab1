"""``engine=local``: the in-process service client (PyTRIO ``ServiceClient`` surface).

Loads the model and tokenizer once. Sampling clients and the LoRA training client all
share that one model object: the policy sampler samples the live adapters, and the base
sampler (eval of the untrained model, KL reference logprobs) runs the same weights with the
adapters switched off — no second copy of the model in memory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from searchr1.engines.local.model import (
    LocalEngineConfig,
    ModelConfig,
    load_model,
    load_tokenizer,
    resolve_device,
)
from searchr1.engines.local.sampling.hf_sampler import LocalSamplingClient
from searchr1.engines.local.training.client import LocalTrainingClient, create_lora_training_client


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

    def __init__(self, engine_cfg: LocalEngineConfig, model_cfg: ModelConfig, run_dir, trainer_cfg) -> None:
        self.engine_cfg = engine_cfg
        self.model_cfg = model_cfg
        self.run_dir = Path(run_dir)
        self.trainer_cfg = trainer_cfg
        self.device = resolve_device(engine_cfg.device)
        self.tokenizer = load_tokenizer(model_cfg, engine_cfg.cache_dir)
        self.model = load_model(model_cfg, self.device, model_cfg.dtype, engine_cfg.cache_dir)
        self.training: LocalTrainingClient | None = None
        self._base_sampler: LocalSamplingClient | None = None

    def get_tokenizer(self):
        return self.tokenizer

    def create_sampling_client(self, model_path: str | None = None) -> LocalSamplingClient:
        """Base model (adapters off) when ``model_path`` is None, else saved sampler weights."""
        if model_path is not None:
            if self.training is None:
                self.create_lora_training_client(self.model_cfg.lora_rank, seed=0)
            return self.training.create_sampling_client(model_path)
        if self._base_sampler is None:
            if self.training is None:
                self._base_sampler = LocalSamplingClient(self.model, self.tokenizer, self.engine_cfg)
            else:
                view = AdaptersDisabled(self.training.model)
                self._base_sampler = LocalSamplingClient(
                    view, self.tokenizer, self.engine_cfg, model_lock=self.training.model_lock
                )
        return self._base_sampler

    def create_lora_training_client(self, rank: int, seed: int, base_model: str | None = None):
        """LoRA on all linear layers of the loaded model (``base_model`` must match it)."""
        if base_model not in (None, self.model_cfg.name, self.model_cfg.hf_id):
            raise ValueError(f"engine=local has {self.model_cfg.hf_id} loaded, not {base_model}")
        if self.training is not None:
            raise RuntimeError("engine=local supports one training client per process")
        t = self.trainer_cfg
        self.training = create_lora_training_client(
            self.model, self.tokenizer, rank, self.model_cfg.lora_alpha, seed, self.device,
            model_name=self.model_cfg.name,
            checkpoint_dir=self.run_dir / "checkpoints" / "engine",
            max_batch_datums=t.max_datums_per_microbatch if t else 32,
            max_batch_tokens=t.max_padded_tokens_per_microbatch if t else 64_000,
            engine_cfg=self.engine_cfg,
        )
        self._base_sampler = None  # the base view must now switch the adapters off
        return self.training

    def create_training_client_from_state_with_optimizer(self, path: str):
        client = self.create_lora_training_client(self.model_cfg.lora_rank, seed=0)
        client.load_state_with_optimizer(path).result()
        return client
