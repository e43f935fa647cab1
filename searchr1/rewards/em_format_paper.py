"""``reward=em_format_paper``: what Search-R1 v0.3's ``qa_em_format.compute_score_em`` returns.

Outcomes with the v0.3 script defaults (structure 0.2, final format 0.1, retrieval 0):

    answer \\ format          valid                          invalid
    correct                  1.0                            0.8   (1 - structure)
    wrong                    0.2 (+ retrieval if retrieved) 0.1   (final format)
    none (no closed answer)  0.2 (+ retrieval if retrieved) 0.1   (see below)

Why "none" scores like "wrong", and "invalid, no answer" is 0.1 rather than the 0 written
in the official no-answer branch: the official scorer reads prompt + response and takes
the LAST ``<answer>…</answer>`` match, returning None only when there are fewer than two
matches. The paper's prompt itself holds two complete matches — ``<answer> and
</answer>`` in the instruction and the example ``<answer> Beijing </answer>`` — so the
no-answer branch never runs: a response without a closed ``<answer>`` is scored as if it
had answered the prompt's example, "Beijing", which is wrong for (almost) every question,
and an invalid-format trajectory then gets ``final_format_score``. The official runs
trained with 0.1 in that cell; so does this reward. (The "valid, no answer" cell cannot
occur with the tag protocol: a valid sequence ends in a closed answer.)

Departures: the answer comes from the response alone (the protocol's ``final_answer``)
and a missing one is replaced by ``PROMPT_EXAMPLE_ANSWER``, which is the official result
except after an invalid turn with no later answer, where the official last match is the
``<answer> and </answer>`` of the retry message ("and" instead of "Beijing"; the two
differ only for a gold answer equal to one of them). The format check is the protocol's.
"""

from __future__ import annotations

from searchr1.rewards.base import REWARDS, RewardInput
from searchr1.rewards.normalize import exact_match

#: the answer the official extraction falls back to when a response has no closed
#: ``<answer>``: the example in the paper's prompt (ours keeps the same example)
PROMPT_EXAMPLE_ANSWER = "Beijing"


def official_answer(answer: str | None) -> str:
    """The answer the official scorer reads: the response's, else the prompt's example."""
    return PROMPT_EXAMPLE_ANSWER if answer is None else answer


@REWARDS.register("em_format_paper")
def em_format_paper_reward(
    inp: RewardInput,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    score: float = 1.0,
    normalize: str = "ascii",
) -> float:
    """The paper's graded reward over (correct, valid format), as officially computed."""
    correct = exact_match(official_answer(inp.answer), inp.golden_answers, normalize)
    if inp.valid_format:
        if correct:
            return score
        return structure_format_score + (retrieval_score if inp.retrieval_correct else 0.0)
    return score - structure_format_score if correct else final_format_score
