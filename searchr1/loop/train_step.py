"""One logical RL step, top to bottom as the algorithm:

    rollout → rewards → selection → step batch → plan → scoring (old / reference log-probs,
            values) → KL → advantages (a registered estimator) → update(s) → metrics

Each stage is a function of its inputs and its own settings (``StepSettings`` holds the
slices; no stage reads the root config), so a test can run one stage alone. The step's data
is one ``StepBatch`` (``loop/step_batch.py``), built once from the selected trajectories and
filled column by column; Datums are made only where they are sent. Under data parallelism
(``dp``, ``searchr1/distributed/``) each rank holds whole groups; mini-batches are global
(cut from all ranks' datums in rank order), losses are normalised by the global
mini-batch's totals, GAE is whitened over every rank, and metrics are reduced, so the
update equals the one-process update on the whole batch. Everything talks to the
engine through the PyTRIO client API (``save_weights_and_get_sampling_client``,
``sample_async``, ``forward``, ``compute_reference_logprobs`` / ``compute_logprobs_async``,
``forward_backward`` / ``forward_backward_custom``, ``optim_step``), so the same step runs
on the local engine and on PyTRIO; a critic (an estimator that ``needs_critic``) always
runs locally.

Departures from the official code, on purpose:
- GRPO advantages are outcome-level (one scalar per trajectory, broadcast to its action
  tokens), as verl's GRPO; PPO uses per-token GAE (``advantages/gae.py``).
- ``loss.old_logprobs=sampler`` (the default; the lab's) uses the sampler's log-probs as
  the ratio baseline; ``recompute`` (the paper presets) re-scores the batch with the
  trainer before the first update, as verl does, except mini-batch 0, whose baseline is its
  own forward's log-probs, detached (the same weights: ``UpdateSettings.first_minibatch_on_policy``).
- Search metrics are counted from this step's own trajectories (never from the shared
  retriever's counters, which eval also feeds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from searchr1.advantages import ADVANTAGES, Estimator, is_degenerate
from searchr1.utils import device_memory
from searchr1.losses.config import KLConfig
from searchr1.loop.step_batch import StepBatch, build_step_batch, trained_tokens, unmasked_observation_tokens
from searchr1.loop.step_scoring import engine_call, kl_stage, observation_logprobs, scoring_stage
from searchr1.loop.update import (UpdateSettings, combine, domain_tokens, minibatch_totals,
                                  plan_update, update_minibatch)
from searchr1.distributed.context import SINGLE
from searchr1.distributed.reduce import UPDATE, trajectory_weights
from searchr1.rollout.datum import lost_to_length
from searchr1.rollout.engine import RolloutEngine, SamplingSettings, derive_seed
from searchr1.rollout.scoring import rollout_metrics, score_trajectory
from searchr1.rollout.step_metrics import SearchCounts, batch_metrics, search_counts
from searchr1.rollout.tool_errors import split_tool_errors
from searchr1.rollout.types import Trajectory
from searchr1.utils.faults import crash_point


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

    @property
    def estimator(self) -> Estimator:
        return ADVANTAGES.get(self.advantage.name)


@dataclass
class Selected:
    """Trajectories that become datums, with their group ids and every group's rewards."""

    trajs_D: list[Trajectory] = field(default_factory=list)
    group_D: list[int] = field(default_factory=list)  # index into rewards_G
    member_D: list[int] = field(default_factory=list)  # index within the group
    rewards_G: list[np.ndarray] = field(default_factory=list)
    degenerate_rate: float = 0.0
    n_trajectories: int = 0
    skipped_overlong: int = 0  # trajectories that lose part of their update to a length limit


@dataclass
class RolledOut:
    """What the rollout phase hands the train phase: the step batch and the rollout's metrics."""

    batch: StepBatch  # empty (size 0) when no trajectory carries signal
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


def select_stage(groups: list[list[Trajectory]], estimator: Estimator, skip_degenerate: bool,
                 mask_observations: bool = True, max_tokens: int | None = None) -> Selected:
    """Trajectories with ≥ 1 trained token, of groups that carry signal for ``estimator``.

    Degenerate groups (all rewards equal) are a notion of group-baseline estimators only:
    counted (and skipped when ``skip_degenerate``) for those, never for a critic's.
    """
    out = Selected(n_trajectories=sum(len(g) for g in groups))
    degenerate = 0
    for g in groups:
        rewards_G = np.array([t.reward for t in g], dtype=np.float64)
        if estimator.group_baseline and is_degenerate(rewards_G):
            degenerate += 1
            if skip_degenerate:
                continue
        kept = [(m, t) for m, t in enumerate(g) if trained_tokens(t, mask_observations)]
        for m, t in kept:
            out.trajs_D.append(t)
            out.group_D.append(len(out.rewards_G))
            out.member_D.append(m)
        out.skipped_overlong += sum(lost_to_length(t, max_tokens) for t in g)
        out.rewards_G.append(rewards_G)
    out.degenerate_rate = degenerate / len(groups) if groups and estimator.group_baseline else 0.0
    return out


async def batch_stage(sel: Selected, max_tokens: int, sampler=None) -> StepBatch:
    """The step batch of ``sel`` (empty without datums); ``sampler`` given: the
    observation-mask ablation's columns."""
    obs = None
    if sampler is not None and sel.trajs_D:
        obs = await observation_logprobs(sel.trajs_D, sampler)
    return build_step_batch(sel.trajs_D, sel.group_D, sel.member_D, sel.rewards_G,
                            sel.n_trajectories, max_tokens, obs)


def advantage_stage(batch: StepBatch, estimator: Estimator, cfg, dp=SINGLE) -> None:
    """Fill ``advantages_T`` (0 off the mask) and, for a critic's estimator, ``returns_T``
    and ``value_mask_T`` (where the critic is fitted; default the mask)."""
    out = estimator(batch, cfg, dp)
    batch.advantages_T = np.asarray(out.advantages_T, np.float64) * batch.mask_T
    batch.returns_T = out.returns_T
    if out.returns_T is not None:
        batch.value_mask_T = batch.mask_T.copy() if out.value_mask_T is None else out.value_mask_T


def size_metrics(batch: StepBatch) -> dict[str, float]:
    """The lab's ``train/*`` sizes over the plan's micro-batches (all mini-batches)."""
    return batch_metrics(batch.lengths_D.tolist(), [int(n) for n in batch.loss_tokens_D], batch.plan.all_bins)


def critic_batch(batch: StepBatch, part: list[int]):
    """The critic's inputs and targets for the datums ``part``, fitted on ``value_mask_T``."""
    from searchr1.engines.local.training.critic import CriticBatch

    return CriticBatch(batch.rows("input_T", part), batch.rows("values_T", part),
                       batch.rows("returns_T", part), batch.rows("value_mask_T", part))


def critic_summary(batch: StepBatch, dp=SINGLE) -> dict[str, float]:
    """Value statistics on the critic's tokens (of every rank)."""
    from searchr1.engines.local.training.critic import critic_metrics

    return critic_metrics(batch.rows("values_T"), batch.rows("returns_T"), batch.rows("value_mask_T"), dp)


# --------------------------------------------------------------------------------- runner


class StepRunner:
    """Runs the stages for the trainer; holds the step-independent pieces."""

    def __init__(self, settings: StepSettings, rollout: RolloutEngine, reward_fn,
                 reference=None, critic=None, dp=SINGLE) -> None:
        self.s = settings
        self.dp = dp  # data parallelism (searchr1/distributed/): this rank's place, collectives
        self.rollout = rollout
        self.reward_fn = reward_fn
        self.reference = reference  # base-model sampling client, for KL (PyTRIO)
        self.critic = critic  # local value model, for an estimator that needs_critic
        self.search_totals = SearchCounts()  # run totals behind the cumulative search/*
        # mini-batch 0 scores its own ratio baseline when the update allows it
        # (UpdateSettings.first_minibatch_on_policy); False: every old log-prob is recomputed
        # before the first update (the reference path of tests and benchmarks)
        self.first_minibatch_on_policy = True
        self.progress = None  # the trainer's StepProgress (loop/progress.py): turns on its bar

    async def run(self, client, examples, step: int, optimizer_step: int, lr_at) -> dict:
        """One step; returns its metrics. ``lr_at(k)`` gives the LR of optimizer step k."""
        t0 = time.perf_counter()
        sampler = client.save_weights_and_get_sampling_client()
        rolled = await self.rollout_phase(sampler, examples, step, t0)
        return await self.train_phase(client, rolled, optimizer_step, lr_at)

    async def rollout_phase(self, sampler, examples, step: int, t0: float | None = None) -> RolledOut:
        """Rollout → rewards → tool-error split → selection → step batch, with the rollout's metrics.

        ``sampler`` is taken by the caller (``run``, or the trainer when rollouts overlap
        training: ``trainer.max_staleness=1``), so its weights are those of that moment.
        """
        t0 = time.perf_counter() if t0 is None else t0
        watched = self.progress.sampler(sampler, step) if self.progress else sampler
        groups = await rollout_stage(self.rollout, watched, examples, self.s.rollout, self.s.seed, step)
        if self.progress:
            self.progress.training()
        crash_point("mid_rollout", step + 1)  # test hook (SEARCHR1_KILL_AT): sampled, not trained
        t_rollout = time.perf_counter() - t0
        reward_stage(groups, self.rollout.protocol, self.reward_fn)
        trajs = [t for g in groups for t in g]
        metrics = rollout_metrics(trajs)
        retriever = self.rollout.retriever
        promises = getattr(retriever, "promises_results", True)
        retriever_metrics = retriever.metrics()
        step_counts = self.dp.sum_counts(search_counts(trajs, retriever_metrics, promises))
        self.search_totals = self.search_totals + step_counts  # the job's searches, every rank
        metrics.update({**self.search_totals.rates("search/"), **step_counts.rates("search/step_")})
        if "search/cache_hit_rate" in retriever_metrics:
            metrics["search/cache_hit_rate"] = retriever_metrics["search/cache_hit_rate"]
        metrics["rollout/sampled_tokens"] = float(sum(t.num_action_tokens for t in trajs))
        split = split_tool_errors(groups, self.s.rollout.on_tool_error, promises)
        metrics.update(split.metrics())
        trainable = split.groups(groups)
        masked = self.s.rollout.mask_observations
        if not masked:  # the paper's ablation: a column rule at batch build (loop/step_batch.py)
            unmasked = unmasked_observation_tokens([t for g in trainable for t in g])
            metrics["train/unmasked_observation_tokens"] = float(unmasked)
        sel = select_stage(trainable, self.s.estimator, self.s.advantage.skip_degenerate_groups, masked,
                           self.s.max_datum_tokens)
        metrics["rollout/degenerate_group_rate"] = sel.degenerate_rate
        metrics["train/skipped_overlong"] = float(sel.skipped_overlong)
        batch = await batch_stage(sel, self.s.max_datum_tokens, None if masked else sampler)
        metrics = self.dp.reduce_metrics(metrics, trajectory_weights(trajs, len(groups)))
        return RolledOut(batch, metrics, t0, t_rollout)

    async def train_phase(self, client, rolled: RolledOut, optimizer_step: int, lr_at,
                          offload: bool = False) -> dict:
        """Scoring → KL → advantages → update(s) → the step's metrics.

        ``offload``: run the engine's blocking calls in a worker thread
        (``asyncio.to_thread``) so a rollout in flight keeps sampling and searching meanwhile.
        """
        metrics = rolled.metrics
        t1 = time.perf_counter()
        if self.dp.any(rolled.batch.size > 0):  # a rank without datums still takes the steps
            metrics.update(await self.train(client, rolled.batch, optimizer_step, lr_at, offload))
        else:
            metrics.update(batch_metrics([], [], []))
        metrics["time/rollout"] = rolled.t_rollout
        metrics["time/train"] = time.perf_counter() - t1
        metrics["time/step_seconds"] = time.perf_counter() - rolled.t0
        metrics.update(device_memory.step_peaks())  # this rank's GPU, when this process has one
        return metrics

    async def train(self, client, batch: StepBatch, optimizer_step: int, lr_at, offload: bool = False) -> dict:
        """Plan → scoring → KL → advantages → one optimizer step per global mini-batch.

        The plan follows ``dp.minibatches`` (this rank's share of each global mini-batch);
        each share's loss is normalised by its global mini-batch's totals, and the update's
        metrics are reduced per mini-batch.
        """
        s, dp, u = self.s, self.dp, self.s.update
        batch.plan = plan_update(batch.lengths_D, u, dp.minibatches(batch.size, u.minibatch_trajectories))
        fused = self.first_minibatch_on_policy and u.first_minibatch_on_policy
        on_policy = batch.plan.minibatches[0] if fused and batch.plan.minibatches else []
        await scoring_stage(client, self.reference, self.critic, batch, u.loss.old_logprobs, s.kl, offload,
                            on_policy)
        kl_metrics = {} if fused else kl_stage(batch, s.kl)  # fused: once mini-batch 0 filled old_T
        advantage_stage(batch, s.estimator, s.advantage, dp)
        step_counts = dp.all_sum([float(batch.n_trajectories), float(batch.size)])
        per_mb = []
        for k, share in enumerate(batch.plan.shares):
            totals = minibatch_totals(dp, u, batch, share, step_counts)
            m = await engine_call(offload, update_minibatch, client, batch, k, u,
                                  lr_at(optimizer_step + k), totals, dp.active, fused and k == 0)
            if self.critic is not None:
                m.update(await engine_call(offload, self.critic.update, critic_batch(batch, share.local),
                                           getattr(lr_at, "step", None), share, dp))
            tokens = sum(domain_tokens(u, batch, i) for i in share.local)
            per_mb.append(dp.reduce_metrics(m, {"tokens": tokens}, UPDATE))
        if fused:
            kl_metrics = kl_stage(batch, s.kl)
        out = combine(per_mb)
        out.setdefault("train/kl", 0.0)
        step = dict(kl_metrics, **size_metrics(batch))
        step["train/datums"] = float(batch.size)
        step["train/optimizer_steps"] = float(len(batch.plan.shares))
        out.update(dp.reduce_metrics(step, {"tokens": float(batch.mask_T.sum())}))
        if self.critic is not None:
            out.update(critic_summary(batch, dp))
        return out
