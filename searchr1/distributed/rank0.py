"""What only rank 0 does: hold the run lock, write ``metrics.jsonl``, trackers and reports.

The other ranks get stand-ins with the same surface, so the loop logs unconditionally and
one process writes each file.
"""

from __future__ import annotations

import contextlib


class NullTracker:
    """A tracker that keeps nothing (ranks other than 0)."""

    def log(self, metrics, step) -> None:
        pass

    def summary(self, metrics) -> None:
        pass

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        pass


def rank0_only(dp, context):
    """``context`` on rank 0, a no-op context elsewhere."""
    return context if dp.is_rank0 else contextlib.nullcontext()


@contextlib.contextmanager
def rank0_trackers(dp, cfg, run_dir):
    """The configured trackers on rank 0 (``trackers/session.py``), ``NullTracker`` elsewhere."""
    if not dp.is_rank0:
        yield NullTracker()
        return
    from searchr1.trackers.session import open_trackers

    with open_trackers(cfg, run_dir) as tracker:
        yield tracker
