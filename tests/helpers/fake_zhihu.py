"""A loopback fake of the Zhihu global search API with deterministic fault injection.

A real HTTP server (a FastAPI app served by uvicorn in a background thread, on 127.0.0.1 and
a free port) speaking the wire format ``ZhihuRetriever`` expects (``retrievers/zhihu.py``):
``GET /api/v1/content/global_search?Query=…&Count=…&SearchDB=all`` with
``Authorization: Bearer <key>`` → ``{Code, Message, Data{Items[{Title, ContentText, Url,
ContentType, AuthorName}]}}``. It exists so the reliability tests exercise the real client
(HTTP, retries, key rotation, timeouts) instead of a mocked transport.

Faults (``FaultPlan``), each as the real API shows it:

- ``timeout``: the answer comes after ``timeout_sleep_s`` (set past the client's timeout);
- ``http_429``: HTTP 429 with ``Retry-After: 0`` (rate limited: the client fails over);
- ``http_500``: HTTP 500 (the client retries with backoff);
- ``malformed``: HTTP 200 whose body is not JSON;
- ``empty``: ``Code`` 0 and no items (a failure where results are promised);
- ``quota``: ``Code`` 30002 (the key's quota is exhausted: the client retires it).

Which query gets which fault is a pure function of ``(seed, query)``: the query's sha256
draws whether it faults (probability ``rate``) and which of ``kinds``. Faults are *sticky*
per query: every attempt at a query, retries and failovers included, gets the same answer,
so a faulted query fails after the client's retries and the set of failed searches is
known from the server's own log (``failed_queries``), independently of the client.
``quota_after=N``: after N successful answers in total, every request gets ``Code`` 30002
(every key's quota ran out). ``max_requests`` bounds what the server answers: the request
that reaches it shuts the server down, later ones are refused (HTTP 503, then no listener),
so a test using it can never hang.

What it served is counted by kind (``served``) and logged per request (``log``: query and
kind); the key a request carried is never stored. A successful answer's first document
echoes the query (so an answer named in the query is in the evidence); given
``passages``, the others are those sharing the most words with the query.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from searchr1.retrievers.server import ServerThread
from searchr1.retrievers.zhihu import QUOTA_EXHAUSTED_CODE, SEARCH_PATH

OK = "ok"
TIMEOUT = "timeout"
HTTP_429 = "http_429"
HTTP_500 = "http_500"
MALFORMED = "malformed"
EMPTY = "empty"
QUOTA = "quota"
REFUSED = "refused"  # past max_requests
UNAUTHORIZED = "unauthorized"  # no bearer key
FAULT_KINDS = (TIMEOUT, HTTP_429, HTTP_500, MALFORMED, EMPTY, QUOTA)
#: the issue's 20% mix: every fault a search can hit that leaves the keys usable
MIXED = (TIMEOUT, HTTP_429, HTTP_500, MALFORMED, EMPTY)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class FaultPlan:
    """What the fake server does wrong, and how much (see the module docstring)."""

    rate: float = 0.0  # share of distinct queries that fault
    kinds: tuple[str, ...] = MIXED  # the faults drawn from, uniformly
    seed: int = 0
    quota_after: int | None = None  # successful answers in total before every key's quota is out
    max_requests: int = 2000  # requests answered before the server shuts itself down
    timeout_sleep_s: float = 2.5  # how late a ``timeout`` answer comes (past the client's timeout)

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {self.rate}")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or (self.rate > 0 and not self.kinds):
            raise ValueError(f"kinds must be a non-empty subset of {FAULT_KINDS}, got {self.kinds}")
        if self.max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")

    def fault_for(self, query: str) -> str:
        """The kind every request for ``query`` gets (``ok`` or a fault), by (seed, query)."""
        digest = hashlib.sha256(f"{self.seed}\x00{query}".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2**64 >= self.rate:
            return OK
        return self.kinds[int.from_bytes(digest[8:16], "big") % len(self.kinds)]


class FakeZhihu:
    """The server; ``with FakeZhihu(plan) as fake:`` serves at ``fake.url`` until exit."""

    def __init__(self, plan: FaultPlan | None = None, passages: Sequence[str] = ()) -> None:
        self.plan = plan or FaultPlan()
        self.passages = list(passages)
        self.served: Counter[str] = Counter()  # requests answered, by kind
        self.log: list[tuple[str, str]] = []  # (query, kind) per request, in arrival order
        self._successes = 0
        self._lock = threading.Lock()
        self._thread: ServerThread | None = None

    # ---- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> FakeZhihu:
        self._thread = ServerThread(self._app())
        # in-flight ``timeout`` answers must not hold the shutdown for long
        self._thread.server.config.timeout_graceful_shutdown = 1
        self._thread.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._thread.__exit__(*exc)

    @property
    def url(self) -> str:
        """Base URL for ``retriever.base_url`` (valid after the server is started)."""
        if self._thread is None:
            raise RuntimeError("the fake Zhihu server is not started (use it as a context manager)")
        return self._thread.url

    @property
    def running(self) -> bool:
        """Whether the server still listens (False once it stopped itself at the bound)."""
        return self._thread is not None and self._thread.thread.is_alive()

    # ---- what it served -------------------------------------------------------------------

    def outcomes(self, query: str) -> list[str]:
        """The kinds served for ``query``, in order."""
        with self._lock:
            return [kind for q, kind in self.log if q == query]

    def answered_queries(self) -> set[str]:
        """Queries answered with documents at least once."""
        with self._lock:
            return {q for q, kind in self.log if kind == OK}

    def failed_queries(self) -> set[str]:
        """Queries never answered with documents: every request for them got a fault."""
        with self._lock:
            answered = {q for q, kind in self.log if kind == OK}
            return {q for q, _ in self.log if q not in answered}

    def faults_served(self) -> dict[str, int]:
        """Requests answered with each fault kind (``ok`` left out), for tables."""
        with self._lock:
            return {k: n for k, n in sorted(self.served.items()) if k != OK}

    # ---- serving --------------------------------------------------------------------------

    def _decide(self, query: str, authorized: bool) -> str:
        """The kind of this request's answer; logs it (the bound and quota are global)."""
        plan = self.plan
        with self._lock:
            if len(self.log) >= plan.max_requests:
                kind = REFUSED
            elif not authorized:
                kind = UNAUTHORIZED
            elif plan.quota_after is not None and self._successes >= plan.quota_after:
                kind = QUOTA
            else:
                kind = plan.fault_for(query)
            self._successes += kind == OK
            self.log.append((query, kind))
            self.served[kind] += 1
            if len(self.log) >= plan.max_requests and self._thread is not None:
                self._thread.server.should_exit = True  # stops by itself: a test never hangs
        return kind

    def _items(self, query: str, count: int) -> list[dict]:
        """The query echoed, then the passages sharing the most words with it."""
        words = set(_WORD.findall(query.lower()))
        ranked = sorted(self.passages, key=lambda p: -len(words & set(_WORD.findall(p.lower()))))
        texts = [query, *ranked][: max(count, 0)]
        return [{"Title": text.split("\n", 1)[0][:80], "ContentText": text,
                 "Url": f"https://www.zhihu.com/question/{_digest(text)}",
                 "ContentType": "answer", "AuthorName": "fake"} for text in texts]

    async def _answer(self, request: Request) -> Response:
        query = request.query_params.get("Query", "")
        try:
            count = int(request.query_params.get("Count", "3"))
        except ValueError:
            count = 3
        authorized = request.headers.get("Authorization", "").startswith("Bearer ")
        kind = self._decide(query, authorized)
        if kind == TIMEOUT:
            await asyncio.sleep(self.plan.timeout_sleep_s)
            return _body(0, "success", self._items(query, count))
        if kind == HTTP_429:
            return JSONResponse({"Code": 429, "Message": "too many requests"}, status_code=429,
                                headers={"Retry-After": "0"})
        if kind == HTTP_500:
            return JSONResponse({"Code": 500, "Message": "internal error"}, status_code=500)
        if kind == REFUSED:
            return JSONResponse({"Code": 503, "Message": "fake server bound reached"},
                                status_code=503)
        if kind == UNAUTHORIZED:
            return JSONResponse({"Code": 401, "Message": "missing key"}, status_code=401)
        if kind == MALFORMED:
            return Response('{"Code": 0, "Data": {"Items": [', media_type="application/json")
        if kind == QUOTA:
            return JSONResponse({"Code": QUOTA_EXHAUSTED_CODE, "Message": "quota exhausted"})
        return _body(0, "success", [] if kind == EMPTY else self._items(query, count))

    def _app(self) -> FastAPI:
        app = FastAPI()
        app.add_api_route(SEARCH_PATH, self._answer, methods=["GET"])
        return app


def _body(code: int, message: str, items: list[dict]) -> JSONResponse:
    return JSONResponse({"Code": code, "Message": message, "Data": {"Items": items}})


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]
