"""Data quirks that do not stop a run but change what it trains on, warned about once at load.

- Duplicate question ids within a split: per-question records (eval files, the lab's
  selection by id, derived seeds) then conflate two rows.
- Questions longer than the context (``rollout.max_prompt_tokens``, else
  ``rollout.max_trajectory_tokens``): the sampler sees only their tail and the instruction
  before them is cut away.

Only questions whose UTF-8 size exceeds the limit are tokenized: a token covers at least one
byte (byte-level BPE, word pieces, byte fallback), plus at most one leading marker, so no
shorter question can pass the limit, and a start over a large training set stays instant.
"""

from __future__ import annotations

import logging
from collections import Counter

from searchr1.data.types import Dataset, QAExample

log = logging.getLogger(__name__)
SPLITS = ("train", "dev", "test")


def duplicate_ids(examples: list[QAExample]) -> tuple[int, str | None]:
    """Rows whose id an earlier row of the list already has, and the first such id."""
    counts = Counter(e.id for e in examples)
    first = next((e.id for e in examples if counts[e.id] > 1), None)
    return sum(n - 1 for n in counts.values()), first


def overlong(examples: list[QAExample], tokenizer, limit: int) -> tuple[int, str | None]:
    """Questions with more than ``limit`` tokens of their own, and the first one's id."""
    candidates = [e for e in examples if len(e.question.encode("utf-8")) + 1 > limit]
    long = [e.id for e in candidates
            if len(tokenizer.encode(e.question, add_special_tokens=False)) > limit]
    return len(long), (long[0] if long else None)


def _summary(what: str, per_split: dict[str, tuple[int, str | None]]) -> str | None:
    total = sum(n for n, _ in per_split.values())
    if not total:
        return None
    parts = ", ".join(f"{s} {n}" for s, (n, _) in per_split.items() if n)
    first = next(f for n, f in per_split.values() if n)
    return f"{total} {what} ({parts}; first id {first!r})"


def data_warnings(dataset: Dataset, tokenizer, limit: int, limit_key: str) -> list[str]:
    """The dataset's quirks as sentences with counts per split (empty when there are none)."""
    splits = {s: dataset.split(s) for s in SPLITS}
    found = [
        _summary("rows repeat an earlier question id of their split",
                 {s: duplicate_ids(ex) for s, ex in splits.items()}),
        _summary(f"questions are longer than the context ({limit_key}={limit} tokens), so the "
                 f"sampler sees only their tail",
                 {s: overlong(ex, tokenizer, limit) for s, ex in splits.items()}),
    ]
    return [f for f in found if f]


def warn_data_quirks(dataset: Dataset, tokenizer, rollout) -> list[str]:
    """Log one warning with every quirk of ``dataset`` under the rollout's context limit."""
    limit_key = "rollout.max_prompt_tokens" if rollout.max_prompt_tokens else "rollout.max_trajectory_tokens"
    limit = rollout.max_prompt_tokens or rollout.max_trajectory_tokens
    found = data_warnings(dataset, tokenizer, limit, limit_key)
    if found:
        log.warning("data: %s. The run goes on with them as they are.", "; ".join(found))
    return found
