"""A request queue that packs concurrent requests into shared batches on one worker thread.

Callers ``submit`` a job and get a ``concurrent.futures.Future``. One worker thread takes
the first waiting job, keeps collecting more for up to ``window_s`` (or until the batch
holds ``max_size`` units of work), runs the whole batch with one call of ``run`` and
resolves every job's future. Jobs that arrive while a batch runs wait for the next one.

Why a thread rather than an asyncio task: the model runs off the event loop either way,
and a thread also serves the synchronous ``sample(...).result()`` API and callers on
several event loops (each ``asyncio.run``, each pytest-asyncio test) with one queue.
``await asyncio.wrap_future(fut)`` keeps the caller's loop free while the batch runs.
The worker exits after ``idle_s`` without work and restarts on the next ``submit``, so
clients that are dropped (one per training step, say) leave no threads behind.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P")
R = TypeVar("R")

_CLOSE = object()  # sentinel put on the queue by ``close``


@dataclass
class Job(Generic[P, R]):
    """One submitted request: its payload, its cost in batch units, and its future."""

    payload: P
    size: int
    future: Future = field(default_factory=Future)


class Batcher(Generic[P, R]):
    """Packs jobs into batches of at most ``max_size`` units and runs them on a worker thread.

    ``run(payloads)`` must return one result per payload, in order; if it raises, every
    job of that batch fails with the exception and the worker carries on. A single job
    larger than ``max_size`` runs alone (``run`` is expected to split it further).
    """

    def __init__(
        self,
        run: Callable[[list[P]], list[R]],
        max_size: int,
        window_s: float,
        name: str,
        idle_s: float = 5.0,
    ) -> None:
        if max_size < 1:
            raise ValueError(f"max batch size must be >= 1, got {max_size}")
        self._run = run
        self._max_size = max_size
        self._window_s = max(0.0, window_s)
        self._name = name
        self._idle_s = idle_s
        self._queue: queue.Queue = queue.Queue()
        self._held: deque[Job] = deque()  # a job that did not fit the previous batch
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards worker start/exit against a racing submit
        self._closed = False

    def submit(self, payload: P, size: int) -> Future:
        """Queue one job of ``size`` units; the returned future resolves to its result."""
        job: Job[P, R] = Job(payload=payload, size=size)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._queue.put(job)
        return job.future

    def close(self, timeout: float | None = None) -> None:
        """Stop the worker after the jobs already queued; idempotent."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_CLOSE)
        if thread is not None:
            thread.join(timeout)

    def _work(self) -> None:
        """Worker loop: collect a batch, run it, resolve its futures; until closed or idle."""
        while True:
            first = self._first_job()
            if first is None or first is _CLOSE:
                return
            batch, closing = self._collect(first)
            self._execute(batch)
            if closing:
                return

    def _first_job(self):
        """The job that opens the next batch; None after ``idle_s`` without one (exit)."""
        if self._held:
            return self._held.popleft()
        while True:
            try:
                return self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return None

    def _collect(self, first: Job) -> tuple[list[Job], bool]:
        """Gather jobs after ``first`` until the window or the size limit ends the batch."""
        batch, size = [first], first.size
        deadline = time.monotonic() + self._window_s
        while size < self._max_size:
            job = self._next_before(deadline)
            if job is None:
                break
            if job is _CLOSE:
                return batch, True
            if size + job.size > self._max_size:
                self._held.append(job)
                break
            batch.append(job)
            size += job.size
        return batch, False

    def _next_before(self, deadline: float):
        """The next queued job, waiting at most until ``deadline``; None when none came."""
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._queue.get_nowait()
            return self._queue.get(timeout=remaining)
        except queue.Empty:
            return None

    def _execute(self, batch: list[Job]) -> None:
        """Run the non-cancelled jobs of ``batch`` and deliver results or the exception."""
        live = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = self._run([job.payload for job in live])
        except BaseException as error:  # noqa: BLE001 - delivered to every waiting caller
            for job in live:
                job.future.set_exception(error)
            return
        for job, result in zip(live, results, strict=True):
            job.future.set_result(result)
