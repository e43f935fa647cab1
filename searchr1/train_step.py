"""One logical RL step: rollout → rewards → advantages → datums → update → metrics.

Everything here talks to the engine through the PyTRIO client API only
(``save_weights_and_get_sampling_client``, ``sample_async``, ``compute_logprobs_async``,
``forward_backward`` / ``forward_backward_custom``, ``optim_step``), so the same step runs on
the local engine and on PyTRIO.

Departures from the paper, on purpose: advantages are outcome-level (one scalar per
trajectory, broadcast to its action tokens); a mini-batch is one ``forward_backward`` call
whose datums are ordered first-fit-decreasing (the local engine's chunker then cuts exactly
those micro-batches; PyTRIO chunks on its own limits), and the engine normalises every chunk
by the totals of the whole call (pytrio semantics) — we never re-weight micro-batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pytrio

from searchr1.advantages import compute_group_advantages
from searchr1.losses.step_loss import kl_reward_adjust, run_update
from searchr1.rollout.batching import pack_ffd, split_minibatches
from searchr1.rollout.datum import build_datum, token_advantages
from searchr1.rollout.engine import RolloutEngine, SamplingSettings, derive_seed
from searchr1.rollout.scoring import rollout_metrics, score_trajectory
from searchr1.rollout.types import Trajectory


ON_POLICY_ONLY = ("train/logprob_mismatch", "train/entropy")


@dataclass
class StepBatch:
    """The trainable part of a step: datums with their shifted arrays and trajectories."""

    datums_D: list[pytrio.Datum] = field(default_factory=list)
    arrays_D: list[dict[str, np.ndarray]] = field(default_factory=list)
    trajs_D: list[Trajectory] = field(default_factory=list)


def build_batch(groups: list[list[Trajectory]], adv_groups, max_tokens: int) -> StepBatch:
    """Datums for every trajectory of every kept group that sampled at least one token."""
    batch = StepBatch()
    for group, adv_G in zip(groups, adv_groups):
        if adv_G is None:
            continue
        for traj, a in zip(group, adv_G):
            if traj.num_action_tokens == 0:
                continue
            datum, arrays = build_datum(traj, token_advantages(traj, float(a)), max_tokens)
            batch.datums_D.append(datum)
            batch.arrays_D.append(arrays)
            batch.trajs_D.append(traj)
    return batch


def ffd_order(batch: StepBatch, idx: list[int], max_datums: int, max_padded: int) -> list[int]:
    """``idx`` reordered so the engine's sequential chunker yields FFD micro-batches."""
    lengths = [len(batch.arrays_D[i]["target_tokens"]) for i in idx]
    bins = pack_ffd(lengths, max_datums, max_padded)
    return [idx[j] for b in bins for j in b]


class StepRunner:
    """Runs logical steps for the trainer; holds the step-independent pieces."""

    def __init__(self, cfg, rollout: RolloutEngine, reward_fn, reference=None) -> None:
        self.cfg = cfg
        self.rollout = rollout
        self.reward_fn = reward_fn
        self.reference = reference  # base-model sampling client, for KL

    async def run(self, client, examples, step: int, optimizer_step: int, lr_at) -> dict:
        """One step; returns its metrics. ``lr_at(k)`` gives the LR of optimizer step k."""
        t0 = time.perf_counter()
        groups = await self._rollout(client, examples, step)
        t_rollout = time.perf_counter() - t0
        trajs = [t for g in groups for t in g]
        rewards = [np.array([t.reward for t in g]) for g in groups]
        adv, degenerate = compute_group_advantages(
            rewards, self.cfg.advantage.name, self.cfg.advantage.eps,
            self.cfg.advantage.skip_degenerate_groups,
        )
        batch = build_batch(groups, adv, self.cfg.trainer.max_datum_tokens)
        metrics = rollout_metrics(trajs)
        metrics["rollout/degenerate_group_rate"] = degenerate
        metrics["rollout/sampled_tokens"] = float(sum(t.num_action_tokens for t in trajs))
        metrics.update(self.rollout.retriever.metrics())
        t1 = time.perf_counter()
        if batch.datums_D:
            metrics.update(await self._update(client, batch, optimizer_step, lr_at))
        metrics["time/rollout"] = t_rollout
        metrics["time/train"] = time.perf_counter() - t1
        metrics["time/step_seconds"] = time.perf_counter() - t0
        return metrics

    async def _rollout(self, client, examples, step: int) -> list[list[Trajectory]]:
        sampler = client.save_weights_and_get_sampling_client()
        r = self.cfg.rollout
        settings = SamplingSettings(r.temperature, r.top_p, r.top_k, derive_seed(self.cfg.seed, "step", step))
        groups = await self.rollout.rollout(sampler, examples, r.group_size, settings)
        for g in groups:
            for t in g:
                score_trajectory(t, self.rollout.protocol, self.reward_fn)
        return groups

    async def _update(self, client, batch: StepBatch, optimizer_step: int, lr_at) -> dict:
        tcfg, kl = self.cfg.trainer, self.cfg.loss.kl
        ref_D = None
        if kl.coef > 0:
            ref_D = await self._reference_logprobs(batch)
            if kl.placement == "reward":
                kl_reward_adjust(batch, ref_D, kl.coef, kl.estimator)
        out: dict[str, float] = {
            "train/loss_tokens_per_rollout_batch": float(sum(a["mask"].sum() for a in batch.arrays_D)),
            "train/datums": float(len(batch.datums_D)),
        }
        parts = split_minibatches(len(batch.datums_D), tcfg.optimizer_steps_per_rollout)
        for k, part in enumerate(parts):
            idx = ffd_order(batch, part, tcfg.max_datums_per_microbatch, tcfg.max_padded_tokens_per_microbatch)
            m = run_update(client, batch, idx, ref_D, self.cfg, lr_at(optimizer_step + k))
            for key, v in m.items():
                if k == 0 and key.startswith(ON_POLICY_ONLY):
                    out[key] = v  # only the first mini-batch is sampled by the same weights
                elif not key.startswith(ON_POLICY_ONLY):
                    out[key] = out.get(key, 0.0) + v / len(parts)  # mean over mini-batches
        out["train/optimizer_steps"] = float(len(parts))
        return out

    async def _reference_logprobs(self, batch: StepBatch) -> list[np.ndarray]:
        """Reference-model logprob of every target token (shifted like the datum)."""
        out = []
        for d, arrays in zip(batch.datums_D, batch.arrays_D):
            full = d.model_input.to_ints() + [int(arrays["tokens_next"][-1])]
            lp = await self.reference.compute_logprobs_async(pytrio.ModelInput.from_ints(full))
            out.append(np.asarray([0.0 if x is None else x for x in lp[1:]], dtype=np.float64))
        return out
