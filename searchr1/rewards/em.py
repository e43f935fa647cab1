"""``reward=em``: the paper's outcome reward, exact match after SQuAD normalisation."""

from __future__ import annotations

from searchr1.rewards.base import REWARDS, RewardInput
from searchr1.rewards.normalize import exact_match


@REWARDS.register("em")
def em_reward(inp: RewardInput, normalize: str = "ascii") -> float:
    """1.0 when there is an answer and it matches any gold answer, else 0.0 (format ignored)."""
    if inp.answer is None:
        return 0.0
    return 1.0 if exact_match(inp.answer, inp.golden_answers, normalize) else 0.0
