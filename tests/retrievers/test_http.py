"""retriever=http: protocol parsing, retries with backoff, micro-batching against our server."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from searchr1.retrievers.base import RETRIEVERS, SearchError
from searchr1.retrievers.bm25 import BM25Retriever
from searchr1.retrievers.http import HttpConfig, HttpRetriever, parse_item, parse_response
from searchr1.retrievers.server import ServerConfig, ServerThread, create_app
from tests.helpers.corpora import CITIES

TINY = CITIES[:3]
OK = {"result": [[{"document": {"id": "p1", "contents": '"Paris"\nParis is big.'},
                   "score": 1.5}]]}


def _client(url: str, **overrides) -> HttpRetriever:
    settings = {"backoff_s": 0.05, "max_backoff_s": 0.2, "batch_window_ms": 1, **overrides}
    cfg = HttpConfig(url=url, **settings)
    return HttpRetriever(cfg)


def test_registered_with_search_r1_defaults():
    assert RETRIEVERS.get("http") is HttpRetriever
    assert HttpConfig().url == "http://127.0.0.1:8000/retrieve"


def test_parse_items_with_and_without_scores():
    scored = parse_item({"document": {"id": "7", "contents": '"Hamlet"\nA play.'}, "score": 2.0})
    assert (scored.id, scored.title, scored.text, scored.score) == ("7", "Hamlet", "A play.", 2.0)
    web = parse_item({"document": {"contents": '"Hamlet"\nA play.'}})  # web search: no id/score
    assert (web.title, web.text, web.score) == ("Hamlet", "A play.", 0.0)
    assert web.id.startswith("sha:") and web.id == parse_item({"contents": '"Hamlet"\nA play.'}).id
    plain = parse_item({"title": "T", "text": "body", "url": "https://x"})
    assert (plain.title, plain.text, plain.url) == ("T", "body", "https://x")
    with pytest.raises(ValueError):
        parse_response({"result": [[]]}, n_queries=2)


async def test_sends_the_search_r1_payload(httpserver):
    httpserver.expect_request("/retrieve", method="POST").respond_with_json(OK)
    client = _client(httpserver.url_for("/retrieve"))
    docs = await client.search(["who"], topk=3)
    await client.aclose()
    sent = json.loads(httpserver.log[0][0].data)
    assert sent == {"queries": ["who"], "topk": 3, "return_scores": True}
    assert docs[0][0].id == "p1" and docs[0][0].score == 1.5


async def test_retries_5xx_and_429_with_backoff_then_succeeds(httpserver):
    url = httpserver.url_for("/retrieve")
    httpserver.expect_ordered_request("/retrieve").respond_with_data("", status=503)
    httpserver.expect_ordered_request("/retrieve").respond_with_data(
        "", status=429, headers={"Retry-After": "0.15"})
    httpserver.expect_ordered_request("/retrieve").respond_with_json(OK)
    client = _client(url, max_retries=3)
    start = time.perf_counter()
    docs = await client.search(["q"], topk=1)
    elapsed = time.perf_counter() - start
    await client.aclose()
    assert docs[0][0].title == "Paris" and client.posts == 3
    assert elapsed >= 0.05 + 0.15 - 0.01  # backoff 0.05 after the 503, Retry-After after 429
    assert client.metrics()["search/error_rate"] == 0.0


async def test_gives_up_after_max_retries(httpserver):
    httpserver.expect_request("/retrieve").respond_with_data("", status=500)
    client = _client(httpserver.url_for("/retrieve"), max_retries=2)
    with pytest.raises(SearchError, match="after 3 attempts"):
        await client.search(["q"], topk=1)
    await client.aclose()
    assert client.posts == 3 and client.metrics()["search/error_rate"] == 1.0


async def test_client_errors_and_malformed_answers_fail_at_once(httpserver):
    httpserver.expect_ordered_request("/retrieve").respond_with_data("nope", status=400)
    httpserver.expect_ordered_request("/retrieve").respond_with_data("{not json", status=200)
    client = _client(httpserver.url_for("/retrieve"), max_retries=3)
    with pytest.raises(SearchError, match="HTTP 400"):
        await client.search(["q"], topk=1)
    with pytest.raises(SearchError, match="malformed"):
        await client.search(["q"], topk=1)
    await client.aclose()
    assert client.posts == 2


async def test_connection_refused_is_retried_then_raised():
    client = _client("http://127.0.0.1:9/retrieve", max_retries=1)
    with pytest.raises(SearchError, match="transport error"):
        await client.search(["q"], topk=1)
    await client.aclose()
    assert client.posts == 2


@pytest.fixture(scope="module")
def bm25_server():
    retriever = BM25Retriever(TINY)
    app = create_app(retriever, ServerConfig(cache_size=0, batch_window_ms=0), default_topk=3)
    with ServerThread(app) as running:
        running.retriever = retriever
        yield running


async def test_micro_batches_concurrent_searches_into_one_post(bm25_server):
    client = _client(f"{bm25_server.url}/retrieve", batch_window_ms=50, max_concurrency=2)
    queries = [["capital France"], ["Spree capital"], ["Danube Budapest", "Paris"]]
    out = await asyncio.gather(*(client.search(q, topk=k) for q, k in zip(queries, (1, 2, 1))))
    await client.aclose()
    assert client.posts == 1
    assert [[d.id for d in docs] for docs in out[0]] == [["p1"]]
    assert [d.id for d in out[1][0]][0] == "p2" and len(out[1][0]) == 2
    assert [[d.id for d in docs] for docs in out[2]] == [["p3"], ["p1"]]
    assert client.metrics()["search/requests"] == 4


async def test_max_batch_queries_splits_posts(bm25_server):
    client = _client(f"{bm25_server.url}/retrieve", batch_window_ms=50, max_batch_queries=2)
    out = await asyncio.gather(*(client.search([f"capital {i}"], topk=1) for i in range(5)))
    await client.aclose()
    assert len(out) == 5 and client.posts == 3



def test_rollout_group_searches_through_our_server(bm25_server):
    """A rollout group's concurrent searches go through the client and server, merged."""
    from searchr1.data.types import QAExample
    from searchr1.rollout.engine import RolloutEngine, SamplingSettings
    from searchr1.schemas import RolloutConfig
    from tests.helpers.rollout_fakes import CharProtocol, ScriptedSampler

    topics = ["Danube Vienna", "capital France", "Spree Germany", "Danube Budapest"]
    script = lambda prompt, i: f"S:{topics[i]};" if "[" not in prompt else "A:x;"  # noqa: E731
    client = _client(f"{bm25_server.url}/retrieve", batch_window_ms=50)
    engine = RolloutEngine(CharProtocol(), client, topk=1, cfg=RolloutConfig())
    example = QAExample(id="q", question="where", golden_answers=("x",), data_source="t")

    async def go():
        try:
            return await engine.rollout_group(ScriptedSampler(script), example, 4,
                                              SamplingSettings(temperature=0.0))
        finally:
            await client.aclose()

    trajectories = asyncio.run(go())
    assert [t.turns[0].documents[0].id for t in trajectories] == ["p3", "p1", "p2", "p3"]
    assert client.posts == 1  # four concurrent searches, one POST
