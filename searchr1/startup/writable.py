"""Whether a run's folder can be made and written, told in one line before Hydra or any work.

``writable_problem`` names what is in the way: a file where a folder should be, a symbolic
link whose target does not exist, or a folder the user may not write. ``main.py`` calls
``refuse_unwritable_output_dir`` on the command line before Hydra creates the folder (which
would fail in a traceback); ``checks.py`` asks the same of every folder the run writes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _file_above(folder: Path) -> Path | None:
    """The nearest existing path at or above ``folder`` when it is a file, else None."""
    for path in (folder, *folder.parents):
        if path.exists():
            return None if path.is_dir() else path
    return None


def _dangling_link(folder: Path) -> Path | None:
    """The nearest path at or above ``folder`` that is a symbolic link to nothing, else None."""
    for path in (folder, *folder.parents):
        if path.is_symlink() and not path.exists():
            return path
        if path.exists():
            return None
    return None


def writable_problem(label: str, folder: str | os.PathLike) -> str | None:
    """Why files cannot be created in ``folder`` (created if missing), or None."""
    link = _dangling_link(Path(folder).expanduser().absolute())
    if link is not None:
        return (f"{label} {folder} cannot be created: {link} is a symbolic link to "
                f"{os.readlink(link)}, which does not exist (create that folder, or remove "
                f"the link)")
    blocker = _file_above(Path(folder).expanduser().absolute())
    if blocker is not None:
        return f"{label} {folder} cannot be created: {blocker} is a file, not a folder"
    try:
        Path(folder).expanduser().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=Path(folder).expanduser()):
            pass
    except OSError as err:
        return f"{label} {folder} is not writable ({err.strerror or type(err).__name__})"
    return None


def refuse_unwritable_output_dir(argv: list[str]) -> None:
    """Exit (code 2) when ``argv``'s ``hydra.run.dir`` (``hydra.sweep.dir`` with ``-m``)
    cannot be written: Hydra creates it before our task runs, and would fail in a traceback."""
    from searchr1.startup.errors import exit_with

    key = "hydra.sweep.dir" if any(a in ("-m", "--multirun") for a in argv) else "hydra.run.dir"
    for arg in argv:
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+") == key and value and "${" not in value:
            problem = writable_problem(key, value)
            if problem:
                exit_with(f"searchr1: cannot start this run: {problem}; "
                          f"pick a {key} in a folder you can write to.")
