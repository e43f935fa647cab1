"""SQuAD-style answer normalisation and the string metrics built on it.

Every reward and every eval metric compares answers through ``normalize_answer``:
lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace (the order of
Search-R1's ``qa_em.py`` and the SQuAD v1.1 script). Two punctuation sets, chosen by
``reward.normalize``:

- ``ascii`` (default, the paper's): ``string.punctuation`` only, so ``O’Brien`` keeps its
  typographic apostrophe and becomes ``o’brien``;
- ``unicode`` (the lab's): also every character in a Unicode punctuation category (``P*``:
  curly quotes, dashes, CJK punctuation …), so ``O’Brien`` becomes ``obrien``. ASCII
  symbols such as ``$`` or ``+`` stay removed in both, so ``unicode`` only ever removes more.

Keeping one implementation makes training rewards and reported EM agree by construction.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

NORMALIZE_MODES = ("ascii", "unicode")
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _is_punct(ch: str, mode: str) -> bool:
    return ch in _PUNCTUATION or (mode == "unicode" and unicodedata.category(ch)[0] == "P")


def check_mode(mode: str) -> str:
    """``mode`` if it is a normalisation mode, else a ``ValueError`` naming the valid ones."""
    if mode not in NORMALIZE_MODES:
        raise ValueError(f"unknown reward.normalize {mode!r}; valid: {', '.join(NORMALIZE_MODES)}")
    return mode


def normalize_answer(s: str, mode: str = "ascii") -> str:
    """Lowercase, strip punctuation (``mode``'s set), remove articles, collapse whitespace."""
    check_mode(mode)
    text = s.lower()
    text = "".join(ch for ch in text if not _is_punct(ch, mode))
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
