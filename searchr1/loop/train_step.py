"""One logical RL step, top to bottom as the algorithm:

    rollout → rewards → selection → step batch → plan → scoring (old / reference log-probs,
            values) → KL → advantages (a registered estimator) → update(s) → metrics

each stage a function in the layer it belongs to: ``rollout_stage``, ``reward_stage``,
``select_stage`` and ``batch_stage`` (here, over ``rollout/`` and ``batch/step_batch.py``),
``plan_update`` and ``update_stage`` (``loop/update.py``; the critic's step is
``advantages/critic.py``), ``scoring_stage`` and ``kl_stage`` (``loop/step_scoring.py``),
``fill_advantages`` (``advantages/base.py``) and ``metrics_stage`` (here).

Each stage is a function of its inputs and its own settings (``StepSettings`` holds the
slices; no stage reads the root config), so a test can run one stage alone. The step's data
is one ``StepBatch`` (``batch/step_batch.py``), built once from the selected trajectories and
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

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from searchr1.advantages import ADVANTAGES, Estimator, fill_advantages, signal_members
from searchr1.advantages.config import DegenerateRule
from searchr1.advantages.critic import critic_summary
from searchr1.utils import device_memory
from searchr1.losses.config import KLConfig
from searchr1.batch.step_batch import StepBatch, build_step_batch, trained_tokens, unmasked_observation_tokens
from searchr1.loop.step_scoring import kl_stage, observation_logprobs, scoring_stage
from searchr1.loop.update import UpdateSettings, combine, plan_update, update_stage
from searchr1.distributed.context import SINGLE
from searchr1.distributed.reduce import trajectory_weights
from searchr1.batch.shifted import lost_to_length
from searchr1.rollout.engine import RolloutEngine, SamplingSettings, derive_seed
from searchr1.rollout.scoring import rollout_metrics, score_trajectory
from searchr1.rollout.step_metrics import SearchCounts, batch_metrics, search_counts
from searchr1.rollout.tool_errors import split_tool_errors
from searchr1.rollout.types import EndReason, Trajectory
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
                 mask_observations: bool = True, max_tokens: int | None = None,
                 degenerate: DegenerateRule = DegenerateRule.equal_rewards, eps: float = 1e-6) -> Selected:
    """Trajectories with ≥ 1 trained token, of groups that carry signal for ``estimator``.

    Degenerate groups (``advantage.degenerate``: all rewards equal, or all advantages exactly
    0.0) are a notion of group-baseline estimators only: counted (and skipped when
    ``skip_degenerate``) for those, never for a critic's. ``signal_members`` also names the
    members a kept group trains (under ``zero_advantages``, not those at exactly 0.0).
    """
    out = Selected(n_trajectories=sum(len(g) for g in groups))
    count = 0
    for g in groups:
        rewards_G = np.array([t.reward for t in g], dtype=np.float64)
        members = signal_members(estimator, rewards_G, degenerate, eps)
        if members is None:
            count += 1
            if skip_degenerate:
                continue
            members = list(range(len(g)))
        kept = [(m, g[m]) for m in members if trained_tokens(g[m], mask_observations)]
        for m, t in kept:
            out.trajs_D.append(t)
            out.group_D.append(len(out.rewards_G))
            out.member_D.append(m)
        out.skipped_overlong += sum(lost_to_length(t, max_tokens) for t in g)
        out.rewards_G.append(rewards_G)
    out.degenerate_rate = count / len(groups) if groups and estimator.group_baseline else 0.0
    return out


async def batch_stage(sel: Selected, max_tokens: int, sampler=None) -> StepBatch:
    """The step batch of ``sel`` (empty without datums); ``sampler`` given: the
    observation-mask ablation's columns."""
    obs = None
    if sampler is not None and sel.trajs_D:
        obs = await observation_logprobs(sel.trajs_D, sampler)
    return build_step_batch(sel.trajs_D, sel.group_D, sel.member_D, sel.rewards_G,
                            sel.n_trajectories, max_tokens, obs)


def size_metrics(batch: StepBatch) -> dict[str, float]:
    """The lab's ``train/*`` sizes over the plan's micro-batches (all mini-batches)."""
    return batch_metrics(batch.lengths_D.tolist(), [int(n) for n in batch.loss_tokens_D], batch.plan.all_bins)


def metrics_stage(batch: StepBatch, per_minibatch: list[dict], kl_metrics: dict, dp=SINGLE,
                  critic=None) -> dict[str, float]:
    """The step's train metrics: the mini-batches' combined (``update.combine``), the step's
    KL, sizes and counts reduced over the ranks, and the critic's value statistics."""
    out = combine(per_minibatch)
    out.setdefault("train/kl", 0.0)
    step = dict(kl_metrics, **size_metrics(batch))
    step["train/datums"] = float(batch.size)
    step["train/optimizer_steps"] = float(len(batch.plan.shares))
    out.update(dp.reduce_metrics(step, {"tokens": float(batch.mask_T.sum())}))
    if critic is not None:
        out.update(critic_summary(batch, dp))
    return out


# --------------------------------------------------------------------------------- runner


class SamplerFailed(RuntimeError):
    """Every trajectory of a step ended with a sampler error: the sampling engine is broken."""


class StepRunner:
    """Runs the stages for the trainer; holds the step-independent pieces."""

    def __init__(self, settings: StepSettings, rollout: RolloutEngine, reward_fn,
                 reference=None, critic=None, dp=SINGLE) -> None:
        self.s = settings
        self.dp = dp  # data parallelism (searchr1/distributed/): this rank's place, collectives
        self.rollout = rollout
        self.reward_fn = reward_fn
        self.reference = reference  # base-model sampling client, for KL (PyTRIO)
        self.critic = critic  # a ValueModel (advantages/critic.py), for an estimator that needs_critic
        self.search_totals = SearchCounts()  # run totals behind the cumulative search/*
        # mini-batch 0 scores its own ratio baseline when the update allows it
        # (UpdateSettings.first_minibatch_on_policy); False: every old log-prob is recomputed
        # before the first update (the reference path of tests and benchmarks)
        self.first_minibatch_on_policy = True
        self.stop = None  # the trainer's StopSignals: a stop signal cuts the rollout short
        self.progress = None  # the trainer's StepProgress (loop/progress.py): turns on its bar

    async def run(self, client, examples, step: int, optimizer_step: int, lr_at) -> dict:
        """One step; returns its metrics. ``lr_at(k)`` gives the LR of optimizer step k."""
        t0 = time.perf_counter()
        sampler = client.save_weights_and_get_sampling_client()
        rolled = await self.rollout_phase(sampler, examples, step, t0)
        crash_point("in_update", step + 1)  # test hook: a signal as the update starts
        return await self.train_phase(client, rolled, optimizer_step, lr_at)

    async def rollout_phase(self, sampler, examples, step: int, t0: float | None = None) -> RolledOut:
        """Rollout → rewards → tool-error split → selection → step batch, with the rollout's metrics.

        ``sampler`` is taken by the caller (``run``, or the trainer when rollouts overlap
        training: ``trainer.max_staleness=1``), so its weights are those of that moment. A
        stop signal (``self.stop``) cancels the rollout at its next await and raises
        ``Interrupted`` on every rank (``loop/stop.py``).
        """
        t0 = time.perf_counter() if t0 is None else t0
        watched = self.progress.sampler(sampler, step) if self.progress else sampler
        rolling = rollout_stage(self.rollout, watched, examples, self.s.rollout, self.s.seed, step)
        asyncio.get_running_loop().call_soon(crash_point, "in_rollout", step + 1)  # test hook: turns in flight
        groups = await (rolling if self.stop is None else self.stop.cut_short(rolling, self.dp))
        if self.progress:
            self.progress.training()
        crash_point("mid_rollout", step + 1)  # test hook (SEARCHR1_KILL_AT): sampled, not trained
        t_rollout = time.perf_counter() - t0
        trajs = [t for g in groups for t in g]
        broken = bool(trajs) and all(t.end_reason is EndReason.SAMPLER_ERROR for t in trajs)
        if self.dp.any(broken):  # a broken engine, not data: stop instead of training on nothing
            raise SamplerFailed(f"step {step + 1}: every trajectory ended in a sampler error (the "
                                f"log's 'sampling failed' warnings name it); the last checkpoint stands")
        reward_stage(groups, self.rollout.protocol, self.reward_fn)
        metrics = rollout_metrics(trajs)
        retriever = self.rollout.retriever
        promises = retriever.promises_results
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
        if not masked:  # the paper's ablation: a column rule at batch build (batch/step_batch.py)
            unmasked = unmasked_observation_tokens([t for g in trainable for t in g])
            metrics["train/unmasked_observation_tokens"] = float(unmasked)
        a = self.s.advantage
        sel = select_stage(trainable, self.s.estimator, a.skip_degenerate_groups, masked,
                           self.s.max_datum_tokens, a.degenerate, a.eps)
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
        """Plan → scoring → KL → advantages → update (one optimizer step per global
        mini-batch, and the critic's) → metrics, each stage a function of its own layer.

        The plan follows ``dp.minibatches`` (this rank's share of each global mini-batch);
        each share's loss is normalised by its global mini-batch's totals, and the update's
        metrics are reduced per mini-batch (``loop/update.py``, pipelined).
        """
        s, dp, u = self.s, self.dp, self.s.update
        batch.plan = plan_update(batch.lengths_D, u, dp.minibatches(batch.size, u.minibatch_trajectories))
        fused = self.first_minibatch_on_policy and u.first_minibatch_on_policy
        on_policy = batch.plan.minibatches[0] if fused and batch.plan.minibatches else []
        await scoring_stage(client, self.reference, self.critic, batch, u.loss.old_logprobs, s.kl, offload,
                            on_policy)
        kl_metrics = {} if fused else kl_stage(batch, s.kl)  # fused: once mini-batch 0 filled old_T
        fill_advantages(batch, s.estimator, s.advantage, dp)
        per_mb = await update_stage(client, batch, u, dp, lr_at, optimizer_step, self.critic, offload, fused)
        if fused:
            kl_metrics = kl_stage(batch, s.kl)
        return metrics_stage(batch, per_mb, kl_metrics, dp, self.critic)
