"""The lockstep rollout schedule: ``rollout.schedule=lockstep`` (issue 13, part 6).

The anchors do not run trajectories independently as ``searchr1/rollout/engine.py`` does
(``schedule=async``). They advance all active trajectories one turn at a time:

1. turn t of every active trajectory is sampled as one batch (here: all sample requests
   issued together and awaited together — the turn's barrier);
2. the turn's searches run, then turn t+1 starts. ``lockstep_search`` says how:
   - ``batched`` (Search-R1's official code): ONE ``retriever.search`` call with every query
     of the turn; if it raises, every search of that turn failed;
   - ``serial`` (the lab): one search at a time, awaited in trajectory order.

Only timing differs from ``async``: each trajectory goes through the same protocol rules —
the first turn of a group is one request with ``num_samples=group_size`` and the same seeds,
budgets, stop reasons, context clipping and observation truncation — using the engine's own
helpers. What is not shared with ``RolloutEngine._advance`` is the few lines between a turn's
observation and its next sample; ``tests/rollout/test_lockstep.py`` checks both schedules produce
equal trajectories over the protocol's branches.

This module is imported by the config schema, so it stays light: the engine (and with it
pytrio) is imported inside the functions, when a rollout runs, not when a config is composed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import Enum
from typing import TYPE_CHECKING

from searchr1.protocols.base import ActionKind, Observation
from searchr1.rollout.types import EndReason, Trajectory, Turn

if TYPE_CHECKING:
    from searchr1.data.types import QAExample
    from searchr1.rollout.engine import RolloutEngine, SamplingSettings

log = logging.getLogger(__name__)

#: How a rollout is scheduled. ``async`` is a Python keyword, hence the functional form;
#: OmegaConf converts a config string to a member by name.
RolloutSchedule = Enum(
    "RolloutSchedule",
    [
        ("async", "async"),  # each trajectory advances on its own (searchr1/rollout/engine.py)
        ("lockstep", "lockstep"),  # all active trajectories advance one turn at a time
    ],
    type=str,
)
RolloutSchedule.__doc__ = "How a rollout is scheduled: async (default) | lockstep."


class LockstepSearch(str, Enum):
    """How a lockstep turn runs its searches."""

    batched = "batched"  # one retriever call with all the turn's queries (the paper's code)
    serial = "serial"  # one search at a time, in trajectory order (the lab's code)


def check_schedule(schedule: object, lockstep_search: object) -> tuple[Enum, LockstepSearch]:
    """Both settings as enum members; a ValueError listing the valid ones otherwise.

    Hydra catches an unknown value at compose (they are enums in the schema); this covers a
    ``RolloutConfig`` built in Python, where dataclasses check nothing.
    """
    out = []
    for name, value, kind in (("schedule", schedule, RolloutSchedule),
                              ("lockstep_search", lockstep_search, LockstepSearch)):
        try:
            out.append(kind(getattr(value, "value", value)))
        except ValueError:
            valid = ", ".join(m.value for m in kind)
            raise ValueError(f"rollout.{name}={value!r} is unknown (valid: {valid})") from None
    return out[0], out[1]


async def rollout_lockstep(
    engine: RolloutEngine,
    sampler,
    examples: list[QAExample],
    group_size: int,
    settings: SamplingSettings,
) -> list[list[Trajectory]]:
    """One group of ``group_size`` trajectories per example, advanced turn by turn."""
    groups: list[list[Trajectory]] = []
    firsts = []  # (group, prompt, budget, example) of groups that get a first turn
    for ex in examples:
        prompt = engine._clip_context(engine.protocol.example_prompt(ex))
        trajs = [Trajectory.start(ex, g, prompt) for g in range(group_size)]
        groups.append(trajs)
        budget = engine.cfg.max_trajectory_tokens - len(prompt)
        if budget <= 0:
            for t in trajs:
                t.end_reason = EndReason.TOKEN_LIMIT
        else:
            firsts.append((trajs, prompt, budget, ex))
    mode = engine.lockstep_search
    pending = await _first_turn(engine, sampler, firsts, group_size, settings)
    while pending:
        searching = []
        for traj, seq, truncated in pending:
            turn = engine._record_turn(traj, seq, truncated)
            end = engine._end_reason(traj, turn)
            if end is None:
                searching.append((traj, turn))
            else:
                traj.end_reason = end
        observations = await _observe_turn(engine, [turn for _, turn in searching], mode)
        pending = await _next_turn(engine, sampler, searching, observations, settings)
    return groups


async def _first_turn(engine: RolloutEngine, sampler, firsts, group_size: int,
                      settings: SamplingSettings) -> list[tuple]:
    """Turn 1 of every group together: one ``num_samples=group_size`` request per group."""
    from searchr1.rollout.engine import derive_seed

    requests = [
        engine._sample(sampler, prompt, group_size,
                       engine._params(settings, budget, derive_seed(settings.seed, ex.id, "first")))
        for _, prompt, budget, ex in firsts
    ]
    responses = await _gather(requests)
    pending = []
    for (trajs, *_), response in zip(firsts, responses):
        if isinstance(response, Exception):
            engine._fail(trajs, response)
            continue
        pending += [(t, seq, False) for t, seq in zip(trajs, response.sequences)]
    return pending


async def _next_turn(engine: RolloutEngine, sampler, searching: list[tuple],
                     observations: list[Observation], settings: SamplingSettings) -> list[tuple]:
    """Append each observation, then sample every continuing trajectory's next turn together.

    The same rules as ``RolloutEngine._advance`` (``_next_request``: token budget, seed,
    context clipping).
    """
    asks = []  # (traj, truncated, request)
    for (traj, turn), observation in zip(searching, observations):
        ask = engine._next_request(traj, turn, observation, settings)
        if ask is None:
            continue
        context, params = ask
        asks.append((traj, len(context) < len(traj.tokens_T), engine._sample(sampler, context, 1, params)))
    responses = await _gather([request for _, _, request in asks])
    pending = []
    for (traj, truncated, _), response in zip(asks, responses):
        if isinstance(response, Exception):
            log.warning("sampling failed mid-trajectory: %r", response)
            traj.end_reason = EndReason.SAMPLER_ERROR
        else:
            pending.append((traj, response.sequences[0], truncated))
    return pending


async def _observe_turn(engine: RolloutEngine, turns: list[Turn],
                        mode: LockstepSearch) -> list[Observation]:
    """The observation of every turn that continues; its searches run per ``mode``."""
    observations: list[Observation] = [Observation(invalid=True)] * len(turns)
    searches = [i for i, t in enumerate(turns) if t.action.kind is ActionKind.SEARCH]
    if mode is LockstepSearch.serial:
        for i in searches:
            (observations[i],) = await _search(engine, [turns[i]])
    elif searches:
        batch = await _search(engine, [turns[i] for i in searches])
        for i, observation in zip(searches, batch):
            observations[i] = observation
    return observations


async def _search(engine: RolloutEngine, turns: list[Turn]) -> list[Observation]:
    """One ``retriever.search`` call for ``turns``' queries; records documents or the error.

    Same recording as ``RolloutEngine._observe``; a failed call fails every turn in it.
    """
    start = time.perf_counter()
    try:
        async with engine._search_sem:
            results = await engine.retriever.search([t.action.query for t in turns], engine.topk)
    except Exception as err:  # noqa: BLE001 - a tool error is shown to the model
        for t in turns:
            t.tool_error = f"{type(err).__name__}: {err}"
            t.search_seconds = time.perf_counter() - start
        return [Observation(error="search failed, please try again")] * len(turns)
    seconds = time.perf_counter() - start
    for t, docs in zip(turns, results):
        t.documents, t.search_seconds = list(docs), seconds
    return [Observation(documents=tuple(docs)) for docs in results]


async def _gather(requests: list) -> list:
    """Await all requests together; an ``Exception`` comes back as a value (failures are data)."""
    results = await asyncio.gather(*requests, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, Exception):
            raise r  # cancellation and the like are not a sampler's failure
    return results
