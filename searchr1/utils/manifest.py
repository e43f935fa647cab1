"""Manifests: the size and sha256 of every file a checkpoint is made of, to verify it later.

A manifest is a JSON file ``{"files": {<path relative to base>: {"size": n, "sha256": h}}}``
written after everything it lists, so a checkpoint whose files were truncated, overwritten
with garbage or deleted afterwards is told apart from a complete one before anything loads
it. Paths are relative to a base folder (the run dir) so a copied or moved run dir verifies.
Verifying hashes every byte once per process (cached by path, size and mtime): a resume
reads the checkpoint anyway, so this costs at most one more read of it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

MANIFEST_FILE = "manifest.json"
_CHUNK = 1 << 20
_hashed: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) → sha256


def sha256_file(path: Path) -> str:
    """The sha256 of ``path``'s bytes (cached per process while size and mtime are unchanged)."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hashed:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _hashed[key] = h.hexdigest()
    return _hashed[key]


def files_under(paths: Iterable[Path]) -> list[Path]:
    """The plain files of ``paths`` (files themselves, folders walked), sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    return out


def write_manifest(target: Path, entries: dict[str, Path], about: dict | None = None) -> None:
    """Write ``target`` recording each ``name → file`` (size, sha256), flushed to disk.

    ``name`` is the file's path relative to the base it is verified against; the file may lie
    elsewhere while the manifest is written (a folder renamed into place afterwards).
    ``about`` (what the files are, e.g. a checkpoint's folder and step) is kept beside them.
    """
    record = {name: {"size": os.path.getsize(f), "sha256": sha256_file(f)}
              for name, f in sorted(entries.items())}
    with open(target, "w", encoding="utf-8") as out:
        json.dump({**(about or {}), "files": record}, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())


def read_manifest(target: Path) -> dict | None:
    """The manifest's JSON object, or None when it is missing or unreadable."""
    try:
        record = json.loads(Path(target).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def manifest_problem(target: Path, base: Path) -> str | None:
    """Why the files ``target`` lists are not what it recorded (None when all match)."""
    try:
        entries = json.loads(Path(target).read_text(encoding="utf-8"))["files"]
        items = [(name, int(e["size"]), str(e["sha256"])) for name, e in entries.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{Path(target).name} is missing or unreadable"
    for name, size, digest in items:
        path = Path(base) / name
        if not path.is_file():
            return f"{name} is missing"
        got = path.stat().st_size
        if got != size:
            return f"{name} has {got} bytes, {size} were written"
        if sha256_file(path) != digest:
            return f"{name} does not match the sha256 recorded when it was written"
    return None
