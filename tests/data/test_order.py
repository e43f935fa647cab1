"""The training data order: ``epochs`` (ours) and ``lab`` (one seeded shuffle, cyclic)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from searchr1.data.order import DataOrder
from searchr1.data.types import QAExample

ROWS = [QAExample(f"t{i}", f"q{i}", ("a",), "nq") for i in range(11)]


def ids(examples) -> list[str]:
    return [ex.id for ex in examples]


def test_lab_order_is_one_seeded_shuffle_read_cyclically():
    shuffled = list(ROWS)
    random.Random(42).shuffle(shuffled)  # the lab: shuffle the file-order list once
    order = DataOrder(ROWS, seed=42, rule="lab")
    assert ids(order.slice(0, 11)) == ids(shuffled)
    assert ids(order.slice(8, 8)) == ids(shuffled[8:] + shuffled[:5])  # wraps, same order
    assert ids(order.slice(11, 11)) == ids(shuffled)  # every pass repeats the first


def test_epochs_order_reshuffles_every_pass():
    order = DataOrder(ROWS, seed=42)
    first = [f"t{i}" for i in np.random.default_rng([42, 0]).permutation(11)]
    second = [f"t{i}" for i in np.random.default_rng([42, 1]).permutation(11)]
    assert ids(order.slice(0, 11)) == first and ids(order.slice(11, 11)) == second
    assert first != second and sorted(second) == sorted(first)


def test_bad_rule_and_empty_split():
    with pytest.raises(ValueError, match="valid: epochs, lab"):
        DataOrder(ROWS, 0, rule="file")
    with pytest.raises(ValueError, match="empty"):
        DataOrder([], 0)
