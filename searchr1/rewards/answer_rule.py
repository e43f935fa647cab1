"""Which text counts as the final answer (``reward.answer_rule``).

- ``last_line`` (default): the protocol's own ``final_answer`` — for ``protocol=tool_call``
  the last ``Answer:`` line of the last turn, markdown emphasis around the label tolerated
  (``**Answer:** x``); for ``protocol=tags`` the last ``<answer>…</answer>``.
- ``lab`` (the lab's reward): the last turn must hold exactly one line that starts with
  ``Answer:`` (case-sensitive, after the line's own surrounding whitespace) and a non-empty
  value after it. None, two such lines, or an empty value is "no valid final answer", and
  ``**Answer:** x`` is not an answer at all. Only the final turn is read; the protocol's
  format verdict (every earlier turn a search) still applies on top.
"""

from __future__ import annotations

ANSWER_RULES = ("last_line", "lab")
LAB_LABEL = "Answer:"


def check_rule(rule: str) -> str:
    """``rule`` if it is an answer rule, else a ``ValueError`` naming the valid ones."""
    if rule not in ANSWER_RULES:
        raise ValueError(f"unknown reward.answer_rule {rule!r}; valid: {', '.join(ANSWER_RULES)}")
    return rule


def lab_answer(final_text: str) -> str | None:
    """The value of the one ``Answer:`` line of ``final_text``, else None (see module doc)."""
    lines = [ln.strip() for ln in final_text.splitlines()]
    values = [ln[len(LAB_LABEL):].strip() for ln in lines if ln.startswith(LAB_LABEL)]
    if len(values) != 1 or not values[0]:
        return None
    return values[0]
