"""The training data order, a registry of named rules: ``epochs`` (ours), ``epochs_drop_last``
(the official trainer's DataLoader) and ``lab`` (one seeded shuffle, read cyclically)."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from torch.utils.data import DataLoader

from searchr1.data.order import DATA_ORDERS, DataOrder, rows_per_epoch
from searchr1.data.types import QAExample

ROWS = [QAExample(f"t{i}", f"q{i}", ("a",), "nq") for i in range(11)]
TRAIN, BATCH, STEPS = 169_615, 512, 1005  # NQ + HotpotQA train, the paper's batch and steps


def ids(examples) -> list[str]:
    return [ex.id for ex in examples]


def test_the_rules_are_registered_options():
    assert DATA_ORDERS.names() == ["epochs", "epochs_drop_last", "lab"]
    with pytest.raises(KeyError, match="valid: epochs, epochs_drop_last, lab"):
        DataOrder(ROWS, 0, rule="file")
    with pytest.raises(ValueError, match="empty"):
        DataOrder([], 0)


def test_lab_order_is_one_seeded_shuffle_read_cyclically():
    shuffled = list(ROWS)
    random.Random(42).shuffle(shuffled)  # the lab's data.py: shuffle the file-order list once
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
    assert ids(order.slice(8, 4)) == first[8:] + second[:1]  # a batch spans two passes


def test_drop_last_reads_whole_batches_of_each_shuffle():
    order = DataOrder(ROWS, seed=42, rule="epochs_drop_last", batch=4)  # 2 batches, 3 rows unread
    first = [f"t{i}" for i in np.random.default_rng([42, 0]).permutation(11)]
    second = [f"t{i}" for i in np.random.default_rng([42, 1]).permutation(11)]
    steps = [ids(order.slice(4 * s, 4)) for s in range(4)]
    assert steps == [first[:4], first[4:8], second[:4], second[4:8]]
    assert rows_per_epoch(11, 4, True) == 8 and rows_per_epoch(11, 4, False) == 11
    with pytest.raises(ValueError, match="fewer than one batch of 12"):
        DataOrder(ROWS, 0, rule="epochs_drop_last", batch=12)


def test_drop_last_has_the_official_batch_counts_at_the_papers_size():
    """169,615 questions in batches of 512, as the official trainer reads them: torch's
    DataLoader(shuffle=True, drop_last=True) gives 331 batches of 512 an epoch and leaves
    143 rows unread; 1,005 steps are 3 epochs and 12 batches of a fourth."""
    official = DataLoader(range(TRAIN), batch_size=BATCH, shuffle=True, drop_last=True)
    sizes = [len(b) for b in official]
    assert (len(official), set(sizes), TRAIN - sum(sizes)) == (331, {512}, 143)
    rows = [QAExample(str(i), "q", ("a",), "nq") for i in range(TRAIN)]
    order = DataOrder(rows, seed=0, rule="epochs_drop_last", batch=BATCH)
    assert order.per_epoch == 331 * 512
    epochs = [order.slice(e * order.per_epoch, order.per_epoch) for e in range(2)]
    for epoch in epochs:  # each epoch: distinct rows, all but 143 of the set
        seen = {ex.id for ex in epoch}
        assert len(seen) == len(epoch) == TRAIN - 143
    unread = [set(map(str, range(TRAIN))) - {ex.id for ex in epoch} for epoch in epochs]
    assert len(unread[0]) == len(unread[1]) == 143 and unread[0] != unread[1]
    last = order.slice((STEPS - 1) * BATCH, BATCH)  # step 1005 is batch 12 of epoch 3
    assert (STEPS - 1) // 331 == 3 and (STEPS - 1) % 331 == 11
    fourth = np.random.default_rng([0, 3]).permutation(TRAIN)
    assert [ex.id for ex in last] == [str(i) for i in fourth[11 * BATCH:12 * BATCH]]
    ours = DataOrder(rows, seed=0, batch=BATCH)  # epochs: no row left out, batch 331 spans two
    counts = Counter(ex.id for ex in ours.slice(0, TRAIN))
    assert len(counts) == TRAIN and set(counts.values()) == {1}
