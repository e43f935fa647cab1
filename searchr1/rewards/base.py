"""The reward vocabulary: ``RewardInput``, the registry, the ``reward`` schema and ``build_reward``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import asdict, dataclass

from searchr1.utils.registry import Registry
from searchr1.utils.schema import one_of
from searchr1.rewards.answer_rule import ANSWER_RULES
from searchr1.rewards.normalize import NORMALIZE_MODES, check_mode

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
    name: str = one_of("em", REWARDS)
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
    answer_rule: str = one_of("last_line", ANSWER_RULES)
    # punctuation stripped before comparing answers: ascii (the paper's) | unicode (ASCII and
    # Unicode punctuation) | lab (Unicode punctuation only, as the lab) — rewards/normalize.py
    normalize: str = one_of("ascii", NORMALIZE_MODES)


_RULE_FIELDS = ("name", "answer_rule")


@dataclass(frozen=True)
class Reward:
    """A reward function with the run's answer rule and normalisation attached (the function
    has ``normalize`` bound already; the field tells the scorer which EM the reward saw)."""

    fn: RewardFn
    answer_rule: str = "last_line"
    normalize: str = "ascii"

    def __call__(self, inp: RewardInput) -> float:
        return float(self.fn(inp))

    @classmethod
    def of(cls, fn: "Reward | RewardFn") -> "Reward":
        """``fn`` as a ``Reward``: a bare reward function gets the default rule and normalisation."""
        return fn if isinstance(fn, Reward) else cls(fn)


def build_reward(cfg: RewardConfig) -> Reward:
    """The reward named by ``cfg.name`` with the config scalars it declares bound.

    ``normalize`` is bound like a scalar: every reward that compares answers declares it. A
    reward that does not cannot honour a mode other than ``ascii`` and is refused with one.
    """
    fn = REWARDS.get(cfg.name)
    params = inspect.signature(fn).parameters
    mode = check_mode(cfg.normalize)
    if mode != "ascii" and "normalize" not in params:
        raise ValueError(f"reward={cfg.name} takes no `normalize` argument, so "
                         f"reward.normalize={mode} cannot apply to it")
    scalars = {k: v for k, v in asdict(cfg).items() if k not in _RULE_FIELDS and k in params}
    bound = functools.partial(fn, **scalars) if scalars else fn
    ANSWER_RULES.get(cfg.answer_rule)  # an unknown rule: a ValueError naming the valid ones
    return Reward(bound, cfg.answer_rule, mode)
