"""SQuAD-style answer normalisation and the string metrics built on it.

Every reward and every eval metric compares answers through ``normalize_answer``:
lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace (the order of
Search-R1's ``qa_em.py`` and the SQuAD v1.1 script). Three punctuation sets, chosen by
``reward.normalize``:

- ``ascii`` (default, the paper's): ``string.punctuation`` only, so ``O’Brien`` keeps its
  typographic apostrophe and becomes ``o’brien``;
- ``unicode``: ``string.punctuation`` and every character in a Unicode punctuation category
  (``P*``: curly quotes, dashes, CJK punctuation …), so ``O’Brien`` becomes ``obrien``;
- ``lab`` (the lab's ``reward.py``): the Unicode ``P*`` categories alone. The nine ASCII
  symbols of ``string.punctuation`` that Unicode files as symbols (``S*``), ``$ + < = > ^ `
  | ~``, are kept: ``$100`` stays ``$100`` (no match with ``100``), ``C++`` stays ``c++``.

A reward compares its answer and golds under one set (``build_reward`` binds the mode to
every reward function), so the three never mix in one comparison.

Keeping one implementation makes training rewards and reported EM agree by construction.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _ascii_punct(ch: str) -> bool:
    return ch in _PUNCTUATION


def _category_punct(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "P"


#: mode → whether a character is stripped as punctuation (module docstring)
PUNCTUATION_SETS = {
    "ascii": _ascii_punct,
    "unicode": lambda ch: _ascii_punct(ch) or _category_punct(ch),
    "lab": _category_punct,
}
NORMALIZE_MODES = tuple(PUNCTUATION_SETS)


def check_mode(mode: str) -> str:
    """``mode`` if it is a normalisation mode, else a ``ValueError`` naming the valid ones."""
    if mode not in NORMALIZE_MODES:
        raise ValueError(f"unknown reward.normalize {mode!r}; valid: {', '.join(NORMALIZE_MODES)}")
    return mode


def normalize_answer(s: str, mode: str = "ascii") -> str:
    """Lowercase, strip punctuation (``mode``'s set), remove articles, collapse whitespace."""
    is_punct = PUNCTUATION_SETS[check_mode(mode)]
    text = "".join(ch for ch in s.lower() if not is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_list(golds: str | Iterable[str]) -> list[str]:
    """Accept one gold string or many (a bare string is one answer, not its characters)."""
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(pred: str, golds: str | Iterable[str], mode: str = "ascii") -> bool:
    """Whether the normalised prediction equals any normalised gold answer."""
    norm = normalize_answer(pred, mode)
    return any(norm == normalize_answer(g, mode) for g in _as_list(golds))


def sub_exact_match(pred: str, golds: str | Iterable[str], mode: str = "ascii") -> bool:
    """Whether any normalised gold answer is a substring of the normalised prediction."""
    norm = normalize_answer(pred, mode)
    return any(normalize_answer(g, mode) in norm for g in _as_list(golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    """SQuAD token F1 between two token lists (1.0 when both are empty)."""
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(pred: str, golds: str | Iterable[str], mode: str = "ascii") -> float:
    """Best SQuAD token F1 of the prediction against any gold answer (0.0 with no golds)."""
    pred_tokens = normalize_answer(pred, mode).split()
    scores = [_f1(pred_tokens, normalize_answer(g, mode).split()) for g in _as_list(golds)]
    return max(scores, default=0.0)
