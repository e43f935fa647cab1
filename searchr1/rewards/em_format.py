"""``reward=em_format``: the lab's EM + format reward (1 / 0 / ``no_answer_penalty``).

A trajectory without a valid final answer — no answer extracted, or the protocol's format
check failed — is penalised below a wrong answer, so the policy first learns to finish in
the expected format and then to be right.
"""

from __future__ import annotations

from searchr1.rewards.base import REWARDS, RewardInput
from searchr1.rewards.normalize import exact_match

NO_ANSWER_PENALTY = -0.1


@REWARDS.register("em_format")
def em_format_reward(inp: RewardInput, no_answer_penalty: float = NO_ANSWER_PENALTY,
                     normalize: str = "ascii") -> float:
    """1.0 valid and correct, 0.0 valid but wrong, ``no_answer_penalty`` otherwise."""
    if inp.answer is None or not inp.valid_format:
        return no_answer_penalty
    return 1.0 if exact_match(inp.answer, inp.golden_answers, normalize) else 0.0
