"""KL to the frozen reference policy: per-token estimators and the two placements.

The reference is the base model with its LoRA adapters switched off. Search-R1 uses two
placements, and both act on action tokens only (``mask_T`` = 1), never on prompt or
retrieved-observation tokens:

- ``reward`` (paper PPO, k1, coef 0.001): the per-token penalty ``coef·KL`` is subtracted
  from the per-token signal (``kl_penalty_advantages``), before the policy loss sees it.
- ``loss`` (paper GRPO, ``low_var_kl``, coef 0.001): ``coef·Σ KL / denominator`` is added to
  the loss (``kl_loss_term``), so its gradient flows through the current logprobs.

Estimators, with d = ref − logp (Schulman's "Approximating KL divergence" naming, as verl):
k1 = logp − ref; k2 = ½(logp − ref)²; k3 = exp(d) − d − 1 (unbiased, always ≥ 0);
``low_var_kl`` is verl's k3: d clamped to [−20, 20] before the exp and the result clamped to
[−10, 10], which keeps one badly off-policy token from dominating the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from searchr1.losses.config import KLConfig  # noqa: F401  (re-exported)
from searchr1.utils.registry import Registry

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("kl estimator")


@KL_ESTIMATORS.register("k1")
def k1(logp_T: torch.Tensor, ref_logp_T: torch.Tensor) -> torch.Tensor:
    """k1 = log π − log π_ref: unbiased, high variance, can be negative per token."""
    return logp_T - ref_logp_T


@KL_ESTIMATORS.register("k2")
def k2(logp_T: torch.Tensor, ref_logp_T: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π − log π_ref)²: biased, low variance, ≥ 0."""
    return 0.5 * (logp_T - ref_logp_T).square()


@KL_ESTIMATORS.register("k3")
def k3(logp_T: torch.Tensor, ref_logp_T: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) − d − 1 with d = log π_ref − log π: unbiased and ≥ 0."""
    d_T = ref_logp_T - logp_T
    return torch.exp(d_T) - d_T - 1.0


@KL_ESTIMATORS.register("low_var_kl")
def low_var_kl(logp_T: torch.Tensor, ref_logp_T: torch.Tensor) -> torch.Tensor:
    """verl's ``low_var_kl``: k3 with d clamped to [−20, 20] and the value to [−10, 10]."""
    d_T = (ref_logp_T - logp_T).clamp(-20.0, 20.0)
    return (torch.exp(d_T) - d_T - 1.0).clamp(-10.0, 10.0)


def kl_estimate(logp_T: torch.Tensor, ref_logp_T: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate, same shape as ``logp_T``; unknown names list the valid ones."""
    return KL_ESTIMATORS.get(estimator)(logp_T, ref_logp_T)


def _masked_kl(
    logp_T: torch.Tensor, ref_logp_T: torch.Tensor, mask_T: torch.Tensor, estimator: str
) -> torch.Tensor:
    """KL on action tokens, exactly 0 elsewhere (no inf·0 from observation tokens)."""
    kl_T = kl_estimate(logp_T, ref_logp_T, estimator)
    return torch.where(mask_T > 0, kl_T * mask_T, torch.zeros_like(kl_T))


def kl_penalty_advantages(
    advantages_T: torch.Tensor,
    logp_sampler_T: torch.Tensor,
    ref_logp_T: torch.Tensor,
    mask_T: torch.Tensor,
    coef: float,
    estimator: str,
) -> torch.Tensor:
    """Return advantages − coef·KL(sampler ‖ ref) on action tokens ("KL in reward").

    Works on any per-token signal: pass per-token rewards instead of advantages to fold the
    penalty in before GAE, as the paper's PPO does. Tokens with mask 0 are returned as is,
    so observation tokens keep their zero advantage. No gradient: all inputs are data.
    """
    with torch.no_grad():
        kl_T = _masked_kl(logp_sampler_T, ref_logp_T, mask_T, estimator)
        return advantages_T - coef * kl_T


def kl_loss_term(
    logp_T: torch.Tensor,
    ref_logp_T: torch.Tensor,
    mask_T: torch.Tensor,
    coef: float,
    estimator: str,
    denominator: float,
) -> torch.Tensor:
    """Scalar coef·Σ_t mask·KL / denominator ("KL in loss"), differentiable in ``logp_T``.

    ``denominator`` is the logical batch's token count (pytrio's ``total_active_tokens``),
    so that micro-batched calls add up to the full batch's value.
    """
    kl_T = _masked_kl(logp_T, ref_logp_T, mask_T, estimator)
    return coef * kl_T.sum() / denominator
