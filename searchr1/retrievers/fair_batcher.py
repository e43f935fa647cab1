"""Fair dynamic batching for the retrieval server: chunks of large requests, taken in turn.

``MicroBatcher`` (the HTTP client's) runs each call whole, first come first served: one
request of 20,000 queries holds the worker while a 1-query request behind it waits for all
of them. ``FairBatcher`` keeps every waiting request's unanswered queries and builds each
retriever call by giving every waiting request an equal share of ``max_items`` (all of it
when one request waits), the requests it served moved to the back of the line. A request
that arrives while a batch runs is therefore in the next batch, and that batch is short
(the large request contributes only its share), so a small request waits about one chunk
(the batch running) plus its own unloaded time, however large the other requests are.

Each worker waits ``window_s`` before building a batch that is not yet full, so concurrent
requests merge. The handler gets the batch's queries and largest ``topk``; each request gets
its own ``topk`` prefix (a ranked list cut shorter is the same ranking). ``saturation``
reports the queue for ``/health``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Handler = Callable[[list[str], int], Awaitable[list[list]]]


@dataclass(eq=False)
class _Request:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)
    since: float  # event-loop time of the submit
    results: list = field(default_factory=list, repr=False)
    handed: int = 0  # queries given to a batch so far (a prefix of ``queries``)
    answered: int = 0

    @property
    def waiting(self) -> int:
        return len(self.queries) - self.handed


Slice = tuple[_Request, int, int]  # a request's queries[start:end] in one batch


class FairBatcher:
    """``await submit(queries, topk)`` → one result list per query, served fairly."""

    def __init__(self, handler: Handler, window_s: float = 0.001, max_items: int = 256,
                 workers: int = 1) -> None:
        if max_items < 1 or workers < 1:
            raise ValueError("max_items and workers must be >= 1")
        self.handler, self.window_s = handler, window_s
        self.max_items, self.workers = max_items, workers
        self.batches = 0  # handler calls so far
        self.max_batch_s = 0.0  # the longest handler call so far
        self._line: deque[_Request] = deque()  # requests with queries not yet handed out
        self._open: set[_Request] = set()  # requests not yet answered
        self._busy = 0
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, queries: list[str], topk: int) -> list[list]:
        if not queries:
            return []
        self._ensure_started()
        loop = asyncio.get_running_loop()
        request = _Request(list(queries), topk, loop.create_future(), loop.time())
        request.results = [None] * len(queries)
        self._line.append(request)
        self._open.add(request)
        self._wake.set()
        try:
            return await request.future
        finally:
            self._open.discard(request)

    def saturation(self) -> dict:
        """The queue now: requests waiting or in a batch, queries not yet handed to a batch,
        busy workers, the age of the oldest unanswered request, the longest batch so far."""
        now = self._loop.time() if self._loop is not None else 0.0
        pending = [r for r in self._open if not r.future.done()]
        return {"requests": len(pending),
                "queued_queries": sum(r.waiting for r in self._line if not r.future.done()),
                "busy_workers": self._busy, "workers": self.workers,
                "oldest_wait_s": round(max((now - r.since for r in pending), default=0.0), 4),
                "max_batch_s": round(self.max_batch_s, 4)}

    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # asyncio objects are bound to the loop that made them
            self._loop, self._wake, self._line = loop, asyncio.Event(), deque()
            self._tasks = [loop.create_task(self._work()) for _ in range(self.workers)]

    async def _work(self) -> None:
        while True:
            while not self._line:
                self._wake.clear()
                await self._wake.wait()
            if self.window_s > 0 and sum(r.waiting for r in self._line) < self.max_items:
                await asyncio.sleep(self.window_s)  # let concurrent requests join this batch
            batch = self._take()
            if batch:
                self._busy += 1
                try:
                    await self._run(batch)
                finally:
                    self._busy -= 1

    def _take(self) -> list[Slice]:
        """An equal share of ``max_items`` for each waiting request, in line order; the room a
        small request leaves is not filled with a large one's queries (the batch that serves
        a newcomer stays short). Served requests go to the back of the line."""
        live = [r for r in self._line if not r.future.done()]  # a cancelled one is dropped
        share = max(1, self.max_items // max(1, len(live)))
        batch, room = [], self.max_items
        for request in live:
            n = min(request.waiting, share, room)
            if n <= 0:
                break
            batch.append((request, request.handed, request.handed + n))
            request.handed += n
            room -= n
        served = {request for request, _, _ in batch}
        self._line = deque([r for r in live if r not in served]
                           + [r for r in live if r in served and r.waiting > 0])
        return batch

    async def _run(self, batch: list[Slice]) -> None:
        queries = [q for request, start, end in batch for q in request.queries[start:end]]
        self.batches += 1
        started = self._loop.time()
        try:
            results = await self.handler(queries, max(r.topk for r, _, _ in batch))
            if len(results) != len(queries):
                raise RuntimeError(f"batch handler returned {len(results)} results for "
                                   f"{len(queries)} queries")
            parts, offset = [], 0
            for request, start, end in batch:  # each request's own topk prefix
                parts.append([list(r[: request.topk]) for r in results[offset:offset + end - start]])
                offset += end - start
        except Exception as err:  # every request of the batch sees the failure
            for request, _, _ in batch:
                if not request.future.done():
                    request.future.set_exception(err)
            return
        finally:
            self.max_batch_s = max(self.max_batch_s, self._loop.time() - started)
        for (request, start, end), part in zip(batch, parts):
            if request.future.done():
                continue
            request.results[start:end] = part
            request.answered += end - start
            if request.answered == len(request.queries):
                request.future.set_result(request.results)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks, self._loop, self._line = [], None, deque()
