"""Where a measurement was made: the card, the commit and the date, for benchmark result files.

The GPU machine gets a copy of the working tree without its git history, so the commit comes
from ``SEARCHR1_COMMIT`` when set (the command that sends the run sets it), else from git.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def commit() -> str:
    """The commit the code ran at (``SEARCHR1_COMMIT``, else ``git rev-parse``), or "unknown"."""
    if os.environ.get("SEARCHR1_COMMIT"):
        return os.environ["SEARCHR1_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def provenance() -> dict[str, str]:
    """``card`` (the CUDA device's name, or "cpu"), ``commit`` and ``date``."""
    import torch  # lazy on purpose: composing a config needs none of it

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"card": card, "commit": commit(), "date": time.strftime("%Y-%m-%d")}
