"""Metric trackers, one module per backend; importing this package registers them all.

``jsonl`` and ``console`` have no dependencies; ``wandb`` and ``swanlab`` import their
SDK only when a run starts. ``searchr1.trackers.session`` is the entry point callers use.
"""

from searchr1.trackers import console, jsonl, swanlab, wandb  # noqa: F401  (registration)
from searchr1.trackers.base import TRACKERS, MultiTracker, RunInfo, Tracker

__all__ = ["TRACKERS", "MultiTracker", "RunInfo", "Tracker"]
