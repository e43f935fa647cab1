"""A Search-R1-compatible retrieval server for any retriever (FastAPI + uvicorn).

    uv run python -m searchr1.retrievers.server retriever=bm25 server.port=8000
    uv run python -m searchr1.retrievers.server retriever=e5 retriever.index_dir=indexes/wiki

Hydra composes ``conf/server.yaml`` (the ``data`` and ``retriever`` groups of the main tree
plus ``server``). ``POST /retrieve`` takes ``{"queries": [str], "topk": int,
"return_scores": bool}`` and answers ``{"result": [[{"document": {"id", "contents"},
"score": float}, …] per query]}``; ``GET /health`` reports the retriever, batching and cache.

How it departs from the official ``retrieval_server.py``: ``return_scores: false`` works (the
official one crashes there; we return the bare documents, the shape its code intends);
``topk`` above ``max_topk`` is capped and below 1 is a 422; a body over ``max_body_bytes``
(or more than ``max_queries`` queries, when set; no cap by default, like the official server,
whose trainer sends a whole step's searches in one POST) is a 413; a request's queries go
through the dynamic batcher (``MicroBatcher``) in chunks of ``max_batch_queries``, merged
with concurrent requests; repeated ``(query, topk)`` pairs come from an LRU cache; documents
are the corpus rows verbatim (``contents`` as the corpus has it).

Bad and slow clients get a 4xx, never a 500 nor a held connection: a body that is not UTF-8
or is JSON nested too deep is a 400, malformed JSON or a wrong shape a 422; a connection
must send its request headers within ``header_timeout_s`` and then its body within
``body_timeout_s`` (else 408 and closed), and at most ``max_connections`` are open at once
(one more is answered 503 and closed), so ``/health`` keeps answering while slow clients
hold connections. The timeouts and the cap live in ``GuardedH11Protocol``, the uvicorn
protocol ``uvicorn_config`` installs.
"""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import h11
import hydra
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from omegaconf import DictConfig
from pydantic import BaseModel, Field, ValidationError, field_validator
from uvicorn.protocols.http.h11_impl import H11Protocol

from searchr1.retrievers.base import Document, Retriever
from searchr1.retrievers.micro_batcher import LRUCache, MicroBatcher


@dataclass
class ServerConfig:
    """Hydra schema of ``server`` (``conf/server.yaml``)."""

    # interface to bind; 127.0.0.1 keeps the server local (0.0.0.0 exposes it)
    host: str = "127.0.0.1"
    port: int = 8000
    # topk when a request sends none (None → retriever.topk), and the cap on any request's topk
    default_topk: int | None = None
    max_topk: int = 50
    # most queries in one request (None: no cap, as the official server; the official trainer
    # sends a step's 512 × 5 = 2,560 searches in one POST) and largest body in bytes (64 MiB:
    # 2,560 queries of 25 KB each); beyond either → HTTP 413
    max_queries: int | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    # slow clients: seconds to send the request headers (from connecting, or from the first
    # byte of a keep-alive connection's next request), then seconds to send the whole body;
    # past either → HTTP 408 and the connection closed
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    # most open connections; one more is answered 503 and closed at once
    max_connections: int = 512
    # dynamic batching: wait for more requests, most queries per retriever call, workers
    batch_window_ms: float = 1.0
    max_batch_queries: int = 256
    batch_workers: int = 1
    # LRU cache of (query, topk) → documents; 0 disables
    cache_size: int = 10_000
    # uvicorn log level
    log_level: str = "warning"


@dataclass
class ServerRoot:
    """Root of ``conf/server.yaml``."""

    data: Any = None
    retriever: Any = None
    server: ServerConfig = field(default_factory=ServerConfig)


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int | None = Field(default=None, ge=1)
    return_scores: bool = False

    @field_validator("queries")
    @classmethod
    def _encodable(cls, queries: list[str]) -> list[str]:
        for i, query in enumerate(queries):
            try:
                query.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate ("\\ud800") breaks tokenizers
                raise ValueError(f"queries[{i}] is not valid Unicode text") from None
        return queries


def document_json(doc: Document) -> dict:
    """A document in the corpus row format: the row's own ``contents`` verbatim when the
    retriever kept it, else rebuilt as ``'"Title"\\ntext'`` (retrievers without rows)."""
    if doc.contents is not None:
        return {"id": doc.id, "contents": doc.contents}
    title = doc.title
    if title and not title.startswith('"'):
        title = f'"{title}"'
    return {"id": doc.id, "contents": f"{title}\n{doc.text}" if title else doc.text}


# ---- bad and slow clients -------------------------------------------------------------------

def _error(status: int, detail: str, close: bool = False) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=None if not close
                        else {"connection": "close"})


class RequestGuard:
    """ASGI middleware: the whole request body read up front, within ``max_body_bytes`` (else
    413) and ``body_timeout_s`` (else 408), then replayed to the app. An unread body ends the
    connection (``connection: close``), so a client cannot keep streaming into it; a client
    that disconnects mid-body gets no answer. ``GuardedH11Protocol`` enforces the same
    timeout at the socket (and the header one, and the connection cap); this one holds under
    any ASGI server. ``stats`` are the counters ``/health`` reports."""

    def __init__(self, app, cfg: ServerConfig) -> None:
        self.app, self.cfg = app, cfg
        self.server_cfg = cfg  # ServerThread / uvicorn_config read the limits from the app
        self.stats = ConnectionStats()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit = self.cfg.max_body_bytes
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                return await _error(400, "invalid Content-Length", close=True)(scope, None, send)
            if declared > limit:
                return await _too_large(limit, scope, send)
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.cfg.body_timeout_s):
                more = True
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None  # nobody to answer
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        return await _too_large(limit, scope, send)
                    chunks.append(chunk)
                    more = message.get("more_body", False)
        except TimeoutError:
            self.stats.timed_out += 1
            return await _error(408, f"request body not received within "
                                     f"{self.cfg.body_timeout_s:g} s", close=True)(scope, None, send)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if replayed:  # the body is in: what follows is the server's disconnect news
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _too_large(limit: int, scope, send) -> None:
    await _error(413, f"request body over {limit} bytes", close=True)(scope, None, send)


@dataclass
class ConnectionStats:
    """Counters of the guard, reported by ``/health``."""

    open: int = 0  # connections open now
    refused: int = 0  # answered 503: over max_connections
    timed_out: int = 0  # answered 408: headers or body too slow


def _raw_response(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and read deadlines.

    uvicorn closes idle keep-alive connections but never one that is sending its request:
    a client that opens a connection and sends nothing, sends half its headers, or sends
    headers and then stalls its body holds the connection for ever. Here each connection is
    in one of three phases, read from h11's state after every event: ``headers`` (from the
    connection's start, or the first byte of a keep-alive connection's next request, until
    the headers are complete) with ``header_timeout_s``, ``body`` (until the body is
    complete) with ``body_timeout_s``, and none (the app is working, or the connection is an
    idle keep-alive, which uvicorn's own ``timeout_keep_alive`` covers). A deadline passed
    answers 408 (when no response has started) and closes. ``bind`` makes a subclass for
    one server's limits and counters.
    """

    cfg: ServerConfig = ServerConfig()
    stats: ConnectionStats = ConnectionStats()

    @classmethod
    def bind(cls, cfg: ServerConfig, stats: ConnectionStats) -> type[GuardedH11Protocol]:
        return type("BoundGuardedH11Protocol", (cls,), {"cfg": cfg, "stats": stats})

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._phase: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self.stats.open = len(self.connections)
        if len(self.connections) > self.cfg.max_connections:
            self.stats.refused += 1
            transport.write(_raw_response(503, "Service Unavailable", "too many connections "
                                          f"(max_connections={self.cfg.max_connections})"))
            transport.close()
            return
        self._enter("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(None)
        super().connection_lost(exc)
        self.stats.open = len(self.connections)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track(reading=True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track(reading=False)

    def _track(self, reading: bool) -> None:
        if self.transport.is_closing():
            return self._enter(None)
        state = self.conn.their_state
        if state is h11.IDLE:  # waiting for a request: counting only once its bytes arrive
            started = reading or bool(self.conn.trailing_data[0]) or self._phase == "headers"
            self._enter("headers" if started else None)
        elif state is h11.SEND_BODY:
            self._enter("body")
        else:  # the request is in (the app is working) or the connection is ending
            self._enter(None)

    def _enter(self, phase: str | None) -> None:
        if phase == self._phase:
            return  # the deadline runs from the phase's start
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            timeout = self.cfg.header_timeout_s if phase == "headers" else self.cfg.body_timeout_s
            self._deadline = self.loop.call_later(timeout, self._expired)

    def _expired(self) -> None:
        phase, self._deadline, self._phase = self._phase, None, None
        if self.transport.is_closing():
            return
        self.stats.timed_out += 1
        cycle = self.cycle
        current = cycle is not None and not cycle.response_complete
        if phase == "headers" or (current and not cycle.response_started):
            timeout = self.cfg.header_timeout_s if phase == "headers" else self.cfg.body_timeout_s
            self.transport.write(_raw_response(
                408, "Request Timeout", f"request {phase} not received within {timeout:g} s"))
        if current:
            cycle.disconnected = True  # the app's receive() now ends; it sends nothing more
            cycle.message_event.set()
        self.transport.close()


def _check(cfg: ServerConfig) -> None:
    bad = [name for name in ("header_timeout_s", "body_timeout_s", "max_connections",
                             "max_body_bytes", "max_batch_queries")
           if not getattr(cfg, name) > 0]
    if cfg.max_queries is not None and cfg.max_queries < 1:
        bad.append("max_queries")
    if bad:
        raise ValueError(f"server.{', server.'.join(bad)} must be > 0")


async def _parse(request: Request) -> RetrieveRequest | JSONResponse:
    """The request body as JSON (whatever its Content-Type, as official clients vary): 400
    when it is not UTF-8 text or nests too deep to parse, 422 when it is malformed JSON or
    not a request (FastAPI's own split)."""
    body = await request.body()
    try:
        payload = json.loads(body)
    except UnicodeDecodeError as err:
        return _error(400, f"request body is not UTF-8 text ({err.reason} at byte {err.start})")
    except RecursionError:
        return _error(400, "request body JSON is nested too deep")
    except ValueError as err:  # JSONDecodeError, or an integer of too many digits
        return _error(422, f"malformed JSON: {err}")
    try:
        return RetrieveRequest.model_validate(payload)
    except ValidationError as err:
        detail = err.errors(include_url=False, include_input=False, include_context=False)
        return JSONResponse({"detail": detail}, status_code=422)
    except RecursionError:
        return _error(400, "request body JSON is nested too deep")


class RetrievalService:
    """Cache lookups, then the misses through the batcher in chunks of ``max_batch_queries``
    (merged with concurrent requests' misses into retriever calls)."""

    def __init__(self, retriever: Retriever, cfg: ServerConfig, default_topk: int) -> None:
        self.retriever, self.cfg = retriever, cfg
        self.default_topk = cfg.default_topk or default_topk
        self.cache = LRUCache(cfg.cache_size)
        self.batcher = MicroBatcher(retriever.search, cfg.batch_window_ms / 1000,
                                    cfg.max_batch_queries, cfg.batch_workers)

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        results: list[list[Document] | None] = [self.cache.get((q, topk)) for q in queries]
        missing = list(dict.fromkeys(q for q, r in zip(queries, results) if r is None))
        if missing:
            size = self.cfg.max_batch_queries
            chunks = [missing[i:i + size] for i in range(0, len(missing), size)]
            parts = await asyncio.gather(*(self.batcher.submit(c, topk) for c in chunks))
            fresh = dict(zip(missing, (docs for part in parts for docs in part), strict=True))
            for query, docs in fresh.items():
                self.cache.put((query, topk), docs)
            results = [fresh[q] if r is None else r for q, r in zip(queries, results)]
        return results  # type: ignore[return-value]

    def health(self, stats: ConnectionStats | None = None) -> dict:
        out = {
            "status": "ok",
            "retriever": type(self.retriever).__name__,
            "batches": self.batcher.batches,
            "cache": {"entries": len(self.cache), "hits": self.cache.hits,
                      "misses": self.cache.misses},
        }
        if stats is not None:
            out["connections"] = {"open": stats.open, "refused": stats.refused,
                                  "timed_out": stats.timed_out}
        return out


def create_app(retriever: Retriever, cfg: ServerConfig | None = None, default_topk: int = 3):
    """The ASGI app serving ``retriever``, wrapped in ``RequestGuard`` (serve it with
    ``uvicorn_config`` / ``ServerThread`` for the socket-level timeouts and cap)."""
    cfg = cfg or ServerConfig()
    _check(cfg)
    service = RetrievalService(retriever, cfg, default_topk)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await service.batcher.aclose()

    app = FastAPI(title="searchr1 retrieval server", lifespan=lifespan)
    app.state.service = service
    guard = RequestGuard(app, cfg)

    @app.post("/retrieve")
    async def retrieve(request: Request):
        parsed = await _parse(request)
        if isinstance(parsed, JSONResponse):
            return parsed
        if cfg.max_queries is not None and len(parsed.queries) > cfg.max_queries:
            return JSONResponse({"detail": f"{len(parsed.queries)} queries > max_queries="
                                 f"{cfg.max_queries}"}, status_code=413)
        topk = min(parsed.topk or service.default_topk, cfg.max_topk)
        results = await service.retrieve(parsed.queries, topk)
        if parsed.return_scores:
            body = [[{"document": document_json(d), "score": d.score} for d in docs]
                    for docs in results]
        else:
            body = [[document_json(d) for d in docs] for docs in results]
        return JSONResponse({"result": body})

    @app.get("/health")
    async def health():
        return JSONResponse(service.health(guard.stats))

    return guard


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                   cfg: ServerConfig | None = None) -> uvicorn.Config:
    """uvicorn settings for ``app`` with ``GuardedH11Protocol`` bound to its limits (the
    ``ServerConfig`` ``create_app`` was given, unless ``cfg`` says otherwise)."""
    cfg = cfg or getattr(app, "server_cfg", None) or ServerConfig()
    stats = getattr(app, "stats", None) or ConnectionStats()
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          lifespan="on", http=GuardedH11Protocol.bind(cfg, stats))


class ServerThread:
    """Run an app with uvicorn in a background thread (tests, benchmarks); ``port=0`` → free."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 cfg: ServerConfig | None = None):
        self.server = uvicorn.Server(uvicorn_config(app, host, port, log_level, cfg))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the retrieval server failed to start")
            threading.Event().wait(0.01)
        return self

    @property
    def url(self) -> str:
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def register_server_configs() -> None:
    """Store the main tree's schemas and the server's root schema in Hydra's ConfigStore."""
    from hydra.core.config_store import ConfigStore

    from searchr1.config import register_configs

    register_configs()
    ConfigStore.instance().store(name="server_root_schema", node=ServerRoot)


@hydra.main(version_base="1.3", config_path="../../conf", config_name="server")
def main(cfg: DictConfig) -> None:
    from searchr1.build import build_dataset, build_retriever, to_schema

    dataset = build_dataset(cfg.data) if cfg.data is not None else None
    retriever = build_retriever(cfg.retriever, dataset)
    server_cfg: ServerConfig = to_schema(cfg.server)
    app = create_app(retriever, server_cfg, cfg.retriever.topk)
    print(f"serving {type(retriever).__name__} on http://{server_cfg.host}:{server_cfg.port}")
    uvicorn.Server(uvicorn_config(app, server_cfg.host, server_cfg.port,
                                  server_cfg.log_level)).run()


if __name__ == "__main__":
    register_server_configs()
    main()
