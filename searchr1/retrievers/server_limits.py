"""Per-request bounds of the retrieval server, and the answer encoded within them.

One request must not be able to take the server down: the queries it sends, the results it
asks for (queries × topk) and the bytes of its answer are each capped (``ServerConfig``), and
a request past a cap is answered 413 with a body that names the cap, its value and the
option that sets it. The answer is encoded a slice of queries at a time, yielding to the
event loop between slices, so a large answer neither stalls other clients nor grows past
``max_response_bytes`` before it is refused.
"""

from __future__ import annotations

import asyncio
import json

from fastapi.responses import JSONResponse, Response

from searchr1.retrievers.base import Document
from searchr1.retrievers.server_config import ServerConfig


def too_large(limit: str, maximum: int, got: int, what: str, advice: str) -> JSONResponse:
    """A 413 whose body names the limit (``server.<limit>``), its value and what was asked."""
    detail = (f"{what}: {got:,} > server.{limit}={maximum:,}. {advice} (the server's limit is "
              f"set with server.{limit}=N on its command line)")
    return JSONResponse({"detail": detail, "limit": f"server.{limit}", "max": maximum,
                         "got": got}, status_code=413)


def over_request_caps(n_queries: int, topk: int, cfg: ServerConfig) -> JSONResponse | None:
    """The 413 for a request with too many queries or results (queries × ``topk``), else None."""
    if cfg.max_queries is not None and n_queries > cfg.max_queries:
        return too_large("max_queries", cfg.max_queries, n_queries, "too many queries in one "
                         "request", "Send them in several requests")
    if n_queries * topk > cfg.max_results:
        return too_large("max_results", cfg.max_results, n_queries * topk,
                         f"too many results asked for ({n_queries:,} queries × topk {topk})",
                         "Send fewer queries per request or a smaller topk")
    return None


def document_json(doc: Document) -> dict:
    """A document in the corpus row format: the row's own ``contents`` verbatim when the
    retriever kept it, else rebuilt as ``'"Title"\\ntext'`` (retrievers without rows)."""
    if doc.contents is not None:
        return {"id": doc.id, "contents": doc.contents}
    title = doc.title
    if title and not title.startswith('"'):
        title = f'"{title}"'
    return {"id": doc.id, "contents": f"{title}\n{doc.text}" if title else doc.text}


def _encode_slice(results: list[list[Document]], scores: bool) -> bytes:
    if scores:
        rows = [[{"document": document_json(d), "score": d.score} for d in docs]
                for docs in results]
    else:
        rows = [[document_json(d) for d in docs] for docs in results]
    return ",".join(json.dumps(row, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
                    for row in rows).encode("utf-8")


async def encode_answer(results: list[list[Document]], scores: bool, cfg: ServerConfig,
                        slice_size: int) -> Response:
    """``{"result": [...]}`` as JSON, or the 413 once it would pass ``max_response_bytes``."""
    parts, size = [b'{"result":['], 13
    for start in range(0, len(results), slice_size):
        if start:
            await asyncio.sleep(0)  # let other requests' work run between slices
            parts.append(b",")
        part = _encode_slice(results[start : start + slice_size], scores)
        size += len(part) + 1
        if size > cfg.max_response_bytes:
            return too_large("max_response_bytes", cfg.max_response_bytes, size,
                             f"the answer passed the byte limit after {start:,} of "
                             f"{len(results):,} queries", "Send fewer queries per request "
                             "or a smaller topk")
        parts.append(part)
    parts.append(b"]}")
    return Response(b"".join(parts), media_type="application/json")
