"""The paper's protocol (``protocol=tags``): think / search / information / answer tags.

Faithful to Search-R1's ``llm_agent/generation.py`` and ``qa_em_format.py``:

- the prompt has the paper's template structure and tag vocabulary (reworded);
- a turn's action is the FIRST match of ``<(search|answer)>(.*?)</\\1>`` (DOTALL), generation
  stops at ``</search>`` or ``</answer>``;
- search results come back as ``\\n\\n<information>Doc 1(Title: t) text\\nDoc 2(…) …
  </information>\\n\\n``; like the official code the joined passages are ``strip()``-ed, so
  the last passage's newline is dropped before ``</information>``;
- an invalid turn gets the official retry message, masked like any observation.

Departures, each deliberate:

- titles are shown without the corpus's quotes (``Title: Paris``, the official shows
  ``Title: "Paris"``) because ``Document`` carries the cleaned title;
- an empty or whitespace search query is INVALID (the official searches the empty string);
- the format check runs on the response (assistant turns + observations) instead of
  prompt + response after an ``<|im_start|>assistant`` marker, so it also works without a
  chat template; the final answer is the response's last ``<answer>`` (see DESIGN).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from searchr1.protocols.base import PROTOCOLS, Action, ActionKind, Observation, Protocol
from searchr1.retrievers.base import Document

PROMPT_TEMPLATE = (
    "Answer the question below. You must reason inside <think> and </think> first, every "
    "time you get new information. After reasoning, if you find that you lack some "
    "knowledge, you can call a search engine with <search> query </search>, and it will "
    "return the top search results between <information> and </information>. You may "
    "search as many times as you want. If you find that no further external knowledge is "
    "needed, you can give the answer directly inside <answer> and </answer>, without "
    "detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

INFO_OPEN = "\n\n<information>"
INFO_CLOSE = "</information>\n\n"
EMPTY_INFORMATION = INFO_OPEN + INFO_CLOSE

ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
OPEN_ACTION_RE = re.compile(r"<(search|answer)>")
FORMAT_TAG_RE = re.compile(r"(</?(?:think|search|information|answer)>)")


@dataclass
class TagsConfig:
    """Hydra schema of ``protocol=tags``."""

    # registry name of the protocol
    name: str = "tags"
    # wrap the prompt as a user message in the chat template; null = whenever the tokenizer
    # has one (what Search-R1's data code does, base models included)
    use_chat_template: bool | None = None


def format_passage(index: int, doc: Document) -> str:
    """One passage as the paper shows it: ``Doc {i}(Title: {title}) {text}\\n``."""
    return f"Doc {index}(Title: {doc.title}) {doc.text}\n"


def render_information(bodies: list[str]) -> str:
    """The observation block around passage strings (joined and stripped, as officially)."""
    return INFO_OPEN + "".join(bodies).strip() + INFO_CLOSE


@PROTOCOLS.register("tags")
class TagsProtocol(Protocol):
    """Search-R1's tag protocol over any tokenizer with ``encode``/``decode``."""

    stop = ["</search>", "</answer>"]

    def __init__(self, tokenizer, use_chat_template: bool | None = None) -> None:
        self.tokenizer = tokenizer
        if use_chat_template is None:  # Search-R1's data code: template whenever one exists
            use_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = use_chat_template

    @classmethod
    def from_config(cls, cfg: TagsConfig, tokenizer) -> TagsProtocol:
        return cls(tokenizer, use_chat_template=cfg.use_chat_template)

    def prompt_text(self, question: str) -> str:
        """The prompt string (chat-templated when configured) ending where the model writes."""
        text = PROMPT_TEMPLATE.format(question=question.strip())
        if not self.use_chat_template:
            return text
        messages = [{"role": "user", "content": text}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def initial_prompt(self, question: str) -> list[int]:
        """Prompt token ids; no special tokens are added beyond what the template writes."""
        return self._encode(self.prompt_text(question))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ---- actions -------------------------------------------------------------------------

    def parse_action(self, text: str) -> Action:
        """The first ``<search>``/``<answer>`` block decides the turn, as in the paper.

        Nested tags follow the regex: ``<search> a <answer> b </answer> </search>`` is a
        search for ``a <answer> b </answer>`` (the lazy match runs to the first
        ``</search>``), while ``<search> a <answer> b </answer>`` (outer tag never closed,
        the usual shape when generation stops at ``</answer>``) is the answer ``b``.
        """
        matches = list(ACTION_RE.finditer(text))
        if not matches:
            return Action(ActionKind.INVALID, error=_no_action_reason(text))
        kind, content = matches[0].group(1), matches[0].group(2).strip()
        note = f"multiple actions ({len(matches)}); the first is used" if len(matches) > 1 else None
        if kind == "answer":
            return Action(ActionKind.ANSWER, answer=content, error=note)
        if not content:
            return Action(ActionKind.INVALID, error="empty query")
        return Action(ActionKind.SEARCH, query=content, error=note)

    # ---- observations --------------------------------------------------------------------

    def observation_tokens(
        self, sampled: list[int], observation: Observation, max_tokens: int
    ) -> tuple[list[int], str]:
        """Tokens and text of the observation, tokenised on their own and fit to ``max_tokens``.

        ``sampled`` is not needed: the tag protocol has no turn-closing tokens. The invalid
        message is fixed text and is never cut; a tool error is shown inside the
        information block like a single passage.
        """
        if observation.invalid:
            return self._encode(INVALID_ACTION_MESSAGE), INVALID_ACTION_MESSAGE
        if observation.error is not None:
            bodies = [observation.error]
        else:
            bodies = [format_passage(i, d) for i, d in enumerate(observation.documents, 1)]
        return self._fit(bodies, max_tokens)

    def _fit(self, bodies: list[str], max_tokens: int) -> tuple[list[int], str]:
        """Drop whole passages from the end until the block fits; cut a lone passage."""
        for n in range(len(bodies), 0, -1):
            text = render_information(bodies[:n])
            tokens = self._encode(text)
            if len(tokens) <= max_tokens:
                return tokens, text
        if not bodies:
            return self._encode(EMPTY_INFORMATION), EMPTY_INFORMATION
        return self._cut(bodies[0], max_tokens)

    def _cut(self, body: str, max_tokens: int) -> tuple[list[int], str]:
        """Keep the head of one passage and re-close it, so the block still ends closed."""
        head = self._encode(INFO_OPEN + body.strip())
        tail = self._encode(INFO_CLOSE)
        tokens = head[: max(0, max_tokens - len(tail))] + tail
        return tokens, self.tokenizer.decode(tokens)

    # ---- scoring -------------------------------------------------------------------------

    def final_answer(self, turn_texts: list[str]) -> str | None:
        """The last ``<answer>…</answer>`` of the response, stripped; None when absent."""
        answers = [m.group(1) for t in turn_texts for m in ANSWER_RE.finditer(t)]
        return answers[-1].strip() if answers else None

    def is_valid_format(self, turn_texts: list[str], observations: list[str] | None = None) -> bool:
        """Search-R1's ``is_valid_sequence`` on the response: turns with observations between.

        ``observations[i]`` is the text appended after turn ``i``. Without it, each
        non-final turn is followed by what the rollout would have appended: an (empty)
        information block after a search, the retry message after an invalid turn.
        """
        if observations is None:
            observations = [self._implied_observation(t) for t in turn_texts[:-1]]
        parts: list[str] = []
        for i, text in enumerate(turn_texts):
            parts.append(text)
            if i < len(observations):
                parts.append(observations[i])
        return check_sequence("".join(parts))[0]

    def _implied_observation(self, text: str) -> str:
        kind = self.parse_action(text).kind
        if kind == ActionKind.SEARCH:
            return EMPTY_INFORMATION
        return INVALID_ACTION_MESSAGE if kind == ActionKind.INVALID else ""


def _no_action_reason(text: str) -> str:
    """Why a turn without a complete action block is invalid (for the trajectory record)."""
    opened = OPEN_ACTION_RE.search(text)
    if opened:
        return f"missing closing tag </{opened.group(1)}>"
    return "no <search> or <answer> block"


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
    Tag counts are balanced whenever the machine accepts, so the official separate count
    check adds nothing. Returns (valid, reason).
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
