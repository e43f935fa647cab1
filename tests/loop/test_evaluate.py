"""Eval summary metrics on hand-built trajectories: EM and searches per source."""

from __future__ import annotations

import pytest

from searchr1.data.types import QAExample
from searchr1.protocols.base import Action, ActionKind
from searchr1.rollout.scoring import eval_metrics
from searchr1.rollout.types import Trajectory, Turn


def traj(source: str, searches: int, em: float) -> Trajectory:
    t = Trajectory.start(QAExample(id=source, question="?", golden_answers=("a",), data_source=source), 0, [1])
    for _ in range(searches):
        t.turns.append(Turn(1, [2], [0.0], "", "stop", Action(ActionKind.SEARCH, query="q"), observation_len=3))
    t.turns.append(Turn(1, [3], [0.0], "", "stop", Action(ActionKind.ANSWER, answer="a")))
    t.scores["em"] = em
    return t


def test_em_and_searches_per_source_and_macro():
    m = eval_metrics([traj("one", 1, 1.0), traj("one", 2, 0.0), traj("two", 3, 1.0)])
    assert m["eval/em/one"] == 0.5 and m["eval/em/two"] == 1.0
    assert m["eval/em/macro"] == 0.75 and m["eval/em/micro"] == pytest.approx(2 / 3)
    assert m["eval/searches/one"] == 1.5 and m["eval/searches/two"] == 3.0
    assert m["eval/searches"] == 2.0
