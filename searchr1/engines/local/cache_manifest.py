"""Integrity of the de-quantised model cache: a manifest of file sizes and sha256 digests.

``write_manifest`` records every file of a freshly converted cache folder; ``manifest_problem``
says why a cache folder cannot be trusted (or None). Sizes are always checked; a file is
re-hashed only when it is newer than the manifest, so a normal load costs a few ``stat`` calls
while a truncated, rewritten or partly copied weight file is caught. A folder without a
manifest (written by an older version) is not trusted either: the caller rebuilds it once.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "searchr1_manifest.json"
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str | os.PathLike) -> Path:
    """Record size and sha256 of every file under ``folder`` (written last, atomically)."""
    root = Path(folder)
    files = {
        str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST
    }
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"files": files}, indent=1), encoding="utf-8")
    os.replace(tmp, root / MANIFEST)
    return root / MANIFEST


def manifest_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` does not match its manifest, or None when it does."""
    root = Path(folder)
    path = root / MANIFEST
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        marker = path.stat().st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError):
        return "no readable manifest"
    if not files:
        return "the manifest lists no files"
    for name, want in files.items():
        p = root / name
        try:
            stat = p.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != want["size"]:
            return f"{name} has {stat.st_size} bytes, expected {want['size']}"
        if stat.st_mtime_ns > marker and file_sha256(p) != want["sha256"]:
            return f"{name} changed since it was written (sha256 differs)"
    return None
