"""Which text counts as the final answer (``reward.answer_rule``).

- ``last_line`` (default): the protocol's own ``final_answer`` — for ``protocol=tool_call``
  the last ``Answer:`` line of the last turn, markdown emphasis around the label tolerated
  (``**Answer:** x``); for ``protocol=tags`` the last ``<answer>…</answer>``.
- ``lab`` (the lab's reward): the final turn is read line by line (lines end at ``\\n``). A
  *label line* is one that, after its leading whitespace, starts with ``answer:`` in any
  letter case (``Answer:``, ``ANSWER:``, ``answer:``). Its value is the rest of that line,
  trimmed; when the rest is blank the value is the next non-blank line, trimmed (``Answer:``
  then ``X`` on the following line answers ``X``), and that line is used up. The turn
  answers only when there is exactly one label line and its value is non-empty; none, two,
  or an empty value is "no valid final answer". ``**Answer:** x`` is not a label line. The
  whole final turn counts, tool-call text included, and nothing else decides the format: a
  trajectory is well-formed when every earlier turn was a search and this rule finds an
  answer (``rollout/scoring.py``). The final turn is the one that ended the trajectory: a
  trajectory that stopped after a search's observation, waiting for a turn it never sampled
  (the observation filled the token budget exactly), has no final text in the lab and so no
  answer, even when its last search turn also wrote an ``Answer:`` line (the lab's
  ``final_text`` is set only by a turn that ends the trajectory).
"""

from __future__ import annotations

import re

ANSWER_RULES = ("last_line", "lab")
_LABEL = re.compile("answer:", re.IGNORECASE)


def check_rule(rule: str) -> str:
    """``rule`` if it is an answer rule, else a ``ValueError`` naming the valid ones."""
    if rule not in ANSWER_RULES:
        raise ValueError(f"unknown reward.answer_rule {rule!r}; valid: {', '.join(ANSWER_RULES)}")
    return rule


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
