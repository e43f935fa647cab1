"""SQuAD-style answer normalisation and the string metrics built on it.

Every reward and every eval metric compares answers through ``normalize_answer``, exactly
as Search-R1's ``qa_em.py`` and the SQuAD v1.1 script do: lowercase, drop ASCII
punctuation, drop the articles a/an/the, collapse whitespace. Keeping one implementation
makes training rewards and reported EM agree by construction.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lowercase, strip punctuation, remove articles, collapse whitespace (SQuAD order)."""
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_list(golds: str | Iterable[str]) -> list[str]:
    """Accept one gold string or many (a bare string is one answer, not its characters)."""
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(pred: str, golds: str | Iterable[str]) -> bool:
    """Whether the normalised prediction equals any normalised gold answer."""
    norm = normalize_answer(pred)
    return any(norm == normalize_answer(g) for g in _as_list(golds))


def sub_exact_match(pred: str, golds: str | Iterable[str]) -> bool:
    """Whether any normalised gold answer is a substring of the normalised prediction."""
    norm = normalize_answer(pred)
    return any(normalize_answer(g) in norm for g in _as_list(golds))


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


def token_f1(pred: str, golds: str | Iterable[str]) -> float:
    """Best SQuAD token F1 of the prediction against any gold answer (0.0 with no golds)."""
    pred_tokens = normalize_answer(pred).split()
    scores = [_f1(pred_tokens, normalize_answer(g).split()) for g in _as_list(golds)]
    return max(scores, default=0.0)
