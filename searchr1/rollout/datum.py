"""Trajectory → ``pytrio.Datum``: one datum per trajectory, observation tokens masked, in
the batch layer's shifted layout (``searchr1/batch/shifted.py``: ``shifted_arrays``, ``truncate``).
"""

from __future__ import annotations

import numpy as np
import pytrio

from searchr1.batch.shifted import shifted_arrays, truncate
from searchr1.rollout.types import Trajectory


class PrefixError(ValueError):
    """A turn's prompt does not extend the trajectory's tokens so far."""


def check_prefix(previous_T: list[int], prompt_T: list[int]) -> None:
    """Raise ``PrefixError`` unless ``prompt_T`` starts with ``previous_T``."""
    n = len(previous_T)
    if len(prompt_T) < n or prompt_T[:n] != previous_T:
        first = next(
            (i for i, (a, b) in enumerate(zip(previous_T, prompt_T)) if a != b),
            min(n, len(prompt_T)),
        )
        raise PrefixError(
            f"next prompt does not extend the previous tokens: first difference at "
            f"token {first} (previous has {n} tokens, prompt has {len(prompt_T)})"
        )


def token_advantages(traj: Trajectory, advantage: float) -> np.ndarray:
    """The scalar outcome advantage broadcast to every action token (0 elsewhere)."""
    return np.asarray(traj.mask_T, dtype=np.float64) * advantage


def to_datum(arrays: dict[str, np.ndarray]) -> pytrio.Datum:
    """Wrap shifted arrays into a ``pytrio.Datum`` (float32 logprobs/advantages)."""
    return pytrio.Datum(
        model_input=pytrio.ModelInput.from_ints(arrays["model_input"].tolist()),
        loss_fn_inputs={
            "target_tokens": arrays["target_tokens"].astype(np.int64),
            "logprobs": arrays["logprobs"].astype(np.float32),
            "advantages": arrays["advantages"].astype(np.float32),
        },
    )


def build_datum(
    traj: Trajectory, advantages_T: np.ndarray, max_tokens: int
) -> tuple[pytrio.Datum, dict[str, np.ndarray]]:
    """One datum for a trajectory, and the shifted arrays it was built from."""
    arrays = shifted_arrays(traj.tokens_T, traj.mask_T, traj.logprobs_T, advantages_T)
    arrays = truncate(arrays, max_tokens)
    return to_datum(arrays), arrays
