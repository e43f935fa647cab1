"""A Search-R1-compatible retrieval server for any retriever (FastAPI + uvicorn).

    uv run python -m searchr1.retrievers.server retriever=bm25 server.port=8000
    uv run python -m searchr1.retrievers.server retriever=e5 retriever.index_dir=indexes/wiki

Hydra composes ``conf/server.yaml`` (the ``data`` and ``retriever`` groups of the main tree
plus ``server``). ``POST /retrieve`` takes ``{"queries": [str], "topk": int,
"return_scores": bool}`` and answers ``{"result": [[{"document": {"id", "contents"},
"score": float}, …] per query]}``; ``GET /health`` reports the retriever, batching and cache.

How it departs from the official ``retrieval_server.py``: ``return_scores: false`` works (the
official one crashes there; we return the bare documents, the shape its code intends);
``topk`` above ``max_topk`` is capped and below 1 is a 422; more than ``max_queries`` queries
or a body over ``max_body_bytes`` is a 413; concurrent requests are merged into one
retriever call (``MicroBatcher``); repeated ``(query, topk)`` pairs come from an LRU cache.
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
from pydantic import BaseModel, Field, ValidationError

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
    # most queries in one request and largest body in bytes; beyond either → HTTP 413
    max_queries: int = 512
    max_body_bytes: int = 1_000_000
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


def document_json(doc: Document) -> dict:
    """A document in the corpus row format: ``contents = '"Title"\\ntext'``."""
    title = doc.title
    if title and not title.startswith('"'):
        title = f'"{title}"'
    return {"id": doc.id, "contents": f"{title}\n{doc.text}" if title else doc.text}


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before any parsing."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and int(length) > self.limit:
            return await _too_large(self.limit, scope, send)
        if length is None and scope["method"] in ("POST", "PUT"):
            body, more = b"", True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > self.limit:
                    return await _too_large(self.limit, scope, send)
            replayed = False

            async def receive():  # noqa: F811  (hand the buffered body to the app)
                nonlocal replayed
                if replayed:
                    return {"type": "http.disconnect"}
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
        return await self.app(scope, receive, send)


async def _too_large(limit: int, scope, send) -> None:
    response = JSONResponse({"detail": f"request body over {limit} bytes"}, status_code=413)
    await response(scope, None, send)


async def _parse(request: Request) -> RetrieveRequest | JSONResponse:
    """The request body as JSON (whatever its Content-Type, as official clients vary), or 422."""
    try:
        payload = json.loads(await request.body())
        return RetrieveRequest.model_validate(payload)
    except json.JSONDecodeError as err:
        return JSONResponse({"detail": f"malformed JSON: {err}"}, status_code=422)
    except ValidationError as err:
        detail = err.errors(include_url=False, include_input=False, include_context=False)
        return JSONResponse({"detail": detail}, status_code=422)


class RetrievalService:
    """Cache lookups, then one batched retriever call for the misses of concurrent requests."""

    def __init__(self, retriever: Retriever, cfg: ServerConfig, default_topk: int) -> None:
        self.retriever, self.cfg = retriever, cfg
        self.default_topk = cfg.default_topk or default_topk
        self.cache = LRUCache(cfg.cache_size)
        self.batcher = MicroBatcher(retriever.search, cfg.batch_window_ms / 1000,
                                    cfg.max_batch_queries, cfg.batch_workers)

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Document]]:
        results: list[list[Document] | None] = [self.cache.get((q, topk)) for q in queries]
        misses = [i for i, r in enumerate(results) if r is None]
        if misses:
            fresh = await self.batcher.submit([queries[i] for i in misses], topk)
            for i, docs in zip(misses, fresh, strict=True):
                results[i] = docs
                self.cache.put((queries[i], topk), docs)
        return results

    def health(self) -> dict:
        return {
            "status": "ok",
            "retriever": type(self.retriever).__name__,
            "batches": self.batcher.batches,
            "cache": {"entries": len(self.cache), "hits": self.cache.hits,
                      "misses": self.cache.misses},
        }


def create_app(retriever: Retriever, cfg: ServerConfig | None = None, default_topk: int = 3):
    """The ASGI app serving ``retriever`` (wrapped in the body-size limit)."""
    cfg = cfg or ServerConfig()
    service = RetrievalService(retriever, cfg, default_topk)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await service.batcher.aclose()

    app = FastAPI(title="searchr1 retrieval server", lifespan=lifespan)
    app.state.service = service

    @app.post("/retrieve")
    async def retrieve(request: Request):
        parsed = await _parse(request)
        if isinstance(parsed, JSONResponse):
            return parsed
        if len(parsed.queries) > cfg.max_queries:
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
        return JSONResponse(service.health())

    return BodyLimit(app, cfg.max_body_bytes)


class ServerThread:
    """Run an app with uvicorn in a background thread (tests, benchmarks); ``port=0`` → free."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
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
    uvicorn.run(app, host=server_cfg.host, port=server_cfg.port,
                log_level=server_cfg.log_level, access_log=False)


if __name__ == "__main__":
    register_server_configs()
    main()
