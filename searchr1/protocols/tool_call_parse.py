"""Parsing one assistant turn of the ``tool_call`` protocol into an ``Action``.

A turn is a SEARCH when it holds exactly one ``<tool_call>`` block naming ``search`` with a
non-empty ``query`` and nothing after the block; an ANSWER when it has no tool call and an
``Answer: …`` line (the last one wins); INVALID otherwise, with the reason recorded. Two call
syntaxes are accepted inside ``<tool_call>…</tool_call>``:

- Qwen3.5 / Qwen3-Coder XML: ``<function=search>\\n<parameter=query>\\n…\\n</parameter>\\n
  </function>``;
- Qwen2.5 / Hermes JSON: ``{"name": "search", "arguments": {"query": "…"}}``.

Departures from a permissive parser, all deliberate (the lab's rules): two calls in one turn,
a call plus an ``Answer:`` line, and text after the call are INVALID rather than "take the
first"; text inside ``<think>…</think>`` is ignored, so a call drafted while thinking does
not count.

This is ``protocol.parse_rule=ours``; the rules are registered options (``PARSE_RULES``), the
lab's in ``tool_call_lab.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from searchr1.protocols.base import Action, ActionKind
from searchr1.utils.registry import Registry

TOOL_NAME = "search"
QUERY_PARAM = "query"

_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_XML_CALL = re.compile(r"\A<function=([^>\n]*)>(.*)</function>\Z", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
# "Answer: x", tolerating markdown emphasis or a heading marker around the label
_ANSWER = re.compile(
    r"^[ \t*_#>]*answer[ \t*_]*:[ \t*_]*(.*?)[ \t*_]*$", re.IGNORECASE | re.MULTILINE
)


def strip_end_markers(text: str, end_markers: Sequence[str] = ()) -> str:
    """``text`` without trailing whitespace and end-of-turn markers (``<|im_end|>``)."""
    text = text.rstrip()
    stripped = True
    while stripped:
        stripped = False
        for marker in end_markers:
            if marker and text.endswith(marker):
                text, stripped = text[: -len(marker)].rstrip(), True
    return text


def visible_text(text: str, end_markers: Sequence[str] = ()) -> str:
    """The part of a turn that counts: end-of-turn markers stripped, thinking dropped."""
    text = strip_end_markers(text, end_markers)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text


def answer_lines(text: str) -> list[str]:
    """Non-empty ``Answer:`` values outside tool-call blocks, in order."""
    outside = _BLOCK.sub("\n", text)
    return [m.group(1).strip() for m in _ANSWER.finditer(outside) if m.group(1).strip()]


def parse_turn(text: str, end_markers: Sequence[str] = ()) -> Action:
    """Classify one assistant turn (see the module docstring for the rules)."""
    body = visible_text(text, end_markers)
    blocks = list(_BLOCK.finditer(body))
    outside = _BLOCK.sub("\n", body)
    answers = answer_lines(body)
    if "<tool_call>" in outside or "</tool_call>" in outside:
        return _invalid("unbalanced <tool_call> tags")
    if not blocks:
        if "<function=" in outside:
            return _invalid("a <function=…> call outside <tool_call> tags")
        if answers:
            return Action(ActionKind.ANSWER, answer=answers[-1])
        return _invalid("neither a search tool call nor a final `Answer:` line")
    if len(blocks) > 1:
        return _invalid(f"{len(blocks)} tool calls in one turn; exactly one is allowed")
    if answers:
        return _invalid("a tool call and a final answer in the same turn")
    if body[blocks[0].end() :].strip():
        return _invalid("text after the tool call")
    query, error = parse_call(blocks[0].group(1))
    if error is not None:
        return _invalid(error)
    return Action(ActionKind.SEARCH, query=query)


def parse_call(inner: str) -> tuple[str | None, str | None]:
    """``(query, None)`` for a valid search call body, else ``(None, reason)``."""
    body = inner.strip()
    if body.startswith("{"):
        return _parse_json_call(body)
    if body.startswith("<function="):
        return _parse_xml_call(body)
    return None, "malformed tool call: expected <function=search> or a JSON object"


def _parse_xml_call(body: str) -> tuple[str | None, str | None]:
    match = _XML_CALL.match(body)
    if match is None:
        return None, "malformed XML tool call"
    name, params_text = match.group(1).strip(), match.group(2)
    if name != TOOL_NAME:
        return None, f"unknown tool {name!r}"
    params = list(_XML_PARAM.finditer(params_text))
    if _XML_PARAM.sub("", params_text).strip():
        return None, "malformed XML tool call: text outside <parameter> tags"
    names = [p.group(1).strip() for p in params]
    if names != [QUERY_PARAM]:
        return None, f"search takes exactly one `{QUERY_PARAM}` parameter, got {names}"
    return _checked_query(params[0].group(2))


def _parse_json_call(body: str) -> tuple[str | None, str | None]:
    try:
        call = json.loads(body)
        args = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
        if isinstance(args, str):
            args = json.loads(args)
    except (json.JSONDecodeError, AttributeError):
        return None, "malformed JSON tool call"
    if not isinstance(call, dict) or call.get("name") != TOOL_NAME:
        name = call.get("name") if isinstance(call, dict) else None
        return None, f"unknown tool {name!r}"
    if not isinstance(args, dict) or set(args) != {QUERY_PARAM}:
        return None, f"search takes exactly one `{QUERY_PARAM}` argument"
    if not isinstance(args[QUERY_PARAM], str):
        return None, "the search query must be a string"
    return _checked_query(args[QUERY_PARAM])


def _checked_query(raw: str) -> tuple[str | None, str | None]:
    query = raw.strip()
    return (query, None) if query else (None, "empty search query")


def _invalid(reason: str) -> Action:
    return Action(ActionKind.INVALID, error=reason)


@dataclass(frozen=True)
class TurnRule:
    """One registered ``protocol.parse_rule``: how a turn is read."""

    parse: Callable[[str, Sequence[str]], Action]  # (turn text, end markers) -> the action
    final_text: Callable[[str, Sequence[str]], str]  # the last turn as the answer rules read it


PARSE_RULES: Registry[TurnRule] = Registry("protocol.parse_rule")
PARSE_RULES.register("ours")(TurnRule(parse_turn, visible_text))
