"""The rules of one turn, shared by the async and the lockstep schedules.

A turn is sampled from the trajectory's running context (left-clipped to
``rollout.max_prompt_tokens``), cut and parsed by the protocol, recorded (sampled tokens
carry the loss mask; a turn sampled from a clipped context is kept as context only), then
ends the trajectory (answer, invalid with ``on_invalid=end``, token / search / turn limits)
or runs its search and appends the observation. Sampling seeds derive from the run seed and
the trajectory's identity, so a schedule changes timing only, never what is drawn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass

import pytrio

from searchr1.protocols.base import ActionKind, Observation, ObservationOverflow, OnInvalid, Protocol
from searchr1.retrievers.base import Retriever
from searchr1.rollout.config import RolloutConfig, check_schedule
from searchr1.rollout.scripted import ScriptedTurns, check_scripted
from searchr1.rollout.types import EndReason, Trajectory, Turn

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


class TurnRules:
    """Sampling, recording, ending and observing one turn of a trajectory."""

    def __init__(
        self, protocol: Protocol, retriever: Retriever, topk: int, cfg: RolloutConfig
    ) -> None:
        self.protocol = protocol
        self.retriever = retriever
        self.topk = topk
        self.cfg = cfg
        self.schedule, self.lockstep_search = check_schedule(cfg.schedule, cfg.lockstep_search)
        self.sample_sem = asyncio.Semaphore(cfg.sampler_concurrency)
        self.search_sem = asyncio.Semaphore(cfg.search_concurrency)
        scripted = check_scripted(cfg.scripted_policy, protocol)
        self.scripted = ScriptedTurns(protocol, cfg.max_searches) if scripted else None

    def fail_group(self, trajs: list[Trajectory], err: Exception) -> list[Trajectory]:
        log.warning("first-turn sampling failed for a group: %r", err)
        for t in trajs:
            t.end_reason = EndReason.SAMPLER_ERROR
        return trajs

    def next_request(self, traj: Trajectory, turn: Turn, observation: Observation,
                      settings: SamplingSettings):
        """Append ``observation`` after ``turn``; the next turn's (context, sampling params),
        or None when the token budget is spent (``traj`` then ends on ``TOKEN_LIMIT``) or the
        protocol refuses an observation that does not fit (``OBSERVATION_LIMIT``)."""
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
        return self.clip_context(traj.tokens_T), self.params(settings, budget, seed)

    def clip_context(self, tokens: list[int]) -> list[int]:
        """The last ``max_prompt_tokens`` tokens (all of them when the limit is unset)."""
        limit = self.cfg.max_prompt_tokens
        return list(tokens) if limit is None or len(tokens) <= limit else list(tokens[-limit:])

    def record_turn(self, traj: Trajectory, seq, truncated: bool = False) -> Turn:
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
        if truncated and not self.cfg.train_truncated_turns:  # context only (module docstring)
            traj.append_observation(turn.sampled_tokens)
        else:
            traj.append_sampled(turn.sampled_tokens, turn.sampled_logprobs)
        traj.turns.append(turn)
        return turn

    def end_reason(self, traj: Trajectory, turn: Turn) -> EndReason | None:
        """Why the trajectory must stop after ``turn``, or None to continue."""
        if turn.action.kind is ActionKind.ANSWER:
            return EndReason.ANSWER
        ends_on_invalid = self.protocol.on_invalid == OnInvalid.end
        if turn.action.kind is ActionKind.INVALID and ends_on_invalid:
            return EndReason.INVALID  # the lab: no retry message, the trajectory ends here
        if len(traj.tokens_T) >= self.cfg.max_trajectory_tokens:
            return EndReason.TOKEN_LIMIT
        if turn.action.kind is ActionKind.SEARCH and traj.num_searches >= self.cfg.max_searches:
            return EndReason.SEARCH_BUDGET
        if len(traj.turns) >= self.cfg.max_turns:
            return EndReason.TURN_LIMIT
        return None

    async def observe(self, turn: Turn) -> Observation:
        """Run the turn's search (or build the invalid-action observation)."""
        action = turn.action
        if action.kind is not ActionKind.SEARCH:
            return Observation(invalid=True)
        start = time.perf_counter()
        try:
            async with self.search_sem:
                docs = (await self.retriever.search([action.query], self.topk))[0]
        except Exception as err:  # noqa: BLE001 - a tool error is shown to the model
            turn.tool_error = f"{type(err).__name__}: {err}"
            return Observation(error="search failed, please try again")
        finally:
            turn.search_seconds = time.perf_counter() - start
        turn.documents = list(docs)
        return Observation(documents=tuple(docs))

    async def sample(self, sampler, tokens: list[int], n: int, params: pytrio.SamplingParams,
                     question: str = "", turn: int = 0):
        """``n`` sequences for ``tokens``; under ``rollout.scripted_policy`` turn ``turn`` of a
        trajectory for ``question`` is scripted (``rollout/scripted.py``)."""
        async with self.sample_sem:
            if self.scripted is not None:
                return await self.scripted.sample(sampler, list(tokens), n, params, question, turn)
            return await sampler.sample_async(
                prompt=pytrio.ModelInput.from_ints(list(tokens)),
                num_samples=n,
                sampling_params=params,
            )

    def params(self, s: SamplingSettings, budget: int, seed: int) -> pytrio.SamplingParams:
        return pytrio.SamplingParams(
            max_tokens=min(self.cfg.max_turn_tokens, budget),
            stop=list(self.protocol.stop),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=seed,
        )
