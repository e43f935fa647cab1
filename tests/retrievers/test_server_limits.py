"""Per-request bounds of the retrieval server (a real uvicorn server on 127.0.0.1): queries,
queries × topk and answer bytes are capped, and a 413 names the cap and its option."""

from __future__ import annotations

import json

import httpx
import pytest

from searchr1.retrievers.bm25 import BM25Retriever
from searchr1.retrievers.server import ServerConfig, ServerThread, create_app, document_json
from tests.helpers.corpora import CITIES

WORDS = ["Paris France", "Berlin Spree", "Danube Vienna", "Lyon cuisine", "capital city"]


def _queries(n: int) -> list[str]:
    return [f"{WORDS[i % 5]} {i}" for i in range(n)]


@pytest.fixture(scope="module")
def default_server():
    retriever = BM25Retriever(CITIES)
    with ServerThread(create_app(retriever, ServerConfig(), default_topk=3)) as running:
        running.retriever = retriever
        yield running


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/retrieve", json=body, timeout=120)


def _searched(server) -> float:
    return server.retriever.metrics(reset=False)["search/requests"]


def test_defaults_refuse_100k_queries_at_top_50_before_any_search(default_server):
    """The issue's attack: 100,000 queries at topk 50 in one 3 MB POST."""
    before = _searched(default_server)
    r = _post(default_server, {"queries": _queries(100_000), "topk": 50})
    assert r.status_code == 413, r.text[:300]
    body = r.json()
    assert body["limit"] == "server.max_queries" and body["max"] == ServerConfig().max_queries
    assert body["got"] == 100_000
    assert "server.max_queries=" in body["detail"] and "100,000" in body["detail"]
    assert _searched(default_server) == before  # refused before the retriever saw a query


def test_queries_times_topk_over_max_results_is_413_naming_the_option(default_server):
    cfg = ServerConfig()
    n = cfg.max_results // 50 + 1  # under max_queries, over max_results at topk 50
    assert n <= cfg.max_queries
    r = _post(default_server, {"queries": _queries(n), "topk": 50})
    assert r.status_code == 413, r.text[:300]
    assert r.json()["limit"] == "server.max_results" and r.json()["got"] == n * 50
    assert f"server.max_results={cfg.max_results:,}" in r.json()["detail"]
    assert _post(default_server, {"queries": _queries(n), "topk": 3}).status_code == 200


def test_defaults_admit_the_official_step_of_2560_queries_at_top_3():
    cfg = ServerConfig()
    assert cfg.max_queries >= 2560 and cfg.max_results >= 2560 * 3
    assert cfg.max_queries < 100_000 and cfg.max_results < 100_000 * 50


def test_an_answer_over_max_response_bytes_is_413_and_a_small_one_is_served():
    cfg = ServerConfig(max_response_bytes=3000, max_batch_queries=4)
    with ServerThread(create_app(BM25Retriever(CITIES), cfg, default_topk=3)) as server:
        big = _post(server, {"queries": _queries(40), "topk": 3, "return_scores": True})
        small = _post(server, {"queries": _queries(2), "topk": 1, "return_scores": True})
    assert big.status_code == 413 and big.json()["limit"] == "server.max_response_bytes"
    assert "server.max_response_bytes=3,000" in big.json()["detail"]
    assert small.status_code == 200 and len(small.json()["result"]) == 2
    assert small.json()["result"][0][0]["document"]["id"] == "p1"


def test_a_body_over_max_body_bytes_names_the_option():
    cfg = ServerConfig(max_body_bytes=1000)
    with ServerThread(create_app(BM25Retriever(CITIES), cfg, default_topk=3)) as server:
        r = httpx.post(f"{server.url}/retrieve", timeout=30,
                       content=json.dumps({"queries": ["x" * 2000]}).encode())
    assert r.status_code == 413 and "server.max_body_bytes" in r.json()["detail"]


def test_the_answer_is_the_same_json_as_before_slicing():
    """Sliced encoding gives one JSON document, rows in order, bare rows without scores."""
    cfg = ServerConfig(max_batch_queries=2)
    retriever = BM25Retriever(CITIES)
    queries = _queries(7)
    with ServerThread(create_app(retriever, cfg, default_topk=2)) as server:
        r = _post(server, {"queries": queries, "topk": 2})
    direct = retriever.search_sync(queries, 2)
    assert [[d["id"] for d in row] for row in r.json()["result"]] == \
        [[d.id for d in docs] for docs in direct]
    assert r.json()["result"][0][0] == document_json(direct[0][0])


@pytest.mark.parametrize("field", ["max_results", "max_response_bytes", "max_queries"])
def test_non_positive_limits_are_refused_at_start(field):
    with pytest.raises(ValueError, match=f"server.{field}"):
        create_app(BM25Retriever(CITIES), ServerConfig(**{field: 0}))
