"""Schema of ``logger``: which trackers receive metrics (``wandb:`` / ``swanlab:`` beside their code)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoggerConfig:
    """Which trackers receive metrics; ``metrics.jsonl`` is always written.

    Select with ``logger=wandb``, ``logger=[wandb,swanlab]`` or ``logger=none``.
    """

    console: bool = True  # final summary on stdout (the per-step bar is always shown)
    wandb: bool = False
    swanlab: bool = False
