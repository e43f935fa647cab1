"""The lab's turn rules for ``protocol=tool_call``: ``parse_rule=lab`` and
``on_observation_overflow=end``.

``parse_rule=lab`` — one syntax, read over the whole turn (end-of-turn markers stripped,
thinking kept):

- a *call* is ``<tool_call>``, ``<function=search>``, ``<parameter=query>``, the query,
  ``</parameter>``, ``</function>``, ``</tool_call>`` with only whitespace between the tags;
  the JSON syntax and any other tool name are not calls;
- exactly one call with nothing but whitespace after it, whose trimmed query is non-empty
  and holds neither ``<`` nor ``>``, is a SEARCH, whatever comes before it (an ``Answer:``
  line before the call still searches);
- no call and no ``<tool_call>`` text at all is the final turn: ANSWER with the lab's answer
  (``rewards/answer_rule.lab_answer``; None when it has no valid ``Answer:`` line);
- anything else (two calls, text after the call, a bad query, a ``<tool_call>`` that is not
  a call) is INVALID.

Under ``parse_rule=ours`` (``tool_call_parse.py``) a JSON call and a query with ``<``/``>``
search, and a call with an ``Answer:`` line is INVALID: more syntaxes and no ambiguous turn.

``on_observation_overflow=end`` — results are kept whole, in order, while the observation's
text (results joined by the template's separator) is at most ``max_observation_tokens``
tokens by itself and the rendered observation fits the trajectory's remaining tokens; when
not even the first fits, the trajectory ends there (``ObservationOverflow``). An error or a
no-result text is one such piece. Under ``cut`` (ours) the last result is cut to fit
instead, so a long first result still informs the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from searchr1.protocols.base import Action, ActionKind, ObservationOverflow
from searchr1.protocols.tool_call_parse import PARSE_RULES, TurnRule, strip_end_markers
from searchr1.rewards.answer_rule import lab_answer

CALL_OPEN = "<tool_call>"
_WS = r"\s*"
_OPEN_TAGS = ("<tool_call>", "<function=search>", "<parameter=query>")
_CLOSE_TAGS = ("</parameter>", "</function>", "</tool_call>")
_CALL = re.compile(
    _WS.join(map(re.escape, _OPEN_TAGS)) + _WS + "(.*?)" + _WS
    + _WS.join(map(re.escape, _CLOSE_TAGS)),
    re.DOTALL,
)


def parse_lab_turn(text: str, end_markers: Sequence[str] = ()) -> Action:
    """Classify one turn under ``parse_rule=lab`` (module docstring)."""
    body = strip_end_markers(text, end_markers)
    calls = list(_CALL.finditer(body))
    if not calls:
        if CALL_OPEN in body:
            return Action(ActionKind.INVALID, error="<tool_call> without a well-formed search call")
        return Action(ActionKind.ANSWER, answer=lab_answer(body))
    if len(calls) > 1:
        return Action(ActionKind.INVALID, error=f"{len(calls)} tool calls in one turn")
    if body[calls[0].end():].strip():
        return Action(ActionKind.INVALID, error="text after the tool call")
    query = calls[0].group(1).strip()
    if not query:
        return Action(ActionKind.INVALID, error="empty search query")
    if "<" in query or ">" in query:
        return Action(ActionKind.INVALID, error="the query contains `<` or `>`")
    return Action(ActionKind.SEARCH, query=query)


PARSE_RULES.register("lab")(TurnRule(parse_lab_turn, strip_end_markers))  # the whole turn, thinking kept


def fit_whole_pieces(
    pieces: list[str],
    separator: str,
    text_tokens: Callable[[str], int],
    render: Callable[[str], list[int]],
    max_tokens: int,
    room: int,
) -> list[int]:
    """The rendering of the longest run of leading ``pieces`` that fits (module docstring);
    ``ObservationOverflow`` when not even the first does."""
    kept: list[str] = []
    best: list[int] | None = None
    for piece in pieces:
        text = separator.join([*kept, piece])
        if text_tokens(text) > max_tokens:
            break
        tokens = render(text)
        if len(tokens) > room:
            break
        kept.append(piece)
        best = tokens
    if best is None:
        raise ObservationOverflow(
            f"the first piece of the observation does not fit ({max_tokens} tokens of text, "
            f"{room} tokens left in the trajectory)")
    return best
