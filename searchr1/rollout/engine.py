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
no ratio corrects. The official code trains such turns on the full context instead.
Each sampled turn passes through ``protocol.cut_turn`` before it is recorded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

import pytrio

from searchr1.data.types import QAExample
from searchr1.protocols.base import ActionKind, Observation, ObservationOverflow, Protocol
from searchr1.retrievers.base import Retriever
from searchr1.rollout.lockstep import RolloutSchedule, check_schedule, rollout_lockstep
from searchr1.rollout.types import EndReason, Trajectory, Turn
from searchr1.schemas import RolloutConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingSettings:
    """Per-rollout sampling choices (training vs greedy eval)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0


def derive_seed(base: int, *parts: object) -> int:
    """A stable 31-bit seed derived from the run seed and a trajectory/turn identity."""
    key = ":".join(str(p) for p in (base, *parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") & 0x7FFFFFFF


class RolloutEngine:
    """Runs groups of trajectories for questions with a sampler, a protocol and a retriever."""

    def __init__(
        self, protocol: Protocol, retriever: Retriever, topk: int, cfg: RolloutConfig
    ) -> None:
        self.protocol = protocol
        self.retriever = retriever
        self.topk = topk
        self.cfg = cfg
        self.schedule, self.lockstep_search = check_schedule(cfg.schedule, cfg.lockstep_search)
        self._sample_sem = asyncio.Semaphore(cfg.sampler_concurrency)
        self._search_sem = asyncio.Semaphore(cfg.search_concurrency)

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
        prompt = self._clip_context(self.protocol.example_prompt(example))
        trajs = [Trajectory.start(example, g, prompt) for g in range(group_size)]
        budget = self.cfg.max_trajectory_tokens - len(prompt)
        if budget <= 0:
            for t in trajs:
                t.end_reason = EndReason.TOKEN_LIMIT
            return trajs
        params = self._params(settings, budget, derive_seed(settings.seed, example.id, "first"))
        try:
            first = await self._sample(sampler, prompt, group_size, params)
        except Exception as err:  # noqa: BLE001 - failures travel as data
            return self._fail(trajs, err)
        await asyncio.gather(
            *(self._advance(sampler, t, seq, settings) for t, seq in zip(trajs, first.sequences))
        )
        return trajs

    def _fail(self, trajs: list[Trajectory], err: Exception) -> list[Trajectory]:
        log.warning("first-turn sampling failed for a group: %r", err)
        for t in trajs:
            t.end_reason = EndReason.SAMPLER_ERROR
        return trajs

    async def _advance(self, sampler, traj: Trajectory, seq, settings: SamplingSettings) -> None:
        """Drive one trajectory from its first sampled turn to its end."""
        truncated = False  # whether ``seq`` was sampled from a left-truncated context
        while True:
            turn = self._record_turn(traj, seq, truncated)
            end = self._end_reason(traj, turn)
            if end is not None:
                traj.end_reason = end
                return
            observation = await self._observe(turn)
            ask = self._next_request(traj, turn, observation, settings)
            if ask is None:
                return
            context, params = ask
            truncated = len(context) < len(traj.tokens_T)
            try:
                response = await self._sample(sampler, context, 1, params)
            except Exception as err:  # noqa: BLE001 - the trajectory is kept as data
                log.warning("sampling failed mid-trajectory: %r", err)
                traj.end_reason = EndReason.SAMPLER_ERROR
                return
            seq = response.sequences[0]

    def _next_request(self, traj: Trajectory, turn: Turn, observation: Observation,
                      settings: SamplingSettings):
        """Append ``observation`` after ``turn``; the next turn's (context, sampling params),
        or None when the token budget is spent (``traj`` then ends on ``TOKEN_LIMIT``) or the
        protocol refuses an observation that does not fit (``OBSERVATION_LIMIT``).
        Shared by the async rollout and the lockstep schedule (``rollout/lockstep.py``)."""
        room = self.cfg.max_trajectory_tokens - len(traj.tokens_T)
        try:
            tokens, text = self.protocol.fit_observation(
                turn.sampled_tokens, observation, self.cfg.max_observation_tokens, room
            )
        except ObservationOverflow:  # the protocol ends the trajectory before it
            traj.end_reason = EndReason.OBSERVATION_LIMIT
            return None
        traj.append_observation(tokens)
        turn.observation_text, turn.observation_len = text, len(tokens)
        budget = self.cfg.max_trajectory_tokens - len(traj.tokens_T)
        if budget <= 0:
            traj.end_reason = EndReason.TOKEN_LIMIT
            return None
        seed = derive_seed(settings.seed, traj.example.id, traj.group_index, len(traj.turns))
        return self._clip_context(traj.tokens_T), self._params(settings, budget, seed)

    def _clip_context(self, tokens: list[int]) -> list[int]:
        """The last ``max_prompt_tokens`` tokens (all of them when the limit is unset)."""
        limit = self.cfg.max_prompt_tokens
        return list(tokens) if limit is None or len(tokens) <= limit else list(tokens[-limit:])

    def _record_turn(self, traj: Trajectory, seq, truncated: bool = False) -> Turn:
        tokens, logprobs, text = self.protocol.cut_turn(
            list(seq.tokens), list(seq.logprobs), seq.text or "", seq.stop_reason
        )
        turn = Turn(
            prompt_len=len(traj.tokens_T),
            sampled_tokens=tokens,
            sampled_logprobs=logprobs,
            text=text,
            stop_reason=seq.stop_reason,
            action=self.protocol.parse_action(text),
        )
        if truncated:  # kept as context, never trained (module docstring)
            traj.append_observation(turn.sampled_tokens)
        else:
            traj.append_sampled(turn.sampled_tokens, turn.sampled_logprobs)
        traj.turns.append(turn)
        return turn

    def _end_reason(self, traj: Trajectory, turn: Turn) -> EndReason | None:
        """Why the trajectory must stop after ``turn``, or None to continue."""
        if turn.action.kind is ActionKind.ANSWER:
            return EndReason.ANSWER
        ends_on_invalid = getattr(self.protocol, "on_invalid", "retry") == "end"
        if turn.action.kind is ActionKind.INVALID and ends_on_invalid:
            return EndReason.INVALID  # the lab: no retry message, the trajectory ends here
        if len(traj.tokens_T) >= self.cfg.max_trajectory_tokens:
            return EndReason.TOKEN_LIMIT
        if turn.action.kind is ActionKind.SEARCH and traj.num_searches >= self.cfg.max_searches:
            return EndReason.SEARCH_BUDGET
        if len(traj.turns) >= self.cfg.max_turns:
            return EndReason.TURN_LIMIT
        return None

    async def _observe(self, turn: Turn) -> Observation:
        """Run the turn's search (or build the invalid-action observation)."""
        action = turn.action
        if action.kind is not ActionKind.SEARCH:
            return Observation(invalid=True)
        start = time.perf_counter()
        try:
            async with self._search_sem:
                docs = (await self.retriever.search([action.query], self.topk))[0]
        except Exception as err:  # noqa: BLE001 - a tool error is shown to the model
            turn.tool_error = f"{type(err).__name__}: {err}"
            return Observation(error="search failed, please try again")
        finally:
            turn.search_seconds = time.perf_counter() - start
        turn.documents = list(docs)
        return Observation(documents=tuple(docs))

    async def _sample(self, sampler, tokens: list[int], n: int, params: pytrio.SamplingParams):
        async with self._sample_sem:
            return await sampler.sample_async(
                prompt=pytrio.ModelInput.from_ints(list(tokens)),
                num_samples=n,
                sampling_params=params,
            )

    def _params(self, s: SamplingSettings, budget: int, seed: int) -> pytrio.SamplingParams:
        return pytrio.SamplingParams(
            max_tokens=min(self.cfg.max_turn_tokens, budget),
            stop=list(self.protocol.stop),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=seed,
        )
