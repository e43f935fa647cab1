"""Outcome rewards: one pure function per option, registered by name (``reward=<name>``).

A reward sees only a ``RewardInput`` — the trajectory's extracted final answer, the gold
answers and the protocol's format verdict — and returns a float. Scalars (penalties,
format scores) are keyword arguments with the paper's defaults; ``build_reward`` binds the
ones a function declares from ``RewardConfig``, so no reward ever receives a config object.

Two choices apply to every reward and so live on the ``Reward`` that ``build_reward``
returns rather than in each function: ``answer_rule`` (which text is the final answer,
``answer_rule.py``; read by ``rollout/scoring.py``) and ``normalize`` (``ascii`` | ``unicode``
punctuation, ``normalize.py``). With ``unicode`` the answer and the golds reach the reward
function already normalised; its own ASCII normalisation then changes nothing (it is
idempotent on normalised text), so the functions stay single-mode.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from searchr1.utils.registry import Registry
from searchr1.rewards.answer_rule import check_rule
from searchr1.rewards.normalize import check_mode, normalize_answer

REWARDS: Registry = Registry("reward")


@dataclass(frozen=True)
class RewardInput:
    """What an outcome reward may look at for one finished trajectory."""

    answer: str | None  # the protocol's final answer, None when there is none
    golden_answers: tuple[str, ...]
    valid_format: bool  # the protocol's ``is_valid_format`` verdict
    retrieval_correct: bool = False  # a gold answer occurs in some observation (paper variant)


RewardFn = Callable[[RewardInput], float]


@dataclass
class RewardConfig:
    """Hydra schema of the ``reward`` group."""

    # registered reward name: em | em_format | em_format_paper
    name: str = "em"
    # em_format: reward when there is no valid final answer (no answer, or format invalid)
    no_answer_penalty: float = -0.1
    # em_format_paper: credit for a well-formed trajectory (and the cost of a malformed one)
    structure_format_score: float = 0.2
    # em_format_paper: credit for a wrong answer in a malformed trajectory
    final_format_score: float = 0.1
    # em_format_paper: extra credit when a gold answer was retrieved (valid format, not correct)
    retrieval_score: float = 0.0
    # which text is the final answer: last_line (the protocol's, markdown tolerated) | lab
    # (exactly one line starting `Answer:` in the final turn; needs protocol=tool_call)
    answer_rule: str = "last_line"
    # punctuation stripped before comparing answers: ascii (the paper's) | unicode (the lab's)
    normalize: str = "ascii"


_RULE_FIELDS = ("name", "answer_rule", "normalize")


@dataclass(frozen=True)
class Reward:
    """A reward function with the run's answer rule and normalisation attached."""

    fn: RewardFn
    answer_rule: str = "last_line"
    normalize: str = "ascii"

    def __call__(self, inp: RewardInput) -> float:
        if self.normalize != "ascii" and inp.answer is not None:
            golds = tuple(normalize_answer(g, self.normalize) for g in inp.golden_answers)
            inp = replace(inp, answer=normalize_answer(inp.answer, self.normalize),
                          golden_answers=golds)
        return float(self.fn(inp))


def build_reward(cfg: RewardConfig) -> Reward:
    """The reward named by ``cfg.name`` with the config scalars it declares bound."""
    fn = REWARDS.get(cfg.name)
    params = inspect.signature(fn).parameters
    scalars = {k: v for k, v in asdict(cfg).items() if k not in _RULE_FIELDS and k in params}
    bound = functools.partial(fn, **scalars) if scalars else fn
    return Reward(bound, check_rule(cfg.answer_rule), check_mode(cfg.normalize))


# Importing the option modules registers them; they import REWARDS and RewardInput from
# this (by then initialised) module, so these imports stay at the bottom.
from searchr1.rewards import em, em_format, em_format_paper  # noqa: E402,F401
