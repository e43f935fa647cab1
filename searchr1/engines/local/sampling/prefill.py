"""The slot sampler's prefill: admission rounds cut into chunks, run eagerly or as CUDA graphs.

A round prefills, for each admitted sequence, the prompt tokens its slot does not hold yet.
``chunks`` sorts the rows longest first and cuts them into chunks of at most
``PREFILL_TOKENS`` padded tokens. With ``padded`` (``engine.prefill_graphs``) a chunk's width
and row count are rounded up to a few sizes (``width_bucket``, ``rows_bucket``), so a whole run
needs few shapes; ``PrefillGraphs`` captures one CUDA graph per (rows, width, attention length)
on its first use and replays it after that, so an admission round costs a few host-to-device
copies and one launch per chunk instead of every layer's kernels dispatched one by one.

Padding never changes a real token's keys: padded positions and padded rows write to the
cache's scratch column (``write = max_len``), which attention never reads.

A chunk whose rows all start at position 0 (fresh prompts: a cold batch, a group's first turn) is
``fresh``: its tokens attend only to each other, so attention runs causal over the chunk's own keys
(``forward_hidden(causal=True)``: no cache read, no mask, SDPA's fused causal kernels) instead of reading
the slots back through a boolean mask. Right padding keeps it exact: a real token's causal window
holds only its row's real tokens before it. ``CAUSAL_FRESH = False`` turns this off (benchmarks).

A prefill wants only keys and values: the last layer stops once it has written them
(``forward_hidden(kv_only=True)``), so a chunk costs one layer's attention and MLP less.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from searchr1.engines.local.sampling.slot_decode import attention_bucket, power_of_two
from searchr1.engines.local.sampling.slot_model import forward_hidden
from searchr1.engines.local.sampling.upload import pinned, upload

PREFILL_TOKENS = 16_384  # padded tokens per prefill chunk
CAUSAL_FRESH = True  # fresh chunks attend causally over their own keys (see the module docstring)
MIN_WIDTH = 16  # smallest padded width of a chunk


def width_bucket(width: int) -> int:
    """Padded width: 16, 32, 64, 128, then multiples of 128 (a 300-token row computes 384)."""
    return power_of_two(width, MIN_WIDTH) if width <= 128 else -(-width // 128) * 128


def rows_bucket(rows: int) -> int:
    """Padded row count: 1, 2, 4, 8, then multiples of 8."""
    return power_of_two(rows) if rows <= 8 else -(-rows // 8) * 8


def _rows_cap(width: int, budget: int) -> int:
    """Most rows of this padded width in one chunk: the largest row bucket within the budget."""
    most = max(1, budget // width)
    return most if most <= 8 else most // 8 * 8


@dataclass
class Chunk:
    """One forward of the prefill: ``[rows, width]`` ids, positions and KV columns, slots."""

    ids: np.ndarray
    pos: np.ndarray
    write: np.ndarray
    slots: np.ndarray
    length: int  # attended positions (an attention bucket)
    tokens: int  # real (not padded) tokens
    fresh: bool = False  # every row starts at position 0: causal attention over the chunk's own keys


def chunks(rows: list[tuple[int, np.ndarray, int]], max_len: int, padded: bool,
           budget: int = PREFILL_TOKENS) -> Iterator[Chunk]:
    """Chunks of ``rows`` = ``(slot, new tokens, first position)``, longest rows first; with
    ``CAUSAL_FRESH`` the fresh rows (from position 0) are cut apart from the rest, so they fill
    fresh chunks of their own."""
    if CAUSAL_FRESH:
        yield from _cut([r for r in rows if r[2] == 0], max_len, padded, budget)
        yield from _cut([r for r in rows if r[2] != 0], max_len, padded, budget)
    else:
        yield from _cut(rows, max_len, padded, budget)


def _cut(rows: list[tuple[int, np.ndarray, int]], max_len: int, padded: bool, budget: int) -> Iterator[Chunk]:
    rows = sorted(rows, key=lambda r: -len(r[1]))
    i = 0
    while i < len(rows):
        longest = len(rows[i][1])
        pad = padded and width_bucket(longest) <= budget
        width = width_bucket(longest) if pad else longest
        cap = _rows_cap(width, budget) if pad else max(1, budget // max(width, 1))
        n = min(len(rows) - i, cap)
        part, i = rows[i : i + n], i + n
        height = min(rows_bucket(n), cap) if pad else n
        ids = np.zeros((height, width), dtype=np.int64)
        pos = np.zeros((height, width), dtype=np.int64)
        write = np.full((height, width), max_len, dtype=np.int64)
        slots = np.full(height, part[0][0], dtype=np.int64)
        for r, (slot, tokens, start) in enumerate(part):
            k = len(tokens)
            ids[r, :k] = tokens
            pos[r, :k] = np.arange(start, start + k)
            pos[r, k:] = start + k - 1
            write[r, :k] = pos[r, :k]
            slots[r] = slot
        yield Chunk(ids, pos, write, slots, attention_bucket(int(pos.max()) + 1, max_len),
                    sum(len(r[1]) for r in part), CAUSAL_FRESH and all(r[2] == 0 for r in part))


def run_eager(chunk: Chunk, weights, cache, layer_fns, device) -> None:
    """Write the chunk's keys and values with one eager forward."""
    device = torch.device(device)
    ids, pos, write = upload(np.stack([chunk.ids, chunk.pos, chunk.write]), device)  # one transfer
    forward_hidden(weights, cache, ids, pos, write, upload(chunk.slots, device), chunk.length, layer_fns,
                   causal=chunk.fresh, kv_only=True)


class _Captured:
    """One captured prefill shape: its input buffers and graph."""

    def __init__(self, shape: tuple[int, int], device) -> None:
        self.inputs = torch.zeros((3, *shape), dtype=torch.int64, device=device)  # ids, pos, write
        self.slots = torch.zeros(shape[0], dtype=torch.int64, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None

    def load(self, chunk: Chunk) -> None:
        self.inputs.copy_(pinned(np.stack([chunk.ids, chunk.pos, chunk.write]), self.inputs.device), non_blocking=True)
        self.slots.copy_(pinned(chunk.slots, self.slots.device), non_blocking=True)

    def forward(self, chunk: Chunk, weights, cache, layer_fns) -> None:
        ids, pos, write = self.inputs
        forward_hidden(weights, cache, ids, pos, write, self.slots, chunk.length, layer_fns, causal=chunk.fresh,
                       kv_only=True)


class PrefillGraphs:
    """Captured prefill chunks per (rows, width, attention length, fresh), sharing the engine's pool.

    They point into the KV pool: ``clear`` them whenever the pool is freed.
    """

    def __init__(self, device, pool, stats) -> None:
        self.device, self.pool, self.stats = torch.device(device), pool, stats
        self._captured: dict[tuple[int, int, int, bool], _Captured] = {}

    def __len__(self) -> int:
        return len(self._captured)

    def clear(self, pool=None) -> None:
        self._captured.clear()
        self.pool = pool if pool is not None else self.pool

    def run(self, chunk: Chunk, weights, cache, layer_fns) -> None:
        """Write the chunk's keys and values: replay its shape's graph (capturing it first)."""
        key = (*chunk.ids.shape, chunk.length, chunk.fresh)
        entry = self._captured.get(key)
        if entry is None:
            entry = self._capture(key, chunk, weights, cache, layer_fns)
        else:
            entry.load(chunk)
        entry.graph.replay()
        self.stats.prefill_replays += 1

    def _capture(self, key, chunk: Chunk, weights, cache, layer_fns) -> _Captured:
        """Warm up on a side stream (it writes this chunk's keys: replaying writes them again,
        the same values), then capture."""
        t0 = time.perf_counter()
        entry = _Captured(key[:2], self.device)
        entry.load(chunk)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            entry.forward(chunk, weights, cache, layer_fns)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            entry.forward(chunk, weights, cache, layer_fns)
        torch.cuda.synchronize(self.device)
        entry.graph = graph
        self._captured[key] = entry
        self.stats.graphs += 1
        self.stats.capture_seconds += time.perf_counter() - t0
        return entry
