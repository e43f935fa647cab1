"""Advantage estimators over whole groups of trajectory rewards.

An estimator maps the rewards of one group (``rewards_G``: the ``group_size`` trajectories
of one question) to one scalar advantage per trajectory. Advantages are always computed
on the whole group, before any micro-batching. ``ADVANTAGES`` is keyed by the config name
``advantage.name``. ``advantage=ppo_gae`` is per token, from a critic: ``advantages/gae.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from searchr1.utils.registry import Registry

AdvantageFn = Callable[..., np.ndarray]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage")


@ADVANTAGES.register("group_mean")
def group_mean(rewards_G: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Lab setting: A = r − mean(group). ``eps`` is unused (same signature for all)."""
    r = np.asarray(rewards_G, dtype=np.float64)
    return r - r.mean()


@ADVANTAGES.register("grpo_std")
def grpo_std(rewards_G: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Paper GRPO: A = (r − mean) / (std + eps), std unbiased (ddof 1).

    A group of one has no spread: mean 0 and std 1 are used, so A = r / (1 + eps),
    as the paper's verl code does for singleton groups.
    """
    r = np.asarray(rewards_G, dtype=np.float64)
    if r.size == 1:
        return (r - 0.0) / (1.0 + eps)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def is_degenerate(rewards_G: np.ndarray) -> bool:
    """A group whose rewards are all equal carries no learning signal."""
    r = np.asarray(rewards_G, dtype=np.float64)
    return bool(r.size > 1 and np.all(r == r[0]))


def compute_group_advantages(
    rewards_by_group: list[np.ndarray], name: str, eps: float, skip_degenerate: bool
) -> tuple[list[np.ndarray | None], float]:
    """Advantages for every group, ``None`` for groups skipped as degenerate.

    Returns (advantages per group, degenerate-group rate).
    """
    fn = ADVANTAGES.get(name)
    out: list[np.ndarray | None] = []
    degenerate = 0
    for rewards_G in rewards_by_group:
        if is_degenerate(rewards_G):
            degenerate += 1
            if skip_degenerate:
                out.append(None)
                continue
        out.append(fn(rewards_G, eps=eps))
    rate = degenerate / len(rewards_by_group) if rewards_by_group else 0.0
    return out, rate
