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
