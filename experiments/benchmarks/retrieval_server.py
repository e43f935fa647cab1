"""Benchmark: retrieval in process vs through the HTTP server, and the wrapper's overhead.

For each corpus (``--data`` hotpotqa_mini: 994 real paragraphs, its 100 questions as queries;
``generated``: ``--passages`` seeded pseudo-wiki passages) and each retriever (BM25, MiniLM
flat FAISS), one run measures:

- in-process batched queries/s (``search_sync`` on batches of 64) and the raw library on the
  same queries (bm25s ``tokenize`` + ``retrieve``; encoder + ``faiss.Index.search``), whose
  ratio is the wrapper's cost (doc lookup, ``Document`` objects, blank-query handling);
- the server (``create_app`` in a uvicorn thread on 127.0.0.1, result cache off, every query
  distinct) under 1, 8 and 32 concurrent clients sending one query per request: requests/s,
  p50 and p99 latency; the reference is the in-process batched queries/s.

The clients run in a second process (its own interpreter) on the same cores, so on a small
machine they take CPU from the server: server figures are lower bounds there. For
MiniLM over the generated corpus the passage vectors are random unit vectors (encoding 100k
passages on CPU takes ~30 min; search cost does not depend on the vectors' values); queries
are encoded for real. Prints medians over ``--repeats`` and writes JSON (``--out``):

    uv run python experiments/benchmarks/retrieval_server.py --quick --out /tmp/retrieval.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import bm25s
import httpx
import numpy as np

from searchr1.data.types import Passage
from searchr1.retrievers import dense_build as builder
from searchr1.retrievers.bm25 import BM25Retriever, read_corpus_jsonl
from searchr1.retrievers.dense_docstore import MemoryDocStore
from searchr1.retrievers.dense_encoder import TextEncoder
from searchr1.retrievers.e5 import E5Config, E5Retriever
from searchr1.retrievers.faiss_index import IndexSpec, build_index
from searchr1.retrievers.server import ServerConfig, ServerThread, create_app

ROOT = Path(__file__).resolve().parents[2]
MINI_INDEX = Path("~/.cache/searchr1/test_indexes/hotpotqa_mini_minilm").expanduser()
WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "po")
         for b in ("ran", "bel", "dor", "fin", "gal", "hes", "mur", "nok", "tel", "vis")]
#: queries per in-process run and one-query requests per server level, by mode and kind
COUNTS = {
    "quick": {"bm25_queries": 256, "dense_queries": 64, "bm25_requests": 160,
              "dense_requests": 48},
    "full": {"bm25_queries": 512, "dense_queries": 256, "bm25_requests": 800,
             "dense_requests": 256},
}


def generated_corpus(n: int, seed: int = 0) -> tuple[list[Passage], list[str]]:
    """``n`` passages of 40 Zipf-distributed pseudo-words, and queries drawn from them."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"{w}{i}" for i in range(200) for w in WORDS])  # 20,000 words
    ranks = np.minimum(rng.zipf(1.3, size=(n, 41)) - 1, len(vocab) - 1)
    words = vocab[ranks]
    passages = [Passage(f"g{i}", f'"{words[i, 0].title()}"\n' + " ".join(words[i, 1:]))
                for i in range(n)]
    picks = rng.choice(n, size=512, replace=False)
    queries = [" ".join(rng.choice(words[i, 1:], size=5)) + f" {words[i, 0]}" for i in picks]
    return passages, queries


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def batches(queries: list[str], size: int = 64):
    return [queries[i : i + size] for i in range(0, len(queries), size)]


def raw_bm25(retriever: BM25Retriever, queries: list[str], k: int) -> None:
    for batch in batches(queries):
        tokens = bm25s.tokenize(batch, stopwords=retriever.stopwords,
                                stemmer=retriever._stemmer, show_progress=False, return_ids=False)
        retriever.model.retrieve(tokens, k=k, show_progress=False)


def raw_dense(retriever: E5Retriever, queries: list[str], k: int) -> None:
    for batch in batches(queries):
        retriever.index.search(retriever.encoder.encode(batch, "query"), k)


def in_process(retriever, queries: list[str], repeats: int) -> dict:
    """Wrapped and raw timings interleaved (caches such as the stemmer's warm both alike)."""
    raw_fn = raw_bm25 if isinstance(retriever, BM25Retriever) else raw_dense
    wrapped_fn = lambda: [retriever.search_sync(b, 3) for b in batches(queries)]  # noqa: E731
    wrapped_fn(), raw_fn(retriever, queries, 3)  # warm-up (numba JIT, caches, thread pools)
    wrapped, raw = [], []
    for _ in range(repeats):
        wrapped.append(timed(wrapped_fn, 1))
        raw.append(timed(lambda: raw_fn(retriever, queries, 3), 1))
    return {"queries_per_s": len(queries) / statistics.median(wrapped),
            "raw_queries_per_s": len(queries) / statistics.median(raw)}


def load_in_child(url: str, queries: list[str], clients: int, total: int) -> dict:
    """``load`` run in the client process (its own interpreter, so its own GIL)."""
    return asyncio.run(load(url, queries, clients, total))


async def load(url: str, queries: list[str], clients: int, total: int) -> dict:
    """``clients`` concurrent clients sending ``total`` one-query requests in all."""
    latencies: list[float] = []
    counter = iter(range(total))

    async def client(http: httpx.AsyncClient) -> None:
        for i in counter:
            body = {"queries": [f"{queries[i % len(queries)]} {i}"], "topk": 3}
            start = time.perf_counter()
            response = await http.post(url, json=body)
            latencies.append(time.perf_counter() - start)
            response.raise_for_status()

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(client(http) for _ in range(clients))), 600)
        elapsed = time.perf_counter() - start
    ms = np.asarray(latencies) * 1000
    return {"requests_per_s": total / elapsed, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "requests": total}


def served(retriever, queries: list[str], requests: dict[int, int], pool) -> dict:
    app = create_app(retriever, ServerConfig(cache_size=0), default_topk=3)
    out = {}
    with ServerThread(app) as server:
        url = f"{server.url}/retrieve"
        pool.apply(load_in_child, (url, queries, 4, 16))  # warm-up
        for clients, total in requests.items():
            out[clients] = pool.apply(load_in_child, (url, queries, clients, total))
        out["batches"] = app.app.state.service.batcher.batches  # BodyLimit wraps the app
    return out


def minilm_retrievers(mini_corpus: Path, gen: list[Passage], encoder: TextEncoder):
    """MiniLM over hotpotqa_mini (index built once, cached) and over the generated corpus."""
    builder.build(mini_corpus, MINI_INDEX, encoder, IndexSpec("flat"), shard_size=500)
    mini = E5Retriever.from_index_dir(MINI_INDEX, E5Config(model_path="minilm"))
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((len(gen), encoder.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    synthetic = E5Retriever(encoder, build_index(vectors, IndexSpec("flat")), MemoryDocStore(gen))
    return mini, synthetic


def run(args) -> dict:
    mini_dir = (ROOT / args.data).resolve()
    mini_passages = read_corpus_jsonl(mini_dir / "corpus.jsonl")
    mini_queries = [json.loads(line)["question"] for line in (mini_dir / "questions.jsonl").open()]
    gen, gen_queries = generated_corpus(args.passages)
    encoder = TextEncoder("minilm", batch_size=16)  # fastest per query on CPU (16 vs 64: 1.3x)
    mini_e5, gen_e5 = minilm_retrievers(mini_dir / "corpus.jsonl", gen, encoder)
    setups = {
        "hotpotqa_mini/bm25": (BM25Retriever(mini_passages), mini_queries),
        "hotpotqa_mini/minilm": (mini_e5, mini_queries),
        f"generated_{len(gen)}/bm25": (BM25Retriever(gen), gen_queries),
        f"generated_{len(gen)}/minilm": (gen_e5, gen_queries),
    }
    results = {}
    pool = multiprocessing.get_context("spawn").Pool(1)  # the clients' process
    for name, (retriever, queries) in setups.items():
        dense = isinstance(retriever, E5Retriever)
        kind = "dense" if dense else "bm25"
        qs = queries[: args.counts[f"{kind}_queries"]]
        total = args.counts[f"{kind}_requests"]
        requests = {1: max(8, total // 4), 8: total, 32: total}
        print(f"[{name}] {len(qs)} queries in process, server requests {requests}", flush=True)
        results[name] = {"in_process": in_process(retriever, qs, args.repeats),
                         "server": served(retriever, qs, requests, pool)}
    pool.close()
    return results


def table(results: dict) -> str:
    rows = ["| setup | figure | value | reference (same run) | ratio |", "|---|---|---|---|---|"]
    for name, r in results.items():
        ip, srv = r["in_process"], r["server"]
        rows.append(f"| {name} | in-process batched q/s (ref: raw library) | "
                    f"{ip['queries_per_s']:.0f} | {ip['raw_queries_per_s']:.0f} | "
                    f"{ip['queries_per_s'] / ip['raw_queries_per_s']:.2f} |")
        for c in (1, 8, 32):
            s = srv[c]
            rows.append(f"| {name} | server req/s @{c} clients (p50 {s['p50_ms']:.1f} ms, "
                        f"p99 {s['p99_ms']:.1f} ms; ref: in-process q/s) | "
                        f"{s['requests_per_s']:.0f} | {ip['queries_per_s']:.0f} | "
                        f"{s['requests_per_s'] / ip['queries_per_s']:.2f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="../shared/data/hotpotqa_mini", help="relative to the repo")
    p.add_argument("--passages", type=int, default=100_000)
    p.add_argument("--quick", action="store_true", help="< 2 minutes on 2 CPU cores")
    p.add_argument("--repeats", type=int, default=3, help="in-process timings (median)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    args.counts = COUNTS["quick" if args.quick else "full"]
    started, load_before = time.time(), os.getloadavg()[0]
    results = run(args)
    print(table(results))
    meta = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "quick": args.quick, "seconds": round(time.time() - started, 1)}
    print(f"\n{meta}")
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
