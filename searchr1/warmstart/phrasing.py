"""Words of the oracle: query phrasings per hop and short reasoning lines.

Pure functions over strings and a ``random.Random``, so the oracle's diversity is testable
without a model. A hop is searched by the entity's real name (``title``, the title of the
passage that answers it) when the generator's query names it; a hop reached through a
description or a former name keeps the generator's query, since the real name is not
known yet at that point of the trajectory.
"""

from __future__ import annotations

import random

from searchr1.data.world_names import contains_phrase

_WH = ("who", "when", "where", "what", "which", "how")

START = (
    "I need to look this up.",
    "I do not know this yet, so I will search.",
    "Let me search for the first fact I need.",
    "I should find {focus} first.",
    "First I need information about {focus}.",
    "The answer is in the encyclopedia; I will search for {focus}.",
)
FOUND = (
    "The results mention {focus}. Next I need information about {next}.",
    "Found it. Now I should look up {next}.",
    "That gives me {next}; I need one more fact about it.",
    "Good, the next thing to search is {next}.",
    "From these results I know to search for {next} next.",
)
MISSED = (
    "These results do not answer it. Let me try a different query.",
    "Nothing relevant here; I will rephrase the search.",
    "That search missed. I should search more specifically.",
    "The passages are about something else. Let me search again.",
)
ANSWER = (
    "The results answer the question.",
    "Now I have what I need.",
    "So the answer is {answer}.",
    "I have enough information: {answer}.",
    "Based on the passages, it is {answer}.",
)
COMPARE = (
    "Comparing the two years, the answer is {answer}.",
    "Putting both dates side by side gives {answer}.",
    "Now I can compare: {answer}.",
)
DIRECT = ("I already know this.", "This needs no search.")


def query_variants(query: str, title: str) -> dict[str, str]:
    """``{phrasing: query}`` for one hop; a hop not named by ``title`` has one variant."""
    if not title or not contains_phrase(query, title):
        return {"relation": query}
    return {"name_only": title, "relation": query, "question": question_form(query, title)}


def question_form(query: str, title: str) -> str:
    """A question-like phrasing: "when was X born" → "When was X born?",
    "X headquarters" → "What is the headquarters of X?"."""
    q = query.strip()
    if q.split(" ", 1)[0].lower() in _WH:
        return q[:1].upper() + q[1:] + "?"
    rest = q[len(title):].strip() if q.startswith(title) else q.replace(title, "").strip()
    return f"What is the {rest} of {title}?" if rest else f"Who is {title}?"


def pick_phrasing(rng: random.Random, shares: dict[str, float], available: list[str]) -> str:
    """Draw one phrasing among ``available`` with the configured shares (renormalised)."""
    weights = [max(0.0, shares.get(p, 0.0)) for p in available]
    if sum(weights) <= 0:
        return "relation" if "relation" in available else available[0]
    return rng.choices(available, weights=weights, k=1)[0]


def ordered_candidates(variants: dict[str, str], first: str) -> list[str]:
    """Queries to try for a hop: the drawn phrasing, then the others, the generator's last."""
    order = [first] + [p for p in ("name_only", "question") if p != first] + ["relation"]
    out: list[str] = []
    for phrasing in order:
        q = variants.get(phrasing)
        if q and q not in out:
            out.append(q)
    return out


def say(rng: random.Random, lines: tuple[str, ...], **fields: str) -> str:
    """One reasoning line drawn from ``lines``, filled with ``fields``."""
    return rng.choice(lines).format(**fields)
