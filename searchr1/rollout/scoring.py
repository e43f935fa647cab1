"""Scoring finished trajectories and turning a batch of them into metrics.

Scoring is synchronous and pure given the protocol and reward function: the final answer
and the format check come from the protocol, the reward from ``searchr1/rewards``. The
metric names are the lab's (DESIGN §1) so runs compare across settings.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from searchr1.protocols.base import ActionKind, Protocol
from searchr1.rewards import RewardFn, RewardInput
from searchr1.rewards.normalize import exact_match, sub_exact_match, token_f1
from searchr1.rollout.types import EndReason, Trajectory


def score_trajectory(traj: Trajectory, protocol: Protocol, reward_fn: RewardFn) -> None:
    """Fill ``answer``, ``reward`` and ``scores`` (em, subem, f1, format) in place."""
    texts = [t.text for t in traj.turns]
    observations = [t.observation_text for t in traj.turns]
    golds = traj.example.golden_answers
    traj.answer = protocol.final_answer(texts) if texts else None
    valid = bool(texts) and protocol.is_valid_format(texts, observations)
    retrieved = any(sub_exact_match(o, golds) for o in observations if o)
    traj.reward = float(reward_fn(RewardInput(traj.answer, golds, valid, retrieved)))
    has = traj.answer is not None
    traj.scores = {
        "em": float(has and exact_match(traj.answer, golds)),
        "subem": float(has and sub_exact_match(traj.answer, golds)),
        "f1": token_f1(traj.answer, golds) if has else 0.0,
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
        "rollout/valid_tool_call_rate": _mean(
            [float(turn.action.kind is not ActionKind.INVALID) for turn in turns]
        ),
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


def eval_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Eval summary: EM per data_source, macro EM (mean over sources), format rate, …"""
    by_source: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_source[t.example.data_source].append(t.scores.get("em", 0.0))
    out = {f"eval/em/{s}": _mean(v) for s, v in sorted(by_source.items())}
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
