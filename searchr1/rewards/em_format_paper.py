"""``reward=em_format_paper``: Search-R1 v0.3's ``qa_em_format.compute_score_em``.

Outcomes with the v0.3 script defaults (structure 0.2, final format 0.1, retrieval 0):

    correct + valid format            1.0
    correct + invalid format          0.8   (1 - structure_format_score)
    wrong or no answer + valid        0.2   (+ retrieval_score if a gold answer was retrieved)
    wrong + invalid, answer extracted 0.1
    no answer + invalid               0.0

Departure: the official scorer extracts the answer from prompt + response and needs two
``<answer>`` matches; here the protocol extracts it from the response alone (see DESIGN),
which gives the same answer.
"""

from __future__ import annotations

from searchr1.rewards import REWARDS, RewardInput
from searchr1.rewards.normalize import exact_match


@REWARDS.register("em_format_paper")
def em_format_paper_reward(
    inp: RewardInput,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """The paper's graded reward over (correct, valid format, answer extracted)."""
    correct = inp.answer is not None and exact_match(inp.answer, inp.golden_answers)
    if correct:
        return score if inp.valid_format else score - structure_format_score
    if inp.valid_format:
        bonus = retrieval_score if inp.retrieval_correct else 0.0
        return structure_format_score + bonus
    return final_format_score if inp.answer is not None else 0.0
