"""A shared, persistent search cache (``retriever.cache=disk``) wrapping any retriever.

``CachedRetriever`` sits in front of a built retriever and answers repeated
``(retriever fingerprint, query, topk)`` lookups from one SQLite file (stdlib ``sqlite3`` in
WAL mode, so many readers and one writer at a time across processes). Every job of a sweep
and every later run that points at the same file (default ``outputs/search_cache.sqlite``)
shares it: with Zhihu it saves quota, with any retriever repeated ablations see the same
evidence.

Rules:

- only successful, non-empty results are stored: a failed search raises through unchanged
  and is never cached, and an empty list is left for the next call to ask again;
- the first writer wins (``INSERT OR IGNORE``), so concurrent jobs converge on one answer;
- the fingerprint hashes the retriever's name, its result-shaping config fields (not
  timeouts, concurrency or key variables) and the retriever's own ``fingerprint`` or corpus
  (ids + contents), so two corpora or two settings never share entries;
- ``search/cache_hit_rate`` is hits / looked-up queries since the last ``metrics()`` reset;
  the wrapped retriever's own ``search/*`` extras (429 rate, quota) are passed through.

The schema field ``cache`` (and ``cache_path``) is added to every retriever schema by
``with_cache_fields`` when the schemas are registered, so no retriever declares it itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import random
import sqlite3
import threading
import time
from enum import Enum
from pathlib import Path

from searchr1.retrievers.base import Document, Retriever

DEFAULT_CACHE_PATH = "outputs/search_cache.sqlite"
BUSY_TIMEOUT_MS = 60_000
# Config fields that change how a retriever runs but not what it returns.
OPERATIONAL_FIELDS = frozenset({
    "topk", "cache", "cache_path", "max_concurrency", "timeout_s", "max_retries", "backoff_s",
    "keys_env", "default_retry_after_s", "max_key_wait_s", "env_file",
})
_BASE_METRICS = frozenset({
    "search/requests", "search/success_rate", "search/error_rate", "search/empty_rate",
    "search/latency",
    "search/latency_p50", "search/latency_p95",
})


class CacheMode(str, Enum):
    """Whether search results are cached on disk."""

    none = "none"  # every query goes to the retriever
    disk = "disk"  # share results through the SQLite file at ``cache_path``


def with_cache_fields(schema: type) -> type:
    """``schema`` plus ``cache`` and ``cache_path`` fields (a dataclass subclass, same name)."""
    fields = [
        ("cache", CacheMode, dataclasses.field(default=CacheMode.none)),
        ("cache_path", str, dataclasses.field(default=DEFAULT_CACHE_PATH)),
    ]
    return dataclasses.make_dataclass(schema.__name__, fields, bases=(schema,),
                                      namespace={"__doc__": schema.__doc__})


def with_search_cache(retriever: Retriever, schema) -> Retriever:
    """Wrap ``retriever`` in a ``CachedRetriever`` when ``schema.cache`` is ``disk``."""
    mode = getattr(schema, "cache", CacheMode.none)
    if CacheMode(mode) is CacheMode.none:
        return retriever
    return CachedRetriever(retriever, schema.cache_path, retriever_fingerprint(schema, retriever))


def retriever_fingerprint(schema, retriever: Retriever) -> str:
    """A hex digest naming what this retriever returns for a query (see module docstring)."""
    config = dataclasses.asdict(schema) if dataclasses.is_dataclass(schema) else dict(schema)
    shaping = {k: v for k, v in sorted(config.items()) if k not in OPERATIONAL_FIELDS}
    digest = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode())
    own = getattr(retriever, "fingerprint", None)
    if own is not None:
        digest.update(json.dumps(own, sort_keys=True, default=str).encode())
    for passage in getattr(retriever, "passages", None) or []:
        digest.update(f"{passage.id}\x00{passage.contents}\x01".encode())
    return digest.hexdigest()


def retry_locked(statement, timeout_s: float = BUSY_TIMEOUT_MS / 1000, sleep=time.sleep):
    """Run ``statement()`` again while SQLite answers "database is locked", for up to
    ``timeout_s`` (short jittered pauses); any other error, or the last "locked", is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return statement()
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            sleep(random.uniform(0.01, 0.05))


class SearchCache:
    """The SQLite table behind the cache; one connection per process, used from threads."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # a forked child opens its own
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000,
                                   check_same_thread=False, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            # a new file's switch to WAL takes an exclusive lock: two processes opening it at
            # once can deadlock on it, and SQLite then answers one of them "locked" at once,
            # without waiting (the busy timeout does not apply); every statement here retries
            retry_locked(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute("PRAGMA synchronous=NORMAL")
            retry_locked(lambda: conn.execute(
                "CREATE TABLE IF NOT EXISTS search_cache (fingerprint TEXT NOT NULL, "
                "query TEXT NOT NULL, topk INTEGER NOT NULL, documents TEXT NOT NULL, "
                "PRIMARY KEY (fingerprint, query, topk)) WITHOUT ROWID"
            ))
            self._conn, self._pid = conn, os.getpid()
        return self._conn

    def get_many(self, fingerprint: str, queries: list[str], topk: int) -> dict[str, list[Document]]:
        """Cached documents of those ``queries`` that have an entry."""
        if not queries:
            return {}
        marks = ",".join("?" * len(queries))
        sql = (f"SELECT query, documents FROM search_cache WHERE fingerprint = ? AND topk = ? "
               f"AND query IN ({marks})")
        with self._lock:
            conn = self._connection()
            rows = retry_locked(lambda: conn.execute(sql, (fingerprint, topk, *queries)).fetchall())
        return {q: [Document(**d) for d in json.loads(docs)] for q, docs in rows}

    def put_many(self, fingerprint: str, topk: int, results: dict[str, list[Document]]) -> None:
        """Store non-empty results; an existing entry is kept (first writer wins)."""
        rows = [(fingerprint, q, topk, json.dumps([dataclasses.asdict(d) for d in docs]))
                for q, docs in results.items() if docs]
        if not rows:
            return

        def write(conn: sqlite3.Connection) -> None:  # one transaction, retried whole
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany("INSERT OR IGNORE INTO search_cache VALUES (?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

        with self._lock:
            conn = self._connection()
            retry_locked(lambda: write(conn))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


class CachedRetriever(Retriever):
    """A retriever answering repeated queries from a ``SearchCache``; misses go to ``inner``."""

    def __init__(self, inner: Retriever, path: str | os.PathLike, fingerprint: str) -> None:
        super().__init__()
        self.inner = inner
        self.cache = SearchCache(path)
        self.cache_fingerprint = fingerprint
        self.promises_results = inner.promises_results
        self._lookups = 0
        self._hits = 0

    @property
    def quota_exhausted(self) -> bool:
        return self.inner.quota_exhausted

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)  # e.g. ``passages`` of a BM25 retriever

    def __repr__(self) -> str:
        return f"CachedRetriever({self.inner!r}, path={str(self.cache.path)!r})"

    async def _search(self, queries: list[str], topk: int) -> list[list[Document]]:
        unique = list(dict.fromkeys(queries))
        found = await asyncio.to_thread(self.cache.get_many, self.cache_fingerprint, unique, topk)
        self._lookups += len(queries)
        self._hits += sum(q in found for q in queries)
        misses = [q for q in unique if q not in found]
        if misses:
            fresh = dict(zip(misses, await self.inner.search(misses, topk), strict=True))
            await asyncio.to_thread(self.cache.put_many, self.cache_fingerprint, topk, fresh)
            found.update(fresh)
        return [list(found[q]) for q in queries]

    def _extra_metrics(self) -> dict[str, float]:
        upstream = self.inner.metrics(reset=False)
        out = {k: v for k, v in upstream.items() if k not in _BASE_METRICS}
        out["search/cache_hit_rate"] = self._hits / self._lookups if self._lookups else 0.0
        out["search/upstream_requests"] = upstream.get("search/requests", 0.0)
        return out

    def _reset_extra(self) -> None:
        self.inner.metrics(reset=True)
        self._lookups = self._hits = 0

    async def aclose(self) -> None:
        await self.inner.aclose()
        self.cache.close()
