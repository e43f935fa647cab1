"""Fair batching: a large request is served a chunk at a time, in turn with small ones; the
load test runs a real server process on 127.0.0.1 with one large client and 8 small ones."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np

from searchr1.retrievers.fair_batcher import FairBatcher
from tests.helpers.server_process import queries, server_process, small_clients, write_corpus


def _recording_handler(log: list[list[str]], delay_s: float = 0.0):
    async def handler(batch: list[str], topk: int) -> list[list[str]]:
        log.append(list(batch))
        await asyncio.sleep(delay_s)
        return [[f"{q}#{i}" for i in range(topk)] for q in batch]
    return handler


async def test_a_small_request_behind_a_large_one_is_in_the_next_batch():
    batches: list[list[str]] = []
    batcher = FairBatcher(_recording_handler(batches, 0.01), window_s=0.0, max_items=10)
    large = asyncio.create_task(batcher.submit([f"L{i}" for i in range(100)], 2))
    await asyncio.sleep(0.005)  # the large request's first chunk is running
    small = await batcher.submit(["s"], 1)
    assert small == [["s#0"]]
    assert batches[1] == ["L10", "L11", "L12", "L13", "L14", "s"]  # next, with a share of L
    assert len(await large) == 100 and (await large)[99] == ["L99#0", "L99#1"]
    assert all(len(b) <= 10 for b in batches)
    await batcher.aclose()


async def test_waiting_requests_share_each_batch_and_keep_their_order():
    batches: list[list[str]] = []
    batcher = FairBatcher(_recording_handler(batches), window_s=0.02, max_items=6)
    out = await asyncio.gather(batcher.submit([f"a{i}" for i in range(9)], 1),
                               batcher.submit(["b0", "b1"], 2), batcher.submit(["c0"], 1))
    assert out[0] == [[f"a{i}#0"] for i in range(9)]
    assert out[1] == [["b0#0", "b0#1"], ["b1#0", "b1#1"]] and out[2] == [["c0#0"]]
    assert batches[0] == ["a0", "a1", "b0", "b1", "c0"]  # a share of 6 // 3 each
    assert batches[1:] == [["a2", "a3", "a4", "a5", "a6", "a7"], ["a8"]]
    await batcher.aclose()


async def test_saturation_reports_the_queue_and_errors_reach_every_request():
    release = asyncio.Event()

    async def handler(batch, topk):
        await release.wait()
        raise RuntimeError("index gone")

    batcher = FairBatcher(handler, window_s=0.0, max_items=4)
    calls = [asyncio.create_task(batcher.submit([f"q{i}{j}" for j in range(6)], 1))
             for i in range(2)]
    await asyncio.sleep(0.05)
    queue = batcher.saturation()
    assert queue["requests"] == 2 and queue["queued_queries"] == 8 and queue["busy_workers"] == 1
    assert queue["oldest_wait_s"] >= 0.04
    release.set()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert batcher.saturation()["requests"] == 0
    await batcher.aclose()


# ---- load: one large client and 8 small ones against a real server process -----------------

SMALL_CLIENTS, SMALL_REQUESTS, LARGE_QUERIES, CHUNK = 8, 8, 4096, 32


async def _small_clients(url: str, tag: str) -> list[float]:
    per_client = [queries(SMALL_REQUESTS, seed=100 + i, tag=f"{tag}{i}x")
                  for i in range(SMALL_CLIENTS)]
    return await small_clients(url, per_client)


async def _chunk_seconds(url: str) -> float:
    """The median time of a request of one chunk's queries, unloaded."""
    times = []
    async with httpx.AsyncClient(timeout=60) as http:
        for n in range(3):
            start = time.perf_counter()
            r = await http.post(f"{url}/retrieve", json={"queries": queries(CHUNK, tag=f"c{n}x")})
            times.append(time.perf_counter() - start)
            assert r.status_code == 200
    return float(np.median(times))


async def _load(url: str) -> tuple[list[float], float, list[float], list[dict]]:
    """Small-client latencies unloaded, one chunk's time, then small-client latencies with
    a large client sending 4,096-query requests back to back; and ``/health`` meanwhile."""
    unloaded, chunk_s = await _small_clients(url, "u"), await _chunk_seconds(url)
    stop, health, large_done = asyncio.Event(), [], []

    async def large(http: httpx.AsyncClient) -> None:
        n = 0
        while not stop.is_set():
            body = {"queries": queries(LARGE_QUERIES, seed=7 + n, tag=f"L{n}x"), "topk": 3}
            r = await http.post(f"{url}/retrieve", json=body)
            assert r.status_code == 200 and r.content.startswith(b'{"result":[')  # no parse here
            large_done.append(r)
            n += 1

    async def watch(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            health.append((await http.get(f"{url}/health")).json())
            await asyncio.sleep(0.05)

    async with httpx.AsyncClient(timeout=120) as http:
        tasks = [asyncio.create_task(large(http)), asyncio.create_task(watch(http))]
        await asyncio.sleep(0.3)  # the large request is in
        loaded = await _small_clients(url, "l")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    assert large_done, "the large client finished no request"
    assert len(large_done[-1].json()["result"]) == LARGE_QUERIES
    return unloaded, chunk_s, loaded, health


def test_small_clients_stay_fast_while_a_large_client_loads_the_server(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", 2000)
    with server_process(corpus, tmp_path / "server", ["server.cache_size=0",
                        f"server.max_batch_queries={CHUNK}"]) as server:
        httpx.post(f"{server.url}/retrieve", json={"queries": queries(64, tag="w")}, timeout=60)
        unloaded, chunk_s, loaded, health = asyncio.run(asyncio.wait_for(_load(server.url), 240))
        final = httpx.get(f"{server.url}/health", timeout=10).json()
    p99 = {name: float(np.percentile(t, 99)) for name, t in
           (("unloaded", unloaded), ("loaded", loaded))}
    bound = 2 * p99["unloaded"] + chunk_s + 0.3  # the target, plus scheduling slack
    assert len(loaded) == SMALL_CLIENTS * SMALL_REQUESTS
    assert p99["loaded"] <= bound, (p99, chunk_s)
    busy = [h["queue"] for h in health if h["queue"]["requests"] > 0]
    assert busy and max(q["queued_queries"] for q in busy) > CHUNK
    assert max(q["oldest_wait_s"] for q in busy) > 0
    assert final["queue"]["requests"] == 0 and final["queue"]["queued_queries"] == 0
