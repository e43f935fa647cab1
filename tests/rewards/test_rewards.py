"""Answer normalisation, string metrics and the three outcome rewards (hand-computed values)."""

from __future__ import annotations

import pytest

from searchr1.rewards import REWARDS, RewardConfig, RewardInput, build_reward
from searchr1.rewards.em import em_reward
from searchr1.rewards.em_format import em_format_reward
from searchr1.rewards.em_format_paper import em_format_paper_reward
from searchr1.rewards.normalize import exact_match, normalize_answer, sub_exact_match, token_f1

GOLDS = ("Barack Obama", "Obama")


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The  U.S.A.", "usa"),
        ("An apple a day", "apple day"),
        ("  Hello,\tWORLD!\n", "hello world"),
        ("theater anthem", "theater anthem"),  # articles only as whole words
        ("A-ha", "aha"),  # punctuation goes before articles are matched
        ("the", ""),
        ("Café  au lait", "café au lait"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_any_gold():
    assert exact_match("obama", GOLDS)
    assert exact_match("  Barack   Obama. ", GOLDS)
    assert not exact_match("President Obama", GOLDS)
    assert exact_match("the Beatles", "Beatles")  # a bare string is one gold answer
    assert not exact_match("anything", ())


def test_sub_exact_match():
    assert sub_exact_match("President Barack Obama", GOLDS)
    assert sub_exact_match("it was obama!", ["Michelle", "Obama"])
    assert not sub_exact_match("Barack", GOLDS)


def test_token_f1_hand_computed():
    # pred tokens [cat, sat, on, mat], gold [cat, on, hat]: P=2/4, R=2/3 → F1 = 4/7
    assert token_f1("The cat sat on the mat", ["a cat on the hat"]) == pytest.approx(4 / 7)
    # a second gold [cat, sat]: P=2/4, R=1 → 2/3 wins the max
    assert token_f1("The cat sat on the mat", ["a cat on the hat", "cat sat"]) == pytest.approx(
        2 / 3
    )
    assert token_f1("dog", ["cat"]) == 0.0
    assert token_f1("The", ["a"]) == 1.0  # both normalise to nothing
    assert token_f1("x", []) == 0.0


def _inp(answer, valid, retrieved=False):
    return RewardInput(answer, GOLDS, valid, retrieval_correct=retrieved)


def test_em_reward():
    assert em_reward(_inp("Obama", True)) == 1.0
    assert em_reward(_inp("Obama", False)) == 1.0  # the paper's em ignores format
    assert em_reward(_inp("Biden", True)) == 0.0
    assert em_reward(_inp(None, True)) == 0.0


def test_em_format_reward():
    assert em_format_reward(_inp("obama", True)) == 1.0
    assert em_format_reward(_inp("Biden", True)) == 0.0
    assert em_format_reward(_inp(None, True)) == -0.1
    assert em_format_reward(_inp("Obama", False)) == -0.1
    assert em_format_reward(_inp(None, False), no_answer_penalty=-0.5) == -0.5


@pytest.mark.parametrize(
    "answer, valid, expected",
    [
        ("Obama", True, 1.0),  # correct + valid
        ("Obama", False, 0.8),  # correct + invalid
        ("Biden", True, 0.2),  # wrong + valid
        (None, True, 0.2),  # no answer + valid (official: structure score)
        ("Biden", False, 0.1),  # wrong + invalid, answer extracted
        (None, False, 0.1),  # no answer + invalid: officially the prompt's example is scored
    ],
)
def test_em_format_paper_six_outcomes(answer, valid, expected):
    assert em_format_paper_reward(_inp(answer, valid)) == pytest.approx(expected)


def test_em_format_paper_no_answer_is_scored_as_the_prompt_example():
    """The official scorer reads the prompt's ``<answer> Beijing </answer>`` when the
    response has none: for a question whose gold is Beijing that is "correct"."""
    beijing = RewardInput(None, ("Beijing",), False)
    assert em_format_paper_reward(beijing) == pytest.approx(0.8)
    assert em_format_paper_reward(RewardInput(None, ("Beijing",), True)) == 1.0


def test_em_format_paper_retrieval_score():
    wrong_retrieved = _inp("Biden", True, retrieved=True)
    assert em_format_paper_reward(wrong_retrieved) == pytest.approx(0.2)
    assert em_format_paper_reward(wrong_retrieved, retrieval_score=0.1) == pytest.approx(0.3)
    right = _inp("Obama", True, retrieved=True)
    assert em_format_paper_reward(right, retrieval_score=0.1) == 1.0


def test_build_reward_binds_scalars():
    assert REWARDS.names() == ["em", "em_format", "em_format_paper"]
    fn = build_reward(RewardConfig(name="em_format", no_answer_penalty=-0.3))
    assert fn(_inp(None, True)) == -0.3
    paper = build_reward(RewardConfig(name="em_format_paper", structure_format_score=0.3))
    assert paper(_inp("Obama", False)) == pytest.approx(0.7)
    assert paper(_inp("Biden", True)) == pytest.approx(0.3)
    assert build_reward(RewardConfig())(_inp("Obama", False)) == 1.0


def test_unknown_reward_lists_valid_names():
    with pytest.raises(KeyError, match="valid: em, em_format, em_format_paper"):
        build_reward(RewardConfig(name="f1"))


# ---- the lab's options: reward.normalize=unicode, reward.answer_rule=lab (issue 12) -----------

from searchr1.rewards import Reward  # noqa: E402
from searchr1.rewards.answer_rule import lab_answer  # noqa: E402


@pytest.mark.parametrize(
    ("raw", "ascii_form", "unicode_form"),
    [
        ("O’Brien", "o’brien", "obrien"),  # U+2019 is Unicode punctuation (Pf), not ASCII
        ("«Le Monde»", "«le monde»", "le monde"),
        ("Tokyo—Japan", "tokyo—japan", "tokyojapan"),  # em dash (Pd)
        ("北京。", "北京。", "北京"),  # CJK full stop (Po)
        ("The $5 A+ plan", "5 plan", "5 plan"),  # ASCII symbols go in both modes
        ("Café  au lait", "café au lait", "café au lait"),  # letters with accents stay
    ],
)
def test_unicode_normalisation_strips_every_punctuation_category(raw, ascii_form, unicode_form):
    assert normalize_answer(raw) == normalize_answer(raw, "ascii") == ascii_form
    assert normalize_answer(raw, "unicode") == unicode_form
    assert normalize_answer(unicode_form) == unicode_form  # idempotent


def test_unicode_mode_in_the_string_metrics():
    assert not exact_match("O’Brien", ["OBrien"]) and exact_match("O’Brien", ["OBrien"], "unicode")
    assert sub_exact_match("Pat O’Brien Jr", ["obrien"], "unicode")
    assert token_f1("Pat O’Brien", ["OBrien"], "unicode") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="valid: ascii, unicode, lab"):
        normalize_answer("x", "latin")


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Answer: Paris", "Paris"),
        ("Thinking first.\nAnswer: Paris\n", "Paris"),
        ("   Answer:   Paris  ", "Paris"),
        ("**Answer:** Paris", None),  # markdown label
        ("Answer: Lyon\nAnswer: Paris", None),  # two answer lines
        ("Answer:", None),
        ("Answer:   \nmore", "more"),  # blank after the label: the next line is the value
        ("The answer: Paris", None),  # must start the line
        ("answer: Paris", "Paris"),  # the label ignores letter case
        ("Final. Answer: Paris", None),
        ("", None),
    ],
)
def test_lab_answer_rule(text, answer):
    assert lab_answer(text) == answer


def test_reward_carries_rule_and_normalisation():
    reward = build_reward(RewardConfig(name="em_format", answer_rule="lab", normalize="unicode"))
    assert isinstance(reward, Reward) and (reward.answer_rule, reward.normalize) == ("lab", "unicode")
    brien = RewardInput("O’Brien", ("OBrien",), True)
    assert reward(brien) == 1.0 and build_reward(RewardConfig(name="em_format"))(brien) == 0.0
    assert reward(RewardInput(None, ("OBrien",), False)) == pytest.approx(-0.1)
    paper = build_reward(RewardConfig(name="em_format_paper", normalize="unicode"))
    assert paper(RewardInput("O’Brien", ("OBrien",), False)) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="valid: lab, last_line"):
        build_reward(RewardConfig(answer_rule="strict"))
    with pytest.raises(ValueError, match="valid: ascii, unicode, lab"):
        build_reward(RewardConfig(normalize="nfkc"))
