"""The protocol contract: how a question becomes a prompt, how a turn becomes an action,
and how an observation becomes tokens.

A protocol owns every string the model sees. The rollout engine only moves tokens: it
appends the sampled tokens as they were sampled (never re-tokenised) and then the tokens
that ``observation_tokens`` returns, which carry no loss. Two protocols exist: ``tags``
(the paper's ``<search>``/``<answer>`` tags) and ``tool_call`` (the lab's chat-template
tool calls).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from searchr1.utils.registry import Registry
from searchr1.retrievers.base import Document

if TYPE_CHECKING:
    from searchr1.data.types import QAExample

PROTOCOLS: Registry = Registry("protocol")


class ActionKind(str, Enum):
    """What the model did in one assistant turn."""

    SEARCH = "search"  # asked for a search (a blank query only where the protocol reads one so)
    ANSWER = "answer"  # gave a final answer
    INVALID = "invalid"  # neither, or a malformed / ambiguous turn


class OnInvalid(str, Enum):
    """What a turn with neither a valid search nor an answer does (``protocol.on_invalid``)."""

    retry = "retry"  # shown the protocol's retry message; the trajectory goes on
    end = "end"  # the trajectory ends there (the lab's rule)


@dataclass(frozen=True)
class Action:
    """The parsed content of one assistant turn."""

    kind: ActionKind
    query: str | None = None
    answer: str | None = None
    error: str | None = None  # why the turn is invalid, for the trajectory record


@dataclass(frozen=True)
class Observation:
    """What the environment returns after a turn; rendered to tokens by the protocol."""

    documents: tuple[Document, ...] = ()
    error: str | None = None  # a tool error (search failed) shown to the model
    invalid: bool = False  # the turn was invalid: render the protocol's retry message


class ObservationOverflow(Exception):
    """The protocol ends the trajectory instead of showing an observation that does not fit."""


class Protocol(ABC):
    """Prompt building, action parsing and observation rendering for one interaction format."""

    #: stop strings (or token ids) passed to the sampler for every assistant turn
    stop: list[str] | list[int]
    #: a turn with neither a valid search nor an answer (``OnInvalid``)
    on_invalid: OnInvalid = OnInvalid.retry

    def final_turn_text(self, turn_texts: list[str]) -> str | None:
        """The final turn's visible text, which ``reward.answer_rule=lab`` reads for its
        ``Answer:`` line; None: this protocol has no such text (the rule needs ``tool_call``)."""
        return None

    @abstractmethod
    def initial_prompt(self, question: str) -> list[int]:
        """Token ids of the first prompt, ending where the assistant starts to write."""

    def example_prompt(self, example: QAExample) -> list[int]:
        """The first prompt for a data row; by default ``initial_prompt(example.question)``.

        Protocols that can take a prompt the row carries (``tags`` with
        ``prompt=dataset``) override it.
        """
        return self.initial_prompt(example.question)

    def cut_turn(
        self, tokens: list[int], logprobs: list[float], text: str, stop_reason: str
    ) -> tuple[list[int], list[float], str]:
        """The part of a sampled turn the trajectory keeps: (tokens, logprobs, text).

        Called by the rollout engine on every sampled turn before it is recorded. The
        default keeps everything; ``tags`` with ``cut=official`` applies the paper's rule.
        """
        return tokens, logprobs, text

    @abstractmethod
    def parse_action(self, text: str) -> Action:
        """Parse one assistant turn's decoded text (stop string included when sampled)."""

    @abstractmethod
    def observation_tokens(
        self, sampled: list[int], observation: Observation, max_tokens: int
    ) -> tuple[list[int], str]:
        """Tokens to append after ``sampled`` before the next assistant turn, and their text.

        Includes anything needed to close the assistant turn and open the next one (for chat
        templates). Passages are dropped whole, last first, until the observation fits
        ``max_tokens``; a single passage that still does not fit is cut.
        """

    def fit_observation(
        self, sampled: list[int], observation: Observation, max_tokens: int, room: int
    ) -> tuple[list[int], str]:
        """``observation_tokens`` for a trajectory with ``room`` tokens left before its limit.

        By default ``room`` is not consulted (the engine ends the trajectory on its token
        limit once the observation is in). A protocol may raise ``ObservationOverflow`` to
        end the trajectory before the observation instead (``tool_call`` with
        ``on_observation_overflow=end``, the lab's rule).
        """
        return self.observation_tokens(sampled, observation, max_tokens)

    @abstractmethod
    def final_answer(self, turn_texts: list[str]) -> str | None:
        """The final answer of a finished trajectory (from its assistant turns), or None."""

    @abstractmethod
    def is_valid_format(
        self, turn_texts: list[str], observations: list[str] | None = None
    ) -> bool:
        """Whether the assistant turns follow the protocol's format (for ``em_format``).

        ``observations[i]`` is the text appended after turn i (``""`` after the last), for
        protocols whose format check spans the whole response (the paper's does).
        """
