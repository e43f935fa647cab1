"""Fault-injection hooks for tests: named points where a test can kill the process.

``crash_point(name, step)`` does nothing unless ``$SEARCHR1_KILL_AT`` names that point, so
production runs pay one environment lookup. Tests use it to prove that a kill at any point
of a step resumes to the result of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal

KILL_ENV = "SEARCHR1_KILL_AT"  # SIGKILL at <point>[@<step>]


def crash_point(name: str, step: int | None = None) -> None:
    """SIGKILL this process when ``$SEARCHR1_KILL_AT`` names this point (tests only).

    ``<point>`` kills the first time the point is reached; ``<point>@<N>`` only when it is
    reached on step ``N`` (1-based: the step whose metrics row and checkpoint are numbered
    ``N``), so a test can let step 1 complete and kill step 2. A point whose caller does not
    know the step (``step=None``) matches the plain form only.
    """
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    point, _, at = spec.partition("@")
    if point == name and (not at or (step is not None and step == int(at))):
        os.kill(os.getpid(), signal.SIGKILL)
