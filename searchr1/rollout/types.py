"""Trajectory types: what a rollout records, token by token.

Shape suffixes used across the package: ``_T`` per token of a trajectory, ``_G`` per
trajectory of a group, ``_D`` per datum of a batch.

A trajectory grows by appending each turn's sampled tokens (mask 1) and then the
observation tokens the protocol renders (mask 0). The mask is set here, where the
observation is injected, and travels with the tokens: nothing downstream reconstructs it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

from searchr1.data.types import QAExample
from searchr1.protocols.base import Action
from searchr1.retrievers.base import Document


class EndReason(str, Enum):
    """Why a trajectory stopped."""

    ANSWER = "answer"  # the model gave a final answer
    SEARCH_BUDGET = "search_budget"  # max searches used, and the last turn did not answer
    TURN_LIMIT = "turn_limit"  # max assistant turns reached without an answer
    TOKEN_LIMIT = "token_limit"  # the trajectory hit max trajectory tokens
    SAMPLER_ERROR = "sampler_error"  # the sampler raised; the trajectory is kept as data
    INVALID = "invalid"  # a turn was neither a search nor an answer (protocol.on_invalid=end)
    # the observation did not fit and the protocol ended the trajectory before it
    # (protocol.on_observation_overflow=end)
    OBSERVATION_LIMIT = "observation_limit"


@dataclass
class Turn:
    """One assistant turn and the observation that followed it."""

    prompt_len: int  # tokens in the context before this turn's sampled tokens
    sampled_tokens: list[int]
    sampled_logprobs: list[float]
    text: str
    stop_reason: str
    action: Action
    observation_text: str = ""
    observation_len: int = 0  # tokens of observation appended after the sampled tokens
    documents: list[Document] = field(default_factory=list)
    tool_error: str | None = None
    search_seconds: float = 0.0


@dataclass
class Trajectory:
    """A full multi-turn rollout for one question."""

    example: QAExample
    group_index: int  # which of the group's ``group_size`` samples this is
    tokens_T: list[int]  # prompt + every turn's sampled and observation tokens
    mask_T: list[int]  # 1 on sampled (action) tokens, 0 on prompt and observation tokens
    logprobs_T: list[float]  # sampler logprob on action tokens, 0.0 elsewhere
    prompt_len: int
    turns: list[Turn] = field(default_factory=list)
    end_reason: EndReason | None = None
    answer: str | None = None
    reward: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)  # em, format, f1, … for metrics

    @classmethod
    def start(cls, example: QAExample, group_index: int, prompt: list[int]) -> "Trajectory":
        n = len(prompt)
        return cls(example, group_index, list(prompt), [0] * n, [0.0] * n, n)

    def append_sampled(self, tokens: list[int], logprobs: list[float]) -> None:
        if len(tokens) != len(logprobs):
            raise ValueError(f"{len(tokens)} sampled tokens but {len(logprobs)} logprobs")
        self.tokens_T += tokens
        self.mask_T += [1] * len(tokens)
        self.logprobs_T += [float(x) for x in logprobs]

    def append_observation(self, tokens: list[int]) -> None:
        self.tokens_T += tokens
        self.mask_T += [0] * len(tokens)
        self.logprobs_T += [0.0] * len(tokens)

    @property
    def num_searches(self) -> int:
        return sum(1 for t in self.turns if t.action.kind.value == "search" and t.observation_len)

    @property
    def num_action_tokens(self) -> int:
        return sum(self.mask_T)

    def to_record(self) -> dict:
        """A JSON-ready summary for ``trajectories.jsonl`` (no token arrays)."""
        ex = self.example
        return {
            "id": ex.id,
            "question": ex.question,
            "golden_answers": list(ex.golden_answers),
            "data_source": ex.data_source,
            "group_index": self.group_index,
            "answer": self.answer,
            "reward": self.reward,
            "scores": self.scores,
            "end_reason": self.end_reason.value if self.end_reason else None,
            "num_searches": self.num_searches,
            "num_tokens": len(self.tokens_T),
            "turns": [
                {
                    "text": t.text,
                    "action": t.action.kind.value,
                    "query": t.action.query,
                    "answer": t.action.answer,
                    "action_error": t.action.error,
                    "stop_reason": t.stop_reason,
                    "observation": t.observation_text,
                    "documents": [asdict(d) for d in t.documents],
                    "tool_error": t.tool_error,
                }
                for t in self.turns
            ],
        }
