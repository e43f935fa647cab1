"""The actor's full objective on one mini-batch: policy loss − entropy bonus + KL term,
each aggregated the same way (``aggregation.aggregate``), as verl's ``dp_actor``:

    loss = agg(pg_T) − entropy_coef · agg(H_T) + kl_coef · agg(KL_T)

Inputs are per-datum 1-D tensors (shifted datum layout): the trainer's log-probs ``logp``
(with gradient), the ratio baseline ``q``, advantages, the action-token mask, optional
reference log-probs, plus each datum's micro-batch index.

Entropy: with ``ent_D`` (``loss.entropy=exact``; the local engine computes it in its chunked
head) H_T is the full distribution's entropy at each position, as verl's
``entropy_from_logits``. Without it (``loss.entropy=sampled``: PyTRIO's client API exposes
only the target tokens' log-probs) the bonus uses the sampled-token estimate H ≈ −log π(y).
Its value is −logp and its gradient is that of −½·logp², i.e. −logp·∇logp, the
score-function gradient of the entropy (E_y[−log π(y)·∇log π(y)] = ∇H on-policy); it is
unbiased on-policy and off by the importance ratio after the first mini-batch of a rollout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from searchr1.losses.aggregation import aggregate
from searchr1.losses.config import Aggregation, KLConfig
from searchr1.losses.kl import kl_estimate
from searchr1.losses.policy import POLICY_LOSSES


@dataclass(frozen=True)
class ObjectiveSpec:
    """The scalars of the objective (a slice of ``LossConfig`` plus micro-batching)."""

    name: str  # policy loss name (POLICY_LOSSES)
    scalars: dict  # its loss_fn_config (thresholds, beta)
    aggregation: Aggregation
    entropy_coef: float
    kl: KLConfig | None  # KL in the loss; None = not in the loss
    n_seq: float  # trajectories the mini-batch stands for (seq_mean_* denominators)
    n_micro: int  # micro-batches of the mini-batch (microbatch_token_mean)
    tokens: float | None = None  # global domain tokens of the mini-batch (data parallel)
    micro_tokens: tuple | None = None  # global domain tokens per micro-batch (data parallel)


def entropy_surrogate(logp_T: torch.Tensor) -> torch.Tensor:
    """Per-token −logp in value, −logp·∇logp in gradient (module docstring)."""
    half_sq_T = -0.5 * logp_T.square()
    return -logp_T.detach() + (half_sq_T - half_sq_T.detach())


def actor_objective(
    spec: ObjectiveSpec,
    logp_D: list[torch.Tensor],
    q_D: list[torch.Tensor],
    adv_D: list[torch.Tensor],
    mask_D: list[torch.Tensor],
    micro_D: list[int],
    ref_D: list[torch.Tensor] | None = None,
    ent_D: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of one mini-batch; ``loss`` is differentiable in ``logp_D`` (and
    ``ent_D``, the exact per-position entropies, when given)."""
    loss, sums = objective_sums(spec, logp_D, q_D, adv_D, mask_D, micro_D, ref_D, ent_D)
    return loss, objective_metrics(sums)


def objective_sums(
    spec: ObjectiveSpec,
    logp_D: list[torch.Tensor],
    q_D: list[torch.Tensor],
    adv_D: list[torch.Tensor],
    mask_D: list[torch.Tensor],
    micro_D: list[int],
    ref_D: list[torch.Tensor] | None = None,
    ent_D: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The objective of some whole datums of a mini-batch, and its metrics as sums.

    With the mini-batch's denominators given in ``spec`` (``tokens``, ``micro_tokens``,
    ``n_seq``), every aggregation is a sum over datums, so the loss of a mini-batch is the
    sum of the losses of any split of its datums — the local engine then takes one gradient
    pass per micro-batch (``SeparableObjective``). ``objective_metrics`` of summed ``sums``
    gives the whole mini-batch's metrics. Without those denominators it is only the
    objective of exactly these datums.
    """
    lp = torch.cat([x.reshape(-1) for x in logp_D])
    dev, dt = lp.device, lp.dtype
    q, adv, w = (torch.cat([x.reshape(-1) for x in xs]).to(dev, dt) for xs in (q_D, adv_D, mask_D))
    seq = torch.cat([torch.full((len(x),), i, dtype=torch.long) for i, x in enumerate(logp_D)]).to(dev)
    micro = torch.cat([torch.full((len(x),), m, dtype=torch.long) for x, m in zip(logp_D, micro_D)]).to(dev)
    agg = dict(mode=spec.aggregation, seq_T=seq, n_seq=spec.n_seq, micro_T=micro, n_micro=spec.n_micro,
               tokens=spec.tokens, micro_tokens=spec.micro_tokens)
    terms = POLICY_LOSSES.get(spec.name).fn.terms
    pg_T, domain_T, extras = terms(lp, q, adv, w, **spec.scalars)
    loss = aggregate(pg_T, domain_T, **agg)
    sums = {"loss_policy": loss.detach(), "token_count": domain_T.sum().to(dt)}
    sums.update({f"extra:{k}": (v.detach() * domain_T).sum() for k, v in extras.items()})
    if spec.entropy_coef:
        ent_T = (entropy_surrogate(lp) if ent_D is None
                 else torch.cat([x.reshape(-1) for x in ent_D]).to(dev, dt))
        ent = aggregate(ent_T, domain_T, **agg)
        loss = loss - spec.entropy_coef * ent
        sums["entropy"] = ent.detach()
    if spec.kl is not None and spec.kl.coef and ref_D is not None:
        ref = torch.cat([x.reshape(-1) for x in ref_D]).to(dev, dt)
        kl_T = torch.where(domain_T, kl_estimate(lp, ref, spec.kl.estimator), torch.zeros_like(lp))
        kl = aggregate(kl_T, domain_T, **agg)
        loss = loss + spec.kl.coef * kl
        sums["kl"] = kl.detach()
    sums["loss_mean"] = loss.detach()
    return loss, sums


def objective_metrics(sums: dict) -> dict[str, float]:
    """Metrics from (summed) ``objective_sums``: the aggregated terms as they are, the policy
    loss's per-token extras as means over the domain tokens."""
    n = max(float(sums["token_count"]), 1.0)
    out = {}
    for key, value in sums.items():
        if key.startswith("extra:"):
            name = key[len("extra:"):].replace("_sum", "_mean").replace("clipped_count", "clip_fraction")
            out[name] = float(value) / n
        else:
            out[key] = float(value)
    return out


@dataclass(frozen=True)
class SeparableObjective:
    """A custom loss that is a sum over datums, so an engine may take its gradient in one
    pass per micro-batch instead of scoring the whole call first.

    ``part(indices, logp_D, ent_D)`` → (loss, sums) of the call's datums ``indices`` (their
    log-probs with gradient; ``ent_D`` the exact entropies or None); ``metrics`` turns the
    sums added over all parts into the call's metrics.
    """

    part: Callable
    metrics: Callable[[dict], dict[str, float]] = objective_metrics
