"""Supervised fine-tuning on oracle trajectories through the engine's training client.

Every step takes ``batch_size`` trajectories (a seeded shuffle, cycled), builds one
``cross_entropy`` datum per trajectory and calls ``forward_backward`` then ``optim_step`` —
the pytrio ``TrainingClient`` API, so it runs the same on ``engine=local`` and
``engine=trio``. A datum is the rollout's own layout (``batch.shifted.shifted_arrays``):
targets are −100 and weights 0 on prompt and observation tokens, so only the oracle's own
turns carry loss. The loss reported is the token-mean negative log-likelihood
Σ w·(−logp) / Σ w over the batch, computed from the returned target logprobs (engine
independent; pytrio's metric names are not relied on).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import numpy as np
import pytrio
from pytrio.types import AdamParams
from tqdm.auto import tqdm

from searchr1.batch.shifted import shifted_arrays, truncate
from searchr1.rollout.types import Trajectory

log = logging.getLogger(__name__)


def sft_datum(traj: Trajectory, max_tokens: int) -> pytrio.Datum:
    """A ``cross_entropy`` datum: loss on the trajectory's sampled (mask 1) tokens only."""
    zeros = np.zeros(len(traj.tokens_T))
    arrays = truncate(shifted_arrays(traj.tokens_T, traj.mask_T, traj.logprobs_T, zeros),
                      max_tokens)
    return pytrio.Datum(
        model_input=pytrio.ModelInput.from_ints(arrays["model_input"].tolist()),
        loss_fn_inputs={"target_tokens": arrays["target_tokens"].astype(np.int64),
                        "weights": arrays["mask"].astype(np.float32)},
    )


def mean_nll(datums: list[pytrio.Datum], outputs: list[dict]) -> float:
    """Σ w·(−logp) / Σ w over a batch, from per-datum target logprobs."""
    num = den = 0.0
    for datum, out in zip(datums, outputs):
        logp = np.asarray(_numpy(out["logprobs"]), dtype=np.float64)
        w = np.asarray(_numpy(datum.loss_fn_inputs["weights"]), dtype=np.float64)[: len(logp)]
        num += float(-(w * logp).sum())
        den += float(w.sum())
    return num / den if den else 0.0


def heldout_nll(client, trajectories: list[Trajectory], max_tokens: int) -> float:
    """Token-mean cross-entropy of ``trajectories`` under the client's current weights."""
    if not trajectories:
        return float("nan")
    datums = [sft_datum(t, max_tokens) for t in trajectories]
    out = client.forward(datums, "cross_entropy").result()
    return mean_nll(datums, out.loss_fn_outputs)


def run_sft(client, trajectories: list[Trajectory], *, steps: int, batch_size: int,
            learning_rate: float, seed: int, adam: dict, max_tokens: int,
            log_fn: Callable[[dict[str, float], int], None] | None = None) -> list[float]:
    """``steps`` SFT steps; returns the training loss of each step (before its update)."""
    if not trajectories:
        raise ValueError("warm start: no oracle trajectories to train on")
    order = list(range(len(trajectories)))
    random.Random(f"warmstart-order:{seed}").shuffle(order)
    losses: list[float] = []
    # one forward-backward of batch_size trajectories per step: minutes on a CPU, so a bar
    # (its loss is normalised over the whole batch, so the step is not split to count inside it)
    bar = tqdm(total=steps, desc=f"sft ({batch_size} trajectories a step)", unit="step")
    for step in range(steps):
        picks = [order[(step * batch_size + i) % len(order)] for i in range(batch_size)]
        datums = [sft_datum(trajectories[i], max_tokens) for i in picks]
        bar.set_postfix_str(f"step {step + 1}: forward-backward of "
                            f"{sum(len(d.model_input) for d in datums)} tokens", refresh=True)
        out = client.forward_backward(datums, "cross_entropy").result()
        client.optim_step(AdamParams(learning_rate=learning_rate, **adam)).result()
        losses.append(mean_nll(datums, out.loss_fn_outputs))
        bar.update(1)
        bar.set_postfix_str(f"loss {losses[-1]:.4f}", refresh=True)
        if log_fn is not None:
            log_fn({"warmstart/loss": losses[-1]}, step + 1)
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == steps:
            log.info("warm start step %d/%d: loss %.4f", step + 1, steps, losses[-1])
    bar.close()
    return losses


def _numpy(value) -> np.ndarray:
    if hasattr(value, "to_numpy"):
        return value.to_numpy()
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)
