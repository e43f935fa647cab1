"""``rollout.on_tool_error`` on scripted groups: which trajectories train, and the counts."""

from __future__ import annotations

import pytest

from searchr1.data.types import QAExample
from searchr1.protocols.base import Action, ActionKind
from searchr1.retrievers.base import Document
from searchr1.rollout.tool_errors import (
    ToolErrorPolicy,
    split_tool_errors,
    trajectory_failed,
    turn_failed,
)
from searchr1.rollout.types import Trajectory, Turn

EX = QAExample(id="q", question="?", golden_answers=("a",), data_source="t")
DOC = Document(id="d1", title="T", text="x")


def _turn(kind: str, *, error: str | None = None, docs=(), executed=True, query="who") -> Turn:
    action = {"search": Action(ActionKind.SEARCH, query=query),
              "answer": Action(ActionKind.ANSWER, answer="a"),
              "invalid": Action(ActionKind.INVALID, error="no tag")}[kind]
    return Turn(prompt_len=0, sampled_tokens=[1], sampled_logprobs=[0.0], text="", stop_reason="stop",
                action=action, observation_len=5 if executed else 0, documents=list(docs),
                tool_error=error)


def _traj(*turns: Turn) -> Trajectory:
    t = Trajectory.start(EX, 0, [1, 2])
    t.turns = list(turns)
    return t


OK = _traj(_turn("search", docs=[DOC]), _turn("answer"))
ERR = _traj(_turn("search", docs=[DOC]), _turn("search", error="SearchError: HTTP 500"))
EMPTY = _traj(_turn("search"), _turn("answer"))  # executed, no documents
NO_SEARCH = _traj(_turn("invalid", executed=True), _turn("answer"))
OVER_BUDGET = _traj(_turn("search", docs=[DOC]), _turn("search", executed=False))  # not run


def test_turn_and_trajectory_failure_rules():
    assert not trajectory_failed(OK, True) and not trajectory_failed(NO_SEARCH, True)
    assert trajectory_failed(ERR, True) and trajectory_failed(ERR, False)  # errors always count
    assert trajectory_failed(EMPTY, True)  # empty where results are promised
    assert not trajectory_failed(EMPTY, False)  # BM25: an empty result is the query's fault
    assert not trajectory_failed(OVER_BUDGET, True)  # a search that never ran is no failure
    assert not turn_failed(_turn("search", query="  "), True)  # blank query: the model's fault


def test_drop_group_leaves_out_every_group_with_a_failure():
    groups = [[OK, ERR, OK], [OK, OK], [EMPTY, NO_SEARCH]]
    split = split_tool_errors(groups, "drop_group")
    assert split.keep_G == [[False] * 3, [True, True], [False, False]]
    assert split.groups(groups) == [[OK, OK]]
    assert split.metrics() == {"rollout/tool_error_trajectories": 2.0,
                               "train/dropped_for_tool_error": 5.0}


def test_drop_trajectory_keeps_the_rest_of_the_group():
    groups = [[OK, ERR, NO_SEARCH], [EMPTY], [OK]]
    split = split_tool_errors(groups, ToolErrorPolicy.drop_trajectory)
    assert split.groups(groups) == [[OK, NO_SEARCH], [OK]]  # the emptied group is removed
    assert split.metrics() == {"rollout/tool_error_trajectories": 2.0,
                               "train/dropped_for_tool_error": 2.0}


def test_observe_trains_everything_but_still_counts():
    groups = [[OK, ERR], [EMPTY, OVER_BUDGET]]
    split = split_tool_errors(groups, "observe")
    assert split.groups(groups) == groups
    assert split.metrics() == {"rollout/tool_error_trajectories": 2.0,
                               "train/dropped_for_tool_error": 0.0}


def test_non_promising_retriever_trains_empty_results():
    groups = [[EMPTY, OK]]
    assert split_tool_errors(groups, "drop_group", promises_results=False).groups(groups) == groups


def test_unknown_policy_lists_valid_ones():
    with pytest.raises(ValueError, match="drop_everything"):
        split_tool_errors([[OK]], "drop_everything")
