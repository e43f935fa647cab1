"""Doc stores: index row → ``Passage``, in memory or read lazily from a corpus JSONL.

Row ``i`` of a dense index is line ``i`` of the corpus JSONL (blank lines skipped), as in
Search-R1, whose wiki-18 e5 index pairs with ``wiki-18.jsonl``. Loading 21M passages as
Python objects would take tens of GB, so ``JsonlDocStore`` keeps only the byte offset of
each row (an int64 array, 8 bytes per passage, cached in a ``.npy`` file beside the index or
the corpus) and reads rows with ``os.pread`` (thread-safe, no shared file position).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from searchr1.data.types import Passage


class MemoryDocStore:
    """Passages held in a list (the embedded world, tests, small corpora)."""

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = list(passages)

    def __len__(self) -> int:
        return len(self.passages)

    def get(self, rows: list[int]) -> list[Passage]:
        return [self.passages[i] for i in rows]


def scan_offsets(path: str | Path) -> np.ndarray:
    """Byte offset of every non-blank line of a JSONL file."""
    offsets = []
    position = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                offsets.append(position)
            position += len(line)
    return np.asarray(offsets, dtype=np.int64)


def load_offsets(corpus: Path, cache: Path | None) -> np.ndarray:
    """Offsets from ``cache`` when it is newer than the corpus, else scanned (and cached)."""
    if cache is not None and cache.is_file() and cache.stat().st_mtime >= corpus.stat().st_mtime:
        return np.load(cache)
    offsets = scan_offsets(corpus)
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.save(cache, offsets)
        except OSError:  # a read-only location: scan again next time
            pass
    return offsets


class JsonlDocStore:
    """Rows read on demand from a ``{"id", "contents"}`` JSONL file by byte offset."""

    def __init__(self, corpus_path: str | Path, offsets_path: str | Path | None = None) -> None:
        self.path = Path(corpus_path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no corpus JSONL at {self.path}")
        cache = Path(offsets_path) if offsets_path else None
        self.offsets = load_offsets(self.path, cache)
        self._fd = os.open(self.path, os.O_RDONLY)
        self._size = self.path.stat().st_size

    def __len__(self) -> int:
        return len(self.offsets)

    def get(self, rows: list[int]) -> list[Passage]:
        return [self._read(i) for i in rows]

    def _read(self, row: int) -> Passage:
        start = int(self.offsets[row])
        end = int(self.offsets[row + 1]) if row + 1 < len(self.offsets) else self._size
        record = json.loads(os.pread(self._fd, end - start, start))
        return Passage(id=str(record["id"]), contents=record["contents"])

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


def iter_corpus(path: str | Path):
    """``(row, Passage)`` for every non-blank line of a corpus JSONL, in order."""
    with open(path, encoding="utf-8") as f:
        row = 0
        for line in f:
            if line.strip():
                record = json.loads(line)
                yield row, Passage(id=str(record["id"]), contents=record["contents"])
                row += 1
