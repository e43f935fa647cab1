"""Which text counts as the final answer, and when a trajectory is well-formed
(``reward.answer_rule``): registered rules, each owning both verdicts.

- ``last_line`` (default): the protocol's own ``final_answer`` — for ``protocol=tool_call``
  the last ``Answer:`` line of the last turn, markdown emphasis around the label tolerated
  (``**Answer:** x``); for ``protocol=tags`` the last ``<answer>…</answer>`` — and the
  protocol's own ``is_valid_format``.
- ``lab`` (the lab's reward): the final turn is read line by line (lines end at ``\\n``). A
  *label line* is one that, after its leading whitespace, starts with ``answer:`` in any
  letter case (``Answer:``, ``ANSWER:``, ``answer:``). Its value is the rest of that line,
  trimmed; when the rest is blank the value is the next non-blank line, trimmed (``Answer:``
  then ``X`` on the following line answers ``X``), and that line is used up. The turn
  answers only when there is exactly one label line and its value is non-empty; none, two,
  or an empty value is "no valid final answer". ``**Answer:** x`` is not a label line. The
  whole final turn counts, tool-call text included, and nothing else decides the format: a
  trajectory is well-formed when every earlier turn was a search and this rule finds an
  answer. The final turn is the one that ended the trajectory: a
  trajectory that stopped after a search's observation, waiting for a turn it never sampled
  (the observation filled the token budget exactly), has no final text in the lab and so no
  answer, even when its last search turn also wrote an ``Answer:`` line (the lab's
  ``final_text`` is set only by a turn that ends the trajectory).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchr1.utils.registry import Registry

if TYPE_CHECKING:
    from searchr1.protocols.base import Protocol

_LABEL = re.compile("answer:", re.IGNORECASE)


@dataclass(frozen=True)
class FinishedTurns:
    """What an answer rule reads of a finished trajectory (``rollout/scoring.py`` builds it)."""

    texts: tuple[str, ...]  # each assistant turn's decoded text
    observations: tuple[str, ...]  # the text appended after each turn ("" after the last)
    searched: tuple[bool, ...]  # whether each turn parsed as a search
    awaiting_turn: bool = False  # stopped after an observation, before a turn it never sampled


class AnswerRule(ABC):
    """One ``reward.answer_rule``: the final answer and the format verdict of a trajectory
    with at least one turn (the scorer gives an empty trajectory neither)."""

    #: the protocols whose final turn the rule can read (empty: every protocol), and what it
    #: reads there, for the start-up check's message when another protocol is chosen
    protocols: tuple[str, ...] = ()
    reads: str = "the protocol's final answer"

    @abstractmethod
    def final_answer(self, protocol: Protocol, turns: FinishedTurns) -> str | None:
        """The final answer, None when there is none."""

    @abstractmethod
    def well_formed(self, protocol: Protocol, turns: FinishedTurns, answer: str | None) -> bool:
        """Whether the trajectory follows the format (``answer``: ``final_answer``'s)."""


ANSWER_RULES: Registry[AnswerRule] = Registry("reward.answer_rule")


class ProtocolRule(AnswerRule):
    """``last_line``: the protocol's own answer and format check."""

    def final_answer(self, protocol: Protocol, turns: FinishedTurns) -> str | None:
        return protocol.final_answer(list(turns.texts))

    def well_formed(self, protocol: Protocol, turns: FinishedTurns, answer: str | None) -> bool:
        return protocol.is_valid_format(list(turns.texts), list(turns.observations))


class OneAnswerLine(AnswerRule):
    """``lab``: exactly one ``Answer:`` line in the final turn (module docstring); well-formed
    when every earlier turn was a search and that line gives an answer (what kind the last turn
    parsed as does not matter: the lab scores an ``Answer:`` line even beside a tool call)."""

    protocols = ("tool_call",)
    reads = "the lab's `Answer:` line"

    def final_answer(self, protocol: Protocol, turns: FinishedTurns) -> str | None:
        visible = protocol.final_turn_text(list(turns.texts))
        if visible is None:
            raise ValueError(
                f"reward.answer_rule=lab reads `Answer:` lines and needs protocol=tool_call, "
                f"not {type(protocol).__name__}; use reward.answer_rule=last_line"
            )
        return None if turns.awaiting_turn else lab_answer(visible)

    def well_formed(self, protocol: Protocol, turns: FinishedTurns, answer: str | None) -> bool:
        return all(turns.searched[:-1]) and answer is not None


ANSWER_RULES.register("last_line")(ProtocolRule())
ANSWER_RULES.register("lab")(OneAnswerLine())


def lab_values(final_text: str) -> list[str]:
    """The value of every label line of ``final_text``, in order (see the module docstring)."""
    lines = final_text.split("\n")
    values: list[str] = []
    i = 0
    while i < len(lines):
        head = lines[i].lstrip()
        label = _LABEL.match(head)
        i += 1
        if label is None:
            continue
        rest = head[label.end():].strip()
        while not rest and i < len(lines):  # blank after the label: the next non-blank line
            rest, i = lines[i].strip(), i + 1
        values.append(rest)
    return values


def lab_answer(final_text: str) -> str | None:
    """The one label line's non-empty value, else None: the lab's final answer."""
    values = lab_values(final_text)
    return values[0] if len(values) == 1 and values[0] else None
