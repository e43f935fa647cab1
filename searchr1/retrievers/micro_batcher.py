"""Dynamic batching of concurrent calls into one, and a small LRU cache of search results.

``MicroBatcher`` serves the HTTP client (concurrent ``search`` calls → one POST); the
retrieval server uses ``FairBatcher``, which also splits large requests. Each of ``workers``
worker tasks takes the first waiting call, then everything else that arrives within
``window_s`` (or is already queued), up to ``max_items`` items, and runs ``handler`` once on
the lot. Under load the queue fills while a worker is busy, so batches grow by themselves;
when idle a call waits at most ``window_s``. Items are ``(query, topk)`` pairs; the handler
gets the queries and the largest ``topk`` of the batch, and each caller gets its own
``topk`` prefix of its results (a ranked list cut shorter is the same ranking).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Handler = Callable[[list[str], int], Awaitable[list[list]]]


@dataclass
class _Call:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """``await submit(queries, topk)`` → one result list per query, via batched ``handler``."""

    def __init__(self, handler: Handler, window_s: float = 0.002, max_items: int = 256,
                 workers: int = 1) -> None:
        if max_items < 1 or workers < 1:
            raise ValueError("max_items and workers must be >= 1")
        self.handler = handler
        self.window_s = window_s
        self.max_items = max_items
        self.workers = workers
        self.batches = 0  # handler calls so far (tests and benchmarks read it)
        self._queue: asyncio.Queue[_Call] | None = None
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, queries: list[str], topk: int) -> list[list]:
        if not queries:
            return []
        self._ensure_started()
        call = _Call(list(queries), topk, asyncio.get_running_loop().create_future())
        await self._queue.put(call)
        return await call.future

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # asyncio objects are bound to the loop that made them
            self._loop, self._queue = loop, asyncio.Queue()
            self._tasks = [loop.create_task(self._work()) for _ in range(self.workers)]

    async def _work(self) -> None:
        while True:
            batch = await self._collect()
            await self._run(batch)

    async def _collect(self) -> list[_Call]:
        """The first waiting call plus whatever arrives within the window, up to max_items."""
        batch = [await self._queue.get()]
        size = len(batch[0].queries)
        deadline = asyncio.get_running_loop().time() + self.window_s
        while size < self.max_items:
            try:
                call = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    call = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            batch.append(call)
            size += len(call.queries)
        return batch

    async def _run(self, batch: list[_Call]) -> None:
        queries = [q for call in batch for q in call.queries]
        self.batches += 1
        try:
            results = await self.handler(queries, max(call.topk for call in batch))
            if len(results) != len(queries):
                raise RuntimeError(f"batch handler returned {len(results)} results for "
                                   f"{len(queries)} queries")
        except Exception as err:  # every caller of the batch sees the failure
            for call in batch:
                if not call.future.done():
                    call.future.set_exception(err)
            return
        start = 0
        for call in batch:
            part = [list(r[: call.topk]) for r in results[start : start + len(call.queries)]]
            start += len(call.queries)
            if not call.future.done():
                call.future.set_result(part)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks, self._loop, self._queue = [], None, None


class LRUCache:
    """At most ``size`` entries; a hit moves an entry to the fresh end (size 0 disables)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key):
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def put(self, key, value) -> None:
        if self.size <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
