"""Stop signals: SIGTERM / SIGINT finish the current step, checkpoint it and end the run cleanly.

SLURM and Kubernetes send SIGTERM some seconds before SIGKILL (SLURM's ``KillWait``, 30 s by
default; Kubernetes' ``terminationGracePeriodSeconds``). While ``StopSignals`` is active the
first SIGTERM or SIGINT only records the request; the trainer finishes the step in flight,
saves a checkpoint and raises ``Stopped``, which ``main.py`` turns into ``summary.json``'s
``stopped_reason``, the resume command on stderr and exit code ``EXIT_STOPPED``. A second
signal while the step finishes restores the default action and re-sends itself (the run dies
at once; the previous checkpoint is intact). Outside the main thread nothing is installed.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping

log = logging.getLogger(__name__)

EXIT_STOPPED = 4  # main.py's exit code when a stop signal ended the run after a checkpoint
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """A stop signal ended the run after ``step`` (already checkpointed)."""

    exit_code = EXIT_STOPPED

    def __init__(self, reason: str, step: int, summary: Mapping[str, float] | None = None) -> None:
        super().__init__(reason)
        self.reason, self.step, self.summary = reason, step, dict(summary or {})


class StopSignals:
    """Context manager: records the first SIGTERM/SIGINT in ``requested`` (its name)."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:  # asked twice: stop waiting for the step
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = name
        log.warning("%s received: finishing the current step, then checkpointing and stopping "
                    "(send it again to stop at once, losing the step)", name)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}
