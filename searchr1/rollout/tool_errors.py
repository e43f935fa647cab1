"""What a failed search does to training: ``rollout.on_tool_error``.

A trajectory is *tool-failed* when one of its executed searches raised after the retriever's
own retries (``Turn.tool_error``), or returned nothing for a non-empty query from a retriever
that promises results (``Retriever.promises_results``; BM25 does not — an empty BM25 result
is the query's fault and trains like any other outcome). Its reward then measures the tool,
not the policy, so by default it must carry no gradient:

- ``drop_group`` (default): a group with any tool-failed trajectory is left out of the
  update entirely; its other trajectories' advantages would be relative to a corrupted mean;
- ``drop_trajectory``: only the tool-failed trajectories are left out, and the group's
  advantages are computed over the rest (a group left empty is dropped);
- ``observe``: today's behaviour, kept as an ablation: the error text is an observation and
  the trajectory trains like any other.

Departure from the reference: neither Search-R1 nor the lab code filters these; the lab's own
run degraded after step 50 when its search keys ran out of quota. Pure functions only: the
step applies ``ToolErrorSplit.groups`` before computing advantages and logs ``metrics()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from searchr1.protocols.base import ActionKind
from searchr1.rollout.types import Trajectory, Turn


class ToolErrorPolicy(str, Enum):
    """How trajectories whose search failed are treated in the update."""

    drop_group = "drop_group"  # leave the whole group out of the update
    drop_trajectory = "drop_trajectory"  # leave the trajectory out; advantages over the rest
    observe = "observe"  # train on it (the error is just an observation)


def turn_failed(turn: Turn, promises_results: bool) -> bool:
    """Whether ``turn`` ran a search that failed or came back empty where results are due."""
    if turn.action.kind is not ActionKind.SEARCH:
        return False
    if turn.tool_error is not None:
        return True
    executed = turn.observation_len > 0
    query = (turn.action.query or "").strip()
    return executed and promises_results and bool(query) and not turn.documents


def trajectory_failed(traj: Trajectory, promises_results: bool) -> bool:
    """Whether any executed search of ``traj`` failed (see ``turn_failed``)."""
    return any(turn_failed(t, promises_results) for t in traj.turns)


@dataclass(frozen=True)
class ToolErrorSplit:
    """The policy's verdict on one step's groups."""

    keep_G: list[list[bool]]  # per group, per trajectory: whether it trains
    failed_G: list[list[bool]]  # per group, per trajectory: whether a search failed

    def groups(self, groups: list[list[Trajectory]]) -> list[list[Trajectory]]:
        """The trainable trajectories, group by group; groups left empty are removed."""
        kept = [[t for t, k in zip(g, keep) if k] for g, keep in zip(groups, self.keep_G)]
        return [g for g in kept if g]

    @property
    def tool_error_trajectories(self) -> int:
        return sum(sum(f) for f in self.failed_G)

    @property
    def dropped(self) -> int:
        """Trajectories left out of the update because of a tool error (theirs or a peer's)."""
        return sum(len(k) - sum(k) for k in self.keep_G)

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/tool_error_trajectories": float(self.tool_error_trajectories),
            "train/dropped_for_tool_error": float(self.dropped),
        }


def split_tool_errors(
    groups: list[list[Trajectory]], policy: ToolErrorPolicy | str, promises_results: bool = True
) -> ToolErrorSplit:
    """Apply ``policy`` to a step's groups; see the module docstring for each policy."""
    policy = ToolErrorPolicy(policy)
    failed_G = [[trajectory_failed(t, promises_results) for t in g] for g in groups]
    if policy is ToolErrorPolicy.observe:
        keep_G = [[True] * len(f) for f in failed_G]
    elif policy is ToolErrorPolicy.drop_trajectory:
        keep_G = [[not x for x in f] for f in failed_G]
    else:
        keep_G = [[not any(f)] * len(f) for f in failed_G]
    return ToolErrorSplit(keep_G, failed_G)
