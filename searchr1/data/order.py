"""Seeded data order: an endless stream of training questions, addressable by position.

Step ``s`` trains on stream positions ``[s·q, (s+1)·q)``. The order is a pure function of
(seed, number of examples, rule), so a resumed run sees exactly the questions an
uninterrupted run would: the checkpoint only needs the cursor. Two rules:

- ``epochs`` (default): epoch ``e`` is ``permutation(len(examples))`` under
  ``numpy.random.default_rng([seed, e])``: a fresh shuffle every pass over the data;
- ``lab``: the lab's ``train.py``: the file-order list shuffled once with the seed, then
  read cyclically (its ``take_batch`` wraps around at the end), so every pass repeats the
  first one. The shuffle is ``random.Random(seed).shuffle``, the generator the lab's data
  preparation uses for its eval draw; the lab's ``data.py`` is not in our reference copy,
  so this generator is an assumption (the wrap-around and the single shuffle are stated in
  its ``train.py``). With 169,615 questions and ≤ 100 × 8 drawn, no run reaches a second pass.
"""

from __future__ import annotations

import random

import numpy as np

from searchr1.data.types import QAExample

ORDER_RULES = ("epochs", "lab")


class DataOrder:
    """Stream positions → examples under ``rule`` (module docstring)."""

    def __init__(self, examples: list[QAExample], seed: int, rule: str = "epochs") -> None:
        if not examples:
            raise ValueError("the training split is empty")
        if rule not in ORDER_RULES:
            raise ValueError(f"unknown data order {rule!r}; valid: {', '.join(ORDER_RULES)}")
        self.examples = examples
        self.seed = seed
        self.rule = rule
        self._epochs: dict[int, np.ndarray] = {}

    def _epoch(self, e: int) -> np.ndarray:
        if self.rule == "lab":
            e = 0  # one shuffle, read cyclically
        if e not in self._epochs:
            if self.rule == "lab":
                order = list(range(len(self.examples)))
                random.Random(self.seed).shuffle(order)
                self._epochs[e] = np.asarray(order)
            else:
                rng = np.random.default_rng([self.seed, e])
                self._epochs[e] = rng.permutation(len(self.examples))
        return self._epochs[e]

    def slice(self, start: int, count: int) -> list[QAExample]:
        """The ``count`` examples at stream positions ``start …`` (crossing epochs)."""
        n = len(self.examples)
        return [self.examples[int(self._epoch(p // n)[p % n])] for p in range(start, start + count)]
