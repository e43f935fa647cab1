"""Seeded data order: an endless stream of training questions, addressable by position.

Step ``s`` trains on stream positions ``[s·q, (s+1)·q)`` (``q`` = ``trainer.questions_per_step``,
the batch). The order is a pure function of (seed, number of examples, batch, rule), so a
resumed run sees exactly the questions an uninterrupted run would: the checkpoint only needs
the cursor. Rules are registered options (``trainer.data_order``):

- ``epochs`` (default): epoch ``e`` is ``permutation(n)`` under
  ``numpy.random.default_rng([seed, e])``, a fresh shuffle every pass; every row is read once
  a pass and a batch may span two passes;
- ``epochs_drop_last`` (the paper presets): the official trainer's order. Search-R1's
  ``ray_trainer.py`` reads the train set through a ``DataLoader(shuffle=True,
  drop_last=True)``: every epoch a fresh shuffle cut into ``n // q`` whole batches, the last
  ``n mod q`` rows of that shuffle not read that epoch (169,615 questions in batches of 512:
  331 batches an epoch, 143 rows unseen each epoch, a different 143 each time). The shuffle
  is ``epochs``'s; torch's own generator (seeded from its global RNG) is not reproduced;
- ``lab``: the lab's ``train.py``: the file-order list shuffled once with
  ``random.Random(seed).shuffle`` (its ``data.py``), then read cyclically (its ``take_batch``
  wraps around at the end), so every pass repeats the first. With 169,615 questions and
  ≤ 100 × 8 drawn, no run of the lab reaches a second pass.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from searchr1.data.types import QAExample
from searchr1.utils.registry import Registry


@dataclass(frozen=True)
class OrderRule:
    """One registered data order (module docstring)."""

    # (n, seed, epoch) -> the row indices of that epoch, in reading order
    epoch: Callable[[int, int, int], np.ndarray]
    # an epoch is whole batches only: the rows after the last whole batch are not read
    drop_last: bool = False


DATA_ORDERS: Registry[OrderRule] = Registry("data order")


def fresh_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """A new shuffle every epoch: ``default_rng([seed, epoch]).permutation(n)``."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def one_shuffle(n: int, seed: int, epoch: int) -> np.ndarray:
    """The same shuffle every epoch: ``random.Random(seed).shuffle`` of ``range(n)``."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return np.asarray(order)


DATA_ORDERS.register("epochs")(OrderRule(fresh_permutation))
DATA_ORDERS.register("epochs_drop_last")(OrderRule(fresh_permutation, drop_last=True))
DATA_ORDERS.register("lab")(OrderRule(one_shuffle))


def rows_per_epoch(n: int, batch: int, drop_last: bool) -> int:
    """Stream positions one epoch covers: ``n``, or its whole batches under ``drop_last``."""
    return (n // batch) * batch if drop_last else n


class DataOrder:
    """Stream positions → examples under the registered ``rule`` (module docstring)."""

    def __init__(self, examples: list[QAExample], seed: int, rule: str = "epochs",
                 batch: int = 1) -> None:
        if not examples:
            raise ValueError("the training split is empty")
        if batch < 1:
            raise ValueError(f"the batch must hold at least one question, got {batch}")
        self.rule = DATA_ORDERS.get(rule)
        self.examples = examples
        self.seed = seed
        self.per_epoch = rows_per_epoch(len(examples), batch, self.rule.drop_last)
        if self.per_epoch == 0:
            raise ValueError(f"trainer.data_order={rule} reads whole batches, and the "
                             f"{len(examples)} training questions are fewer than one batch "
                             f"of {batch}")
        self._epochs: dict[int, np.ndarray] = {}

    def _epoch(self, e: int) -> np.ndarray:
        if e not in self._epochs:
            self._epochs[e] = self.rule.epoch(len(self.examples), self.seed, e)
        return self._epochs[e]

    def slice(self, start: int, count: int) -> list[QAExample]:
        """The ``count`` examples at stream positions ``start …`` (crossing epochs)."""
        return [self.examples[int(self._epoch(p // self.per_epoch)[p % self.per_epoch])]
                for p in range(start, start + count)]
