"""The async multi-turn rollout engine.

Per question, the first turn is sampled once with ``num_samples=group_size`` (all
trajectories of a group share the prompt); after that each trajectory advances on its own:
there is no barrier between turns of different trajectories, so one trajectory's search
overlaps another's sampling. Within a trajectory, order is causal. Concurrency is bounded by
one semaphore for the sampler and one for the retriever.

Budget rule (the paper's): after ``max_searches`` executed searches the model gets one last
turn in which a search is not executed; the trajectory then ends with ``search_budget``.
Failures travel as data: a search error becomes the observation the model sees, a sampler
error ends the trajectory with ``sampler_error``.

Context limit (``rollout.max_prompt_tokens``, the paper's ``max_prompt_length``): the
sampler gets the last N tokens of the context, as officially. The first prompt is itself
left-truncated, so the trajectory starts with what the sampler saw. A later turn sampled
from a truncated context stays in the trajectory (the context of later turns) but with
mask 0 and logprob 0: the datum conditions every token on the whole trajectory, which is
not the context that turn was sampled from, so training on it would be off-policy in a way
no ratio corrects. The official code trains such turns on the full context instead;
``rollout.train_truncated_turns=true`` does the same (the paper presets).
Each sampled turn passes through ``protocol.cut_turn`` before it is recorded.
"""

from __future__ import annotations

import asyncio
import logging

from searchr1.data.types import QAExample
from searchr1.rollout.config import RolloutSchedule
from searchr1.rollout.lockstep import rollout_lockstep
from searchr1.rollout.turns import SamplingSettings, TurnRules, derive_seed
from searchr1.rollout.types import EndReason, Trajectory

__all__ = ["RolloutEngine", "SamplingSettings", "derive_seed"]

log = logging.getLogger(__name__)


class RolloutEngine(TurnRules):
    """Runs groups of trajectories for questions with a sampler, a protocol and a retriever."""

    async def rollout(
        self, sampler, examples: list[QAExample], group_size: int, settings: SamplingSettings
    ) -> list[list[Trajectory]]:
        """One group of ``group_size`` trajectories per example, in the examples' order."""
        if self.schedule is RolloutSchedule["lockstep"]:  # searchr1/rollout/lockstep.py
            return await rollout_lockstep(self, sampler, examples, group_size, settings)
        tasks = [self.rollout_group(sampler, ex, group_size, settings) for ex in examples]
        return list(await asyncio.gather(*tasks))

    async def rollout_group(
        self, sampler, example: QAExample, group_size: int, settings: SamplingSettings
    ) -> list[Trajectory]:
        if self.schedule is RolloutSchedule["lockstep"]:  # searchr1/rollout/lockstep.py
            return (await rollout_lockstep(self, sampler, [example], group_size, settings))[0]
        prompt = self.clip_context(self.protocol.example_prompt(example))
        trajs = [Trajectory.start(example, g, prompt) for g in range(group_size)]
        budget = self.cfg.max_trajectory_tokens - len(prompt)
        if budget <= 0:
            for t in trajs:
                t.end_reason = EndReason.TOKEN_LIMIT
            return trajs
        params = self.params(settings, budget, derive_seed(settings.seed, example.id, "first"))
        try:
            first = await self.sample(sampler, prompt, group_size, params, example.question, 0)
        except Exception as err:  # noqa: BLE001 - failures travel as data
            return self.fail_group(trajs, err)
        await asyncio.gather(
            *(self._advance(sampler, t, seq, settings) for t, seq in zip(trajs, first.sequences))
        )
        return trajs

    async def _advance(self, sampler, traj: Trajectory, seq, settings: SamplingSettings) -> None:
        """Drive one trajectory from its first sampled turn to its end."""
        truncated = False  # whether ``seq`` was sampled from a left-truncated context
        while True:
            turn = self.record_turn(traj, seq, truncated)
            end = self.end_reason(traj, turn)
            if end is not None:
                traj.end_reason = end
                return
            observation = await self.observe(turn)
            ask = self.next_request(traj, turn, observation, settings)
            if ask is None:
                return
            context, params = ask
            truncated = len(context) < len(traj.tokens_T)
            try:
                response = await self.sample(sampler, context, 1, params, traj.example.question,
                                             len(traj.turns))
            except Exception as err:  # noqa: BLE001 - the trajectory is kept as data
                log.warning("sampling failed mid-trajectory: %r", err)
                traj.end_reason = EndReason.SAMPLER_ERROR
                return
            seq = response.sequences[0]

