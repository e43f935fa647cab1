"""``eval.per_source`` + ``eval.selection``: ``first`` and ``per_source_seed`` (a fresh
``Random(seed)`` per benchmark); the lab's own rule (``selection=lab``) is tested in
``tests/protocols/test_tool_call_lab_fidelity.py``.

The fixture is a test.parquet-shaped list written here (7 benchmarks, unequal sizes, each a
contiguous block in file order as in Search-R1's test.parquet).
"""

from __future__ import annotations

import random

import pytest

from searchr1.data.selection import eval_examples, select_examples
from searchr1.data.types import Dataset, QAExample
from searchr1.loop.config import EvalConfig

SOURCES = {"nq": 36, "triviaqa": 41, "popqa": 29, "hotpotqa": 33, "2wikimultihopqa": 27,
           "musique": 18, "bamboogle": 12}


@pytest.fixture(scope="module")
def pool() -> list[QAExample]:
    sources = [source for source, n in SOURCES.items() for _ in range(n)]
    return [QAExample(id=f"test_{row}", question=f"{source} question {row}",
                      golden_answers=("x",), data_source=source)
            for row, source in enumerate(sources)]


def per_source_rule(rows: list[QAExample], k: int = 10, seed: int = 42) -> list[str]:
    """Per benchmark in first-seen order, a fresh Random(seed).shuffle, first k ids."""
    ids = []
    for source in dict.fromkeys(r.data_source for r in rows):
        block = [r.id for r in rows if r.data_source == source]
        random.Random(seed).shuffle(block)
        ids += block[:k]
    return ids


def test_per_source_seed_selection_gives_70_ids(pool):
    picked = select_examples(pool, per_source=10, selection="per_source_seed", seed=42)
    assert len(picked) == 70 and [ex.id for ex in picked] == per_source_rule(pool)
    assert len({ex.id for ex in picked}) == 70
    assert {ex.data_source for ex in picked} == set(SOURCES)
    assert all(sum(ex.data_source == s for ex in picked) == 10 for s in SOURCES)
    # not simply the first ten of each block: the shuffle moved some later rows in
    assert [ex.id for ex in picked[:10]] != [f"test_{i}" for i in range(10)]


def test_per_source_seed_selection_is_seeded_and_per_source(pool):
    other = select_examples(pool, per_source=10, selection="per_source_seed", seed=7)
    assert [ex.id for ex in other] == per_source_rule(pool, seed=7) != per_source_rule(pool)
    # a source's pick does not depend on the other sources (a fresh Random per source)
    only_nq = [ex for ex in pool if ex.data_source == "nq"]
    picked = select_examples(only_nq, 10, "per_source_seed")
    assert [ex.id for ex in picked] == per_source_rule(pool)[:10]


def test_first_selection_and_caps(pool):
    assert select_examples(pool) == pool
    assert select_examples(pool, max_questions=16) == pool[:16]
    first = select_examples(pool, per_source=2, selection="first")
    assert [ex.id for ex in first[:4]] == ["test_0", "test_1", "test_36", "test_37"]
    assert len(select_examples(pool, per_source=10, selection="lab", max_questions=25)) == 25
    whole = select_examples(pool, selection="lab")  # every question, shuffled per source
    assert sorted(ex.id for ex in whole) == sorted(ex.id for ex in pool) and whole != pool


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"selection": "random"}, "valid: first, lab, per_source_seed"),
    ({"per_source": 0}, "per_source must be >= 1"),
    ({"max_questions": 0}, "max_questions must be >= 1"),
])
def test_bad_selection_settings(pool, kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_examples(pool, **kwargs)


def test_eval_examples_reads_the_eval_config(pool):
    dataset = Dataset(train=[], dev=pool[:5], test=pool)
    cfg = EvalConfig(split="test", max_questions=None, per_source=10,
                     selection="per_source_seed")
    assert [ex.id for ex in eval_examples(dataset, cfg)] == per_source_rule(pool)
    assert eval_examples(dataset, EvalConfig()) == pool[:5]  # defaults: dev, first 16
