"""KV of recently decoded sequences, kept so the next turn's prompt skips re-prefilling them.

A multi-turn rollout sends each turn as a new request whose prompt is the whole context so
far: the previous prompt, the tokens sampled for it, then the observation. After a decode the
HF sampler ``put``s every row's sequence with its per-layer keys and values; a later row
``take``s the entry sharing the longest prefix with its prompt and prefills only the rest.

Rules:
- an entry is removed when taken: the row that extends it stores the longer sequence, so a
  trajectory holds one entry at a time;
- at least one prompt token is always left to prefill (its logits pick the first token);
- entries older than the weights are dropped (``sync`` with the weights' version): keys and
  values are functions of the weights;
- the store holds at most ``max_tokens`` tokens; the least recently stored go first.

Shapes: per layer ``[H, T, D]`` (KV heads, tokens, head size).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

#: a shorter shared prefix is prefilled again: it saves less than the gather costs
MIN_REUSE = 16


@dataclass
class Entry:
    """One stored sequence: its tokens and the keys/values of each of them, per layer."""

    tokens: np.ndarray  # int64 [T]
    keys: list[torch.Tensor]  # per layer [H, T, D]
    values: list[torch.Tensor]

    def shared_prefix(self, prompt: np.ndarray) -> int:
        """Length of the common prefix of this entry's tokens and ``prompt``."""
        n = min(len(self.tokens), len(prompt))
        differ = np.flatnonzero(self.tokens[:n] != prompt[:n])
        return int(differ[0]) if len(differ) else n


class PrefixStore:
    """Entries by insertion order; see the module docstring for the rules."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.version: object = None
        self.tokens = 0  # tokens held, summed over entries
        self.hits = 0  # rows that reused a prefix
        self.reused_tokens = 0  # prompt tokens not prefilled thanks to the store
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    def sync(self, version: object) -> None:
        """Forget every entry when the weights changed since they were stored."""
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def take(self, prompt: list[int]) -> tuple[int, Entry | None]:
        """``(reused, entry)``: the entry sharing the longest prefix with ``prompt`` (removed
        from the store) and how many of its tokens to reuse; ``(0, None)`` below ``MIN_REUSE``."""
        if not self._entries or self.max_tokens <= 0:
            return 0, None
        ids = np.asarray(prompt, dtype=np.int64)
        best, best_len = None, 0
        for key, entry in self._entries.items():
            n = entry.shared_prefix(ids)
            if n > best_len:
                best, best_len = key, n
        reused = min(best_len, len(prompt) - 1)
        if best is None or reused < MIN_REUSE:
            return 0, None
        entry = self._entries.pop(best)
        self.tokens -= len(entry.tokens)
        self.hits += 1
        self.reused_tokens += reused
        return reused, entry

    def put(self, tokens: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Store a sequence with its per-layer ``[H, T, D]`` keys and values (T = len(tokens))."""
        if len(tokens) < MIN_REUSE or len(tokens) > self.max_tokens:
            return
        self._entries[self._next_id] = Entry(np.asarray(tokens, dtype=np.int64), keys, values)
        self._next_id += 1
        self.tokens += len(tokens)
        while self.tokens > self.max_tokens:
            _, old = self._entries.popitem(last=False)
            self.tokens -= len(old.tokens)
