"""The paper's format check (``qa_em_format.is_valid_sequence``) as a state machine.

Departure: it runs on the response (assistant turns + observations) instead of prompt +
response after an ``<|im_start|>assistant`` / ``Assistant:`` marker, so it also works
without a chat template. Tag counts are balanced whenever the machine accepts, so the
official separate count check adds nothing.
"""

from __future__ import annotations

import re

FORMAT_TAG_RE = re.compile(r"(</?(?:think|search|information|answer)>)")

# state machine of qa_em_format.is_valid_sequence: (state, tag) → next state
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_CONTENT_STATES = frozenset({"in_think", "in_search", "in_information", "in_answer"})


def check_sequence(response: str) -> tuple[bool, str]:
    """think → (search → information → think)* → answer, only whitespace outside tags.

    Any of the four tags where the machine does not expect it (including inside
    ``<think>``), text after ``</answer>``, or an unfinished sequence makes it invalid.
    Returns (valid, reason).
    """
    state = "start"
    for part in FORMAT_TAG_RE.split(response):
        if not part.strip():
            continue
        if FORMAT_TAG_RE.fullmatch(part):
            nxt = _TRANSITIONS.get((state, part))
            if nxt is None:
                return False, f"unexpected tag {part} in state {state}"
            state = nxt
        elif state not in _CONTENT_STATES:
            return False, f"unexpected text {part.strip()[:40]!r} in state {state}"
    if state != "end":
        return False, f"incomplete sequence, ended in state {state}"
    return True, "valid"
