"""The shared stop rule: ids, strings, length, their order, and windows equal token-by-token checks."""

from __future__ import annotations

import random

from searchr1.engines.local.sampling.stops import LENGTH, STOP, Ending, StopRule

ALPHABET = "abcdefgh "  # token id i decodes to ALPHABET[i]; 9 is "<eos>"


def decode(tokens: list[int]) -> str:
    return "".join("<eos>" if t == 9 else ALPHABET[t] for t in tokens)


def ids(text: str) -> list[int]:
    return [ALPHABET.index(c) for c in text]


RULE = StopRule(frozenset({9}), ("cab", "h h"), decode, max_tokens=12)


def test_each_ending_and_which_wins_on_the_same_token():
    assert RULE.check(ids("abd")) is None
    assert RULE.check(ids("abd") + [9]) == Ending(4, STOP)  # EOS kept
    assert RULE.check(ids("ddcab")) == Ending(5, STOP)  # the completing token kept
    assert RULE.check(ids("abdgabdgabda")) == Ending(12, LENGTH)
    assert RULE.check(ids("abdgabdgac") + ids("ab")) == Ending(12, STOP)  # stop beats length
    assert RULE.check(ids("abdgabdgabd") + [9]) == Ending(12, STOP)
    assert StopRule(frozenset({3})).check(ids("abcd" * 50)) == Ending(200, STOP)  # no cap
    assert StopRule(frozenset({3})).check(ids("abc" * 50)) is None


def test_a_window_ends_where_the_earliest_ending_is():
    tokens = ids("ggcabh h") + [9]  # "cab" at 5, "h h" at 8, EOS at 9
    assert RULE.check(tokens, new=len(tokens)) == Ending(5, STOP)
    assert RULE.check(tokens[:3] + [9] + tokens[3:], new=10) == Ending(4, STOP)  # EOS first
    assert RULE.check(ids("gh hgggggggggg")[:14], new=14) == Ending(4, STOP)
    assert RULE.check(ids("gggggggggggggg"), new=14) == Ending(12, LENGTH)  # nothing kept past 12
    # a stop string spanning the previous window and this one
    assert RULE.check(ids("dddca") + ids("bdd"), new=3) == Ending(6, STOP)


def token_by_token(rule: StopRule, tokens: list[int]) -> Ending | None:
    for k in range(1, len(tokens) + 1):
        ending = rule.check(tokens[:k])
        if ending is not None:
            return ending
    return None


def test_windowed_checks_agree_with_checking_after_every_token():
    """What the slot sampler sees (windows of w tokens) ends where the HF decode ends."""
    rng = random.Random(0)
    for trial in range(300):
        tokens = [rng.choice([0, 1, 2, 7, 8, 8, 9] if trial % 3 else range(10)) for _ in range(12)]
        expected = token_by_token(RULE, tokens)
        for w in (1, 3, 5, 12):
            got, done = None, 0
            while got is None and done < len(tokens):
                new = min(w, len(tokens) - done)
                done += new
                got = RULE.check(tokens[:done], new)
            assert got == expected, (tokens, w)


def test_capped_keeps_ids_and_strings():
    capped = RULE.capped(3)
    assert (capped.token_ids, capped.strings, capped.max_tokens) == (RULE.token_ids, RULE.strings, 3)
    assert capped.check(ids("abd")) == Ending(3, LENGTH)
