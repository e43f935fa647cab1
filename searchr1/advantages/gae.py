"""Per-token advantages from a critic: GAE with observation tokens as environment steps.

Faithful to verl's ``compute_gae_advantage_return`` (``core_algos.py``) with Search-R1's
state masking: the reward sits on the last action token (minus ``coef·KL`` per action
token when KL is in the reward, verl's ``apply_kl_penalty``), and the recursion

    δ_t = r_t + γ·V_next − V_t,   A_t = δ_t + γλ·A_next,   R_t = A_t + V_t

runs over action tokens only: an observation (retrieved passages) between two turns is an
environment transition, so an action token's "next" is the next *action* token (observation
tokens carry no value target and no advantage; they are 0 in the outputs). ``V_next`` is 0
after the last action token. ``whiten`` is verl's ``masked_whiten`` over the action tokens of
the whole batch: (A − mean) / sqrt(var + 1e-8), var with Bessel's correction, mean added
back = no (``shift_mean=True``).

``advantage.gae_domain`` picks the tokens of that recursion. ``action`` (above): an
action token's δ bootstraps from the next *action* token's value. ``response`` (verl, the
paper presets): every token after the prompt is a step, observations included —
``compute_gae_advantage_return`` runs over all response positions, ``masked_whiten`` and
the critic's value loss use the response's attention mask, and only the policy loss and the
KL penalty use Search-R1's ``info_mask`` (``response_mask`` below gives that domain; the
outcome reward then sits on the last response token). With γ = λ = 1 both give the same
returns R_t = Σ rewards after t; they differ in the whitening statistics and in the value
targets the critic is fitted on.
"""

from __future__ import annotations

import numpy as np

from searchr1.advantages.base import ADVANTAGES, Estimator, TokenAdvantages


def gae(
    rewards_T: np.ndarray, values_T: np.ndarray, mask_T: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """(advantages_T, returns_T) of one trajectory; 0 where ``mask_T`` is 0."""
    rewards, values = np.asarray(rewards_T, float), np.asarray(values_T, float)
    mask = np.asarray(mask_T) > 0
    if not (rewards.shape == values.shape == mask.shape):
        raise ValueError("rewards, values and mask must have the same shape")
    adv, ret = np.zeros_like(rewards), np.zeros_like(rewards)
    next_value, next_adv = 0.0, 0.0
    for t in np.flatnonzero(mask)[::-1]:
        delta = rewards[t] + gamma * next_value - values[t]
        next_adv = delta + gamma * lam * next_adv
        adv[t], ret[t] = next_adv, next_adv + values[t]
        next_value = values[t]
    return adv, ret


def outcome_rewards(mask_T: np.ndarray, reward: float) -> np.ndarray:
    """The scalar outcome reward on the last action token, 0 elsewhere."""
    out = np.zeros(len(mask_T), dtype=float)
    idx = np.flatnonzero(np.asarray(mask_T) > 0)
    if idx.size:
        out[idx[-1]] = reward
    return out


def response_mask(mask_T: np.ndarray) -> np.ndarray:
    """1 from the first action token to the end (the response: turns and observations)."""
    mask = np.asarray(mask_T) > 0
    out = np.zeros(len(mask), dtype=float)
    idx = np.flatnonzero(mask)
    if idx.size:
        out[idx[0]:] = 1.0
    return out


def gae_domains(masks_D: list[np.ndarray], domain: str) -> list[np.ndarray]:
    """The tokens GAE runs over per datum: the action mask, or the response (verl)."""
    if getattr(domain, "value", domain) == "response":
        return [response_mask(m) for m in masks_D]
    return [np.asarray(m, float) for m in masks_D]


def whiten(advantages_D: list[np.ndarray], masks_D: list[np.ndarray], all_sum=None) -> list[np.ndarray]:
    """verl's ``masked_whiten`` across the batch's action tokens; non-action tokens stay 0.

    ``all_sum`` (data parallel: sums a list over ranks) makes the mean and variance those
    of every rank's action tokens together, from the global n, Σx and Σ(x − x̄)².
    """
    parts = [a[np.asarray(m) > 0] for a, m in zip(advantages_D, masks_D)]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    if all_sum is not None:
        n, total = all_sum([float(flat.size), float(flat.sum())])
        mean = total / max(n, 1.0)
        (sq,) = all_sum([float(np.square(flat - mean).sum())])
        if n < 2:
            return [np.asarray(a, float).copy() for a in advantages_D]
        var = sq / (n - 1)
    elif flat.size < 2:
        return [np.asarray(a, float).copy() for a in advantages_D]
    else:
        mean, var = flat.mean(), flat.var(ddof=1)
    scale = 1.0 / np.sqrt(var + 1e-8)
    return [np.where(np.asarray(m) > 0, (a - mean) * scale, 0.0) for a, m in zip(advantages_D, masks_D)]


def ppo_gae(batch, cfg, dp=None) -> TokenAdvantages:
    """GAE per datum over ``advantage.gae_domain``'s tokens, whitened over every rank's
    domain tokens (``dp``), with returns and the tokens the critic is fitted on.

    Rewards per token: the outcome reward on the domain's last token, minus the
    KL-in-reward penalty (``penalty_T``) when there is one; values from the critic (``values_T``).
    """
    domains = gae_domains(batch.rows("mask_T"), getattr(cfg, "gae_domain", "action"))
    penalties = batch.rows("penalty_T") if batch.penalty_T is not None else [0.0] * batch.size
    pairs = [gae(outcome_rewards(m, r) - p, v, m, cfg.gamma, cfg.lam)
             for m, r, p, v in zip(domains, batch.reward_D, penalties, batch.rows("values_T"))]
    all_sum = dp.all_sum if dp is not None and dp.active else None
    adv_D = whiten([a for a, _ in pairs], domains, all_sum)
    flat = lambda xs: np.concatenate(xs) if xs else np.zeros(0)
    return TokenAdvantages(flat(adv_D), flat([r for _, r in pairs]), flat(domains))


ADVANTAGES.register("ppo_gae")(Estimator(ppo_gae, group_baseline=False, needs_critic=True))
