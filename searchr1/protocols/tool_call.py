"""The lab's protocol (``protocol=tool_call``): chat-template tool calls and ``Answer:``.

The model sees one tool, ``search(query: string)``, declared through its own chat template
(``apply_chat_template(..., tools=[SEARCH_TOOL])``; Qwen3.5 with ``enable_thinking=False``),
searches with the template's tool-call syntax and finishes with a line ``Answer: <short
answer>``. Turn parsing lives in ``tool_call_parse``.

Token continuity. The rollout never re-tokenises sampled text: the next prompt is the
previous prompt + the sampled tokens + what ``observation_tokens`` returns, and that must
be exactly what the chat template would have rendered. Nothing about the template is
hard-coded; two diffs of reference renderings are taken at construction:

- closing tokens: render ``[system?, user, assistant("Answer: reference")]`` and take what
  follows the assistant content (ChatML: ``<|im_end|>``, ``\\n``). Sampled tokens that already
  end with part of it (the stop token) get only the rest. Its special tokens are ``stop``;
- tool turn: render ``[…, assistant, tool(content)]`` with the generation prompt and keep
  the suffix past the rendering of ``[…, assistant]``. The shorter rendering must be a
  token prefix of the longer, else ``TemplateError`` (the template rewrites history).

Invalid turns and search errors are also answered with a ``tool`` message, not a ``user``
one: in Qwen3.5's template a new user message moves the "last query" and re-renders earlier
assistant turns without their ``<think>`` block, which would break the prefix property.

Models whose template ignores ``tools`` (SmolLM2's plain ChatML) get a bundled ChatML
template with a tools section (``templates/chatml_tools.jinja``, Hermes JSON calls); it is
detected by rendering with the tool and looking for the tool's description in the text.

Prompt texts are options, so a user can supply the lab's own: ``system_prompt`` (or
``system_prompt_file``: a bundled ``templates/<name>.txt`` or a path), ``tool_description``,
``query_description`` (the query parameter's) and ``question_template`` (``{question}`` marks where the question goes). The defaults put
our instructions in the user message and no system message; ``experiment=lab`` uses the
lab's layout (a system message with a worked two-search example, the bare question as the
user message) in our own wording (``templates/lab_system_prompt.txt``).

Observation texts (result layout, no-result, error and invalid-turn texts) come from
``observation_template_file`` (``observation_text.py``; our wording by default).
``parse_rule`` (a registered turn rule: ``ours`` in ``tool_call_parse.py``, ``lab`` in
``tool_call_lab.py``) and ``on_observation_overflow`` (``OverflowRule``) select the lab's turn
and budget rules.

``on_invalid``: what a turn with neither a valid search call nor an answer does. ``retry``
(default) answers it with a tool message saying what was wrong and lets the model go on;
``end`` (the lab) ends the trajectory there (``EndReason.INVALID``), so it scores as "no
valid final answer".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from searchr1.protocols.base import PROTOCOLS, Action, ActionKind, Observation, OnInvalid, Protocol
from searchr1.protocols.observation_text import DEFAULT_TEXTS, ObservationTexts, load_observation_texts
from searchr1.protocols.tool_call_lab import fit_whole_pieces  # and registers parse_rule=lab
from searchr1.protocols.tool_call_parse import PARSE_RULES, answer_lines
from searchr1.protocols.tool_call_text import (  # noqa: F401  (re-exported)
    INVALID_MESSAGE,
    NO_RESULTS,
    OverflowRule,
    QUERY_DESCRIPTION,
    QUESTION_SLOT,
    SEARCH_TOOL,
    TOOL_DESCRIPTION,
    USER_PROMPT,
    format_documents,
    load_template,
    search_tool,
    system_text,
)
from searchr1.retrievers.base import Document
from searchr1.utils.schema import Checked, field_value, member, one_of

log = logging.getLogger(__name__)

_REF_QUESTION = "Which city is the reference?"
_REF_ANSWER = "Answer: reference"
_REF_CALL = '<tool_call>\n{"name": "search", "arguments": {"query": "reference"}}\n</tool_call>'


class TemplateError(ValueError):
    """The chat template cannot support token-continuous tool calls (see module docstring)."""


@dataclass
class ToolCallConfig(Checked):
    """Hydra schema of ``protocol=tool_call``."""

    # registry name of the protocol
    name: str = "tool_call"
    # system message text; null = none (or system_prompt_file's)
    system_prompt: str | None = None
    # system message from a bundled templates/<name>.txt or a file path (not with system_prompt)
    system_prompt_file: str | None = None
    # the search tool's description in its schema; null = ours (TOOL_DESCRIPTION)
    tool_description: str | None = None
    # the description of the tool's `query` parameter; null = ours (QUERY_DESCRIPTION)
    query_description: str | None = None
    # the first user message; {question} marks the question; null = ours (USER_PROMPT)
    question_template: str | None = None
    # a turn with neither a valid search call nor an answer: retry (a tool message says what
    # was wrong, the model goes on) | end (the trajectory ends there, as in the lab)
    on_invalid: OnInvalid = OnInvalid.retry
    # Qwen3-style thinking: False renders the empty <think></think> block in the prompt
    enable_thinking: bool = False
    # bundled template name (protocols/templates/<name>.jinja) or a .jinja path, used when
    # the model's chat template ignores `tools`
    fallback_template: str = "chatml_tools"
    # each result's content is cut to this many characters
    max_content_chars: int = 1200
    # how a turn is read: ours (XML or JSON calls; a call plus an `Answer:` line is invalid)
    # | lab (XML calls only, no `<`/`>` in the query, text before a call allowed) —
    # protocols/tool_call_lab.py
    parse_rule: str = one_of("ours", PARSE_RULES)
    # an observation over max_observation_tokens: cut (drop results, then cut the last) |
    # end (whole results only; the trajectory ends when not even the first fits)
    on_observation_overflow: OverflowRule = OverflowRule.cut
    # the observation texts: a bundled templates/<name>.yaml or a .yaml path; keys left out
    # keep our defaults (protocols/observation_text.py)
    observation_template_file: str = "observation"

    @classmethod
    def problems(cls, node, path: str) -> list[str]:
        """The observation texts must load (a missing file, bad YAML keys or fields)."""
        template = field_value(node, "observation_template_file")
        try:
            load_observation_texts(None if template is None else str(template))
        except (OSError, ValueError) as err:
            return [str(err)]
        return []


@PROTOCOLS.register("tool_call")
class ToolCallProtocol(Protocol):
    """Prompting, parsing and token-continuous observations through the chat template."""

    def __init__(
        self,
        tokenizer,
        system_prompt: str | None = None,
        enable_thinking: bool = False,
        fallback_template: str = "chatml_tools",
        max_content_chars: int = 1200,
        *,
        tool_description: str | None = None,
        query_description: str | None = None,
        question_template: str | None = None,
        on_invalid: OnInvalid | str = OnInvalid.retry,
        parse_rule: str = "ours",
        on_observation_overflow: OverflowRule | str = OverflowRule.cut,
        observation_texts: ObservationTexts = DEFAULT_TEXTS,
    ) -> None:
        """``tokenizer``: a transformers tokenizer whose ``chat_template`` is used (or the
        fallback when it ignores ``tools``). Reference renderings are diffed here, so a
        template that cannot be token-continuous fails at construction, not mid-rollout."""
        self.on_invalid = member(OnInvalid, on_invalid, "protocol.on_invalid")
        self.on_observation_overflow = member(OverflowRule, on_observation_overflow,
                                              "protocol.on_observation_overflow")
        self.turn_rule = PARSE_RULES.get(parse_rule)
        template = USER_PROMPT if question_template is None else question_template
        if QUESTION_SLOT not in template:
            raise ValueError(f"protocol.question_template must contain {QUESTION_SLOT}")
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.question_template = template
        self.tool = search_tool(TOOL_DESCRIPTION if tool_description is None else tool_description,
                                QUERY_DESCRIPTION if query_description is None else query_description)
        self.texts = observation_texts
        self.max_content_chars = max_content_chars
        self.chat_template, self.uses_fallback = self._select_template(fallback_template)
        uses_thinking = "enable_thinking" in self.chat_template
        self._template_kwargs = {"enable_thinking": enable_thinking} if uses_thinking else {}
        self._closing = self._closing_tokens()
        self.stop: list[int] = self._end_of_turn_ids()
        self._end_markers = [self._decode([i]) for i in self.stop]
        if tokenizer.eos_token:
            self._end_markers.append(tokenizer.eos_token)
        self._history = self._render(self._reference() + [_assistant(_REF_CALL)], False)

    @classmethod
    def from_config(cls, cfg: ToolCallConfig, tokenizer) -> ToolCallProtocol:
        """Build from the ``protocol=tool_call`` config node."""
        return cls(
            tokenizer, system_text(cfg), cfg.enable_thinking, cfg.fallback_template,
            cfg.max_content_chars, tool_description=cfg.tool_description,
            query_description=cfg.query_description, question_template=cfg.question_template,
            on_invalid=cfg.on_invalid, parse_rule=cfg.parse_rule,
            on_observation_overflow=cfg.on_observation_overflow,
            observation_texts=load_observation_texts(cfg.observation_template_file),
        )

    # ---- prompt --------------------------------------------------------------------------

    def messages(self, question: str) -> list[dict[str, str]]:
        """The first messages: optional system, then the question in ``question_template``."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        user = self.question_template.replace(QUESTION_SLOT, question)
        return system + [{"role": "user", "content": user}]

    def initial_prompt(self, question: str) -> list[int]:
        return self._render(self.messages(question), True)

    # ---- actions -------------------------------------------------------------------------

    def parse_action(self, text: str) -> Action:
        return self.turn_rule.parse(text, self._end_markers)

    def final_answer(self, turn_texts: list[str]) -> str | None:
        """The last ``Answer:`` line of the last turn (even if that turn is invalid)."""
        if not turn_texts:
            return None
        answers = answer_lines(self.final_turn_text(turn_texts))
        return answers[-1] if answers else None

    def final_turn_text(self, turn_texts: list[str]) -> str:
        """The last turn as the answer rules read it (the parse rule's ``final_text``: end
        markers removed, and thinking too unless ``parse_rule=lab``, which reads the whole turn)."""
        if not turn_texts:
            return ""
        return self.turn_rule.final_text(turn_texts[-1], self._end_markers)

    def is_valid_format(
        self, turn_texts: list[str], observations: list[str] | None = None
    ) -> bool:
        """Every turn but the last is one valid search call; the last is an answer."""
        kinds = [self.parse_action(t).kind for t in turn_texts]
        return bool(kinds) and kinds[-1] is ActionKind.ANSWER and all(
            k is ActionKind.SEARCH for k in kinds[:-1]
        )

    # ---- observations --------------------------------------------------------------------

    def observation_tokens(
        self, sampled: list[int], observation: Observation, max_tokens: int
    ) -> tuple[list[int], str]:
        closing = self._closing[_overlap(sampled, self._closing) :]
        if observation.invalid:
            tokens = closing + self._tool_turn(self.texts.invalid)
        elif observation.error:
            tokens = closing + self._tool_turn(self.texts.failure(observation.error))
        else:
            tokens = self._fit(closing, list(observation.documents), max_tokens)
        return tokens, self._decode(tokens)

    def fit_observation(
        self, sampled: list[int], observation: Observation, max_tokens: int, room: int
    ) -> tuple[list[int], str]:
        """``on_observation_overflow=end``: whole pieces within both budgets, else the
        trajectory ends (``tool_call_lab.fit_whole_pieces``); ``cut``: ``observation_tokens``."""
        if self.on_observation_overflow is not OverflowRule.end or observation.invalid:
            return self.observation_tokens(sampled, observation, max_tokens)
        closing = self._closing[_overlap(sampled, self._closing) :]
        if observation.error:
            pieces = [self.texts.failure(observation.error)]
        else:
            blocks = self.texts.result_blocks(list(observation.documents), self.max_content_chars)
            pieces = blocks or [self.texts.no_results]
        tokens = fit_whole_pieces(
            pieces, self.texts.separator, lambda text: len(self._encode(text)),
            lambda text: closing + self._tool_turn(text), max_tokens, room,
        )
        return tokens, self._decode(tokens)

    def _fit(self, closing: list[int], docs: list[Document], max_tokens: int) -> list[int]:
        """Closing + tool turn, dropping whole documents (last first), then cutting one."""
        while True:
            tokens = closing + self._tool_turn(self.texts.documents(docs, self.max_content_chars))
            if len(tokens) <= max_tokens or not docs:
                return tokens
            if len(docs) == 1:
                return self._fit_one(closing, docs[0], max_tokens)
            docs.pop()

    def _fit_one(self, closing: list[int], doc: Document, max_tokens: int) -> list[int]:
        """The longest cut of ``doc``'s text that fits (binary search on characters)."""
        lo, hi, best = 0, min(len(doc.text), self.max_content_chars), None
        while lo <= hi:
            mid = (lo + hi) // 2
            cut = replace(doc, text=doc.text[:mid])
            tokens = closing + self._tool_turn(self.texts.documents([cut], self.max_content_chars))
            if len(tokens) <= max_tokens:
                best, lo = tokens, mid + 1
            else:
                hi = mid - 1
        # not even an empty passage fits: the template's own framing is over budget
        return best if best is not None else closing + self._tool_turn(self.texts.no_results)

    # ---- chat-template mechanics ---------------------------------------------------------

    def _reference(self) -> list[dict[str, str]]:
        return self.messages(_REF_QUESTION)

    def _tool_turn(self, content: str) -> list[int]:
        """Tokens of a tool message plus the next generation prompt (after the closing)."""
        tool = {"role": "tool", "name": "search", "content": content}
        full = self._render(self._reference() + [_assistant(_REF_CALL), tool], True)
        _require_prefix(self._history, full, "a tool message")
        return full[len(self._history) :]

    def _closing_tokens(self) -> list[int]:
        """What the template writes after an assistant message's content (text diff, then
        the shortest token tail that decodes to it, so no tokenizer merges are assumed)."""
        prompt = self._render(self._reference(), True)
        full = self._render(self._reference() + [_assistant(_REF_ANSWER)], False)
        _require_prefix(prompt, full, "an assistant message")
        text = self._decode(full[len(prompt) :])
        if _REF_ANSWER not in text:
            raise TemplateError("cannot find the assistant content in the template's rendering")
        tail = text.rsplit(_REF_ANSWER, 1)[1]
        for start in range(len(full), len(prompt) - 1, -1):
            decoded = self._decode(full[start:])
            if decoded == tail:
                return full[start:]
            if len(decoded) > len(tail):
                break
        raise TemplateError("the template's turn closing does not start on a token boundary")

    def _end_of_turn_ids(self) -> list[int]:
        """The special tokens of the closing (``<|im_end|>``), else the EOS token."""
        special = set(self.tokenizer.all_special_ids)
        special |= {i for i, t in self.tokenizer.added_tokens_decoder.items() if t.special}
        ids = list(dict.fromkeys(i for i in self._closing if i in special))
        if not ids and self.tokenizer.eos_token_id is not None:
            ids = [self.tokenizer.eos_token_id]
        if not ids:
            raise TemplateError("the chat template closes a turn with no special token")
        return ids

    def _select_template(self, fallback: str) -> tuple[str, bool]:
        """The model's template if it renders ``tools``, else the fallback template."""
        template = self.tokenizer.chat_template
        if isinstance(template, Mapping):
            template = template.get("tool_use") or template.get("default")
        if template and self._renders_tools(template):
            return template, False
        log.warning("chat template ignores `tools`; using the fallback template %r", fallback)
        return load_template(fallback), True

    def _renders_tools(self, template: str) -> bool:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], tools=[self.tool], chat_template=template,
            add_generation_prompt=True, tokenize=False,
        )
        return self.tool["function"]["description"] in text

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, tools=[self.tool], chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt, tokenize=True, **self._template_kwargs,
        )
        return _ids(out)

    def _encode(self, text: str) -> list[int]:
        return _ids(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(
            tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


def _assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


def _ids(out) -> list[int]:
    """Token ids from whatever ``apply_chat_template`` / ``encode`` returned."""
    if isinstance(out, Mapping):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


def _overlap(sampled: list[int], closing: list[int]) -> int:
    """Length of the longest tail of ``sampled`` that is a head of ``closing``."""
    for n in range(min(len(sampled), len(closing)), 0, -1):
        if sampled[-n:] == closing[:n]:
            return n
    return 0


def _require_prefix(prefix: list[int], full: list[int], what: str) -> None:
    """Raise ``TemplateError`` unless ``prefix`` is a token prefix of ``full``."""
    if full[: len(prefix)] == prefix:
        return
    at = next((i for i, (a, b) in enumerate(zip(prefix, full)) if a != b), len(full))
    raise TemplateError(
        f"chat template is not prefix-stable: adding {what} re-renders earlier tokens "
        f"(first difference at token {at} of {len(prefix)}). Token-continuous rollouts need "
        f"a template that only appends; set protocol.fallback_template or fix the template."
    )
