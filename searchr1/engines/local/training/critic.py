"""The critic of ``advantage=ppo_gae``: a causal LM with a scalar value head, in-process.

PyTRIO has no value head, so the critic always runs here, whichever engine holds the
policy. Its base is the policy's base model (a separate copy with its *own* LoRA adapters,
as verl's critic is a separate model initialised from the actor's weights) or
``critic.model``. The value head is a linear layer on the last hidden state, zero-initialised
(so the first values are 0 and the first GAE advantages are the plain returns); it is
trained in full, the base through LoRA.

Layout: a value for every position of a datum's ``model_input`` (the shifted layout), so
``values[i]`` is V of the state that predicts ``target_tokens[i]`` — verl's
``values[:, -response_length-1:-1]`` alignment. Only action positions are used.

This module is the torch half only (the ``ValueModel`` of ``advantages/critic.py``, which
owns the critic's batch, its update's loss weights and its metrics): values per position,
the gradient of a per-datum weighted clipped value loss (``losses/value.py``) in forward
passes of at most ``critic.max_tokens_per_pass`` padded tokens, and AdamW at
``critic.learning_rate`` with a linear warm-up over ``warmup_ratio`` of the run's optimizer
steps and gradient clipping, as verl's critic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from peft import LoraConfig

from searchr1.engines.local.training.setup import peft_model
from searchr1.losses.value import clipped_value_terms
from searchr1.utils.lr_schedule import learning_rate

if TYPE_CHECKING:
    from searchr1.advantages.critic import CriticBatch


class Critic:
    """A LoRA causal LM + value head with its own AdamW (see module docstring); the step's
    ``advantages.critic.ValueModel``."""

    def __init__(self, base_model, cfg, total_steps: int, seed: int, device) -> None:
        self.cfg, self.total_steps, self.device = cfg, max(total_steps, 1), torch.device(device)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules="all-linear")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = peft_model(base_model.to(self.device), lora).eval()
        hidden = base_model.config.hidden_size
        dtype = next(base_model.parameters()).dtype
        self.head = torch.nn.Linear(hidden, 1, device=self.device, dtype=torch.float32)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self._dtype = dtype
        self.params = [p for p in self.model.parameters() if p.requires_grad] + list(self.head.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate)
        self.steps = 0
        # trainer.warmup_unit / warmup_start (set by build.py): (unit, start, training steps)
        self.warmup = ("optimizer_step", "first", self.total_steps)

    @property
    def microbatch_trajectories(self) -> int:
        return self.cfg.microbatch_trajectories

    def _lr(self, step: int | None) -> float:
        """Warm-up LR of this update: by optimizer step, or by the training step ``step``."""
        unit, start, training_steps = self.warmup
        if getattr(unit, "value", unit) == "step" and step is not None:
            return learning_rate("linear_warmup", self.cfg.learning_rate, step, training_steps,
                                 self.cfg.warmup_ratio, start)
        return learning_rate("linear_warmup", self.cfg.learning_rate, self.steps, self.total_steps,
                             self.cfg.warmup_ratio, start)

    def _forward(self, inputs_D: list[np.ndarray]) -> list[torch.Tensor]:
        """Values per position for each datum (one right-padded forward of the decoder alone:
        the LM head's vocabulary logits are never computed)."""
        n = max(len(x) for x in inputs_D)
        ids = torch.zeros(len(inputs_D), n, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, x in enumerate(inputs_D):
            ids[i, : len(x)] = torch.as_tensor(np.asarray(x), dtype=torch.long)
            att[i, : len(x)] = 1
        decoder = self.model.get_base_model().model
        hidden = decoder(input_ids=ids.to(self.device), attention_mask=att.to(self.device)).last_hidden_state
        values = self.head(hidden.float()).squeeze(-1)
        return [values[i, : len(x)] for i, x in enumerate(inputs_D)]

    def _passes(self, index: list[int], lengths: list[int]) -> list[list[int]]:
        """``index`` cut into forwards of at most ``critic.max_tokens_per_pass`` padded tokens
        (longest first, so rows of a pass have similar lengths). Passes only group work: the
        loss weights come from the micro-batches (``microbatch_trajectories``)."""
        budget = max(1, self.cfg.max_tokens_per_pass)
        passes: list[list[int]] = []
        width = 0
        for i in sorted(index, key=lambda i: -lengths[i]):
            if passes and (len(passes[-1]) + 1) * max(width, lengths[i]) <= budget:
                passes[-1].append(i)
                width = max(width, lengths[i])
            else:
                passes.append([i])
                width = lengths[i]
        return passes

    @torch.no_grad()
    def values(self, inputs_D: list[np.ndarray]) -> list[np.ndarray]:
        """V per position of each datum's model input."""
        out: list[np.ndarray | None] = [None] * len(inputs_D)
        lengths = [len(x) for x in inputs_D]
        for part in self._passes(list(range(len(inputs_D))), lengths):
            for i, v in zip(part, self._forward([inputs_D[i] for i in part])):
                out[i] = v.cpu().double().numpy()
        return out

    def backward(self, batch: CriticBatch, weights_D: Sequence[float]) -> dict[str, float]:
        """Accumulate the gradient of Σ_d w_d Σ_t mask·ℓ_t, ℓ the clipped value loss, datum
        ``d``'s tokens weighted ``weights_D[d]`` whichever forward pass it shares; returns the
        weighted sums ``value_loss`` and ``vf_clipfrac``."""
        weight = list(weights_D)
        lengths = [len(x) for x in batch.inputs_D]
        sums = {"value_loss": 0.0, "vf_clipfrac": 0.0}
        for part in self._passes(list(range(len(lengths))), lengths):
            v = torch.cat(self._forward([batch.inputs_D[i] for i in part]))
            cat = lambda xs: torch.cat([torch.as_tensor(np.asarray(xs[i]), dtype=torch.float32) for i in part])
            old, ret = cat(batch.old_values_D).to(v.device), cat(batch.returns_D).to(v.device)
            mask = cat(batch.masks_D) > 0
            w_T = torch.cat([torch.full((lengths[i],), weight[i]) for i in part]) * mask
            w_T = w_T.to(v.device)
            loss_T, clipped_T = clipped_value_terms(v, old, ret, self.cfg.cliprange_value)
            loss = (loss_T * w_T).sum()
            loss.backward()
            sums["value_loss"] += float(loss.detach())
            sums["vf_clipfrac"] += float((clipped_T.float() * w_T).sum())
        return sums

    def optimizer_step(self, step: int | None = None, dp=None) -> float:
        """Sum the gradients over the ranks (``dp``), clip, one AdamW step at the warm-up LR
        (``step``: the training step, for ``trainer.warmup_unit=step``); returns that LR."""
        if dp is not None:
            dp.all_reduce_grads(self.params)
        lr = self._lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.cfg.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return lr

    def save(self, path) -> None:
        """Adapters, value head, optimizer and step count (for ``trainer.resume``)."""
        trainable = {k: v for k, v in self.model.state_dict().items() if "lora_" in k}
        torch.save({"lora": trainable, "head": self.head.state_dict(),
                    "optimizer": self.optimizer.state_dict(), "steps": self.steps}, path)

    def load(self, path) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["lora"], strict=False)
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


def build_critic(critic_cfg, model_cfg, cache_dir: str, total_steps: int, seed: int,
                 dp=None) -> Critic:
    """Load the critic's base (``critic.model`` or the policy's) and wrap it (on this
    rank's GPU under torchrun)."""
    from dataclasses import replace

    from searchr1.distributed.launch import local_device
    from searchr1.engines.local.model import load_model, resolve_device

    active = dp is not None and dp.active
    device = local_device(critic_cfg.device, dp.local_rank) if active else resolve_device(critic_cfg.device)
    base_cfg = model_cfg if critic_cfg.model is None else replace(
        model_cfg, name=f"{model_cfg.name}-critic", hf_id=critic_cfg.model, gguf_file=None)
    base = load_model(base_cfg, device, base_cfg.dtype, cache_dir)
    return Critic(base, critic_cfg, total_steps, seed, device)
