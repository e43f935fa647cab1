"""The shared search cache: hits, no caching of failures or empties, fingerprints, processes."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from searchr1.build import build_dataset, build_retriever
from searchr1.config import register_configs
from searchr1.data.types import Passage
from searchr1.retrievers.base import Document, Retriever, SearchError
from searchr1.retrievers.bm25 import BM25Config, BM25Retriever
from searchr1.retrievers.cache import (
    CachedRetriever,
    CacheMode,
    SearchCache,
    retriever_fingerprint,
    with_cache_fields,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


class Scripted(Retriever):
    """Returns one document per query named after it; ``fail``/``empty`` queries misbehave."""

    def __init__(self, fail: set[str] = frozenset(), empty: set[str] = frozenset()) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.fail, self.empty = set(fail), set(empty)

    async def _search(self, queries, topk):
        self.calls.append(list(queries))
        if self.fail & set(queries):
            raise SearchError("upstream 500")
        return [[] if q in self.empty else [Document(id=f"d-{q}", title=q, text=f"about {q}")]
                for q in queries]


def _cached(tmp_path, inner=None, fingerprint="fp"):
    inner = inner or Scripted()
    return CachedRetriever(inner, tmp_path / "cache.sqlite", fingerprint), inner


async def test_repeated_query_is_a_hit_and_skips_the_retriever(tmp_path):
    cached, inner = _cached(tmp_path)
    first = await cached.search(["paris", "rome"], topk=3)
    again = await cached.search(["rome", "oslo", "rome"], topk=3)
    assert inner.calls == [["paris", "rome"], ["oslo"]]
    assert again[0] == first[1] == [Document(id="d-rome", title="rome", text="about rome")]
    assert again[2] == again[0] and again[1][0].id == "d-oslo"
    m = cached.metrics()
    assert m["search/cache_hit_rate"] == pytest.approx(2 / 5)  # rome twice of 5 lookups
    assert m["search/requests"] == 5 and m["search/upstream_requests"] == 3
    assert cached.metrics()["search/cache_hit_rate"] == 0.0  # reset
    assert (await cached.search(["paris"], topk=2))[0][0].id == "d-paris"
    assert inner.calls[-1] == ["paris"]  # topk is part of the key


async def test_failures_and_empty_results_are_never_cached(tmp_path):
    cached, inner = _cached(tmp_path, Scripted(fail={"bad"}, empty={"void"}))
    with pytest.raises(SearchError):
        await cached.search(["bad"], topk=3)
    assert await cached.search(["void"], topk=3) == [[]]
    inner.fail.clear()
    inner.empty.clear()
    assert (await cached.search(["bad", "void"], topk=3))[0][0].id == "d-bad"
    assert inner.calls == [["bad"], ["void"], ["bad", "void"]]
    m = cached.metrics()
    assert m["search/error_rate"] == pytest.approx(1 / 4)
    assert m["search/empty_rate"] == pytest.approx(1 / 4)  # an empty result is not a success
    assert m["search/success_rate"] == pytest.approx(2 / 4)
    rows = sqlite3.connect(tmp_path / "cache.sqlite").execute(
        "SELECT query FROM search_cache ORDER BY query").fetchall()
    assert rows == [("bad",), ("void",)]


async def test_cache_persists_across_instances_and_separates_fingerprints(tmp_path):
    a, _ = _cached(tmp_path, fingerprint="A")
    await a.search(["q"], topk=3)
    a2, inner_a2 = _cached(tmp_path, fingerprint="A")  # a later run, same retriever
    b, inner_b = _cached(tmp_path, fingerprint="B")  # another retriever, same file
    await a2.search(["q"], topk=3)
    await b.search(["q"], topk=3)
    assert inner_a2.calls == [] and inner_b.calls == [["q"]]


def test_fingerprint_tells_corpora_and_settings_apart():
    one = [Passage("1", '"Paris"\nParis is in France.'), Passage("2", '"Rome"\nRome is old.')]
    two = [Passage("1", '"Paris"\nParis is in Texas.'), Passage("2", '"Rome"\nRome is old.')]
    schema = with_cache_fields(BM25Config)()
    fp = retriever_fingerprint(schema, BM25Retriever(one))
    assert fp == retriever_fingerprint(schema, BM25Retriever(one))
    assert fp != retriever_fingerprint(schema, BM25Retriever(two))  # same ids, other text
    other = with_cache_fields(BM25Config)(stemmer="none")
    assert fp != retriever_fingerprint(other, BM25Retriever(one))
    operational = with_cache_fields(BM25Config)(max_concurrency=2, cache=CacheMode.disk)
    assert fp == retriever_fingerprint(operational, BM25Retriever(one))


def _writer(path: str, worker: int, n: int, out) -> None:
    """One process: write n entries (half shared with every other worker), read them back."""
    cache = SearchCache(path)
    try:
        for i in range(n):
            query = f"shared-{i}" if i % 2 else f"w{worker}-{i}"
            doc = Document(id=f"{worker}-{i}", title=query, text="t")
            cache.put_many("fp", 3, {query: [doc]})
            assert cache.get_many("fp", [query], 3)[query]
        out.put(("ok", worker))
    except Exception as err:  # noqa: BLE001 - reported to the parent
        out.put(("error", repr(err)))


def test_concurrent_writer_processes_share_one_file(tmp_path):
    path, workers, n = str(tmp_path / "shared.sqlite"), 4, 60
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, n, out)) for w in range(workers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert sorted(results) == [("ok", w) for w in range(workers)], results
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    count = conn.execute("SELECT COUNT(*) FROM search_cache").fetchone()[0]
    assert count == workers * n // 2 + n // 2  # private rows + one copy of each shared row
    shared = SearchCache(path).get_many("fp", [f"shared-{i}" for i in range(1, n, 2)], 3)
    assert len(shared) == n // 2 and all(len(docs) == 1 for docs in shared.values())


def test_config_option_wraps_the_built_retriever(tmp_path):
    register_configs()
    db = tmp_path / "c.sqlite"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "retriever.cache=disk", f"retriever.cache_path={db}", "data.train_questions=4",
            "data.dev_questions=2", "data.test_questions=2"])
        plain = compose(config_name="config")
    dataset = build_dataset(cfg.data)
    retriever = build_retriever(cfg.retriever, dataset)
    assert isinstance(retriever, CachedRetriever) and retriever.cache.path == db
    assert retriever.passages is retriever.inner.passages  # attributes pass through
    assert not isinstance(build_retriever(plain.retriever, dataset), CachedRetriever)


def test_set_up_statements_retry_while_the_file_is_locked_and_nothing_else():
    """Two processes switching a new file to WAL at once can deadlock, and SQLite answers one
    "database is locked" without waiting: the set-up retries that answer, only that one."""
    from searchr1.retrievers.cache import retry_locked

    answers = [sqlite3.OperationalError("database is locked")] * 3 + ["wal"]
    pauses = []

    def statement():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry_locked(statement, sleep=pauses.append) == "wal" and len(pauses) == 3

    def broken():
        raise sqlite3.OperationalError("no such table: search_cache")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_locked(broken, sleep=pauses.append)

    def always_locked():
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        retry_locked(always_locked, timeout_s=0.05)
