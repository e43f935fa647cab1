"""Benchmark: the retrieval server's per-request bounds, measured on a real server process.

Starts ``python -m searchr1.retrievers.server retriever=bm25`` over a corpus (default the
994 real paragraphs of hotpotqa_mini, 571 characters on average, as wiki-18's passages) with
the default limits and the result cache off, and measures:

- the server's resident memory at rest and its peak (``VmHWM``) after the largest request
  the defaults admit (``max_queries`` queries at ``topk = max_results // max_queries``, with
  scores), and the seconds and bytes of that answer;
- the issue's attack (100,000 queries at topk 50): the status, how fast it is refused, and
  that the peak does not move;
- 8 small clients (one query per request) alone, then while a large client sends the
  largest admitted requests back to back: p50 / p99 latency, against the target
  ``2 × unloaded + one chunk`` (one chunk: a request of ``max_batch_queries`` queries at the
  large client's topk, alone).

The small clients run in this process and the large one in another, on the same cores as
the server, so on a small machine they take CPU from it. Writes JSON with ``--out``:

    uv run python experiments/benchmarks/retrieval_server_limits.py --out /tmp/limits.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import numpy as np

from searchr1.retrievers.server_config import ServerConfig
from tests.helpers.server_process import server_process, small_clients

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT.parent.parent / "shared" / "data" / "hotpotqa_mini"


def make_queries(questions: list[str], n: int, tag: str) -> list[str]:
    """``n`` distinct queries (the questions again with a unique number: every one a miss)."""
    return [f"{questions[i % len(questions)]} {tag}{i}" for i in range(n)]


async def timed_post(http: httpx.AsyncClient, url: str, body: dict) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    r = await http.post(f"{url}/retrieve", json=body)
    return r, time.perf_counter() - start


async def largest_and_attack(server, questions: list[str], cfg: ServerConfig) -> dict:
    topk = cfg.max_results // cfg.max_queries
    out = {"rss_idle_mib": server.memory_kib("VmRSS") / 1024,
           "peak_before_mib": server.memory_kib() / 1024, "largest": []}
    async with httpx.AsyncClient(timeout=600) as http:
        for n in range(2):
            body = {"queries": make_queries(questions, cfg.max_queries, f"big{n}x"), "topk": topk,
                    "return_scores": True}
            r, seconds = await timed_post(http, server.url, body)
            assert r.status_code == 200, r.text[:300]
            out["largest"].append({"queries": cfg.max_queries, "topk": topk, "seconds": seconds,
                                   "answer_mib": len(r.content) / 2**20,
                                   "peak_after_mib": server.memory_kib() / 1024})
        attack = {"queries": make_queries(questions, 100_000, "atk"), "topk": 50}
        r, seconds = await timed_post(http, server.url, attack)
        out["attack"] = {"status": r.status_code, "seconds": seconds, "body": r.json(),
                         "request_mib": len(json.dumps(attack)) / 2**20,
                         "peak_after_mib": server.memory_kib() / 1024}
    return out


def large_client(url: str, queries: list[str], topk: int, stop, seconds) -> None:
    """In its own process: the largest admitted request, back to back until ``stop``."""
    with httpx.Client(timeout=600) as http:
        while not stop.is_set():
            start = time.perf_counter()
            r = http.post(f"{url}/retrieve", json={"queries": queries, "topk": topk,
                                                   "return_scores": True})
            r.raise_for_status()
            seconds.append(time.perf_counter() - start)


async def fairness(url: str, questions: list[str], cfg: ServerConfig, clients: int,
                   requests: int) -> dict:
    def per_client(tag):
        return [make_queries(questions[i::clients], requests, f"{tag}{i}x") for i in range(clients)]

    topk = cfg.max_results // cfg.max_queries
    unloaded = await small_clients(url, per_client("u"))
    async with httpx.AsyncClient(timeout=600) as http:
        chunk = [(await timed_post(http, url, {"queries": make_queries(
            questions, cfg.max_batch_queries, f"c{n}x"), "topk": topk, "return_scores": True}))[1]
            for n in range(3)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        stop, large = manager.Event(), manager.list()
        proc = ctx.Process(target=large_client, args=(
            url, make_queries(questions, cfg.max_queries, "L"), topk, stop, large))
        proc.start()
        await asyncio.sleep(3.0)  # the process is up and its first request is in
        loaded = await small_clients(url, per_client("l"))
        stop.set()
        proc.join(600)
        large = list(large)
    ms = {k: np.asarray(v) * 1000 for k, v in (("unloaded", unloaded), ("loaded", loaded))}
    out = {k: {"p50_ms": float(np.percentile(v, 50)), "p99_ms": float(np.percentile(v, 99)),
               "requests": len(v)} for k, v in ms.items()}
    out["chunk_ms"] = float(np.median(chunk)) * 1000
    out["target_ms"] = 2 * out["unloaded"]["p99_ms"] + out["chunk_ms"]
    out["large_request_s"] = large
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=MINI, help="folder with corpus.jsonl and "
                   "questions.jsonl")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=20, help="per small client")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    cfg = ServerConfig()
    questions = [json.loads(line)["question"] for line in (args.data / "questions.jsonl").open()]
    started, load_before = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, \
            server_process(args.data / "corpus.jsonl", Path(tmp) / "server",
                           ["server.cache_size=0"]) as server:
        asyncio.run(small_clients(server.url, [make_queries(questions, 4, "warm")]))
        memory = asyncio.run(largest_and_attack(server, questions, cfg))
        latency = asyncio.run(fairness(server.url, questions, cfg, args.clients, args.requests))
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "seconds": round(time.time() - started, 1)}
    results = {"meta": meta, "limits": {k: getattr(cfg, k) for k in (
        "max_queries", "max_results", "max_response_bytes", "max_body_bytes",
        "max_batch_queries", "max_topk")}, "memory": memory, "latency": latency}
    print(json.dumps(results, indent=1, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
