"""Client of a Search-R1 retrieval server (``retriever=http``).

``POST {url}`` with ``{"queries": [...], "topk": k, "return_scores": true}``; the answer is
``{"result": [[item, …] per query]}`` where an item is ``{"document": {...}, "score": s}``
(the official dense/BM25 servers), ``{"document": {...}}`` (the official web-search servers,
no score) or a bare document; a document has ``contents`` (``'"Title"\\ntext'``) or
``title`` / ``text``, and an ``id`` when the corpus has one. We always send
``return_scores: true`` because the official server crashes without it.

Concurrent ``search`` calls within ``batch_window_ms`` are merged into one POST of up to
``max_batch_queries`` queries (``MicroBatcher``), with at most ``max_concurrency`` POSTs in
flight. Timeouts, transport errors, HTTP 5xx and 429 are retried ``max_retries`` times with
exponential backoff (``backoff_s`` doubling, capped at ``max_backoff_s``; a 429's
``Retry-After`` seconds are honoured up to that cap); any other error status or a malformed
answer raises ``SearchError`` at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass

import httpx

from searchr1.data.types import Passage
from searchr1.retrievers.base import RETRIEVERS, Document, Retriever, SearchError
from searchr1.retrievers.micro_batcher import MicroBatcher
from searchr1.utils.schema import ranged

log = logging.getLogger(__name__)


@dataclass
class HttpConfig:
    """Hydra schema of ``retriever=http``."""

    # registry name of the retriever
    name: str = "http"
    # passages returned per query
    topk: int = ranged(3, ge=1)
    # the server's retrieve endpoint (Search-R1's default: http://127.0.0.1:8000/retrieve)
    url: str = "http://127.0.0.1:8000/retrieve"
    # seconds before one HTTP request times out
    timeout_s: float = ranged(30.0, gt=0)
    # retries after a timeout, transport error, 5xx or 429
    max_retries: int = ranged(3, ge=0)
    # first backoff in seconds (doubles with every retry) and its cap
    backoff_s: float = ranged(0.5, ge=0)
    max_backoff_s: float = 8.0
    # most POSTs in flight at once
    max_concurrency: int = ranged(8, ge=1)
    # merge search calls arriving within this window into one POST (0: only already queued)
    batch_window_ms: float = 5.0
    # most queries in one POST
    max_batch_queries: int = 64


class _Retryable(Exception):
    """A failure worth another attempt; ``wait`` is a server-requested delay, if any."""

    def __init__(self, detail: str, wait: float | None = None) -> None:
        super().__init__(detail)
        self.wait = wait


@RETRIEVERS.register("http")
class HttpRetriever(Retriever):
    """Async Search-R1 protocol client with retries and micro-batching."""

    def __init__(self, cfg: HttpConfig | None = None, *,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__()
        self.cfg = cfg or HttpConfig()
        if not self.cfg.url:
            raise ValueError("retriever=http needs retriever.url (the server's /retrieve URL)")
        self._transport = transport
        self._runtime: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, MicroBatcher] | None
        self._runtime = None
        self.posts = 0  # HTTP requests sent, retries included
        self.fingerprint = {"url": self.cfg.url}

    @classmethod
    def from_config(cls, cfg: HttpConfig, dataset=None) -> HttpRetriever:
        """``retriever=http``: the server owns the corpus; the dataset's is not used."""
        return cls(cfg)

    def __repr__(self) -> str:
        return f"HttpRetriever(url={self.cfg.url!r}, topk={self.cfg.topk})"

    async def _search(self, queries: list[str], topk: int) -> list[list[Document]]:
        return await self._batcher().submit(queries, topk)

    def _batcher(self) -> MicroBatcher:
        loop = asyncio.get_running_loop()
        if self._runtime is None or self._runtime[0] is not loop:
            client = httpx.AsyncClient(timeout=self.cfg.timeout_s, transport=self._transport)
            batcher = MicroBatcher(self._post_with_retries, self.cfg.batch_window_ms / 1000,
                                   self.cfg.max_batch_queries, self.cfg.max_concurrency)
            self._runtime = (loop, client, batcher)
        return self._runtime[2]

    async def _post_with_retries(self, queries: list[str], topk: int) -> list[list[Document]]:
        for attempt in range(self.cfg.max_retries + 1):
            try:
                return await self._post(queries, topk)
            except _Retryable as err:
                if attempt == self.cfg.max_retries:
                    raise SearchError(
                        f"retrieval server failed after {attempt + 1} attempts: {err}"
                    ) from None
                delay = min(self.cfg.backoff_s * 2**attempt, self.cfg.max_backoff_s)
                if err.wait is not None:
                    delay = min(max(delay, err.wait), self.cfg.max_backoff_s)
                log.debug("retrieval %s; retry %d in %.2fs", err, attempt + 1, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _post(self, queries: list[str], topk: int) -> list[list[Document]]:
        client = self._runtime[1]
        payload = {"queries": queries, "topk": topk, "return_scores": True}
        self.posts += 1
        try:
            response = await client.post(self.cfg.url, json=payload)
        except httpx.TimeoutException:
            raise _Retryable("request timed out") from None
        except httpx.TransportError as err:
            raise _Retryable(f"transport error ({type(err).__name__})") from None
        status = response.status_code
        if status == 429:
            raise _Retryable("HTTP 429", _retry_after(response))
        if status >= 500:
            raise _Retryable(f"HTTP {status}")
        if status != 200:
            raise SearchError(f"retrieval server answered HTTP {status}: {response.text[:200]}")
        try:
            return parse_response(response.json(), len(queries))
        except (ValueError, TypeError, KeyError) as err:
            raise SearchError(f"malformed retrieval response: {err}") from None

    async def aclose(self) -> None:
        if self._runtime is not None and self._runtime[0] is asyncio.get_running_loop():
            await self._runtime[2].aclose()
            await self._runtime[1].aclose()
        self._runtime = None


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


def parse_response(payload: dict, n_queries: int) -> list[list[Document]]:
    """Documents per query from a ``/retrieve`` answer, with or without scores."""
    result = payload["result"]
    if not isinstance(result, list) or len(result) != n_queries:
        raise ValueError(f"expected a list of {n_queries} result lists")
    return [[parse_item(item) for item in items] for items in result]


def parse_item(item: dict) -> Document:
    """One result item: ``{"document", "score"?}`` or a bare document dict."""
    if not isinstance(item, dict):
        raise TypeError(f"result item is {type(item).__name__}, not an object")
    doc = item["document"] if "document" in item else item
    score = float(item.get("score", doc.get("score", 0.0)) or 0.0)
    if "contents" in doc:
        passage = Passage(id="", contents=str(doc["contents"]))
        title, text = passage.title, passage.text
    else:
        title, text = str(doc.get("title", "")), str(doc.get("text", ""))
    digest = hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()[:16]
    doc_id = str(doc.get("id") or f"sha:{digest}")
    return Document(id=doc_id, title=title, text=text, score=score,
                    url=doc.get("url"), source=doc.get("source"),
                    contents=str(doc["contents"]) if "contents" in doc else None)
