"""The RL loop: steps, checkpoints, resume and periodic evaluation.

One ``Trainer.run`` = (eval before) → for each step: ``StepRunner.run`` → metrics →
checkpoint every ``save_every`` → eval every ``eval_every`` → final checkpoint and eval.
With ``trainer.max_staleness=1`` (``_Overlap``) a step is ``StepRunner.train_phase`` on a
rollout launched one step earlier, while the next step's ``rollout_phase`` runs.
The data order is a pure function of the seed (``DataOrder``), sampling seeds are derived
from (seed, step), and engine state (adapters, optimizer, RNG) is saved with the loop's own
state, so ``trainer.resume=auto`` continues with no repeated or skipped step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from searchr1.loop.breaker import CircuitBreaker, SearchOutage, quota_exhausted
from searchr1.loop.checkpoint import (CRITIC_FILE, TrainerState, checkpoint_dir, crash_point,
                                      engine_state_name, resolve_resume, save_checkpoint)
from searchr1.data.order import DataOrder
from searchr1.data.selection import eval_examples
from searchr1.distributed.context import SINGLE
from searchr1.loop.metric_names import named_metrics
from searchr1.loop.plan import total_optimizer_steps, trajectories_per_step
from searchr1.loop.before_after import before_after_report
from searchr1.loop.evaluate import evaluate_split, evaluate_split_parallel
from searchr1.loop.progress import StepProgress
from searchr1.loop.stop import Interrupted, Stopped, StopSignals
from searchr1.utils.lr_schedule import step_lr
from searchr1.rollout.engine import SamplingSettings
from searchr1.rollout.step_metrics import SearchCounts
from searchr1.warmstart.apply import apply_warm_start, fix_reference

log = logging.getLogger(__name__)

BAR_KEYS = {"reward/mean": "R", "reward/correct": "EM", "rollout/search_calls": "srch",
            "train/loss": "loss", "time/step_seconds": "s"}


class _Overlap:
    """``trainer.max_staleness=1``: the rollout of step k+1 runs while step k trains.

    At most one rollout is in flight ahead of the update. Its sampler is taken when it is
    launched — right after step k's rollout is consumed and before step k's update starts —
    so it samples the weights after step k−1: never more than one step old, and the
    importance-sampling ratio of the loss (old log-probs = the sampler's) corrects for the
    lag. ``train/staleness`` is the lag in steps (updates) between the weights a rollout was
    launched on and the weights it trains. (The local engine's sampler reads the live
    adapters, so its turns sampled after the update use newer weights: the logged lag is an
    upper bound there.) The update's blocking engine calls run in a worker thread
    (``asyncio.to_thread``) so sampling and searches proceed meanwhile. The trainer saves
    and evaluates between steps as before; no rollout is launched past the last step. A
    resumed run's first step is on-policy (its in-flight rollout was not saved). With
    ``loss.old_logprobs=recompute`` the ratio baseline is the trainer's current weights, so
    the lag goes uncorrected: overlap is meant for the default ``sampler`` baseline.
    """

    def __init__(self, runner, client, order, tcfg) -> None:
        if tcfg.max_staleness != 1:
            raise ValueError(f"trainer.max_staleness must be 0 or 1, not {tcfg.max_staleness}")
        self.runner, self.client, self.order = runner, client, order
        self.q, self.steps = tcfg.questions_per_step, tcfg.steps
        self.pending: tuple[asyncio.Task, int] | None = None  # (rollout task, step launched at)
        self.last_end: float | None = None

    def _launch(self, step: int, cursor: int, launched_at: int) -> None:
        t0 = time.perf_counter()
        sampler = self.client.save_weights_and_get_sampling_client()  # the weights of now
        task = asyncio.create_task(self.runner.rollout_phase(sampler, self.order.slice(cursor, self.q), step, t0))
        self.pending = (task, launched_at)

    async def step(self, step: int, cursor: int, opt_steps: int, lr_at) -> dict:
        if self.pending is None:
            self._launch(step, cursor, step)
        (task, launched_at), self.pending = self.pending, None
        t_wait = time.perf_counter()
        rolled = await task
        wait = time.perf_counter() - t_wait
        if step + 1 < self.steps:  # launched on the weights after `step` updates
            self._launch(step + 1, cursor + self.q, step)
        metrics = await self.runner.train_phase(self.client, rolled, opt_steps, lr_at, offload=True)
        now = time.perf_counter()
        metrics["train/staleness"] = float(step - launched_at)
        metrics["time/rollout_wait"] = wait
        metrics["time/step_seconds"] = now - (rolled.t0 if self.last_end is None else self.last_end)
        self.last_end = now
        return metrics

    def close(self) -> None:
        if self.pending is not None:
            task = self.pending[0]
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # cut short by a stop signal meanwhile: seen, not raised
            self.pending = None


@dataclass(frozen=True)
class _Run:
    """What the steps of one run share, set up once by ``Trainer._plan_run``."""

    client: object  # the training client
    runner: object  # the step pipeline (``StepRunner``)
    order: DataOrder
    lr_for: Callable[[int], Callable[[int], float]]  # step -> (optimizer step -> LR)
    overlap: _Overlap | None  # trainer.max_staleness=1 only


class Trainer:
    """Owns the loop; the engine, rollout engine and trackers are handed in, built elsewhere.
    ``build_runner(cfg, rollout, reward_fn, service, dp)`` makes the step pipeline once the
    training client exists (``searchr1.build.build_step_runner``)."""

    def __init__(self, cfg, run_dir: Path, service, dataset, rollout, reward_fn, tracker,
                 dp=None, stop: StopSignals | None = None, *, build_runner) -> None:
        self.cfg = cfg
        self.build_runner = build_runner
        self._job_stop = stop  # main.py's, active for the whole job (start-up included)
        self.dp = dp or SINGLE  # data parallelism: this rank's questions, rank-0 writes
        self.run_dir = Path(run_dir)
        self.service = service
        self.dataset = dataset
        self.rollout = rollout
        self.reward_fn = reward_fn
        self.tracker = tracker
        self.totals = {"sampled_tokens": 0.0, "trained_tokens": 0.0, "search_calls": 0.0}
        self.wall_before = 0.0  # wall seconds of the run's earlier processes (a resume)
        self.step_rows: list[dict[str, float]] = []  # this process's step metrics, for the note
        self.critic = None  # set in run() when advantage=ppo_gae
        self.breaker = CircuitBreaker(cfg.trainer.breaker)  # search circuit breaker (loop/breaker.py)

    async def run(self) -> dict[str, float]:
        """Train, evaluating before/during/after; return the final summary metrics.

        SIGTERM / SIGINT end the run within seconds (``Stopped``, ``loop/stop.py``): a rollout
        or an eval in flight is cut short and the last completed step saved; an update or a
        checkpoint write is finished and its step saved. Without the job's ``StopSignals``
        (``stop``), the trainer installs its own for the run.
        """
        if self._job_stop is not None:
            self.stop = self._job_stop
            return await self._run()
        with StopSignals() as self.stop:
            return await self._run()

    async def _run(self) -> dict[str, float]:
        """Start or resume, train between the evals, and summarise the run."""
        self._t0 = time.perf_counter()
        state = resolve_resume(self.cfg.trainer.resume, self.run_dir, self.dp.world)
        client = await self._start(state)
        run = self._plan_run(client, state)
        self._last_saved = self._at[0]
        final: dict[str, float] = {}  # every eval's metrics, then the run's totals
        try:
            before, after, step = await self._train_between_evals(run, final)
        finally:
            if run.overlap is not None:
                run.overlap.close()  # a loop left early must not leave a rollout running
        final.update(after)
        self._print_before_after(before, after, step)
        final.update(self.totals, steps=float(step), wall_seconds=self._wall())
        return final

    def _wall(self) -> float:
        """Wall seconds of the whole run: earlier processes (before a resume) and this one."""
        return self.wall_before + time.perf_counter() - self._t0

    async def _start(self, state: TrainerState | None):
        """The training client: resumed from ``state``, or fresh with the warm start applied
        (``searchr1/warmstart/``, a no-op for ``warmstart=none``)."""
        if state is not None:
            log.info("resuming from step %d (%s)", state.step, state.engine_state)
            return self.service.create_training_client_from_state_with_optimizer(state.engine_state)
        client = self.service.create_lora_training_client(rank=self.cfg.model.lora_rank, seed=self.cfg.seed)
        await apply_warm_start(self.cfg, client, self.dataset, self.rollout, self.tracker, self.run_dir)
        fix_reference(self.cfg, client)  # KL against the warm start, not the model before it
        return client

    def _plan_run(self, client, state: TrainerState | None) -> _Run:
        """What the steps share: the step pipeline (its critic and the run's totals so far
        restored on a resume), the data order, the LR schedule and the overlap, if any; and
        the position to start from (``self._at``)."""
        tcfg = self.cfg.trainer
        runner = self.build_runner(self.cfg, self.rollout, self.reward_fn, self.service, self.dp)
        self.critic = runner.critic  # advantage=ppo_gae: saved and restored with the loop state
        if state is not None:
            if self.critic is not None:
                self.critic.load(checkpoint_dir(self.run_dir, state.step) / CRITIC_FILE)
            saved = dict(state.totals.get("trainer", {}))  # the summary and search/* go on
            self.wall_before = float(saved.pop("wall_seconds", 0.0))  # the summary's time goes on too
            self.totals.update(saved)
            runner.search_totals = SearchCounts(**state.totals.get("search", {}))
        runner.stop = self.stop  # a stop signal cuts the rollout short
        self._runner = runner
        self._at = (state.step, state.cursor, state.optimizer_steps) if state else (0, 0, 0)
        order = DataOrder(self.dataset.train, self.cfg.seed, tcfg.data_order, tcfg.questions_per_step)
        lr_for = partial(step_lr, tcfg, total_optimizer_steps(tcfg, self.cfg.rollout.group_size))
        overlap = _Overlap(runner, client, order, tcfg) if tcfg.max_staleness else None
        return _Run(client, runner, order, lr_for, overlap)

    async def _train_between_evals(self, run: _Run, final: dict) -> tuple[dict, dict, int]:
        """(eval before, eval after, steps done): the eval before training (a fresh run), the
        steps, the eval after (none when nothing was trained after an eval before: ``after`` is
        ``before`` then). A stop signal that cuts a rollout or an eval short saves the last
        completed step and raises ``Stopped``."""
        before: dict[str, float] = {}
        try:
            if self._at[0] == 0 and self.cfg.eval.before_training:
                before = await self._evaluate(run.client, 0)
                final.update(before)
            step = await self._steps(run, final)
            trained = bool(self.step_rows)  # steps=0 (or nothing left to train): no second eval
            after = await self._evaluate(run.client, step) if trained or not before else before
            return before, after, step
        except Interrupted as err:
            raise self._stopped(err, run.client, *self._at) from None

    def _print_before_after(self, before: dict, after: dict, step: int) -> None:
        """The evals before and after training and what changed (``loop/before_after.py``;
        rank 0, when there was an eval before and steps trained since)."""
        if before and self.step_rows and self.dp.is_rank0:
            evals = self.run_dir / "eval"
            print(before_after_report(before, after, step, evals / "step_000000/trajectories.jsonl",
                                      evals / f"step_{step:06d}/trajectories.jsonl", self.step_rows),
                  flush=True)

    async def _steps(self, run: _Run, final: dict) -> int:
        """The steps from ``self._at`` on, each logged, saved on schedule and evaluated every
        ``eval_every``; returns the number of steps done (``self._at`` holds the position)."""
        tcfg = self.cfg.trainer
        step, cursor, opt_steps = self._at
        bar = tqdm(total=tcfg.steps, initial=step, desc="train", unit="step", disable=not self.dp.is_rank0)
        run.runner.progress = progress = StepProgress(bar)  # each sampled turn shows on the bar
        while step < tcfg.steps:
            metrics = await self._one_step(run, step, cursor, opt_steps)
            step, cursor = step + 1, cursor + tcfg.questions_per_step
            opt_steps += int(metrics.get("train/optimizer_steps", 0))
            self._at = (step, cursor, opt_steps)
            self._record(metrics, step, progress)
            await self._save_or_stop(run.client, metrics)
            if step < tcfg.steps and tcfg.eval_every and step % tcfg.eval_every == 0:
                final.update(await self._evaluate(run.client, step))
        bar.close()
        return step

    async def _one_step(self, run: _Run, step: int, cursor: int, opt_steps: int) -> dict[str, float]:
        """Step ``step + 1``: its rollout and update (the rollout launched a step earlier under
        ``trainer.max_staleness=1``); its metrics."""
        self._phase = f"the rollout of step {step + 1}"
        if run.overlap is None:
            mine = self.dp.split_groups(run.order.slice(cursor, self.cfg.trainer.questions_per_step))
            metrics = await run.runner.run(run.client, mine, step, opt_steps, run.lr_for(step))
        else:
            metrics = await run.overlap.step(step, cursor, opt_steps, run.lr_for(step))
        metrics.setdefault("train/staleness", 0.0)
        return metrics

    def _record(self, metrics: dict[str, float], step: int, progress: StepProgress) -> None:
        """The run's totals, the logged row (``trainer.metric_names``) and the progress bar."""
        self._accumulate(metrics)
        self.step_rows.append(metrics)
        self.tracker.log(named_metrics(metrics, self.cfg.trainer.metric_names), step)
        crash_point("after_update", step)  # test hook (SEARCHR1_KILL_AT): updated, not saved
        progress.bar.update(1)
        progress.finished({v: f"{metrics[k]:.3g}" for k, v in BAR_KEYS.items() if k in metrics})

    async def _save_or_stop(self, client, metrics: dict[str, float]) -> None:
        """Checkpoint the step just done on schedule, at the end, on a stop signal or when the
        search breaker trips, then stop (``Stopped``: main.py exits 4; ``SearchOutage``: 3);
        over the breaker's threshold within its grace period, back off."""
        tcfg = self.cfg.trainer
        step, cursor, opt_steps = self._at
        # the metrics are the job's, and quota is pooled: every rank decides alike
        stop = self.breaker.observe(metrics, self.dp.any(quota_exhausted(self.rollout.retriever)))
        signalled = self.dp.any(self.stop.requested is not None)  # every rank stops here
        if stop or signalled or step == tcfg.steps or (tcfg.save_every and step % tcfg.save_every == 0):
            self._save(client, step, cursor, opt_steps)
        if signalled or self.dp.any(self.stop.requested is not None):  # one during the save
            if step > self._last_saved:
                self._save(client, step, cursor, opt_steps)
            raise Stopped(f"stopped by {self.stop.requested or 'a stop signal on another rank'}",
                          step, self._stop_summary(step))
        if stop:  # searches keep failing: checkpointed
            raise SearchOutage(stop, step, self._stop_summary(step))
        if self.breaker.pause_s:  # over the threshold, within the grace period: back off
            await asyncio.sleep(self.breaker.pause_s)

    def _stopped(self, err: Interrupted, client, step: int, cursor: int, opt_steps: int) -> Stopped:
        """A stop signal cut ``self._phase`` short after ``step`` completed steps: that step is
        saved when its checkpoint is not on disk yet, and the run stops (main.py exits 4)."""
        log.warning("%s was cut short by %s and discarded", self._phase, err)
        if step > self._last_saved:
            self._save(client, step, cursor, opt_steps)
        return Stopped(f"stopped by {err} during {self._phase}", step, self._stop_summary(step))

    def _stop_summary(self, step: int) -> dict[str, float]:
        return {**self.totals, "steps": float(step), "wall_seconds": self._wall()}

    def _accumulate(self, m: dict[str, float]) -> None:
        n = trajectories_per_step(self.cfg.trainer, self.cfg.rollout.group_size)
        self.totals["sampled_tokens"] += m.get("rollout/sampled_tokens", 0.0)
        self.totals["trained_tokens"] += m.get("train/loss_tokens_per_rollout_batch", 0.0)
        self.totals["search_calls"] += m.get("rollout/search_calls", 0.0) * n

    def _save(self, client, step: int, cursor: int, opt_steps: int) -> None:
        """Engine state + sampler weights, then the loop state (crash-safe: loop/checkpoint.py)."""
        trainer = {**self.totals, "wall_seconds": self._wall()}
        totals = {"trainer": trainer, "search": asdict(self._runner.search_totals)}
        full = self.cfg.model.tuning == "full"  # a resume needs as many processes
        if self.dp.is_rank0:  # the adapters and the critic are replicated: rank 0 writes them
            save_checkpoint(self.run_dir, client, step, cursor, opt_steps, self.critic, totals,
                            self.dp.world if full else 0)
        elif client.capabilities.sharded_state:  # FSDP2 shards: every rank writes its own
            client.save_state(engine_state_name(step), overwrite=True).result()
        self.dp.barrier()  # no rank runs ahead of a checkpoint it could resume from
        self._last_saved = step

    async def _evaluate(self, client, step: int) -> dict[str, float]:
        """Greedy eval of the current weights on the eval split; logged at ``step``."""
        e = self.cfg.eval
        self._phase = f"the eval after step {step}" if step else "the eval before training"
        examples = eval_examples(self.dataset, e)
        sampler = client.save_weights_and_get_sampling_client()
        settings = SamplingSettings(temperature=e.temperature, seed=self.cfg.seed)
        out_dir = self.run_dir / "eval" / f"step_{step:06d}"
        start = time.perf_counter()
        asyncio.get_running_loop().call_soon(crash_point, "in_eval", step)  # test hook: questions in flight
        if self.dp.active:
            metrics = await evaluate_split_parallel(self.dp, sampler, self.rollout, examples,
                                                    self.reward_fn, settings, out_dir, self.stop)
        else:
            metrics = await evaluate_split(sampler, self.rollout, examples, self.reward_fn,
                                           settings, out_dir, stop=self.stop)
        seconds = time.perf_counter() - start
        metrics["time/eval"] = seconds  # the eval's share of an arm's wall time
        log.info("eval at step %d: %.1f s, %d questions", step, seconds, len(examples))
        self.tracker.log(metrics, step)
        return metrics
