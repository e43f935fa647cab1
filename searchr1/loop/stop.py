"""Stop signals: SIGTERM / SIGINT end the run within seconds, at the next boundary, cleanly.

SLURM and Kubernetes send SIGTERM some seconds before SIGKILL (SLURM's ``KillWait``, 30 s by
default; Kubernetes' ``terminationGracePeriodSeconds``). While ``StopSignals`` is active the
first SIGTERM or SIGINT records the request and cuts short the phase that can take minutes:

- a rollout or an eval (run through ``cut_short``) is cancelled at its next await (the next
  turn's sample or search, the next question) and raises ``Interrupted``; nothing of it is
  kept (a partial eval writes no files), and the trainer saves the last completed step if
  its checkpoint is not on disk yet;
- an update or a checkpoint write in progress is finished (seconds), and the step saved.

Either way the trainer raises ``Stopped``, which ``main.py`` turns into ``summary.json``'s
``stopped_reason``, the resume command on stderr and exit code ``EXIT_STOPPED``. Under data
parallelism every rank decides at the same points (``dp.any``), so all ranks stop at one
boundary and write one checkpoint. A second signal restores the default action and re-sends
itself (the run dies at once; the previous checkpoint is intact). Outside the main thread
nothing is installed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Mapping
from typing import TypeVar

log = logging.getLogger(__name__)

EXIT_STOPPED = 4  # main.py's exit code when a stop signal ended the run after a checkpoint
SIGNALS = (signal.SIGTERM, signal.SIGINT)
T = TypeVar("T")


class Stopped(Exception):
    """A stop signal ended the run after ``step`` (already checkpointed)."""

    exit_code = EXIT_STOPPED

    def __init__(self, reason: str, step: int, summary: Mapping[str, float] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.step, self.summary = reason, step, dict(summary or {})


class Interrupted(Exception):
    """A stop signal cut a rollout or an eval short (on this rank or, agreed, on another)."""


class StopSignals:
    """Context manager: records the first SIGTERM/SIGINT in ``requested`` (its name) and
    cancels the phases running under ``cut_short``."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old: dict[int, object] = {}
        self._running: dict[asyncio.Task, asyncio.AbstractEventLoop] = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:  # asked twice: stop waiting
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = name
        for task, loop in list(self._running.items()):
            if not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
        log.warning("%s received: stopping at the next boundary (a rollout or an eval is cut "
                    "short, an update or a checkpoint write is finished); the last completed "
                    "step's checkpoint stands (send it again to stop at once)", name)

    async def cut_short(self, work: Awaitable[T], dp=None) -> T:
        """``await work``, cancelled by a stop signal; then every rank of ``dp`` agrees.

        Raises ``Interrupted`` on every rank when a signal came before ``work`` finished on
        any rank (or before it started); otherwise returns its result. ``dp`` (a
        ``DataParallel``; None for one process) is asked once, after ``work``: the rollout
        and the eval run no collective of their own, so no rank waits on one that stopped.
        """
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(work)
        self._running[task] = loop
        if self.requested is not None:
            task.cancel()
        try:
            result = await task
        except asyncio.CancelledError:
            if self.requested is None or asyncio.current_task().cancelling():
                raise  # cancelled from outside (not by a signal): not ours to turn into a stop
            result = None
        finally:
            self._running.pop(task, None)
        stop = self.requested is not None
        if dp.any(stop) if dp is not None else stop:
            raise Interrupted(self.requested or "a stop signal on another rank")
        return result

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}
