"""Scoring finished trajectories and turning a batch of them into metrics.

Scoring is synchronous and pure given the protocol and reward function: the final answer
and the format verdict come from the reward's registered answer rule
(``reward.answer_rule``, ``rewards/answer_rule.py``: the protocol's own by default, the lab's
one-line rule with ``lab``); the reward from ``searchr1/rewards``. EM/F1 use the reward's
normalisation, so the logged EM is the EM the reward saw. Metric names and definitions are
the lab's: ``rollout/valid_tool_call_rate`` is executed searches ÷ turns that contain
``<tool_call>`` (the lab's ``train.py``), not "valid turns ÷ turns". Step-level ``search/*``
and ``train/*`` batch metrics are in ``step_metrics.py``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from searchr1.protocols.base import ActionKind, Protocol
from searchr1.rewards import Reward, RewardFn, RewardInput
from searchr1.rewards.answer_rule import ANSWER_RULES, FinishedTurns
from searchr1.rewards.normalize import exact_match, sub_exact_match, token_f1
from searchr1.rollout.types import EndReason, Trajectory

TOOL_CALL_OPEN = "<tool_call>"


def finished_turns(traj: Trajectory) -> FinishedTurns:
    """What the answer rule reads of ``traj``. ``awaiting_turn``: it stopped after an
    observation, before a turn it never sampled (``rewards/answer_rule.py``)."""
    return FinishedTurns(
        texts=tuple(t.text for t in traj.turns),
        observations=tuple(t.observation_text for t in traj.turns),
        searched=tuple(t.action.kind is ActionKind.SEARCH for t in traj.turns),
        awaiting_turn=bool(traj.turns) and traj.turns[-1].observation_len > 0,
    )


def score_trajectory(traj: Trajectory, protocol: Protocol, reward_fn: Reward | RewardFn) -> None:
    """Fill ``answer``, ``reward`` and ``scores`` (em, subem, f1, format) in place."""
    reward_fn = Reward.of(reward_fn)
    rule, mode = ANSWER_RULES.get(reward_fn.answer_rule), reward_fn.normalize
    turns = finished_turns(traj)
    golds = traj.example.golden_answers
    traj.answer = rule.final_answer(protocol, turns) if turns.texts else None
    valid = bool(turns.texts) and rule.well_formed(protocol, turns, traj.answer)
    retrieved = any(sub_exact_match(o, golds, mode) for o in turns.observations if o)
    traj.reward = float(reward_fn(RewardInput(traj.answer, golds, valid, retrieved)))
    has = traj.answer is not None
    traj.scores = {
        "em": float(has and exact_match(traj.answer, golds, mode)),
        "subem": float(has and sub_exact_match(traj.answer, golds, mode)),
        "f1": token_f1(traj.answer, golds, mode) if has else 0.0,
        "format": float(valid),
        "retrieval_correct": float(retrieved),
    }


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Batch metrics: ``reward/*`` and ``rollout/*`` over all trajectories given."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_source[t.example.data_source].append(t.reward)
    turns = [turn for t in trajs for turn in t.turns]
    out = {
        "reward/mean": _mean([t.reward for t in trajs]),
        "reward/correct": _mean([t.scores.get("em", 0.0) for t in trajs]),
        "reward/format": _mean([t.scores.get("format", 0.0) for t in trajs]),
        "rollout/turns": _mean([len(t.turns) for t in trajs]),
        "rollout/search_calls": _mean([t.num_searches for t in trajs]),
        "rollout/no_search_rate": _mean([float(t.num_searches == 0) for t in trajs]),
        "rollout/trajectory_tokens": _mean([len(t.tokens_T) for t in trajs]),
        "rollout/action_tokens": _mean([t.num_action_tokens for t in trajs]),
        "rollout/valid_tool_call_rate": valid_tool_call_rate(trajs),
        "rollout/tool_error_rate": _mean(
            [float(turn.tool_error is not None) for turn in turns if turn.action.kind is ActionKind.SEARCH]
        ),
        "rollout/sampler_error_rate": _mean(
            [float(t.end_reason is EndReason.SAMPLER_ERROR) for t in trajs]
        ),
    }
    for reason in EndReason:
        out[f"rollout/end/{reason.value}"] = _mean([float(t.end_reason is reason) for t in trajs])
    for source, rewards in sorted(by_source.items()):
        out[f"reward/{source}"] = _mean(rewards)
    return out


def valid_tool_call_rate(trajs: list[Trajectory]) -> float:
    """The lab's definition: executed searches ÷ turns whose text contains ``<tool_call>``.

    Denominator at least 1 (0.0 when no turn tried a call), as in the lab. A turn parsed as a
    search counts as an attempt too: with ``protocol=tool_call`` it always contains the
    marker (the same count), and with ``protocol=tags`` the rate stays a rate.
    """
    attempts = sum(
        TOOL_CALL_OPEN in turn.text or turn.action.kind is ActionKind.SEARCH
        for t in trajs for turn in t.turns
    )
    return sum(t.num_searches for t in trajs) / max(attempts, 1)


def eval_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Eval summary: EM per data_source, macro EM (mean over sources), format rate, …"""
    by_source: dict[str, list[float]] = defaultdict(list)
    searches: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_source[t.example.data_source].append(t.scores.get("em", 0.0))
        searches[t.example.data_source].append(float(t.num_searches))
    out = {f"eval/em/{s}": _mean(v) for s, v in sorted(by_source.items())}
    out.update({f"eval/searches/{s}": _mean(v) for s, v in sorted(searches.items())})
    out["eval/em/macro"] = _mean([_mean(v) for v in by_source.values()])
    out["eval/em/micro"] = _mean([t.scores.get("em", 0.0) for t in trajs])
    out["eval/f1"] = _mean([t.scores.get("f1", 0.0) for t in trajs])
    out["eval/format_rate"] = _mean([t.scores.get("format", 0.0) for t in trajs])
    out["eval/reward"] = _mean([t.reward for t in trajs])
    out["eval/searches"] = _mean([t.num_searches for t in trajs])
    out["eval/no_search_rate"] = _mean([float(t.num_searches == 0) for t in trajs])
    out["eval/turns"] = _mean([len(t.turns) for t in trajs])
    searches = [turn for t in trajs for turn in t.turns if turn.action.kind is ActionKind.SEARCH]
    out["eval/search_error_rate"] = _mean([float(s.tool_error is not None) for s in searches])
    out["eval/questions"] = float(len(trajs))
    return out
