"""The retrieval server: Search-R1 protocol round trips, validation, batching, cache, load."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from searchr1.retrievers.micro_batcher import LRUCache, MicroBatcher
from searchr1.retrievers.bm25 import BM25Retriever
from searchr1.retrievers.http import HttpConfig, HttpRetriever
from searchr1.retrievers.server import ServerConfig, ServerThread, create_app, document_json
from tests.helpers.corpora import CITIES

CFG = ServerConfig(max_topk=3, max_queries=40, max_body_bytes=4000)


@pytest.fixture(scope="module")
def server():
    retriever = BM25Retriever(CITIES)
    app = create_app(retriever, CFG, default_topk=2)
    with ServerThread(app) as running:
        running.retriever = retriever
        yield running


def _post(server, body, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/retrieve", json=body, timeout=10, **kwargs)


def test_round_trip_raw_request_with_scores(server):
    r = _post(server, {"queries": ["capital of France", "Danube Vienna"], "topk": 2,
                       "return_scores": True})
    assert r.status_code == 200
    result = r.json()["result"]
    assert len(result) == 2 and len(result[0]) == 2
    first = result[0][0]
    assert first["document"] == {"id": "p1", "contents": CITIES[0].contents}
    assert first["score"] > result[0][1]["score"] > 0
    assert result[1][0]["document"]["id"] == "p3"


def test_return_scores_false_gives_bare_documents(server):
    r = _post(server, {"queries": ["Danube Vienna"], "topk": 1, "return_scores": False})
    assert r.json() == {"result": [[{"id": "p3", "contents": CITIES[2].contents}]]}


def test_missing_topk_uses_default_and_large_topk_is_capped(server):
    default = _post(server, {"queries": ["capital city France Germany"]}).json()["result"][0]
    capped = _post(server, {"queries": ["capital city France Germany Danube"], "topk": 99})
    assert len(default) == 2 and len(capped.json()["result"][0]) == CFG.max_topk


def test_form_encoded_body_is_still_json(server):
    """curl -d sends a form content type; the official clients send JSON: both are read."""
    r = httpx.post(f"{server.url}/retrieve", content=b'{"queries": ["Lyon cuisine"], "topk": 1}',
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "p4"


def test_empty_query_list_gives_empty_result(server):
    assert _post(server, {"queries": []}).json() == {"result": []}


@pytest.mark.parametrize("body", [
    b'{"queries": ["x"', b"not json", b'{"topk": 2}', b'{"queries": "x"}',
    b'{"queries": [1, 2]}', b'{"queries": ["x"], "topk": 0}', b'[]',
])
def test_malformed_requests_are_422(server, body):
    r = httpx.post(f"{server.url}/retrieve", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text


def test_too_many_queries_is_413(server):
    assert _post(server, {"queries": ["q"] * (CFG.max_queries + 1)}).status_code == 413


def test_oversized_body_is_413_with_and_without_content_length(server):
    body = json.dumps({"queries": ["x" * 5000]}).encode()
    assert httpx.post(f"{server.url}/retrieve", content=body).status_code == 413

    def chunks():  # no Content-Length: chunked transfer encoding
        yield body[:3000]
        yield body[3000:]

    assert httpx.post(f"{server.url}/retrieve", content=chunks()).status_code == 413


def test_health(server):
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.json()["retriever"] == "BM25Retriever"


async def test_round_trip_with_our_client(server):
    client = HttpRetriever(HttpConfig(url=f"{server.url}/retrieve"))
    try:
        docs = (await client.search(["capital of Germany"], topk=1))[0]
        direct = server.retriever.search_sync(["capital of Germany"], 1)[0]
    finally:
        await client.aclose()
    assert [(d.id, d.title, d.text) for d in docs] == [(d.id, d.title, d.text) for d in direct]
    assert docs[0].score == pytest.approx(direct[0].score, rel=1e-6)


async def test_load_32_clients_x_50_requests_no_error(server):
    """1,600 requests over loopback from 32 concurrent clients: every one answers 200."""
    queries = ["capital France", "river Spree", "Danube Budapest", "Lyon cuisine", "city"]
    before = server.retriever.metrics(reset=False)["search/requests"]

    async def client(i: int, http: httpx.AsyncClient) -> list[int]:
        codes = []
        for j in range(50):
            body = {"queries": [f"{queries[(i + j) % 5]} {i} {j}"], "topk": 2}
            codes.append((await http.post(f"{server.url}/retrieve", json=body)).status_code)
        return codes

    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        codes = await asyncio.wait_for(
            asyncio.gather(*(client(i, http) for i in range(32))), timeout=120)
    assert sum(len(c) for c in codes) == 1600 and {c for cs in codes for c in cs} == {200}
    served = server.retriever.metrics(reset=False)["search/requests"] - before
    assert served == 1600  # every (distinct) query reached the retriever once


def test_document_json_keeps_an_already_quoted_title():
    from searchr1.retrievers.base import Document

    assert document_json(Document("a", '"T"', "x"))["contents"] == '"T"\nx'
    assert document_json(Document("a", "T", "x"))["contents"] == '"T"\nx'
    assert document_json(Document("a", "", "x"))["contents"] == "x"


async def test_micro_batcher_merges_concurrent_calls_and_slices_topk():
    calls = []

    async def handler(queries, topk):
        calls.append((list(queries), topk))
        return [[f"{q}-{i}" for i in range(topk)] for q in queries]

    batcher = MicroBatcher(handler, window_s=0.05, max_items=10)
    out = await asyncio.gather(batcher.submit(["a", "b"], 1), batcher.submit(["c"], 3))
    await batcher.aclose()
    assert calls == [(["a", "b", "c"], 3)]
    assert out == [[["a-0"], ["b-0"]], [["c-0", "c-1", "c-2"]]]


async def test_micro_batcher_respects_max_items_and_spreads_errors():
    sizes = []

    async def handler(queries, topk):
        sizes.append(len(queries))
        if "boom" in queries:
            raise RuntimeError("backend down")
        return [[q] for q in queries]

    batcher = MicroBatcher(handler, window_s=0.05, max_items=3)
    out = await asyncio.gather(*(batcher.submit([str(i)], 1) for i in range(7)))
    assert out == [[[str(i)]] for i in range(7)] and sizes == [3, 3, 1]
    results = await asyncio.gather(batcher.submit(["boom"], 1), batcher.submit(["ok"], 1),
                                   return_exceptions=True)
    await batcher.aclose()
    assert all(isinstance(r, RuntimeError) for r in results)


def test_lru_cache_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the oldest
    cache.put("c", 3)
    assert (cache.get("b"), cache.get("a"), cache.get("c")) == (None, 1, 3)
    assert (cache.hits, cache.misses, len(cache)) == (3, 1, 2)


async def test_server_cache_answers_repeats_without_the_retriever():
    retriever = BM25Retriever(CITIES)
    app = create_app(retriever, ServerConfig(cache_size=100), default_topk=2)
    with ServerThread(app) as running:
        async with httpx.AsyncClient() as http:
            for _ in range(3):
                r = await http.post(f"{running.url}/retrieve",
                                    json={"queries": ["France", "Germany"], "topk": 2})
                assert r.status_code == 200
    assert retriever.metrics()["search/requests"] == 2  # the first request only


# ---- bad bodies, slow clients, the connection cap (a real server on 127.0.0.1) -------------

import socket  # noqa: E402
import time  # noqa: E402

from searchr1.data.types import Passage  # noqa: E402
from searchr1.retrievers.server import RequestGuard  # noqa: E402

SLOW = ServerConfig(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=200)


@pytest.fixture(scope="module")
def default_server():
    with ServerThread(create_app(BM25Retriever(CITIES), ServerConfig(), default_topk=2)) as running:
        yield running


@pytest.mark.parametrize("body,status", [
    (b'{"queries": ["caf\xe9"]}', 400),  # Latin-1, not UTF-8
    (b"\xff\xff\xff", 400),
    (b'{"queries": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 400),  # 10k deep
    (b"[" * 10_000 + b"]" * 10_000, 400),
    (b'{"queries": ["x"], "topk": ' + b"9" * 5000 + b"}", 422),  # too many digits to parse
    (b'{"queries": ["\\ud800"]}', 422),  # a lone surrogate: no tokenizer takes it
])
def test_undecodable_or_too_deep_bodies_are_4xx_not_500(default_server, body, status):
    r = httpx.post(f"{default_server.url}/retrieve", content=body,
                   headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == status, r.text
    assert httpx.get(f"{default_server.url}/health", timeout=5).status_code == 200


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _read_until_closed(sock: socket.socket, deadline: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``deadline`` passes)."""
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data + b"<reset>"
        if not chunk:
            return data + b"<closed>"
        data += chunk
    return data + b"<still open>"


def _slow_clients(url: str, n: int) -> list[socket.socket]:
    """A third each: connect and send nothing, send half the headers, send headers then
    stall the body."""
    socks = []
    for i in range(n):
        sock = _connect(url)
        if i % 3 == 1:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Le")
        elif i % 3 == 2:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                         b"\r\nContent-Length: 100\r\n\r\n{\"queries\": [")
        socks.append(sock)
    return socks


def test_slow_loris_connections_are_closed_after_the_timeout_while_health_answers():
    app = create_app(BM25Retriever(CITIES), SLOW, default_topk=2)
    with ServerThread(app) as running:
        start = time.monotonic()
        socks = _slow_clients(running.url, 51)
        try:
            with httpx.Client(timeout=2) as http:  # /health stays up while they hang on
                while time.monotonic() - start < 0.7:
                    r = http.get(f"{running.url}/health")
                    assert r.status_code == 200 and r.json()["connections"]["open"] >= 51
                    bad = http.post(f"{running.url}/retrieve", content=b"\xff" * 64)
                    assert bad.status_code == 400
                    time.sleep(0.05)
            answers = [_read_until_closed(s, start + 6) for s in socks]
        finally:
            for sock in socks:
                sock.close()
        elapsed = time.monotonic() - start
        assert all(a.endswith((b"<closed>", b"<reset>")) for a in answers), answers[:3]
        assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers[:3]
        assert 0.9 < elapsed < 6
        health = httpx.get(f"{running.url}/health", timeout=5).json()
        assert health["connections"]["timed_out"] >= 51 and health["connections"]["open"] <= 1
        r = httpx.post(f"{running.url}/retrieve", json={"queries": ["Danube"], "topk": 1})
        assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "p3"


def test_a_slow_but_steady_body_is_cut_at_the_body_timeout():
    """A deadline, not an idle timer: a byte every 0.2 s does not keep the body open."""
    app = create_app(BM25Retriever(CITIES), SLOW, default_topk=2)
    with ServerThread(app) as running:
        sock = _connect(running.url)
        try:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            start, answer = time.monotonic(), b""
            while time.monotonic() - start < 4:
                try:
                    sock.sendall(b" ")
                except OSError:
                    break
                sock.settimeout(0.2)
                try:
                    chunk = sock.recv(4096)
                except TimeoutError:
                    continue
                answer += chunk
                if not chunk or b"408" in answer:
                    break
            assert answer.startswith(b"HTTP/1.1 408 "), answer
            assert time.monotonic() - start < 2.5
        finally:
            sock.close()


def test_keep_alive_requests_are_not_cut_by_the_header_timeout():
    app = create_app(BM25Retriever(CITIES), SLOW, default_topk=2)
    with ServerThread(app) as running, httpx.Client(timeout=5) as http:
        for _ in range(3):  # one connection, idle gaps shorter than uvicorn's keep-alive
            assert http.get(f"{running.url}/health").status_code == 200
            time.sleep(0.6)
        assert http.get(f"{running.url}/health").json()["connections"]["timed_out"] == 0


def test_connections_over_the_cap_get_503_and_are_closed():
    cfg = ServerConfig(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=4)
    app = create_app(BM25Retriever(CITIES), cfg, default_topk=2)
    with ServerThread(app) as running:
        held = [_connect(running.url) for _ in range(4)]
        try:
            extra = _connect(running.url)
            answer = _read_until_closed(extra, time.monotonic() + 3)
            extra.close()
            assert answer.startswith(b"HTTP/1.1 503 ") and answer.endswith(b"<closed>"), answer
            time.sleep(1.5)  # the held ones time out, which frees the slots
            r = httpx.get(f"{running.url}/health", timeout=5)
            assert r.status_code == 200 and r.json()["connections"]["refused"] == 1
        finally:
            for sock in held:
                sock.close()


async def test_request_guard_times_out_a_stalled_body_under_any_asgi_server():
    """The middleware's own deadline (the socket-level one is uvicorn-specific)."""
    async def app(scope, receive, send):  # never reached
        raise AssertionError

    sent = []

    async def receive():
        await asyncio.sleep(60)

    async def send(message):
        sent.append(message)

    guard = RequestGuard(app, ServerConfig(body_timeout_s=0.2))
    scope = {"type": "http", "method": "POST", "headers": [(b"content-length", b"10")]}
    await asyncio.wait_for(guard(scope, receive, send), 5)
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]


# ---- the official trainer's batch, rows served verbatim ------------------------------------


def test_official_trainer_batch_of_2560_queries_returns_2560_results_in_order():
    """Official Search-R1 training POSTs a step's 512 × 5 searches at once; the default caps
    admit it and the server batches them internally (chunks of max_batch_queries)."""
    retriever = BM25Retriever(CITIES)
    app = create_app(retriever, ServerConfig(), default_topk=3)
    words = ["Paris France", "Berlin Spree", "Danube Vienna", "Lyon cuisine", "capital city"]
    queries = [f"{words[i % 5]} {i}" for i in range(2560)]
    with ServerThread(app) as running:
        r = httpx.post(f"{running.url}/retrieve", timeout=60,
                       json={"queries": queries, "topk": 3, "return_scores": True})
        batches = httpx.get(f"{running.url}/health").json()["batches"]
    assert r.status_code == 200, r.text[:300]
    result = r.json()["result"]
    assert len(result) == 2560
    direct = retriever.search_sync(queries, 3)
    assert [[d["document"]["id"] for d in docs] for docs in result] == \
        [[d.id for d in docs] for docs in direct]
    assert batches >= 2560 // ServerConfig().max_batch_queries  # chunked through the batcher


def test_rows_are_served_verbatim_even_when_the_title_begins_with_a_quote():
    row = '""Weird Al" Yankovic"\n"Weird Al" Yankovic is an American musician.'
    corpus = [*CITIES, Passage("w1", row)]
    app = create_app(BM25Retriever(corpus, verbatim_titles=True), ServerConfig(), default_topk=1)  # as over a corpus file
    with ServerThread(app) as running:
        r = httpx.post(f"{running.url}/retrieve", json={"queries": ["Yankovic musician"]})
    assert r.json()["result"] == [[{"id": "w1", "contents": row}]]
