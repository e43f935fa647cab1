"""Which questions of a split are evaluated (``eval.per_source``, ``eval.selection``).

- ``selection=first`` (default): questions in the split's file order; with ``per_source=K``
  the first K of each ``data_source``.
- ``selection=lab`` (the lab's fixed eval set): ONE ``random.Random(seed)``
  (``eval.selection_seed``, 42) for the whole split; the sources are visited in sorted name
  order and each source's questions (file order) are shuffled by that one generator in turn,
  first K kept. This is the rule the lab's data preparation applies to test.parquet to make
  its 70 questions (10 × 7 benchmarks); a source's pick therefore depends on the sizes of the
  sources sorted before it. ``random.Random`` is Python's Mersenne Twister, so the same list
  and seed give the same 70 ids on any machine.
- ``selection=per_source_seed``: like ``lab`` but with a fresh ``Random(seed)`` per source,
  sources in first-seen order, so one benchmark's pick does not move when another benchmark
  grows or is left out.

Sources are listed in first-seen order (sorted for ``lab``); questions inside a source
keep the order the rule produced. ``max_questions`` then caps the total (null = no cap).
The dataset's own ``dev`` split may already be a per-source draw (``data=nq_hotpotqa``:
numpy, seed 42); to select the lab's ids from the whole test pool, evaluate a split that
holds the whole pool in file order (``data.dev_per_source=0`` then ``eval.split=test``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from searchr1.data.types import QAExample

SELECTIONS = ("first", "lab", "per_source_seed")


def by_source(examples: Sequence[QAExample]) -> dict[str, list[QAExample]]:
    """Examples grouped by ``data_source``, sources in first-seen order, rows in file order."""
    groups: dict[str, list[QAExample]] = {}
    for ex in examples:
        groups.setdefault(ex.data_source, []).append(ex)
    return groups


def shuffled_pick(rows: list[QAExample], k: int | None, rng: random.Random) -> list[QAExample]:
    """One source's pick: ``rng.shuffle`` a copy, first ``k`` (all when ``k`` is None)."""
    shuffled = list(rows)
    rng.shuffle(shuffled)
    return shuffled if k is None else shuffled[:k]


def _seeded(groups: dict[str, list[QAExample]], k: int | None, seed: int,
            shared: bool) -> list[QAExample]:
    """``lab`` (``shared``: one generator, sorted sources) or ``per_source_seed``."""
    rng = random.Random(seed)
    names = sorted(groups) if shared else list(groups)
    picked: list[QAExample] = []
    for name in names:
        picked += shuffled_pick(groups[name], k, rng if shared else random.Random(seed))
    return picked


def select_examples(
    examples: Sequence[QAExample],
    per_source: int | None = None,
    selection: str = "first",
    seed: int = 42,
    max_questions: int | None = None,
) -> list[QAExample]:
    """The eval questions of ``examples`` under the rule in the module docstring."""
    if selection not in SELECTIONS:
        raise ValueError(f"unknown eval.selection {selection!r}; valid: {', '.join(SELECTIONS)}")
    for name, value in (("eval.per_source", per_source), ("eval.max_questions", max_questions)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or null, got {value}")
    if selection == "first" and per_source is None:
        picked = list(examples)
    elif selection == "first":
        picked = [ex for rows in by_source(examples).values() for ex in rows[:per_source]]
    else:
        picked = _seeded(by_source(examples), per_source, seed, shared=selection == "lab")
    return picked if max_questions is None else picked[:max_questions]


def eval_examples(dataset, eval_cfg) -> list[QAExample]:
    """The questions ``eval_cfg`` (an ``EvalConfig`` node) selects from ``dataset``."""
    return select_examples(
        dataset.split(eval_cfg.split), eval_cfg.per_source, eval_cfg.selection,
        eval_cfg.selection_seed, eval_cfg.max_questions,
    )
