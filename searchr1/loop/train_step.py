"""One logical RL step as a pipeline of typed stages:

    rollout → rewards → selection → scoring (old / reference log-probs, values)
            → per-token advantages (GRPO broadcast or GAE; KL-in-reward here)
            → datums built once → update (``searchr1/loop/update.py``) → metrics

Each stage is a function of its inputs and its own settings (``StepSettings`` holds the
slices; no stage reads the root config), so a test can run one stage alone. Everything
talks to the engine through the PyTRIO client API (``save_weights_and_get_sampling_client``,
``sample_async``, ``forward``, ``compute_reference_logprobs`` / ``compute_logprobs_async``,
``forward_backward`` / ``forward_backward_custom``, ``optim_step``), so the same step runs
on the local engine and on PyTRIO; the critic (``advantage=ppo_gae``) always runs locally.

Departures from the official code, on purpose:
- GRPO advantages are outcome-level (one scalar per trajectory, broadcast to its action
  tokens), as verl's GRPO; PPO uses per-token GAE (``advantages/gae.py``).
- ``loss.old_logprobs=sampler`` (the default; the lab's) uses the sampler's log-probs as
  the ratio baseline; ``recompute`` (the paper presets) re-scores the batch with the
  trainer before the first update, as verl does.
- Search metrics are counted from this step's own trajectories (never from the shared
  retriever's counters, which eval also feeds).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
import pytrio
import torch

from searchr1.advantages import compute_group_advantages
from searchr1.advantages.gae import gae, outcome_rewards, whiten
from searchr1.losses.config import KLConfig, KLPlacement, OldLogprobs
from searchr1.losses.kl import kl_estimate
from searchr1.rollout.datum import shifted_arrays, to_datum, truncate
from searchr1.rollout.engine import RolloutEngine, SamplingSettings, derive_seed
from searchr1.loop.microbatches import pack_ffd
from searchr1.rollout.scoring import rollout_metrics, score_trajectory
from searchr1.rollout.step_metrics import SearchCounts, batch_metrics, search_metrics
from searchr1.rollout.tool_errors import split_tool_errors
from searchr1.rollout.types import Trajectory
from searchr1.rollout.unmask import unmask_observations
from searchr1.loop.checkpoint import crash_point
from searchr1.loop.update import TrainBatch, UpdateSettings, combine, minibatches, update_minibatch


@dataclass(frozen=True)
class StepSettings:
    """The config slices of a step (built by ``build.build_step_runner``)."""

    rollout: object  # RolloutConfig
    advantage: object  # AdvantageConfig
    update: UpdateSettings
    max_datum_tokens: int = 8192
    seed: int = 0

    @property
    def kl(self) -> KLConfig:
        return self.update.loss.kl


@dataclass
class Selected:
    """Trajectories that become datums, with their GRPO scalar advantage (if any)."""

    trajs_D: list[Trajectory] = field(default_factory=list)
    scalar_D: list[float] = field(default_factory=list)
    degenerate_rate: float = 0.0
    n_trajectories: int = 0


@dataclass
class Scored:
    """Per-datum shifted arrays and the log-probs/values scored on them."""

    arrays_D: list[dict[str, np.ndarray]]
    old_D: list[np.ndarray]  # ratio baseline (sampler or recomputed)
    ref_D: list[np.ndarray] | None = None
    values_D: list[np.ndarray] | None = None


@dataclass
class RolledOut:
    """What the rollout phase hands the train phase: the selection and the rollout's metrics."""

    sel: Selected
    metrics: dict
    t0: float  # when the phase (its sampler) started
    t_rollout: float  # seconds of sampling and search


# ------------------------------------------------------------------------------- stages


async def rollout_stage(engine: RolloutEngine, sampler, examples, r, seed: int, step: int):
    settings = SamplingSettings(r.temperature, r.top_p, r.top_k, derive_seed(seed, "step", step))
    return await engine.rollout(sampler, examples, r.group_size, settings)


def reward_stage(groups: list[list[Trajectory]], protocol, reward_fn) -> None:
    for g in groups:
        for t in g:
            score_trajectory(t, protocol, reward_fn)


def select_stage(groups: list[list[Trajectory]], adv) -> Selected:
    """Kept trajectories (with ≥ 1 action token) and their GRPO advantage (0 for ppo_gae)."""
    rewards = [np.array([t.reward for t in g]) for g in groups]
    if adv.name == "ppo_gae":
        adv_groups, rate = [np.zeros(len(g)) for g in groups], 0.0
    else:
        adv_groups, rate = compute_group_advantages(rewards, adv.name, adv.eps, adv.skip_degenerate_groups)
    out = Selected(degenerate_rate=rate, n_trajectories=sum(len(g) for g in groups))
    for g, a_G in zip(groups, adv_groups):
        if a_G is None:
            continue
        for t, a in zip(g, a_G):
            if t.num_action_tokens:
                out.trajs_D.append(t)
                out.scalar_D.append(float(a))
    return out


def input_arrays(trajs_D: list[Trajectory], max_tokens: int) -> list[dict[str, np.ndarray]]:
    """Shifted per-token arrays of each trajectory (advantages filled in later)."""
    out = []
    for t in trajs_D:
        a = truncate(shifted_arrays(t.tokens_T, t.mask_T, t.logprobs_T, np.zeros(len(t.tokens_T))), max_tokens)
        a["sampler_logprobs"] = a["logprobs"]
        out.append(a)
    return out


def _probe(a: dict[str, np.ndarray]) -> pytrio.Datum:
    """A datum with inputs and targets only, for scoring calls."""
    return pytrio.Datum(model_input=pytrio.ModelInput.from_ints(a["model_input"].tolist()),
                        loss_fn_inputs={"target_tokens": a["target_tokens"].astype(np.int64)})


async def reference_logprobs(client, reference, arrays_D) -> list[np.ndarray]:
    """Reference log-prob of every target (batched on the local engine, else concurrent)."""
    if hasattr(client, "compute_reference_logprobs"):
        out = client.compute_reference_logprobs([_probe(a) for a in arrays_D])
        return [np.asarray(x.tolist(), dtype=np.float64)[: len(a["mask"])] for x, a in zip(out, arrays_D)]

    async def one(a):
        full = a["model_input"].tolist() + [int(a["tokens_next"][-1])]
        lp = await reference.compute_logprobs_async(pytrio.ModelInput.from_ints(full))
        return np.asarray([0.0 if x is None else x for x in lp[1:]], dtype=np.float64)

    return list(await asyncio.gather(*(one(a) for a in arrays_D)))


def recompute_logprobs(client, arrays_D) -> list[np.ndarray]:
    """The trainer's current log-probs of the targets (verl's old_log_prob), no gradient."""
    fb = client.forward([_probe(a) for a in arrays_D], "cross_entropy").result()
    return [np.asarray(o["logprobs"].tolist(), dtype=np.float64)[: len(a["mask"])] * a["mask"]
            for o, a in zip(fb.loss_fn_outputs, arrays_D)]


async def _call(offload: bool, fn, *args):
    """``fn(*args)``; in a worker thread when ``offload`` (the engine's calls block)."""
    return await asyncio.to_thread(fn, *args) if offload else fn(*args)


async def scoring_stage(client, reference, critic, arrays_D, s: StepSettings, offload: bool = False) -> Scored:
    old_D = [a["sampler_logprobs"] for a in arrays_D]
    if OldLogprobs(s.update.loss.old_logprobs) is OldLogprobs.recompute:
        old_D = await _call(offload, recompute_logprobs, client, arrays_D)
    ref_D = None
    if s.kl.coef > 0:
        if offload and hasattr(client, "compute_reference_logprobs"):  # local: a blocking call
            ref_D = await asyncio.to_thread(lambda: asyncio.run(reference_logprobs(client, reference, arrays_D)))
        else:
            ref_D = await reference_logprobs(client, reference, arrays_D)
    values_D = None
    if critic is not None:
        values_D = await _call(offload, critic.values, [a["model_input"] for a in arrays_D])
    return Scored(arrays_D, old_D, ref_D, values_D)


def token_kl(old_D, ref_D, arrays_D, kl: KLConfig) -> list[np.ndarray]:
    """Per-token KL(old ‖ ref) on action tokens, 0 elsewhere."""
    out = []
    for q, r, a in zip(old_D, ref_D, arrays_D):
        k = kl_estimate(torch.as_tensor(q), torch.as_tensor(r), kl.estimator).numpy()
        out.append(np.where(a["mask"] > 0, k, 0.0))
    return out


def advantage_stage(sel: Selected, sc: Scored, s: StepSettings) -> tuple[list[np.ndarray], list | None, dict]:
    """Per-token advantages (and GAE returns); KL in the reward is applied here."""
    masks = [a["mask"] for a in sc.arrays_D]
    kl_D = token_kl(sc.old_D, sc.ref_D, sc.arrays_D, s.kl) if sc.ref_D is not None else None
    in_reward = kl_D is not None and s.kl.placement == KLPlacement.reward
    metrics = {}
    if kl_D is not None:
        metrics["train/kl_sampled"] = float(np.concatenate([k[m > 0] for k, m in zip(kl_D, masks)]).mean())
        if in_reward:
            metrics["train/kl"] = metrics["train/kl_sampled"]
    if s.advantage.name != "ppo_gae":
        adv_D = [m * a for m, a in zip(masks, sel.scalar_D)]
        if in_reward:
            adv_D = [a - s.kl.coef * k for a, k in zip(adv_D, kl_D)]
        return adv_D, None, metrics
    rewards_D = [outcome_rewards(m, t.reward) for m, t in zip(masks, sel.trajs_D)]
    if in_reward:
        rewards_D = [r - s.kl.coef * k for r, k in zip(rewards_D, kl_D)]
    pairs = [gae(r, v, m, s.advantage.gamma, s.advantage.lam)
             for r, v, m in zip(rewards_D, sc.values_D, masks)]
    return whiten([p[0] for p in pairs], masks), [p[1] for p in pairs], metrics


def datum_stage(sc: Scored, adv_D: list[np.ndarray], n_trajectories: int) -> TrainBatch:
    """The step's datums, built once: ratio baseline and advantages in place."""
    arrays_D = []
    for a, q, adv in zip(sc.arrays_D, sc.old_D, adv_D):
        a = dict(a, logprobs=np.asarray(q, np.float64) * a["mask"], advantages=np.asarray(adv) * a["mask"])
        arrays_D.append(a)
    return TrainBatch([to_datum(a) for a in arrays_D], arrays_D, sc.ref_D, n_trajectories)


# --------------------------------------------------------------------------------- runner


class StepRunner:
    """Runs the stages for the trainer; holds the step-independent pieces."""

    def __init__(self, settings: StepSettings, rollout: RolloutEngine, reward_fn,
                 reference=None, critic=None) -> None:
        self.s = settings
        self.rollout = rollout
        self.reward_fn = reward_fn
        self.reference = reference  # base-model sampling client, for KL (PyTRIO)
        self.critic = critic  # local value model for advantage=ppo_gae
        self.search_totals = SearchCounts()  # run totals behind the cumulative search/*

    async def run(self, client, examples, step: int, optimizer_step: int, lr_at) -> dict:
        """One step; returns its metrics. ``lr_at(k)`` gives the LR of optimizer step k."""
        t0 = time.perf_counter()
        sampler = client.save_weights_and_get_sampling_client()
        rolled = await self.rollout_phase(sampler, examples, step, t0)
        return await self.train_phase(client, rolled, optimizer_step, lr_at)

    async def rollout_phase(self, sampler, examples, step: int, t0: float | None = None) -> RolledOut:
        """Rollout → rewards → tool-error split → selection, with the rollout's metrics.

        ``sampler`` is taken by the caller (``run``, or the trainer when rollouts overlap
        training: ``trainer.max_staleness=1``), so its weights are those of that moment.
        """
        t0 = time.perf_counter() if t0 is None else t0
        groups = await rollout_stage(self.rollout, sampler, examples, self.s.rollout, self.s.seed, step)
        crash_point("mid_rollout", step + 1)  # test hook (SEARCHR1_KILL_AT): sampled, not trained
        t_rollout = time.perf_counter() - t0
        reward_stage(groups, self.rollout.protocol, self.reward_fn)
        trajs = [t for g in groups for t in g]
        metrics = rollout_metrics(trajs)
        retriever = self.rollout.retriever
        promises = getattr(retriever, "promises_results", True)
        retriever_metrics = retriever.metrics()
        searches, self.search_totals = search_metrics(trajs, self.search_totals, retriever_metrics,
                                                      promises)
        metrics.update(searches)
        if "search/cache_hit_rate" in retriever_metrics:
            metrics["search/cache_hit_rate"] = retriever_metrics["search/cache_hit_rate"]
        metrics["rollout/sampled_tokens"] = float(sum(t.num_action_tokens for t in trajs))
        split = split_tool_errors(groups, self.s.rollout.on_tool_error, promises)
        metrics.update(split.metrics())
        trainable = split.groups(groups)
        if not self.s.rollout.mask_observations:  # the paper's ablation (rollout/unmask.py)
            unmasked = await unmask_observations([t for g in trainable for t in g], sampler)
            metrics["train/unmasked_observation_tokens"] = float(unmasked)
        sel = select_stage(trainable, self.s.advantage)
        metrics["rollout/degenerate_group_rate"] = sel.degenerate_rate
        return RolledOut(sel, metrics, t0, t_rollout)

    async def train_phase(self, client, rolled: RolledOut, optimizer_step: int, lr_at,
                          offload: bool = False) -> dict:
        """Scoring → advantages → datums → update(s) → the step's metrics.

        ``offload``: run the engine's blocking calls in a worker thread
        (``asyncio.to_thread``) so a rollout in flight keeps sampling and searching meanwhile.
        """
        metrics = rolled.metrics
        t1 = time.perf_counter()
        if rolled.sel.trajs_D:
            metrics.update(await self.train(client, rolled.sel, optimizer_step, lr_at, offload))
        else:
            metrics.update(batch_metrics([], [], []))
        metrics["time/rollout"] = rolled.t_rollout
        metrics["time/train"] = time.perf_counter() - t1
        metrics["time/step_seconds"] = time.perf_counter() - rolled.t0
        return metrics

    async def train(self, client, sel: Selected, optimizer_step: int, lr_at, offload: bool = False) -> dict:
        arrays_D = input_arrays(sel.trajs_D, self.s.max_datum_tokens)
        sc = await scoring_stage(client, self.reference, self.critic, arrays_D, self.s, offload)
        adv_D, returns_D, metrics = advantage_stage(sel, sc, self.s)
        batch = datum_stage(sc, adv_D, sel.n_trajectories)
        parts = minibatches(len(batch.datums_D), self.s.update.minibatch_trajectories)
        per_mb = []
        for k, part in enumerate(parts):
            m = await _call(offload, update_minibatch, client, batch, part, self.s.update,
                            lr_at(optimizer_step + k))
            if self.critic is not None:
                m.update(await _call(offload, self.critic.update, _critic_batch(batch, sc, returns_D, part)))
            per_mb.append(m)
        out = combine(per_mb)
        out.setdefault("train/kl", 0.0)
        out.update(metrics)
        out.update(_batch_sizes(batch, parts, self.s.update))
        out["train/datums"] = float(len(batch.datums_D))
        out["train/optimizer_steps"] = float(len(parts))
        if self.critic is not None:
            from searchr1.engines.local.training.critic import critic_metrics

            out.update(critic_metrics(sc.values_D, returns_D, [a["mask"] for a in batch.arrays_D]))
        return out


def _batch_sizes(batch: TrainBatch, parts: list[list[int]], u: UpdateSettings) -> dict:
    """The lab's ``train/*`` sizes over every mini-batch's FFD micro-batches."""
    lengths = [len(a["target_tokens"]) for a in batch.arrays_D]
    bins = [[part[j] for j in b] for part in parts
            for b in pack_ffd([lengths[i] for i in part], u.max_datums_per_microbatch,
                              u.max_padded_tokens_per_microbatch)]
    loss_tokens = [int(a["mask"].sum()) for a in batch.arrays_D]
    return batch_metrics(lengths, loss_tokens, bins)


def _critic_batch(batch: TrainBatch, sc: Scored, returns_D, part: list[int]):
    from searchr1.engines.local.training.critic import CriticBatch

    return CriticBatch([batch.arrays_D[i]["model_input"] for i in part],
                       [sc.values_D[i] for i in part], [returns_D[i] for i in part],
                       [batch.arrays_D[i]["mask"] for i in part])
