"""BM25 retriever: quality on real HotpotQA paragraphs, persistence, ranking and metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

from searchr1.retrievers.base import RETRIEVERS, Document
from searchr1.retrievers.bm25 import BM25Config, BM25Retriever, read_corpus_jsonl
from tests.helpers.corpora import CITIES, HOTPOTQA_MINI


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def mini():
    if not (HOTPOTQA_MINI / "corpus.jsonl").is_file():
        pytest.skip("shared/data/hotpotqa_mini is absent")
    questions = [json.loads(line) for line in (HOTPOTQA_MINI / "questions.jsonl").open()]
    return BM25Retriever.from_corpus_file(HOTPOTQA_MINI / "corpus.jsonl"), questions


def test_registered_and_config_defaults():
    assert RETRIEVERS.get("bm25") is BM25Retriever
    cfg = BM25Config()
    assert (cfg.name, cfg.topk, cfg.corpus_path, cfg.stemmer) == ("bm25", 3, None, "english")


def test_hotpotqa_mini_gold_title_hit_rate(mini):
    retriever, questions = mini
    results = _run(retriever.search([q["question"] for q in questions], topk=3))
    hits = []
    for q, docs in zip(questions, results, strict=True):
        titles = {d.title for d in docs}
        hits += [t in titles for t in q["supporting_titles"]]
    rate = sum(hits) / len(hits)
    assert abs(rate - 0.685) <= 0.05, rate


def test_ranking_best_first_and_fields(mini):
    retriever, questions = mini
    docs = _run(retriever.search([questions[1]["question"]], topk=10))[0]
    assert len(docs) == 10
    scores = [d.score for d in docs]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0
    first = retriever.passages[[p.id for p in retriever.passages].index(docs[0].id)]
    assert (docs[0].title, docs[0].text) == (first.title, first.text)


def test_save_load_round_trip(tmp_path):
    if not (HOTPOTQA_MINI / "corpus.jsonl").is_file():
        pytest.skip("shared/data/hotpotqa_mini is absent")
    passages = read_corpus_jsonl(HOTPOTQA_MINI / "corpus.jsonl")
    queries = [json.loads(line)["question"] for line in (HOTPOTQA_MINI / "questions.jsonl").open()][:20]
    built = BM25Retriever(passages, index_dir=tmp_path / "idx")
    loaded = BM25Retriever(passages, index_dir=tmp_path / "idx")
    assert not built.loaded_from_disk and loaded.loaded_from_disk
    assert _run(built.search(queries, 5)) == _run(loaded.search(queries, 5))


def test_fingerprint_mismatch_rebuilds(tmp_path):
    BM25Retriever(CITIES, index_dir=tmp_path)
    other = BM25Retriever(CITIES[:3], index_dir=tmp_path)
    assert not other.loaded_from_disk
    assert BM25Retriever(CITIES[:3], index_dir=tmp_path).loaded_from_disk


@pytest.mark.parametrize("verbatim", [False, True])
def test_tiny_corpus_answer_ranks_first(verbatim):
    retriever = BM25Retriever(CITIES, verbatim_titles=verbatim)
    docs = _run(retriever.search(["What is the capital of France?"], topk=2))[0]
    assert docs[0] == Document(
        id="p1",
        title="Paris",
        text="Paris is the capital and largest city of France.",
        score=docs[0].score,
        # verbatim: the row as the server serves it; else the title/text split only
        contents=CITIES[0].contents if verbatim else None,
    )
    assert docs[0].score > docs[1].score


def test_empty_queries_and_topk_clamp():
    retriever = BM25Retriever(CITIES)
    out = _run(retriever.search(["", "   ", "Danube Vienna", "the of"], topk=50))
    assert out[0] == [] and out[1] == [] and out[3] == []  # "the of": stop words only
    assert [d.id for d in out[2]][0] == "p3" and len(out[2]) <= len(CITIES)
    everything = _run(retriever.search(["city capital France Germany Danube"], topk=50))[0]
    assert len(everything) == len(CITIES)


def test_one_retrieve_call_per_search(monkeypatch):
    retriever = BM25Retriever(CITIES)
    calls = []
    original = retriever.model.retrieve
    monkeypatch.setattr(
        retriever.model, "retrieve", lambda q, **kw: calls.append(len(q)) or original(q, **kw)
    )
    _run(retriever.search(["France", "Germany", "", "Vienna"], topk=1))
    assert calls == [3]


def test_metrics_counters_move(monkeypatch):
    retriever = BM25Retriever(CITIES)
    _run(retriever.search(["France", "Germany"], topk=1))
    m = retriever.metrics()
    assert m["search/requests"] == 2.0 and m["search/error_rate"] == 0.0
    assert m["search/success_rate"] == 1.0

    def boom(*args, **kwargs):
        raise RuntimeError("index gone")

    _run(retriever.search(["France"], topk=1))
    monkeypatch.setattr(retriever.model, "retrieve", boom)
    with pytest.raises(RuntimeError):
        _run(retriever.search(["France"], topk=1))
    m = retriever.metrics()
    assert m["search/requests"] == 2.0 and m["search/error_rate"] == 0.5
    assert retriever.metrics()["search/requests"] == 0.0  # reset


def test_building_an_index_logs_nothing_below_warning(caplog):
    """bm25s sets its own logger to DEBUG: every run's log carried "Building index from IDs"."""
    import logging

    caplog.set_level(logging.DEBUG)
    BM25Retriever(CITIES)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("bm25s")] == []
