"""The critic's clipped value loss (PPO), as in verl's ``compute_value_loss``.

With v the new prediction, v_old the rollout-time value and R the GAE return, per action
token: v_clip = clamp(v, v_old − c, v_old + c); loss = ½ · max((v − R)², (v_clip − R)²).
``vf_clipfrac`` is the share of tokens where the clipped term is the larger one. The
reduction over tokens is the caller's (``aggregation.aggregate``), so the critic uses the
same micro-batch token-mean as the actor in the paper presets.
"""

from __future__ import annotations

import torch


def clipped_value_terms(
    values_T: torch.Tensor, old_values_T: torch.Tensor, returns_T: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token value loss ½·max(unclipped², clipped²) and the clipped-wins indicator."""
    if cliprange < 0:
        raise ValueError(f"cliprange_value must be >= 0, got {cliprange}")
    clipped_T = old_values_T + (values_T - old_values_T).clamp(-cliprange, cliprange)
    loss1_T = (values_T - returns_T).square()
    loss2_T = (clipped_T - returns_T).square()
    return 0.5 * torch.maximum(loss1_T, loss2_T), (loss2_T > loss1_T).to(values_T.dtype)


def explained_variance(values, returns) -> float:
    """1 − Var(R − v) / Var(R) over action tokens (0 when Var(R) is 0)."""
    var = float(torch.as_tensor(returns).var(unbiased=False))
    if var == 0.0:
        return 0.0
    diff = torch.as_tensor(returns) - torch.as_tensor(values)
    return 1.0 - float(diff.var(unbiased=False)) / var
