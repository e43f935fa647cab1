"""Outcome-level estimators relative to the group: one scalar per trajectory, per token.

A per-group rule maps the rewards of one group (``rewards_G``: the ``group_size``
trajectories of one question, all of them, also those that became no datum) to one scalar
per trajectory; the estimator broadcasts each datum's scalar to its trained tokens (verl's
GRPO is outcome-level too) and subtracts the KL-in-reward penalty per token when there is one.
"""

from __future__ import annotations

import math

import numpy as np

from searchr1.advantages.base import ADVANTAGES, Estimator, TokenAdvantages


def compensated_sum(values) -> float:
    """Python's built-in ``sum`` of floats since 3.12: Neumaier's compensated summation,
    left to right, the compensation added once at the end (CPython ``builtin_sum_impl``)."""
    total, comp = 0.0, 0.0
    for x in map(float, values):
        t = total + x
        comp += (total - t) + x if abs(total) >= abs(x) else (x - t) + total
        total = t
    return total + comp if comp and math.isfinite(comp) else total


def group_mean(rewards_G: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Lab setting: A = r − mean(group), the mean as the lab computes it:
    ``sum(rewards) / len(rewards)`` on its Python (≥ 3.13: ``compensated_sum``).
    ``eps`` is unused (same signature for all)."""
    r = np.asarray(rewards_G, dtype=np.float64)
    return r - compensated_sum(r) / r.size


def grpo_std(rewards_G: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Paper GRPO: A = (r − mean) / (std + eps), std unbiased (ddof 1).

    A group of one has no spread: mean 0 and std 1 are used, so A = r / (1 + eps),
    as the paper's verl code does for singleton groups.
    """
    r = np.asarray(rewards_G, dtype=np.float64)
    if r.size == 1:
        return (r - 0.0) / (1.0 + eps)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def scalar_advantages(rule, batch, eps: float) -> np.ndarray:
    """Each datum's scalar: ``rule`` on its whole group's rewards, at its member index."""
    per_group = {g: rule(batch.rewards_G[g], eps=eps) for g in np.unique(batch.group_D)}
    return np.array([per_group[g][m] for g, m in zip(batch.group_D, batch.member_D)], np.float64)


def broadcast(rule):
    """The estimator of a per-group ``rule``: scalar × mask − penalty, per token."""

    def estimate(batch, cfg, dp=None) -> TokenAdvantages:
        scalar_T = np.repeat(scalar_advantages(rule, batch, cfg.eps), batch.lengths_D)
        adv_T = batch.mask_T * scalar_T
        if batch.penalty_T is not None:
            adv_T = adv_T - batch.penalty_T
        return TokenAdvantages(adv_T)

    return estimate


ADVANTAGES.register("group_mean")(Estimator(broadcast(group_mean), True, group_rule=group_mean))
ADVANTAGES.register("grpo_std")(Estimator(broadcast(grpo_std), True, group_rule=grpo_std))
