"""Schemas of the ``loss`` group and its closed choices (torch-free: composing a config
must not import torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class KLEstimator(str, Enum):
    """Per-token KL estimator (``searchr1/losses/kl.py``)."""

    k1 = "k1"
    k2 = "k2"
    k3 = "k3"
    low_var_kl = "low_var_kl"  # verl's clamped k3


class KLPlacement(str, Enum):
    """Where the KL-to-reference term enters."""

    reward = "reward"  # subtracted from per-token rewards/advantages (paper PPO)
    loss = "loss"  # added to the loss (paper GRPO)


class Aggregation(str, Enum):
    """How per-token losses of a mini-batch become one scalar (``losses/aggregation.py``)."""

    token_mean = "token_mean"  # Σ loss / Σ action tokens of the mini-batch (pytrio 0.2.9)
    seq_mean_token_mean = "seq_mean_token_mean"  # mean over trajectories of their token mean
    seq_mean_token_sum = "seq_mean_token_sum"  # mean over trajectories of their token sum
    microbatch_token_mean = "microbatch_token_mean"  # mean over micro-batches of token means (verl)


class OldLogprobs(str, Enum):
    """The ratio's baseline log π_old."""

    sampler = "sampler"  # the sampler's log-probs recorded during the rollout
    recompute = "recompute"  # the trainer's log-probs before the first update (verl)


class EntropyEstimate(str, Enum):
    """What the entropy bonus measures (``searchr1/losses/objective.py``)."""

    exact = "exact"  # the full distribution's entropy per position (verl; engine=local)
    sampled = "sampled"  # −log π(y) of the sampled token (any engine: only log-probs needed)


@dataclass
class KLConfig:
    """Schema of ``loss.kl``: the KL-to-reference term and where it enters."""

    coef: float = 0.0  # KL coefficient; 0 disables the term (lab); paper uses 0.001
    estimator: KLEstimator = KLEstimator.k3  # k1 | k2 | k3 | low_var_kl
    placement: KLPlacement = KLPlacement.loss  # reward | loss


@dataclass
class LossConfig:
    """Schema of the ``loss`` group: which PyTRIO loss, its scalars, and the extra terms."""

    name: str = "importance_sampling"  # cross_entropy | importance_sampling | ppo | cispo | dro
    clip_low: float = 0.2  # ε_low: ratio clipped below at 1 − ε_low (ppo, cispo)
    clip_high: float = 0.2  # ε_high: ratio clipped above at 1 + ε_high (ppo, cispo)
    dro_beta: float = 0.1  # β of DRO's quadratic penalty ½β(logp − q)²
    kl: KLConfig = field(default_factory=KLConfig)  # KL to the reference (coef 0 = off)
    entropy_coef: float = 0.0  # entropy bonus coefficient (paper 0.001); 0 = off
    entropy: EntropyEstimate = EntropyEstimate.exact  # exact (engine=local) | sampled
    old_logprobs: OldLogprobs = OldLogprobs.sampler  # sampler | recompute
    aggregation: Aggregation = Aggregation.token_mean  # see Aggregation
