"""The retrieval server's settings (``server`` in ``conf/server.yaml``) and their checks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerConfig:
    """Hydra schema of ``server`` (``conf/server.yaml``)."""

    # interface to bind; 127.0.0.1 keeps the server local (0.0.0.0 exposes it)
    host: str = "127.0.0.1"
    port: int = 8000
    # topk when a request sends none (None → retriever.topk), and the cap on any request's topk
    default_topk: int | None = None
    max_topk: int = 50
    # per-request caps, each answered 413 when passed (the body names the option): queries in
    # one request (the official trainer sends a step's 512 × 5 = 2,560 searches in one POST),
    # results (queries × topk), the JSON answer's bytes, and the body's bytes (64 MiB: 2,560
    # queries of 25 KB each). None disables the query cap (the official server has none).
    max_queries: int | None = 4096
    max_results: int = 32_768
    max_response_bytes: int = 64 * 1024 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    # slow clients: seconds to send the request headers (from connecting, or from the first
    # byte of a keep-alive connection's next request), then seconds to send the whole body;
    # past either → HTTP 408 and the connection closed
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    # most open connections; one more is answered 503 and closed at once
    max_connections: int = 512
    # fair dynamic batching: wait this long for more requests, then run at most
    # max_batch_queries queries per retriever call, taken in turn from every waiting request
    # (a large request is served a chunk at a time, between the other clients' queries)
    batch_window_ms: float = 1.0
    max_batch_queries: int = 256
    batch_workers: int = 1
    # LRU cache of (query, topk) → documents; 0 disables
    cache_size: int = 10_000
    # uvicorn log level
    log_level: str = "warning"


_POSITIVE = ("header_timeout_s", "body_timeout_s", "max_connections", "max_body_bytes",
             "max_batch_queries", "batch_workers", "max_results", "max_response_bytes", "max_topk")


def check_server_config(cfg: ServerConfig) -> None:
    """Raise ``ValueError`` naming every setting that must be positive and is not."""
    bad = [name for name in _POSITIVE if not getattr(cfg, name) > 0]
    if cfg.max_queries is not None and cfg.max_queries < 1:
        bad.append("max_queries")
    if bad:
        raise ValueError(f"server.{', server.'.join(bad)} must be > 0")
