"""``reward.normalize=lab``: the lab's punctuation set (Unicode ``P*`` only), against the
lab's rule re-derived here (its ``reward.py``: lowercase, drop every character whose Unicode
category starts with ``P``, drop the articles a/an/the, collapse whitespace)."""

from __future__ import annotations

import random
import re
import string
import unicodedata

import pytest

from searchr1.rewards import RewardConfig, RewardInput, build_reward
from searchr1.rewards.normalize import NORMALIZE_MODES, exact_match, normalize_answer

ARTICLES = re.compile(r"\b(a|an|the)\b")


def labs_rule(text: str) -> str:
    """The lab's normalisation, written from its stated rule."""
    kept = "".join(c for c in text.lower() if not unicodedata.category(c).startswith("P"))
    return " ".join(ARTICLES.sub(" ", kept).split())


@pytest.mark.parametrize(("raw", "lab", "unicode"), [
    ("$100", "$100", "100"),  # `$` is a currency symbol (Sc), not punctuation
    ("C++", "c++", "c"),  # `+` is a math symbol (Sm)
    ("x<y=z>w", "x<y=z>w", "xyzw"),
    ("x^2 | y~z `q`", "x^2 | y~z `q`", "x2 yz q"),
    ("O’Brien, Jr.", "obrien jr", "obrien jr"),  # P* goes in both
    ("The «Times»!", "times", "times"),
    ("#1 @home 50% (a_b)", "1 home 50 ab", "1 home 50 ab"),  # these ASCII marks are P*
])
def test_lab_keeps_the_nine_ascii_symbols(raw, lab, unicode):
    assert normalize_answer(raw, "lab") == lab == labs_rule(raw)
    assert normalize_answer(raw, "unicode") == unicode


def test_exactly_nine_ascii_punctuation_marks_are_symbols():
    kept = [c for c in string.punctuation if normalize_answer(f"x{c}y", "lab") != "xy"]
    assert "".join(kept) == "$+<=>^`|~"


def test_lab_mode_equals_the_labs_rule_on_random_strings():
    rng = random.Random(0)
    alphabet = string.printable + "’“”«»—–…。，、！？£€¥±×÷§¶·•éßΩ北京 "
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        assert normalize_answer(text, "lab") == labs_rule(text), repr(text)


@pytest.mark.parametrize("name", ["em", "em_format", "em_format_paper"])
def test_every_reward_compares_under_the_lab_set(name):
    lab = build_reward(RewardConfig(name=name, normalize="lab"))
    ours = build_reward(RewardConfig(name=name, normalize="unicode"))
    dollars = RewardInput("$100", ("100",), True)
    assert lab.normalize == "lab" and lab(dollars) < ours(dollars) == 1.0
    assert lab(RewardInput("C++", ("c++",), True)) == 1.0
    assert not exact_match("C++", ["C"], "lab") and exact_match("C++", ["C"], "unicode")


def test_a_reward_without_a_normalize_argument_is_refused_a_mode():
    from searchr1.rewards.base import REWARDS

    REWARDS._items["_plain"] = lambda inp: 1.0
    try:
        assert build_reward(RewardConfig(name="_plain"))(RewardInput("x", ("x",), True)) == 1.0
        with pytest.raises(ValueError, match="takes no `normalize`"):
            build_reward(RewardConfig(name="_plain", normalize="lab"))
    finally:
        del REWARDS._items["_plain"]
    assert NORMALIZE_MODES == ("ascii", "unicode", "lab")
