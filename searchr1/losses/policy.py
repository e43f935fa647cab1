"""The five PyTRIO loss functions, as pure functions on flat per-token tensors.

Formulas follow Tinker's documented definitions (tinker-docs ``/tinker/losses/*``), which
pytrio 0.2.9 accepts under the same names and ``loss_fn_config`` keys. With r = exp(logp − q),
q the sampler's logprob and A the advantage, the per-token losses are:

    cross_entropy        −w·logp
    importance_sampling  −r·A
    ppo                  −min(r·A, clip(r, lo, hi)·A)      lo/hi = clip_{low,high}_threshold
    cispo                −sg(clip(r, lo, hi))·A·logp        (sg = stop-gradient)
    dro                  −(logp·A − ½·β·(logp − q)²)

Tinker sums these over tokens. pytrio's trainer instead normalises each call by totals of
the whole logical batch (``GradientAccumulationTotals``, carried by every micro-batch), but
does not document which total each loss uses. Our choice, written down once here:

- cross_entropy, importance_sampling, ppo, cispo: Σ over active tokens / total_active_tokens
  (labels ≠ −100, past the auto-shifted first label; for cross_entropy also weight ≠ 0).
- dro: Σ over *advantage tokens* (active and A ≠ 0) / total_advantage_tokens, as pytrio's
  planner comment says that total exists for DRO. Restricting the numerator too keeps the
  quadratic penalty off observation tokens, whose q is 0 by construction.

Each function returns ``(loss, sums)``: ``loss`` is this micro-batch's share of the
logical-batch loss (its token sum / ``denominator``), ready for ``backward``; ``sums`` are
additive numbers (``loss_sum``, ``token_count``, ``ratio_sum``, ``clipped_count``) that
``finalize_metrics`` turns into means once all micro-batches are in. Defaults of the
config scalars are Tinker's: ppo 0.8/1.2, cispo one-sided 0.0/4.0, dro β = 0.1 (the
default of a Tinker-compatible executor; Tinker does not document one).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from searchr1.losses.config import LossConfig  # noqa: F401  (re-exported)
from searchr1.utils.registry import Registry

Sums = dict[str, float]
LossFn = Callable[..., tuple[torch.Tensor, Sums]]
_TENSOR_ARGS = ("logprobs_T", "sampling_logprobs_T", "advantages_T", "weights_T", "denominator")


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: its function and which pytrio total normalises it."""

    fn: LossFn
    denominator: Literal["total_active_tokens", "total_advantage_tokens"]


POLICY_LOSSES: Registry[LossSpec] = Registry("loss")


def _register(name: str, denominator: str = "total_active_tokens") -> Callable[[LossFn], LossFn]:
    def decorator(fn: LossFn) -> LossFn:
        POLICY_LOSSES.register(name)(LossSpec(fn, denominator))  # type: ignore[arg-type]
        return fn

    return decorator


def loss_fn_config(name: str, clip_low: float, clip_high: float, dro_beta: float) -> dict | None:
    """The ``loss_fn_config`` pytrio expects for ``name``: ε → absolute thresholds, β → beta."""
    if name in ("ppo", "cispo"):
        return {"clip_low_threshold": 1.0 - clip_low, "clip_high_threshold": 1.0 + clip_high}
    if name == "dro":
        return {"beta": dro_beta}
    return None


def validate_loss_config(name: str, config: dict[str, object] | None) -> dict[str, float]:
    """Check ``loss_fn_config`` against the loss's keyword scalars; typos fail loudly."""
    allowed = set(inspect.signature(POLICY_LOSSES.get(name).fn).parameters) - set(_TENSOR_ARGS)
    unknown = set(config or {}) - allowed
    if unknown:
        raise ValueError(f"{name} does not accept loss_fn_config keys {sorted(unknown)}; valid: {sorted(allowed)}")
    scalars = {key: float(value) for key, value in (config or {}).items()}  # type: ignore[arg-type]
    if not all(math.isfinite(v) for v in scalars.values()):
        raise ValueError(f"{name} loss_fn_config values must be finite, got {scalars}")
    return scalars


def _reduce(
    per_token_T: torch.Tensor, domain_T: torch.Tensor, denominator: float, **extra: torch.Tensor
) -> tuple[torch.Tensor, Sums]:
    """Sum ``per_token_T`` over ``domain_T`` (bool), divide by ``denominator``; add sums."""
    total = torch.where(domain_T, per_token_T, torch.zeros_like(per_token_T)).sum()
    sums = {"loss_sum": float(total.detach()), "token_count": float(domain_T.sum())}
    sums.update({k: float(v.detach()) for k, v in extra.items()})
    return total / denominator, sums


def _ratio(logprobs_T: torch.Tensor, sampling_logprobs_T: torch.Tensor, active_T: torch.Tensor):
    """r = exp(logp − q) on active tokens, 1 elsewhere (so padding never overflows)."""
    log_ratio_T = torch.where(active_T, logprobs_T - sampling_logprobs_T, torch.zeros_like(logprobs_T))
    return log_ratio_T, torch.exp(log_ratio_T)


def _check_thresholds(low: float, high: float) -> None:
    if not (0.0 <= low <= high):
        raise ValueError(f"clip thresholds must satisfy 0 <= low <= high, got {low}, {high}")


Terms = tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]  # per-token loss, domain, extras
TermsFn = Callable[..., Terms]
#: name → per-token terms (loss per token, bool domain, per-token extras such as ratio);
#: the update's custom objective aggregates these its own way (``losses/objective.py``)
POLICY_TERMS: dict[str, TermsFn] = {}


def _with_terms(name: str, denominator: str = "total_active_tokens") -> Callable[[TermsFn], LossFn]:
    """Register ``terms`` as loss ``name``: the reduced loss is Σ_domain terms / denominator."""

    def decorator(terms: TermsFn) -> TermsFn:
        POLICY_TERMS[name] = terms

        def loss(logprobs_T, sampling_logprobs_T, advantages_T, weights_T, denominator, *args, **kw):
            per_token_T, domain_T, extras = terms(
                logprobs_T, sampling_logprobs_T, advantages_T, weights_T, *args, **kw)
            sums = {k: (v * domain_T).sum() for k, v in extras.items()}
            return _reduce(per_token_T, domain_T, denominator, **sums)

        loss.__signature__ = _loss_signature(terms)  # type: ignore[attr-defined]
        loss.__doc__ = terms.__doc__
        loss.terms = terms  # type: ignore[attr-defined]
        _register(name, denominator)(loss)
        return loss  # the module-level name is the reduced loss (pytrio's contract)

    return decorator


def _loss_signature(terms: TermsFn) -> inspect.Signature:
    """``terms``' signature with ``denominator`` inserted after the tensors (pytrio order)."""
    params = list(inspect.signature(terms).parameters.values())
    denom = inspect.Parameter("denominator", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return inspect.Signature(params[:4] + [denom] + params[4:])


@_with_terms("cross_entropy")
def cross_entropy(logprobs_T, sampling_logprobs_T, advantages_T, weights_T) -> Terms:
    """Weighted negative log-likelihood −Σ w·logp / N (SFT); q and A are unused."""
    del sampling_logprobs_T, advantages_T
    return -weights_T * logprobs_T, weights_T != 0, {}


@_with_terms("importance_sampling")
def importance_sampling(logprobs_T, sampling_logprobs_T, advantages_T, weights_T) -> Terms:
    """REINFORCE with an unclipped importance ratio: −Σ r·A / N (the lab's loss)."""
    active_T = weights_T != 0
    _, ratio_T = _ratio(logprobs_T, sampling_logprobs_T, active_T)
    return -weights_T * ratio_T * advantages_T, active_T, {"ratio_sum": ratio_T}


@_with_terms("ppo")
def ppo(
    logprobs_T, sampling_logprobs_T, advantages_T, weights_T,
    clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2,
) -> Terms:
    """Clipped surrogate −Σ min(r·A, clip(r)·A) / N; counts tokens where the clip binds."""
    _check_thresholds(clip_low_threshold, clip_high_threshold)
    active_T = weights_T != 0
    _, ratio_T = _ratio(logprobs_T, sampling_logprobs_T, active_T)
    unclipped_T = ratio_T * advantages_T
    clipped_T = ratio_T.clamp(clip_low_threshold, clip_high_threshold) * advantages_T
    per_token_T = -weights_T * torch.minimum(unclipped_T, clipped_T)
    binds_T = (clipped_T < unclipped_T).to(ratio_T.dtype)  # the min picked the clipped term
    return per_token_T, active_T, {"ratio_sum": ratio_T, "clipped_count": binds_T}


@_with_terms("cispo")
def cispo(
    logprobs_T, sampling_logprobs_T, advantages_T, weights_T,
    clip_low_threshold: float = 0.0, clip_high_threshold: float = 4.0,
) -> Terms:
    """−Σ sg(clip(r))·A·logp / N: clipping bounds the coefficient but never zeros a gradient."""
    _check_thresholds(clip_low_threshold, clip_high_threshold)
    active_T = weights_T != 0
    _, ratio_T = _ratio(logprobs_T, sampling_logprobs_T, active_T)
    coef_T = ratio_T.clamp(clip_low_threshold, clip_high_threshold).detach()
    per_token_T = -weights_T * coef_T * advantages_T * logprobs_T
    outside_T = ((ratio_T < clip_low_threshold) | (ratio_T > clip_high_threshold)).to(ratio_T.dtype)
    return per_token_T, active_T, {"ratio_sum": ratio_T, "clipped_count": outside_T}


@_with_terms("dro", denominator="total_advantage_tokens")
def dro(logprobs_T, sampling_logprobs_T, advantages_T, weights_T, beta: float = 0.1) -> Terms:
    """−Σ (logp·A − ½β(logp − q)²) / N_adv over tokens with A ≠ 0 (see module docstring)."""
    if beta < 0:
        raise ValueError(f"DRO beta must be non-negative, got {beta}")
    domain_T = (weights_T != 0) & (advantages_T != 0)
    log_ratio_T, ratio_T = _ratio(logprobs_T, sampling_logprobs_T, domain_T)
    objective_T = logprobs_T * advantages_T - 0.5 * beta * log_ratio_T.square()
    return -weights_T * objective_T, domain_T, {"ratio_sum": ratio_T}


def finalize_metrics(sums: Sums) -> dict[str, float]:
    """Turn summed micro-batch numbers into pytrio's metric names plus ratio/clip means.

    ``loss_sum`` and ``token_count`` stay sums and ``loss_mean = loss_sum / token_count``,
    exactly as pytrio aggregates its trainer's per-chunk metrics.
    """
    count = sums.get("token_count", 0.0)
    out = {"loss_sum": sums.get("loss_sum", 0.0), "token_count": count}
    out["loss_mean"] = out["loss_sum"] / count if count > 0 else 0.0
    if "ratio_sum" in sums:
        out["ratio_mean"] = sums["ratio_sum"] / count if count > 0 else 0.0
    if "clipped_count" in sums:
        out["clip_fraction"] = sums["clipped_count"] / count if count > 0 else 0.0
    return out
