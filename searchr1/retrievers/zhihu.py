"""Zhihu global search (``retriever=zhihu``): the lab's online search backend.

``GET {base_url}/api/v1/content/global_search?Query=…&Count={topk}&SearchDB=all`` with
``Authorization: Bearer <key>`` and ``X-Request-Timestamp`` (unix seconds) returns
``{Code, Message, Data{Items[{Title, ContentText, Url, ContentType, AuthorName}]}}``;
``Code`` 0 is success. Every query of one ``search`` call runs concurrently. How many
searches are in flight at once is one setting, ``rollout.search_concurrency``: the rollout
engine sends each search as its own call under that bound (this retriever used to carry a
second, ``retriever.max_concurrency``, that meant the same thing). Direct callers may still
pass ``max_concurrency`` to the constructor.

Keys come from ``keys_env`` (comma or newline separated), else the lab's fallback variables
``ZHIHU_SEARCH_KEY`` / ``ZHIHU_ACCESS_SECRET``, each from the environment or the ``.env``
file ``env_file`` (``zhihu_keys.py``), and are used round-robin. The failure policy, per
query:

- HTTP 429 or ``Code`` 30001 (rate limited): the key is set aside until ``Retry-After``
  (header seconds, else ``default_retry_after_s``) and the query fails over to the next key;
- ``Code`` 30002 (quota exhausted) or HTTP 401/403: the key is retired for the run, with a
  loud warning naming it only by fingerprint (index + sha256 prefix);
- no usable key: wait for the earliest ``Retry-After`` if it is within ``max_key_wait_s``,
  else raise ``SearchError``;
- timeouts, transport errors and 5xx: retried with exponential backoff, ``max_retries``
  times; malformed JSON or any other API error: ``SearchError`` at once.

Keys never reach logs, exception messages, reprs or metrics: errors are raised ``from None``
(an httpx exception carries its request, headers included) and any text from the server is
scrubbed of key strings before it is shown.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass

import httpx

from searchr1.retrievers.base import RETRIEVERS, Document, Retriever, SearchError
from searchr1.retrievers.zhihu_keys import (
    Key,
    KeyPool,
    MissingCredentialsError,
    find_keys,
    missing_message,
)
from searchr1.utils.schema import ranged

log = logging.getLogger(__name__)

SEARCH_PATH = "/api/v1/content/global_search"
RATE_LIMITED_CODE = 30001
QUOTA_EXHAUSTED_CODE = 30002


@dataclass
class ZhihuConfig:
    """Hydra schema of ``retriever=zhihu``."""

    # registry name of the retriever
    name: str = "zhihu"
    # passages returned per query (sent as Count)
    topk: int = ranged(3, ge=1)
    # API host; the lab's client (llm-agent-rl-lab's search.py) calls this one
    base_url: str = "https://developer.zhihu.com"
    # environment variable holding the keys, comma or newline separated (never the keys);
    # when unset, ZHIHU_SEARCH_KEY then ZHIHU_ACCESS_SECRET are tried (the lab's fallbacks)
    keys_env: str = "ZHIHU_SEARCH_KEYS"
    # a .env file read for those variables when the environment lacks them; null = none
    env_file: str | None = ".env"
    # seconds before one HTTP request times out
    timeout_s: float = ranged(10.0, gt=0)
    # retries of one query after a timeout, transport error or 5xx
    max_retries: int = ranged(3, ge=0)
    # first backoff in seconds; doubles with every retry
    backoff_s: float = ranged(0.5, ge=0)
    # ContentText is cut to this many characters
    max_content_chars: int = ranged(1200, ge=1)
    # seconds a rate-limited key is set aside when the server sends no Retry-After
    default_retry_after_s: float = 30.0
    # longest wait for a rate-limited key when none is free; beyond it the query fails
    max_key_wait_s: float = 60.0


@dataclass(frozen=True)
class _Failure:
    """Why one HTTP attempt did not yield documents, and what the policy does about it."""

    kind: str  # rate_limited | retire | transient | fatal
    detail: str
    retry_after: float = 0.0
    timeout: bool = False


@dataclass
class _Counters:
    """Per-query event counts behind the extra ``search/*`` metrics."""

    timeouts: int = 0  # queries that saw at least one timeout
    rate_limited: int = 0  # queries that saw at least one 429 / Code 30001
    failovers: int = 0  # times a query moved to another key


@dataclass
class _QueryState:
    """What one query has gone through so far (retry and failover budgets)."""

    retries: int = 0
    rate_limit_hits: int = 0
    saw_timeout: bool = False
    saw_rate_limit: bool = False


@RETRIEVERS.register("zhihu_lab")  # retriever=zhihu_lab: the same client, the lab's settings
@RETRIEVERS.register("zhihu")
class ZhihuRetriever(Retriever):
    """Async Zhihu global search with key rotation, failover and bounded concurrency."""

    def __init__(
        self,
        cfg: ZhihuConfig | None = None,
        *,
        keys: list[str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        """``keys`` overrides the environment (tests); ``transport`` is passed to httpx;
        ``max_concurrency`` bounds requests in flight (None: the caller bounds them)."""
        super().__init__()
        self.cfg = cfg or ZhihuConfig()
        if not self.cfg.base_url:
            raise ValueError("retriever=zhihu needs base_url (the Zhihu API host)")
        secrets, self._key_source = [k.strip() for k in keys or []], "the keys argument"
        if keys is None:
            secrets, where = find_keys(self.cfg.keys_env, self.cfg.env_file)
            self._key_source = f"${where}"
            if not secrets:
                raise MissingCredentialsError(missing_message(self.cfg.keys_env, self.cfg.env_file))
        if not secrets or not all(secrets):
            raise MissingCredentialsError(
                f"ZhihuRetriever got no keys or an empty key (set {self.cfg.keys_env})"
            )
        self._pool = KeyPool(secrets)
        self._transport = transport
        self._max_concurrency = max_concurrency
        # (event loop, client, semaphore): asyncio objects are bound to the loop that made them
        self._runtime: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, object] | None
        self._runtime = None
        self._counters = _Counters()

    @staticmethod
    def check_credentials(cfg: ZhihuConfig) -> list[str]:
        """Pre-flight check: what is missing to run ``cfg`` (empty when ready)."""
        missing = []
        if not cfg.base_url:
            missing.append("retriever.base_url is empty (the Zhihu API host)")
        if not find_keys(cfg.keys_env, cfg.env_file)[0]:
            missing.append(missing_message(cfg.keys_env, cfg.env_file))
        return missing

    @classmethod
    def from_config(cls, cfg: ZhihuConfig, dataset=None) -> ZhihuRetriever:
        """``retriever=zhihu``: the web search ignores the dataset's corpus."""
        return cls(cfg)

    def __repr__(self) -> str:
        return (
            f"ZhihuRetriever(base_url={self.cfg.base_url!r}, keys={len(self._pool)} from "
            f"{self._key_source}, retired={self._pool.retired_count}, topk={self.cfg.topk})"
        )

    @property
    def quota_exhausted(self) -> bool:
        """Whether every key is retired (quota code 30002, or rejected): no search can succeed.

        Read by the circuit breaker (``loop/breaker.py``) after each step, which stops the run
        at once; rate-limited keys are not retired and do not count.
        """
        return len(self._pool) > 0 and self._pool.retired_count == len(self._pool)

    # ---- search --------------------------------------------------------------------------

    async def _search(self, queries: list[str], topk: int) -> list[list[Document]]:
        results = await asyncio.gather(
            *(self._search_one(q, topk) for q in queries), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return list(results)

    async def _search_one(self, query: str, topk: int) -> list[Document]:
        """One query through the key pool, retrying and failing over per the policy."""
        client, semaphore = self._client()
        state = _QueryState()
        async with semaphore:
            while True:
                key = await self._acquire_key()
                outcome = await self._attempt(client, key, query, topk)
                if isinstance(outcome, list):
                    return outcome
                await self._handle(outcome, key, state)

    def _client(self) -> tuple[httpx.AsyncClient, object]:
        """The HTTP client and semaphore of the running event loop (made on first use)."""
        loop = asyncio.get_running_loop()
        if self._runtime is None or self._runtime[0] is not loop:
            client = httpx.AsyncClient(
                base_url=self.cfg.base_url, timeout=self.cfg.timeout_s, transport=self._transport
            )
            bound = self._max_concurrency
            self._runtime = (loop, client, asyncio.Semaphore(bound) if bound else nullcontext())
        return self._runtime[1], self._runtime[2]

    async def _acquire_key(self) -> Key:
        """A usable key, waiting for a rate-limited one when that is within the bound."""
        while True:
            now = time.monotonic()
            key = self._pool.pick(now)
            if key is not None:
                return key
            wait = self._pool.wait_time(now)
            if wait is None:
                raise SearchError(
                    f"all {len(self._pool)} Zhihu search keys are retired (quota exhausted, "
                    f"Code {QUOTA_EXHAUSTED_CODE}, or rejected)"
                )
            if wait > self.cfg.max_key_wait_s:
                raise SearchError(
                    f"all {len(self._pool)} Zhihu search keys are rate-limited; the earliest "
                    f"frees in {wait:.1f}s > max_key_wait_s={self.cfg.max_key_wait_s}"
                )
            await asyncio.sleep(wait)

    async def _attempt(
        self, client: httpx.AsyncClient, key: Key, query: str, topk: int
    ) -> list[Document] | _Failure:
        """One HTTP request with ``key``: documents, or the failure to act on."""
        params = {"Query": query, "Count": str(topk), "SearchDB": "all"}
        headers = {
            "Authorization": f"Bearer {key.secret}",
            "X-Request-Timestamp": str(int(time.time())),
            "Accept": "application/json",
        }
        try:
            response = await client.get(SEARCH_PATH, params=params, headers=headers)
        except httpx.TimeoutException:
            return _Failure("transient", "request timed out", timeout=True)
        except httpx.TransportError as err:
            return _Failure("transient", f"transport error ({type(err).__name__})")
        except httpx.HTTPError as err:  # decoding errors, redirect loops: not worth a retry
            return _Failure("fatal", f"Zhihu search request failed ({type(err).__name__})")
        return self._interpret(response, topk)

    def _interpret(self, response: httpx.Response, topk: int) -> list[Document] | _Failure:
        """Map an HTTP response to documents or a failure (see the module docstring)."""
        status = response.status_code
        if status == 429:
            return _Failure("rate_limited", "HTTP 429", self._retry_after(response))
        if status >= 500:
            return _Failure("transient", f"HTTP {status}")
        try:
            payload = response.json()
        except ValueError:
            payload = None
        code = payload.get("Code") if isinstance(payload, dict) else None
        if code == RATE_LIMITED_CODE:
            return _Failure("rate_limited", f"Code {code}", self._retry_after(response))
        if code == QUOTA_EXHAUSTED_CODE:
            return _Failure("retire", f"quota exhausted (Code {code})")
        if status in (401, 403):
            return _Failure("retire", f"key rejected (HTTP {status})")
        if not isinstance(payload, dict):
            what = "malformed JSON from Zhihu search" if status == 200 else "Zhihu search error"
            return _Failure("fatal", f"{what} (HTTP {status})")
        if status != 200 or code != 0:
            message = self._pool.redact(str(payload.get("Message", "")))[:200]
            return _Failure("fatal", f"Zhihu search error: HTTP {status}, Code {code}: {message}")
        return self._documents(payload, topk)

    def _retry_after(self, response: httpx.Response) -> float:
        """``Retry-After`` in seconds, or the configured default (dates are not parsed)."""
        try:
            seconds = float(response.headers.get("Retry-After", ""))
        except ValueError:
            return self.cfg.default_retry_after_s
        return seconds if seconds >= 0 else self.cfg.default_retry_after_s

    async def _handle(self, failure: _Failure, key: Key, state: _QueryState) -> None:
        """Apply the policy to one failure: set aside, retire, back off, or raise."""
        now = time.monotonic()
        if failure.kind == "rate_limited":
            self._note_rate_limit(state)
            self._pool.set_aside(key, failure.retry_after, now)
            self._counters.failovers += len(self._pool) > 1
            log.info(
                "Zhihu %s rate-limited (%s); set aside %.1fs",
                key.fingerprint, failure.detail, failure.retry_after,
            )
        elif failure.kind == "retire":
            self._pool.retire(key)
            self._counters.failovers += len(self._pool) > 1
            log.warning(
                "!!! Zhihu search %s %s: retired for this run, %d of %d keys left. "
                "Searches fail (and rewards degrade) once all are gone.",
                key.fingerprint, failure.detail,
                len(self._pool) - self._pool.retired_count, len(self._pool),
            )
        elif failure.kind == "transient":
            await self._back_off(failure, state)
        else:
            raise SearchError(failure.detail)

    def _note_rate_limit(self, state: _QueryState) -> None:
        """Count a rate-limit event; too many for one query ends it (no endless ping-pong)."""
        state.rate_limit_hits += 1
        if not state.saw_rate_limit:
            state.saw_rate_limit = True
            self._counters.rate_limited += 1
        if state.rate_limit_hits > len(self._pool) * (self.cfg.max_retries + 1):
            raise SearchError(
                f"Zhihu search rate-limited {state.rate_limit_hits} times for one query"
            )

    async def _back_off(self, failure: _Failure, state: _QueryState) -> None:
        """Sleep before retrying a transient failure, or raise once retries are spent."""
        if failure.timeout and not state.saw_timeout:
            state.saw_timeout = True
            self._counters.timeouts += 1
        if state.retries >= self.cfg.max_retries:
            raise SearchError(
                f"Zhihu search failed after {state.retries + 1} attempts: {failure.detail}"
            )
        delay = self.cfg.backoff_s * 2**state.retries
        state.retries += 1
        log.debug("Zhihu search %s; retry %d in %.2fs", failure.detail, state.retries, delay)
        await asyncio.sleep(delay)

    def _documents(self, payload: dict, topk: int) -> list[Document] | _Failure:
        """``Data.Items`` as Documents (ContentText cut to ``max_content_chars``)."""
        data = payload.get("Data") or {}
        items = (data.get("Items") or []) if isinstance(data, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            return _Failure("fatal", "malformed Zhihu search response (Data.Items is not a list)")
        return [self._document(item) for item in items[:topk]]

    def _document(self, item: dict) -> Document:
        title = str(item.get("Title") or "").strip()
        text = str(item.get("ContentText") or "").strip()[: self.cfg.max_content_chars]
        url = str(item.get("Url") or "").strip() or None
        kind = str(item.get("ContentType") or "").strip() or None
        author = str(item.get("AuthorName") or "").strip() or None
        doc_id = url or "zhihu:" + hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()[:16]
        source = f"zhihu/{kind or 'unknown'}" + (f" / {author}" if author else "")
        return Document(id=doc_id, title=title, text=text, url=url, source=source, kind=kind,
                        author=author)

    # ---- metrics and lifecycle -----------------------------------------------------------

    def _reset_extra(self) -> None:
        self._counters = _Counters()

    def _extra_metrics(self) -> dict[str, float]:
        n = self._requests
        c = self._counters
        return {
            "search/timeout_rate": c.timeouts / n if n else 0.0,
            "search/429_rate": c.rate_limited / n if n else 0.0,
            "search/credential_failover_rate": c.failovers / n if n else 0.0,
            "search/quota_exhausted_keys": float(self._pool.retired_count),
        }

    async def aclose(self) -> None:
        if self._runtime is not None and self._runtime[0] is asyncio.get_running_loop():
            await self._runtime[1].aclose()
        self._runtime = None
