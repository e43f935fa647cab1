"""One datum's shifted per-token layout, its truncation, and what a length limit cuts.

A trajectory carries ``tokens_T``, ``mask_T`` (1 = sampled by the policy) and
``logprobs_T`` (sampler log-probs on sampled tokens, 0 elsewhere). A datum is the standard
next-token layout with ONE right shift applied to every per-token array together::

    model_input   = tokens[:-1]
    target_tokens = tokens[1:], with IGNORE (−100) where the target is not an action token
    logprobs      = logprobs[1:]           # 0 on prompt and observation targets
    advantages    = A · mask[1:] (+ per-token terms)   # 0 on prompt and observation targets

so position i of every loss input describes the prediction of ``tokens[i+1]`` from
``tokens[:i+1]`` (pytrio's ``auto_shift=False`` convention).

Prompt and observation targets get pytrio's ignore label −100 (its client validation
accepts it for every loss): they stay in the context but are not "active" tokens, so
pytrio's ``total_active_tokens`` — the denominator of the token-mean losses — counts exactly
the tokens that carry loss, however long the prompt and the retrieved passages are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # read by field only: the batch layer imports no rollout module
    from searchr1.rollout.types import Trajectory

IGNORE = -100  # pytrio's ignore label for target tokens


def shifted_arrays(
    tokens_T: list[int],
    mask_T: list[int],
    logprobs_T: list[float],
    advantages_T: np.ndarray,
) -> dict[str, np.ndarray]:
    """The shifted per-token arrays of one datum (length T−1 each).

    ``advantages_T`` is per token of the unshifted sequence; it is multiplied by the mask
    so no prompt or observation token can carry advantage, whatever the caller passed.
    """
    if not (len(tokens_T) == len(mask_T) == len(logprobs_T) == len(advantages_T)):
        raise ValueError("tokens, mask, logprobs and advantages must have equal length")
    if len(tokens_T) < 2:
        raise ValueError("a datum needs at least two tokens")
    mask = np.asarray(mask_T, dtype=np.float64)
    targets = np.asarray(tokens_T[1:], dtype=np.int64)
    return {
        "model_input": np.asarray(tokens_T[:-1], dtype=np.int64),
        "target_tokens": np.where(mask[1:] > 0, targets, IGNORE),
        "tokens_next": targets,
        "logprobs": (np.asarray(logprobs_T, dtype=np.float64) * mask)[1:],
        "advantages": (np.asarray(advantages_T, dtype=np.float64) * mask)[1:],
        "mask": mask[1:],
    }


def truncate(traj_arrays: dict[str, np.ndarray], max_tokens: int) -> dict[str, np.ndarray]:
    """Keep the first ``max_tokens`` positions of every shifted array."""
    return {k: v[:max_tokens] for k, v in traj_arrays.items()}


def lost_to_length(traj: Trajectory, max_tokens: int | None) -> bool:
    """Whether a sampled turn of ``traj`` loses its update to a length limit: it was sampled
    from a cut context (kept with mask 0), or runs past ``max_tokens`` datum positions
    (``truncate``); counted so over-long trajectories never shrink the update silently."""
    for turn in traj.turns:
        n = len(turn.sampled_tokens)
        if n and (traj.mask_T[turn.prompt_len] == 0
                  or (max_tokens is not None and turn.prompt_len + n - 1 > max_tokens)):
            return True
    return False
