"""Schemas of the ``loss`` group (kept free of torch so composing a config stays fast)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KLConfig:
    """Schema of ``loss.kl``: the KL-to-reference term and where it enters."""

    coef: float = 0.0  # KL coefficient; 0 disables the term (lab); paper uses 0.001
    estimator: str = "k3"  # k1 | k2 | k3 | low_var_kl (verl's clamped k3)
    placement: str = "loss"  # reward: subtract from per-token advantages | loss: add to the loss


@dataclass
class LossConfig:
    """Schema of the ``loss`` group: which PyTRIO loss, its scalars, and the KL term."""

    name: str = "importance_sampling"  # cross_entropy | importance_sampling | ppo | cispo | dro
    clip_low: float = 0.2  # ε_low: ratio clipped below at 1 − ε_low (ppo, cispo)
    clip_high: float = 0.2  # ε_high: ratio clipped above at 1 + ε_high (ppo, cispo)
    dro_beta: float = 0.1  # β of DRO's quadratic penalty ½β(logp − q)²
    kl: KLConfig = field(default_factory=KLConfig)  # KL to the reference (coef 0 = off)
