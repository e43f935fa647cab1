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

Each rule is a registered option (``EVAL_SELECTIONS``). Sources are listed in first-seen
order (sorted for ``lab``); questions inside a source keep the order the rule produced.
``max_questions`` then caps the total (null = no cap).
The dataset's own ``dev`` split may already be a per-source draw (``data=nq_hotpotqa``:
numpy, seed 42); to select the lab's ids from the whole test pool, evaluate a split that
holds the whole pool in file order (``data.dev_per_source=0`` then ``eval.split=test``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from searchr1.data.types import QAExample
from searchr1.utils.registry import Registry

#: (examples, per_source, seed) -> the picked examples, before ``max_questions``
Selection = Callable[[Sequence[QAExample], "int | None", int], list[QAExample]]
EVAL_SELECTIONS: Registry[Selection] = Registry("eval.selection")


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


@EVAL_SELECTIONS.register("first")
def first(examples: Sequence[QAExample], k: int | None, seed: int) -> list[QAExample]:
    """File order; with ``k`` the first ``k`` of each source (``seed`` unused)."""
    if k is None:
        return list(examples)
    return [ex for rows in by_source(examples).values() for ex in rows[:k]]


@EVAL_SELECTIONS.register("lab")
def one_generator(examples: Sequence[QAExample], k: int | None, seed: int) -> list[QAExample]:
    """The lab's: one ``Random(seed)`` over the sources in sorted name order."""
    groups, rng = by_source(examples), random.Random(seed)
    return [ex for name in sorted(groups) for ex in shuffled_pick(groups[name], k, rng)]


@EVAL_SELECTIONS.register("per_source_seed")
def per_source_seed(examples: Sequence[QAExample], k: int | None, seed: int) -> list[QAExample]:
    """A fresh ``Random(seed)`` per source, sources in first-seen order."""
    return [ex for rows in by_source(examples).values()
            for ex in shuffled_pick(rows, k, random.Random(seed))]


def select_examples(
    examples: Sequence[QAExample],
    per_source: int | None = None,
    selection: str = "first",
    seed: int = 42,
    max_questions: int | None = None,
) -> list[QAExample]:
    """The eval questions of ``examples`` under the rule in the module docstring."""
    rule = EVAL_SELECTIONS.get(selection)
    for name, value in (("eval.per_source", per_source), ("eval.max_questions", max_questions)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or null, got {value}")
    picked = rule(examples, per_source, seed)
    return picked if max_questions is None else picked[:max_questions]


def eval_examples(dataset, eval_cfg) -> list[QAExample]:
    """The questions ``eval_cfg`` (an ``EvalConfig`` node) selects from ``dataset``."""
    return select_examples(
        dataset.split(eval_cfg.split), eval_cfg.per_source, eval_cfg.selection,
        eval_cfg.selection_seed, eval_cfg.max_questions,
    )
