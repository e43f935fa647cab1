"""The retriever contract: async batched search returning ranked documents.

Every retriever (bm25, dense, http, zhihu) subclasses ``Retriever`` and implements
``_search``; the base class counts requests, errors and latency and reports them as the
``search/*`` metrics the lab logs.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from searchr1.utils.registry import Registry

RETRIEVERS: Registry = Registry("retriever")


@dataclass(frozen=True)
class Document:
    """One retrieved passage. ``title``/``text`` are split from the corpus ``contents``."""

    id: str
    title: str
    text: str
    score: float = 0.0
    url: str | None = None
    source: str | None = None
    contents: str | None = None  # the corpus row verbatim ('"Title"\ntext'), where the retriever has it
    # what a search service reports beside the text, unformatted (zhihu: ContentType and
    # AuthorName; None when absent); observation templates compose them (`source` there)
    kind: str | None = None
    author: str | None = None


class SearchError(RuntimeError):
    """A search failed after the retriever's own retries; the rollout records it as a tool error."""


class Retriever(ABC):
    """Async search: ``await search(queries, topk)`` → one ranked list per query."""

    #: whether every non-empty query should get documents; then an empty list is a failure
    #: (counted in ``search/success_rate`` and by the tool-error policy). BM25 drops
    #: non-matching passages, so an empty result there is the query's fault: it sets False.
    promises_results: bool = True

    @property
    def quota_exhausted(self) -> bool:
        """Whether no search can succeed any more for want of quota (keys all retired); a
        retriever without keys never exhausts one. The trainer stops the run on it."""
        return False

    def __init__(self) -> None:
        self._requests = 0
        self._errors = 0
        self._empty = 0
        self._latencies: list[float] = []

    async def search(self, queries: list[str], topk: int) -> list[list[Document]]:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        start = time.perf_counter()
        self._requests += len(queries)
        try:
            result = await self._search(queries, topk)
        except Exception:
            self._errors += len(queries)
            raise
        finally:
            self._latencies.append(time.perf_counter() - start)
        if self.promises_results:
            self._empty += sum(1 for q, docs in zip(queries, result) if q.strip() and not docs)
        return result

    @abstractmethod
    async def _search(self, queries: list[str], topk: int) -> list[list[Document]]:
        """Return ``topk`` documents per query, best first."""

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """``search/*`` counters since the last reset (rates are per query)."""
        n = self._requests
        lat = np.asarray(self._latencies, dtype=float)
        out = {
            "search/requests": float(n),
            "search/success_rate": (n - self._errors - self._empty) / n if n else 0.0,
            "search/error_rate": self._errors / n if n else 0.0,
            "search/empty_rate": self._empty / n if n else 0.0,
            "search/latency": float(lat.mean()) if lat.size else 0.0,
            "search/latency_p50": float(np.percentile(lat, 50)) if lat.size else 0.0,
            "search/latency_p95": float(np.percentile(lat, 95)) if lat.size else 0.0,
        }
        out.update(self._extra_metrics())
        if reset:
            self._requests = self._errors = self._empty = 0
            self._latencies = []
            self._reset_extra()
        return out

    def _extra_metrics(self) -> dict[str, float]:
        """Retriever-specific counters (e.g. ``search/429_rate``); empty by default."""
        return {}

    def _reset_extra(self) -> None:
        """Reset the counters behind ``_extra_metrics``; a no-op by default."""

    async def aclose(self) -> None:
        """Release connections or servers; a no-op for in-memory retrievers."""


class LocalRetriever(Retriever):
    """An in-process retriever whose batched search blocks (bm25, e5): the search runs in a
    worker thread, at most ``max_concurrency`` calls at a time, and blank queries get no
    documents without reaching the index. Subclasses implement ``_search_live``."""

    def __init__(self, max_concurrency: int) -> None:
        super().__init__()
        self._semaphore = asyncio.Semaphore(max_concurrency)

    async def _search(self, queries: list[str], topk: int) -> list[list[Document]]:
        async with self._semaphore:
            return await asyncio.to_thread(self.search_sync, queries, topk)

    def search_sync(self, queries: list[str], topk: int) -> list[list[Document]]:
        """Blocking batched retrieval (no metrics); ``search`` runs it in a thread."""
        results: list[list[Document]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q and q.strip()]
        if live:
            for i, docs in zip(live, self._search_live([queries[i] for i in live], topk), strict=True):
                results[i] = docs
        return results

    @abstractmethod
    def _search_live(self, queries: list[str], topk: int) -> list[list[Document]]:
        """Ranked documents for each of ``queries`` (none blank), in one batched call."""
