"""The paper's protocol (``protocol=tags``): think / search / information / answer tags.

Faithful to Search-R1's ``llm_agent/generation.py``, ``qa_em_format.py`` and its data code:

- the prompt is our wording of the paper's template (``prompt=ours``), or the rendered
  instruction the data row carries (``prompt=dataset``: the ``prompt`` column of
  ``data=nq_hotpotqa``, so the paper setting needs no copied prose); with ``ours`` a
  question without a final ``?`` gets one, as the official data code does;
- a turn's action is the FIRST match of ``<(search|answer)>(.*?)</\\1>`` (DOTALL);
- ``cut=official``: no stop strings; each sampled turn is cut after the first
  ``</search>`` anywhere, else the first ``</answer>``, and loses its EOS, on the sampled
  tokens (``tags_cut.py``). ``cut=first_stop`` stops the sampler at whichever tag closes
  first and keeps the EOS (cheaper; not the paper's rule);
- search results come back as ``\\n\\n<information>Doc 1(Title: t) text\\nDoc 2(…) …
  </information>\\n\\n``, the joined passages ``strip()``-ed as officially; the title is
  the first line of the corpus ``contents`` verbatim, quotes included, when the document
  carries ``contents``;
- ``observation_truncation=tokens`` keeps the first ``max_tokens`` tokens of the rendered
  observation, as the official ``_process_next_obs`` does, even when that loses
  ``</information>`` (the format check then fails, as it does officially);
  ``passages`` drops whole passages from the end and re-closes the block;
- an invalid turn gets the official retry message, masked like any observation.

``empty_query``: ``<search></search>`` (or a blank query) is an invalid turn by default
(ours: the retry message follows, and the format check fails); ``search`` (the paper
presets) reads it as the official parse does, a search for ``""``, a valid turn. What a
search for ``""`` returns is the retriever's: the local retrievers return no passages for a
blank query (an empty information block), the official e5 server ranks the bare prefix.

Departures, each deliberate:

- the format check runs on the response (``tags_format.py``); the final answer is the
  response's last ``<answer>`` (see ``rewards/em_format_paper.py``);
- a retriever whose documents carry no ``contents`` shows its cleaned ``title``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from searchr1.data.types import QAExample
from searchr1.protocols.base import PROTOCOLS, Action, ActionKind, Observation, Protocol
from searchr1.protocols.tags_cut import cut_sampled_turn
from searchr1.protocols.tags_format import check_sequence
from searchr1.retrievers.base import Document

__all__ = ["EmptyQuery", "TagsConfig", "TagsProtocol", "check_sequence"]

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



def prompt_texts(cfg) -> dict[str, str]:
    """Every text this protocol shows the model (what a warm start's fingerprint covers)."""
    return {"prompt": PROMPT_TEMPLATE, "invalid": INVALID_ACTION_MESSAGE,
            "information": EMPTY_INFORMATION}


ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
OPEN_ACTION_RE = re.compile(r"<(search|answer)>")


class PromptSource(str, Enum):
    """Where the first prompt's instruction comes from."""

    ours = "ours"  # our wording of the paper's template, question inserted
    dataset = "dataset"  # the row's rendered ``prompt`` (data=nq_hotpotqa), chat-templated


class CutRule(str, Enum):
    """How a sampled turn ends."""

    official = "official"  # no stop strings; cut at first </search>, else </answer>; no EOS
    first_stop = "first_stop"  # stop strings; whichever tag closes first; EOS kept


class EmptyQuery(str, Enum):
    """What a search block with a blank query is."""

    invalid = "invalid"  # an invalid turn, answered with the retry message (ours)
    search = "search"  # a search for "" (the official parse)


class ObservationTruncation(str, Enum):
    """How an observation is fit to ``rollout.max_observation_tokens``."""

    tokens = "tokens"  # first N tokens of the rendered block (the paper's)
    passages = "passages"  # drop whole passages from the end, keep the block closed


@dataclass
class TagsConfig:
    """Hydra schema of ``protocol=tags``."""

    # registry name of the protocol
    name: str = "tags"
    # wrap the prompt as a user message in the chat template; null = whenever the tokenizer
    # has one (what Search-R1's data code does, base models included)
    use_chat_template: bool | None = None
    # ours | dataset (the row's rendered prompt; needs data=nq_hotpotqa)
    prompt: PromptSource = PromptSource.ours
    # official (the paper's cut rule) | first_stop (stop strings, cheaper)
    cut: CutRule = CutRule.first_stop
    # tokens (the paper's: first N tokens) | passages (whole passages dropped)
    observation_truncation: ObservationTruncation = ObservationTruncation.passages
    # <search></search>: invalid (ours, the retry message follows) | search (a search for "",
    # the official parse)
    empty_query: EmptyQuery = EmptyQuery.invalid


def with_question_mark(question: str) -> str:
    """The question stripped, with ``?`` appended when it does not end with one (officially)."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def passage_parts(doc: Document) -> tuple[str, str]:
    """(title, text) as the official ``_passages2string`` splits ``contents``.

    The title is the first line verbatim (``"Hamlet"`` keeps its quotes), the text the
    remaining lines. Documents from ``e5``, ``http`` and ``bm25`` over a corpus file carry
    ``contents`` and get the verbatim title; ``bm25`` over the world's own corpus does not (its
    observations keep the unquoted titles the packaged warm start was trained on), nor do
    ``zhihu``'s, and show their cleaned ``title``.
    """
    contents = getattr(doc, "contents", None)
    if not contents:
        return doc.title, doc.text
    title, _, text = contents.partition("\n")
    return title, text


def format_passage(index: int, doc: Document) -> str:
    """One passage as the paper shows it: ``Doc {i}(Title: {title}) {text}\\n``."""
    title, text = passage_parts(doc)
    return f"Doc {index}(Title: {title}) {text}\n"


def render_information(bodies: list[str]) -> str:
    """The observation block around passage strings (joined and stripped, as officially)."""
    return INFO_OPEN + "".join(bodies).strip() + INFO_CLOSE


def dataset_messages(example: QAExample) -> list[dict[str, str]]:
    """The chat messages of the row's ``prompt`` (``meta["prompt"]``), checked."""
    prompt = example.meta.get("prompt")
    if prompt is None:
        raise ValueError(
            f"protocol.prompt=dataset needs rows with a 'prompt' column (data=nq_hotpotqa); "
            f"example {example.id!r} ({example.data_source}) has none"
        )
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    if not messages:
        raise ValueError(f"example {example.id!r}: its 'prompt' holds no message")
    return messages


@PROTOCOLS.register("tags")
class TagsProtocol(Protocol):
    """Search-R1's tag protocol over any tokenizer with ``encode``/``decode``."""

    #: stop strings of ``cut=first_stop``; an instance with ``cut=official`` has none
    stop = ["</search>", "</answer>"]

    def __init__(
        self,
        tokenizer,
        use_chat_template: bool | None = None,
        prompt: PromptSource | str = PromptSource.ours,
        cut: CutRule | str = CutRule.first_stop,
        observation_truncation: ObservationTruncation | str = ObservationTruncation.passages,
        empty_query: EmptyQuery | str = EmptyQuery.invalid,
    ) -> None:
        self.tokenizer = tokenizer
        if use_chat_template is None:  # Search-R1's data code: template whenever one exists
            use_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.use_chat_template = use_chat_template
        self.prompt = PromptSource(prompt)
        self.cut = CutRule(cut)
        self.observation_truncation = ObservationTruncation(observation_truncation)
        self.empty_query = EmptyQuery(empty_query)
        if self.cut is CutRule.official:
            self.stop = []
        self._special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())

    @classmethod
    def from_config(cls, cfg: TagsConfig, tokenizer) -> TagsProtocol:
        return cls(tokenizer, use_chat_template=cfg.use_chat_template, prompt=cfg.prompt,
                   cut=cfg.cut, observation_truncation=cfg.observation_truncation,
                   empty_query=cfg.empty_query)

    # ---- prompts -------------------------------------------------------------------------

    def prompt_text(self, question: str) -> str:
        """Our prompt string (chat-templated when configured) ending where the model writes."""
        text = PROMPT_TEMPLATE.format(question=with_question_mark(question))
        return self._render([{"role": "user", "content": text}])

    def example_prompt_text(self, example: QAExample) -> str:
        """The prompt string for a data row, under ``protocol.prompt``."""
        if self.prompt is PromptSource.ours:
            return self.prompt_text(example.question)
        return self._render(dataset_messages(example))

    def _render(self, messages: list[dict[str, str]]) -> str:
        """Chat-templated messages; without a template, the first message's content (officially)."""
        if not self.use_chat_template:
            return messages[0]["content"]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def initial_prompt(self, question: str) -> list[int]:
        """Prompt token ids for a bare question (``prompt=ours`` only)."""
        if self.prompt is PromptSource.dataset:
            raise ValueError("protocol.prompt=dataset renders the row's prompt: "
                             "use example_prompt(example), not initial_prompt(question)")
        return self._encode(self.prompt_text(question))

    def example_prompt(self, example: QAExample) -> list[int]:
        """Prompt token ids; no special tokens are added beyond what the template writes."""
        return self._encode(self.example_prompt_text(example))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # ---- actions -------------------------------------------------------------------------

    def cut_turn(
        self, tokens: list[int], logprobs: list[float], text: str, stop_reason: str
    ) -> tuple[list[int], list[float], str]:
        """``cut=official``: the paper's cut on the sampled tokens (see ``tags_cut.py``)."""
        if self.cut is CutRule.first_stop:
            return tokens, logprobs, text
        kept = cut_sampled_turn(tokens, logprobs, self._decode, self._special_ids)
        return kept.tokens, kept.logprobs, kept.text

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
        if not content and self.empty_query is EmptyQuery.invalid:
            return Action(ActionKind.INVALID, error="empty query")
        return Action(ActionKind.SEARCH, query=content, error=note)

    # ---- observations --------------------------------------------------------------------

    def observation_tokens(
        self, sampled: list[int], observation: Observation, max_tokens: int
    ) -> tuple[list[int], str]:
        """Tokens and text of the observation, tokenised on their own and fit to ``max_tokens``.

        ``sampled`` is not needed: the tag protocol has no turn-closing tokens. A tool
        error is shown inside the information block like a single passage. Under
        ``passages`` the invalid message is never cut; under ``tokens`` every observation
        is cut alike, as officially.
        """
        if observation.error is not None:
            bodies = [observation.error]
        else:
            bodies = [format_passage(i, d) for i, d in enumerate(observation.documents, 1)]
        if self.observation_truncation is ObservationTruncation.tokens:
            text = INVALID_ACTION_MESSAGE if observation.invalid else render_information(bodies)
            return self._head(text, max_tokens)
        if observation.invalid:
            return self._encode(INVALID_ACTION_MESSAGE), INVALID_ACTION_MESSAGE
        return self._fit(bodies, max_tokens)

    def _head(self, text: str, max_tokens: int) -> tuple[list[int], str]:
        """The first ``max_tokens`` tokens of ``text`` (its closing tag may be lost)."""
        tokens = self._encode(text)
        if len(tokens) <= max_tokens:
            return tokens, text
        head = tokens[: max(0, max_tokens)]
        return head, self.tokenizer.decode(head)

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
