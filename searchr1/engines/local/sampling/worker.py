"""The thread that owns a sampling engine: callers queue work, one worker does all device work.

Both GPU engines (the slot sampler, ``slot_engine.py``, and vLLM, ``vllm_engine.py``) are driven
this way: callers from any thread (the rollout's event loop) queue sequences and get futures; the
worker waits for work, asks the engine what to start now (``_take``, under the lock), serves it
(``_serve``: device work, outside the lock), and releases the engine's memory when asked and idle
(``_sleep``). A failure inside ``_serve`` fails the requests it touched (``_fail_all``) and the
worker keeps serving.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque


class EngineWorker:
    """The queue, the lock and the loop; subclasses define what a turn of the loop does."""

    def _start_worker(self, name: str) -> None:
        self.asleep = self._sleep_wanted = self._closed = False
        self._queue: deque = deque()
        self._live: dict = {}  # what the engine is working on (the loop runs while it is not empty)
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def _enqueue(self, items) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError(f"{self._thread.name} is closed")
            self._queue.extend(items)
            self._cv.notify()

    def request_sleep(self) -> None:
        """Release the engine's memory once it is idle; the next request restores it."""
        with self._cv:
            self._sleep_wanted = True
            self._cv.notify()

    def close(self, timeout: float = 30) -> None:
        """Stop the worker once the work in hand is done."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=timeout)

    def _work(self) -> None:
        with self._worker_context():
            while True:
                with self._cv:
                    while not (self._queue or self._live or self._closed or self._sleep_wanted):
                        self._cv.wait()
                    if self._closed and not self._live:
                        return
                    if self._sleep_wanted and not self._queue and not self._live:
                        self._sleep_wanted = False
                        self._sleep()
                        continue
                    taken = self._take()
                try:
                    self._serve(taken)
                except BaseException as error:  # noqa: BLE001 - fail the requests, keep serving
                    self._fail_all(error, taken)

    # ----- what a subclass defines ----------------------------------------------------------
    def _worker_context(self):
        """A context the whole loop runs in (``torch.inference_mode`` for the slot sampler)."""
        return contextlib.nullcontext()

    def _take(self) -> list:
        """Under the lock: pop the queued work to start now."""
        raise NotImplementedError

    def _serve(self, taken: list) -> None:
        """Outside the lock: start ``taken`` and advance what is live by one round."""
        raise NotImplementedError

    def _sleep(self) -> None:
        """Release the engine's memory (the worker is idle)."""
        raise NotImplementedError

    def _fail_all(self, error: BaseException, taken: list) -> None:
        """Fail every request in flight and the ``taken`` ones."""
        raise NotImplementedError
