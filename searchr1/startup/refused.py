"""A refused start leaves nothing behind: the run dir Hydra made for it is removed.

Hydra creates the run directory (``.hydra/`` and ``main.log``) before the start-up checks
run, so every start refused with exit 2 (a bad value, missing keys, a hub model without
network, a model that does not fit) left an empty run behind under ``outputs/runs/``, which
``compare`` and a later resume then had to step around. ``removed_if_refused`` removes the
run dir when a ``StartupError`` ends the job and the dir holds nothing but what Hydra and
the run lock put there. A dir holding anything a run writes (metrics, a summary, checkpoints,
eval files), or locked by a live process, is left exactly as it was; so is its parent, unless
it is a date folder of Hydra's default layout that this removal left empty.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from searchr1.startup.errors import StartupError
from searchr1.startup.rundir import LOCK_FILE, is_locked

START_FILES = {".hydra", "main.log", LOCK_FILE}  # what exists before a run has done anything
DATE_FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def remove_if_empty(run_dir: Path) -> bool:
    """Remove ``run_dir`` when it holds only start files and no live process holds it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not {p.name for p in run_dir.iterdir()} <= START_FILES:
        return False
    if is_locked(run_dir):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = run_dir.parent
    if DATE_FOLDER.match(parent.name) and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
    return True


@contextmanager
def removed_if_refused(run_dir: Path) -> Iterator[None]:
    """Run the job; when start-up refuses it (``StartupError``), remove its empty run dir."""
    try:
        yield
    except StartupError:
        remove_if_empty(run_dir)
        raise
