"""The step's scoring passes, each filling columns of the step batch from its own inputs.

- ``observation_logprobs``: the sampling weights' log-prob of every token of a trajectory
  (the observation-mask ablation's old log-probs for retrieved tokens; before batch build).
- ``old_logprobs``: the ratio baseline — the sampler's log-probs (``loss.old_logprobs=sampler``,
  the lab's) or the trainer's, recomputed before the first update (``recompute``, verl's
  ``old_log_prob``). Datums the update scores on-policy (mini-batch 0, see
  ``UpdateSettings.first_minibatch_on_policy``) are left out of the recompute pass: their rows
  hold the sampler's log-probs as a placeholder until their update call fills them.
- ``reference_logprobs``: the frozen base model's log-probs of the targets (KL), batched on
  the local engine, one concurrent ``compute_logprobs_async`` per datum on PyTRIO.
- ``kl_stage``: per-token KL(old ‖ ref) on trained tokens; with KL in the reward it becomes
  the ``penalty_T`` column that the advantage estimators subtract.

Every pass takes its inputs from the batch's columns: Datums are made at the call
(``StepBatch.datums`` with the targets only). A batch with no datum (a data-parallel rank
that kept none this step) gets empty columns and calls no engine.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytrio
import torch

from searchr1.losses.config import KLConfig, KLPlacement, OldLogprobs
from searchr1.losses.kl import kl_estimate
from searchr1.batch.step_batch import StepBatch
from searchr1.rollout.types import Trajectory

TARGETS = ("target_tokens",)


async def observation_logprobs(trajs: list[Trajectory], sampler) -> list[list[float | None]]:
    """Score every whole trajectory with ``sampler`` (concurrently): one log-prob per token."""
    return list(await asyncio.gather(*(
        sampler.compute_logprobs_async(pytrio.ModelInput.from_ints(list(t.tokens_T))) for t in trajs)))


def recompute_logprobs(client, batch: StepBatch, idx: list[int] | None = None) -> list[np.ndarray]:
    """The trainer's current log-probs of the targets of datums ``idx`` (default all; no
    gradient), 0 off the mask."""
    idx = list(range(batch.size)) if idx is None else idx
    if not idx:
        return []
    fb = client.forward(batch.datums(idx, inputs=TARGETS), "cross_entropy").result()
    return [batch.call_logprobs(d, o) for d, o in zip(idx, fb.loss_fn_outputs)]


def recomputed_old(client, batch: StepBatch, on_policy: list[int]) -> np.ndarray:
    """The ``old_T`` column: recomputed for every datum but those in ``on_policy``, whose rows
    keep the sampler's log-probs until their update fills them."""
    skip = set(on_policy)
    rest = [d for d in range(batch.size) if d not in skip]
    old = batch.sampler_T.copy()
    for d, row in zip(rest, recompute_logprobs(client, batch, rest)):
        old[batch.offsets[d]:batch.offsets[d + 1]] = row
    return old


async def reference_logprobs(client, reference, batch: StepBatch) -> list[np.ndarray]:
    """Reference log-prob of every target (batched on the local engine, else concurrent)."""
    if client.capabilities.reference_logprobs:
        out = client.compute_reference_logprobs(batch.datums(inputs=TARGETS))
        return [np.asarray(x.tolist(), dtype=np.float64)[:n] for x, n in zip(out, batch.lengths_D)]

    async def one(d: int) -> np.ndarray:
        full = batch.row("input_T", d).tolist() + [int(batch.row("next_T", d)[-1])]
        lp = await reference.compute_logprobs_async(pytrio.ModelInput.from_ints(full))
        return np.asarray([0.0 if x is None else x for x in lp[1:]], dtype=np.float64)

    return list(await asyncio.gather(*(one(d) for d in range(batch.size))))


async def engine_call(offload: bool, fn, *args):
    """``fn(*args)``; in a worker thread when ``offload`` (the engine's calls block)."""
    return await asyncio.to_thread(fn, *args) if offload else fn(*args)


async def scoring_stage(client, reference, critic, batch: StepBatch, old_logprobs: str,
                        kl: KLConfig, offload: bool = False, on_policy: list[int] = ()) -> None:
    """Fill ``old_T``, ``ref_T`` (KL on) and ``values_T`` (with a critic); ``on_policy``:
    datums whose recomputed old log-probs their own update call provides."""
    if batch.size == 0:
        empty = np.zeros(0)
        batch.old_T = empty
        batch.ref_T = empty.copy() if kl.coef > 0 else None
        batch.values_T = empty.copy() if critic is not None else None
        return
    if OldLogprobs(old_logprobs) is OldLogprobs.recompute:
        batch.old_T = await engine_call(offload, recomputed_old, client, batch, list(on_policy))
    else:
        batch.old_T = batch.sampler_T.copy()
    if kl.coef > 0:
        if offload and client.capabilities.in_process:  # the local engine's calls block
            ref = await asyncio.to_thread(lambda: asyncio.run(reference_logprobs(client, reference, batch)))
        else:
            ref = await reference_logprobs(client, reference, batch)
        batch.set_rows("ref_T", ref)
    if critic is not None:
        batch.set_rows("values_T", await engine_call(offload, critic.values, batch.rows("input_T")))


def kl_stage(batch: StepBatch, kl: KLConfig) -> dict[str, float]:
    """KL(old ‖ ref) per trained token; ``penalty_T`` = coef·KL when KL is in the reward.

    Its metrics are means over this batch's trained tokens (none without one).
    """
    if batch.ref_T is None:
        return {}
    k = kl_estimate(torch.as_tensor(batch.old_T), torch.as_tensor(batch.ref_T), kl.estimator).numpy()
    trained = batch.mask_T > 0
    kl_T = np.where(trained, k, 0.0)
    in_reward = kl.placement == KLPlacement.reward
    if in_reward:
        batch.penalty_T = kl.coef * kl_T
    if not trained.any():
        return {}
    metrics = {"train/kl_sampled": float(kl_T[trained].mean())}
    if in_reward:
        metrics["train/kl"] = metrics["train/kl_sampled"]
    return metrics
