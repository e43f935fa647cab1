"""Seeded data order: an endless stream of shuffled epochs, addressable by position.

Step ``s`` trains on stream positions ``[s·q, (s+1)·q)``. The order is a pure function of
(seed, number of examples), so a resumed run sees exactly the questions an uninterrupted
run would: the checkpoint only needs the cursor.
"""

from __future__ import annotations

import numpy as np

from searchr1.data.types import QAExample


class DataOrder:
    """Epoch ``e`` is ``permutation(len(examples))`` under ``default_rng([seed, e])``."""

    def __init__(self, examples: list[QAExample], seed: int) -> None:
        if not examples:
            raise ValueError("the training split is empty")
        self.examples = examples
        self.seed = seed
        self._epochs: dict[int, np.ndarray] = {}

    def _epoch(self, e: int) -> np.ndarray:
        if e not in self._epochs:
            rng = np.random.default_rng([self.seed, e])
            self._epochs[e] = rng.permutation(len(self.examples))
        return self._epochs[e]

    def slice(self, start: int, count: int) -> list[QAExample]:
        """The ``count`` examples at stream positions ``start …`` (crossing epochs)."""
        n = len(self.examples)
        return [self.examples[int(self._epoch(p // n)[p % n])] for p in range(start, start + count)]
