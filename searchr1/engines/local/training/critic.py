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

Optimisation, as verl's critic: AdamW at ``critic.learning_rate`` with a linear warm-up
over ``warmup_ratio`` of the run's optimizer steps, gradient clipping, one optimizer step
per actor mini-batch, each the mean over micro-batches of their token-mean clipped value
loss (``losses/value.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from peft import LoraConfig, get_peft_model

from searchr1.losses.aggregation import aggregate
from searchr1.losses.config import Aggregation
from searchr1.losses.value import clipped_value_terms, explained_variance
from searchr1.loop.lr_schedule import learning_rate


@dataclass
class CriticBatch:
    """One mini-batch for the critic: per-datum inputs and targets (shifted layout)."""

    inputs_D: list[np.ndarray]  # model_input token ids
    old_values_D: list[np.ndarray]  # values at rollout time
    returns_D: list[np.ndarray]  # GAE returns (0 off action tokens)
    masks_D: list[np.ndarray]  # 1 on action positions


class Critic:
    """A LoRA causal LM + value head with its own AdamW (see module docstring)."""

    def __init__(self, base_model, cfg, total_steps: int, seed: int, device) -> None:
        self.cfg, self.total_steps, self.device = cfg, max(total_steps, 1), torch.device(device)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules="all-linear")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = get_peft_model(base_model.to(self.device), lora).eval()
        hidden = base_model.config.hidden_size
        dtype = next(base_model.parameters()).dtype
        self.head = torch.nn.Linear(hidden, 1, device=self.device, dtype=torch.float32)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self._dtype = dtype
        self.params = [p for p in self.model.parameters() if p.requires_grad] + list(self.head.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate)
        self.steps = 0

    def _forward(self, inputs_D: list[np.ndarray]) -> list[torch.Tensor]:
        """Values per position for each datum (one padded forward)."""
        n = max(len(x) for x in inputs_D)
        ids = torch.zeros(len(inputs_D), n, dtype=torch.long, device=self.device)
        att = torch.zeros_like(ids)
        for i, x in enumerate(inputs_D):
            ids[i, : len(x)] = torch.as_tensor(np.asarray(x), dtype=torch.long)
            att[i, : len(x)] = 1
        out = self.model(input_ids=ids, attention_mask=att, output_hidden_states=True)
        values = self.head(out.hidden_states[-1].float()).squeeze(-1)
        return [values[i, : len(x)] for i, x in enumerate(inputs_D)]

    def _micro(self, n: int) -> list[range]:
        size = max(1, self.cfg.microbatch_trajectories)
        return [range(s, min(s + size, n)) for s in range(0, n, size)]

    @torch.no_grad()
    def values(self, inputs_D: list[np.ndarray]) -> list[np.ndarray]:
        """V per position of each datum's model input."""
        out: list[np.ndarray] = []
        for part in self._micro(len(inputs_D)):
            out += [v.cpu().double().numpy() for v in self._forward([inputs_D[i] for i in part])]
        return out

    def update(self, batch: CriticBatch) -> dict[str, float]:
        """One optimizer step on ``batch``: mean over micro-batches of token-mean value loss."""
        parts = self._micro(len(batch.inputs_D))
        sums = {"value_loss": 0.0, "vf_clipfrac": 0.0}
        for part in parts:
            v_D = self._forward([batch.inputs_D[i] for i in part])
            v = torch.cat(v_D)
            cat = lambda xs: torch.cat([torch.as_tensor(xs[i], dtype=torch.float32) for i in part]).to(v.device)
            old, ret, mask = cat(batch.old_values_D), cat(batch.returns_D), cat(batch.masks_D) > 0
            loss_T, clipped_T = clipped_value_terms(v, old, ret, self.cfg.cliprange_value)
            loss = aggregate(loss_T, mask, Aggregation.token_mean) / len(parts)
            loss.backward()
            sums["value_loss"] += float(loss.detach())
            sums["vf_clipfrac"] += float(aggregate(clipped_T, mask, Aggregation.token_mean)) / len(parts)
        lr = learning_rate("linear_warmup", self.cfg.learning_rate, self.steps, self.total_steps,
                           self.cfg.warmup_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.cfg.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"critic/value_loss": sums["value_loss"], "critic/vf_clipfrac": sums["vf_clipfrac"],
                "critic/lr": lr}


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


def critic_metrics(values_D, returns_D, masks_D) -> dict[str, float]:
    """``critic/values_mean`` and ``critic/explained_variance`` on action tokens."""
    v = np.concatenate([np.asarray(x)[np.asarray(m) > 0] for x, m in zip(values_D, masks_D)])
    r = np.concatenate([np.asarray(x)[np.asarray(m) > 0] for x, m in zip(returns_D, masks_D)])
    if v.size == 0:
        return {}
    return {"critic/values_mean": float(v.mean()),
            "critic/explained_variance": explained_variance(torch.as_tensor(v), torch.as_tensor(r))}


def build_critic(critic_cfg, model_cfg, cache_dir: str, total_steps: int, seed: int) -> Critic:
    """Load the critic's base (``critic.model`` or the policy's) and wrap it."""
    from dataclasses import replace

    from searchr1.engines.local.model import load_model, resolve_device

    device = resolve_device(critic_cfg.device)
    base_cfg = model_cfg if critic_cfg.model is None else replace(
        model_cfg, name=f"{model_cfg.name}-critic", hf_id=critic_cfg.model, gguf_file=None)
    base = load_model(base_cfg, device, base_cfg.dtype, cache_dir)
    return Critic(base, critic_cfg, total_steps, seed, device)
