"""The RL loop: steps, checkpoints, resume and periodic evaluation.

One ``Trainer.run`` = (eval before) → for each step: ``StepRunner.run`` → metrics →
checkpoint every ``save_every`` → eval every ``eval_every`` → final checkpoint and eval.
The data order is a pure function of the seed (``DataOrder``), sampling seeds are derived
from (seed, step), and engine state (adapters, optimizer, RNG) is saved with the loop's own
state, so ``trainer.resume=auto`` continues with no repeated or skipped step.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

from tqdm.auto import tqdm

from searchr1.build import build_step_runner, optimizer_steps_per_rollout
from searchr1.loop.checkpoint import CRITIC_FILE, TrainerState, checkpoint_dir, resolve_resume, write_state
from searchr1.data.order import DataOrder
from searchr1.data.selection import eval_examples
from searchr1.evaluate import format_before_after, evaluate_split
from searchr1.loop.lr_schedule import learning_rate
from searchr1.rollout.engine import SamplingSettings

log = logging.getLogger(__name__)

BAR_KEYS = {"reward/mean": "R", "reward/correct": "EM", "rollout/search_calls": "srch",
            "train/loss": "loss", "time/step_seconds": "s"}


class Trainer:
    """Owns the loop; the engine, rollout engine and trackers are handed in, built elsewhere."""

    def __init__(self, cfg, run_dir: Path, service, dataset, rollout, reward_fn, tracker) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.service = service
        self.dataset = dataset
        self.rollout = rollout
        self.reward_fn = reward_fn
        self.tracker = tracker
        self.totals = {"sampled_tokens": 0.0, "trained_tokens": 0.0, "search_calls": 0.0}
        self.critic = None  # set in run() when advantage=ppo_gae

    def _total_optimizer_steps(self) -> int:
        t = self.cfg.trainer
        return t.steps * optimizer_steps_per_rollout(t, self.cfg.rollout.group_size)

    def _client(self, state: TrainerState | None):
        m = self.cfg.model
        if state is None:
            return self.service.create_lora_training_client(rank=m.lora_rank, seed=self.cfg.seed)
        log.info("resuming from step %d (%s)", state.step, state.engine_state)
        return self.service.create_training_client_from_state_with_optimizer(state.engine_state)

    async def run(self) -> dict[str, float]:
        """Train, evaluating before/during/after; return the final summary metrics."""
        t0 = time.perf_counter()
        tcfg = self.cfg.trainer
        state = resolve_resume(tcfg.resume, self.run_dir)
        client = self._client(state)
        if state is None:  # fresh run: warm start (searchr1/warmstart/), a no-op for warmstart=none
            from searchr1.warmstart.apply import apply_warm_start
            await apply_warm_start(self.cfg, client, self.dataset, self.rollout, self.tracker, self.run_dir)
        step, cursor = (state.step, state.cursor) if state else (0, 0)
        opt_steps = state.optimizer_steps if state else 0
        order = DataOrder(self.dataset.train, self.cfg.seed, tcfg.data_order)
        runner = build_step_runner(self.cfg, self.rollout, self.reward_fn, self.service)
        self.critic = runner.critic  # advantage=ppo_gae: saved and restored with the loop state
        if state is not None and self.critic is not None:
            self.critic.load(checkpoint_dir(self.run_dir, state.step) / CRITIC_FILE)
        lr_at = partial(learning_rate, tcfg.lr_schedule, tcfg.learning_rate,
                        total_steps=self._total_optimizer_steps(), warmup_ratio=tcfg.warmup_ratio)
        final: dict[str, float] = {}
        before: dict[str, float] = {}
        if step == 0 and self.cfg.eval.before_training:
            before = await self._evaluate(client, 0)
            final.update(before)
        bar = tqdm(total=tcfg.steps, initial=step, desc="train", unit="step")
        while step < tcfg.steps:
            q = tcfg.questions_per_step
            metrics = await runner.run(client, order.slice(cursor, q), step, opt_steps, lr_at)
            step, cursor = step + 1, cursor + q
            opt_steps += int(metrics.get("train/optimizer_steps", 0))
            self._accumulate(metrics)
            self.tracker.log(metrics, step)
            bar.update(1)
            bar.set_postfix({v: f"{metrics[k]:.3g}" for k, v in BAR_KEYS.items() if k in metrics})
            if step == tcfg.steps or (tcfg.save_every and step % tcfg.save_every == 0):
                self._save(client, step, cursor, opt_steps)
            if step < tcfg.steps and tcfg.eval_every and step % tcfg.eval_every == 0:
                final.update(await self._evaluate(client, step))
        bar.close()
        after = await self._evaluate(client, step)
        final.update(after)
        if before:
            print(format_before_after(before, after, step), flush=True)
        final.update(self.totals, steps=float(step), wall_seconds=time.perf_counter() - t0)
        return final

    def _accumulate(self, m: dict[str, float]) -> None:
        n = self.cfg.trainer.questions_per_step * self.cfg.rollout.group_size
        self.totals["sampled_tokens"] += m.get("rollout/sampled_tokens", 0.0)
        self.totals["trained_tokens"] += m.get("train/loss_tokens_per_rollout_batch", 0.0)
        self.totals["search_calls"] += m.get("rollout/search_calls", 0.0) * n

    def _save(self, client, step: int, cursor: int, opt_steps: int) -> None:
        """Engine state + sampler weights, then the loop state (written last, atomically)."""
        name = f"step_{step:06d}"
        engine_state = client.save_state(name).result().path
        sampler = client.save_weights_for_sampler(name).result().path
        if self.critic is not None:
            checkpoint_dir(self.run_dir, step).mkdir(parents=True, exist_ok=True)
            self.critic.save(checkpoint_dir(self.run_dir, step) / CRITIC_FILE)
        write_state(self.run_dir, TrainerState(step, cursor, engine_state, sampler, opt_steps))

    async def _evaluate(self, client, step: int) -> dict[str, float]:
        """Greedy eval of the current weights on the eval split; logged at ``step``."""
        e = self.cfg.eval
        examples = eval_examples(self.dataset, e)
        sampler = client.save_weights_and_get_sampling_client()
        settings = SamplingSettings(temperature=e.temperature, seed=self.cfg.seed)
        out_dir = self.run_dir / "eval" / f"step_{step:06d}"
        metrics = await evaluate_split(sampler, self.rollout, examples, self.reward_fn,
                                       settings, out_dir)
        self.tracker.log(metrics, step)
        return metrics
