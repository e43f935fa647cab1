"""A Search-R1-compatible retrieval server for any retriever (FastAPI + uvicorn).

    uv run python -m searchr1.retrievers.server retriever=bm25 server.port=8000
    uv run python -m searchr1.retrievers.server retriever=e5 retriever.index_dir=indexes/wiki

Hydra composes ``conf/server.yaml`` (the ``data`` and ``retriever`` groups of the main tree
plus ``server``). ``POST /retrieve`` takes ``{"queries": [str], "topk": int,
"return_scores": bool}`` and answers ``{"result": [[{"document": {"id", "contents"},
"score": float}, …] per query]}``; ``GET /health`` reports the retriever, batching and cache.

How it departs from the official ``retrieval_server.py``: ``return_scores: false`` works (the
official one crashes there; we return the bare documents, the shape its code intends);
``topk`` above ``max_topk`` is capped and below 1 is a 422; repeated ``(query, topk)`` pairs
come from an LRU cache; documents are the corpus rows verbatim (``contents`` as the corpus
has it).

One request cannot take the server down or starve the others (the official server has no
limits): more than ``max_queries`` queries, more than ``max_results`` results (queries ×
topk), an answer over ``max_response_bytes`` or a body over ``max_body_bytes`` is a 413 whose
body names the limit and its option (``server_limits``); the default caps admit the official
trainer's 2,560-query step at top-3. A request's cache misses go to the ``FairBatcher``,
which serves large requests ``max_batch_queries`` at a time, in turn with every other
waiting request, so a small request waits at most the batch running plus its own;
``/health`` reports the queue (requests, queued queries, the oldest wait).

Bad and slow clients get a 4xx, never a 500 nor a held connection: a body that is not UTF-8
or is JSON nested too deep is a 400, malformed JSON or a wrong shape a 422; a connection
must send its request headers within ``header_timeout_s`` and then its body within
``body_timeout_s`` (else 408 and closed), and at most ``max_connections`` are open at once
(one more is answered 503 and closed), so ``/health`` keeps answering while slow clients
hold connections. The timeouts and the cap live in ``GuardedH11Protocol``, the uvicorn
protocol ``uvicorn_config`` installs.
"""

from __future__ import annotations

import json
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import hydra
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from omegaconf import DictConfig
from pydantic import BaseModel, Field, ValidationError, field_validator

from searchr1.retrievers.base import Document, Retriever
from searchr1.retrievers.fair_batcher import FairBatcher
from searchr1.retrievers.micro_batcher import LRUCache
from searchr1.retrievers.server_config import ServerConfig, check_server_config
from searchr1.retrievers.server_guard import (ConnectionStats, GuardedH11Protocol, RequestGuard,
                                              _error)
from searchr1.retrievers.server_limits import document_json, encode_answer, over_request_caps

ENCODE_SLICE_DOCUMENTS = 256  # documents JSON-encoded between two yields to other requests

__all__ = ["ServerConfig", "ServerThread", "create_app", "document_json", "uvicorn_config",
           "RequestGuard", "RetrievalService"]


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


# ---- bad and slow clients -------------------------------------------------------------------

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
    """Cache lookups, then the misses through the ``FairBatcher`` (``max_batch_queries`` per
    retriever call, taken in turn from every waiting request)."""

    def __init__(self, retriever: Retriever, cfg: ServerConfig, default_topk: int) -> None:
        self.retriever, self.cfg = retriever, cfg
        self.default_topk = cfg.default_topk or default_topk
        self.cache = LRUCache(cfg.cache_size)
        self.batcher = FairBatcher(retriever.search, cfg.batch_window_ms / 1000,
                                   cfg.max_batch_queries, cfg.batch_workers)

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        results: list[list[Document] | None] = [self.cache.get((q, topk)) for q in queries]
        missing = list(dict.fromkeys(q for q, r in zip(queries, results) if r is None))
        if missing:
            fresh = dict(zip(missing, await self.batcher.submit(missing, topk), strict=True))
            for query, docs in fresh.items():
                self.cache.put((query, topk), docs)
            results = [fresh[q] if r is None else r for q, r in zip(queries, results)]
        return results  # type: ignore[return-value]

    def health(self, stats: ConnectionStats | None = None) -> dict:
        out = {
            "status": "ok",
            "retriever": type(self.retriever).__name__,
            "batches": self.batcher.batches,
            "queue": self.batcher.saturation(),
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
    check_server_config(cfg)
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
        topk = min(parsed.topk or service.default_topk, cfg.max_topk)
        refused = over_request_caps(len(parsed.queries), topk, cfg)
        if refused is not None:
            return refused
        results = await service.retrieve(parsed.queries, topk)
        slice_size = max(1, ENCODE_SLICE_DOCUMENTS // topk)  # short pauses of the event loop
        return await encode_answer(results, parsed.return_scores, cfg, slice_size)

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
