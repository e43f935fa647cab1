"""The retrieval server's guards: 4xx for bad bodies, header/body deadlines, a connection cap."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import h11
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from searchr1.retrievers.server_config import ServerConfig


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
    await _error(413, f"request body over {limit} bytes (server.max_body_bytes)", close=True)(scope, None, send)


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
