"""retriever=e5: pooling math, MiniLM quality on HotpotQA paragraphs, FAISS indexes,
build_index (resume, layout) and loading a Search-R1-style prebuilt index."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from searchr1.data.types import Dataset, Passage
from searchr1.retrievers import dense_build as builder
from searchr1.retrievers.base import RETRIEVERS
from searchr1.retrievers.bm25 import BM25Retriever
from searchr1.retrievers.dense_docstore import JsonlDocStore
from searchr1.retrievers.dense_encoder import TextEncoder, default_prefixes, mean_pool
from searchr1.retrievers.e5 import E5Config, E5Retriever
from searchr1.retrievers.faiss_index import IndexSpec, build_index, search
from tests.helpers.corpora import CITIES, HOTPOTQA_MINI

TINY = [*CITIES, Passage("p5", '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.')]


class HashEncoder:
    """A deterministic stand-in encoder: a text's vector is seeded by its hash."""

    dim = 8

    def __init__(self, fail_after_batches: int | None = None) -> None:
        self.fail_after = fail_after_batches
        self.encoded: list[str] = []

    def describe(self) -> dict:
        return {"model_path": "hash", "dim": self.dim}

    def encode(self, texts, kind="query", progress=None):
        if self.fail_after is not None and len(self.encoded) >= self.fail_after * 2:
            raise KeyboardInterrupt("simulated kill")
        self.encoded += texts
        rows = [np.random.default_rng(int(hashlib.md5(t.encode()).hexdigest()[:8], 16))
                .standard_normal(self.dim) for t in texts]
        vectors = np.asarray(rows, dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _write_corpus(path: Path, passages: list[Passage]) -> Path:
    path.write_text("".join(json.dumps(p.to_row()) + "\n" for p in passages))
    return path


def _gold_hit_rate(retriever, questions) -> float:
    results = asyncio.run(retriever.search([q["question"] for q in questions], topk=3))
    hits = []
    for q, docs in zip(questions, results, strict=True):
        titles = {d.title for d in docs}
        hits += [t in titles for t in q["supporting_titles"]]
    return sum(hits) / len(hits)


@pytest.fixture(scope="session")
def minilm():
    return TextEncoder("minilm", batch_size=32)


@pytest.fixture(scope="session")
def mini_index(minilm):
    """hotpotqa_mini encoded by build_index (MiniLM, flat) at most once: the folder lives in
    the user cache, and build_index reuses a complete one (its meta.json matches)."""
    if not (HOTPOTQA_MINI / "corpus.jsonl").is_file():
        pytest.skip("shared/data/hotpotqa_mini is absent")
    out = Path("~/.cache/searchr1/test_indexes/hotpotqa_mini_minilm").expanduser()
    builder.build(HOTPOTQA_MINI / "corpus.jsonl", out, minilm, IndexSpec("flat"), shard_size=500,
                  progress=False)
    questions = [json.loads(line) for line in (HOTPOTQA_MINI / "questions.jsonl").open()]
    return out, questions


# ---- math --------------------------------------------------------------------------------

def test_mean_pool_ignores_padding():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]],
                           [[2.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert mean_pool(hidden, mask).tolist() == [[2.0, 3.0], [2.0, 0.0]]


def test_prefix_defaults_by_model():
    assert default_prefixes("minilm") == ("", "")
    assert default_prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert RETRIEVERS.get("e5") is E5Retriever


def test_minilm_embeddings_are_unit_and_prefix_matters(minilm):
    plain = minilm.encode(["capital of France"], "query")
    assert plain.shape == (1, 384) and np.linalg.norm(plain) == pytest.approx(1.0, abs=1e-5)
    e5_style = TextEncoder("minilm", query_prefix="query: ")
    assert float(plain[0] @ e5_style.encode(["capital of France"], "query")[0]) < 0.999
    order = minilm.encode(["a b c d e f", "x"], "passage")  # batch sorted by length inside
    assert np.allclose(order[1], minilm.encode(["x"], "passage")[0], atol=1e-5)


# ---- quality on real HotpotQA paragraphs --------------------------------------------------

def test_minilm_gold_hit_rate_at_3(mini_index):
    out, questions = mini_index
    retriever = E5Retriever.from_config(E5Config(index_dir=str(out), model_path="minilm"))
    assert retriever.index.ntotal == 994
    assert _gold_hit_rate(retriever, questions) >= 0.70


def test_bm25_gold_hit_rate_at_3(mini_index):
    _, questions = mini_index
    assert _gold_hit_rate(BM25Retriever.from_corpus_file(HOTPOTQA_MINI / "corpus.jsonl"), questions) >= 0.68


def test_search_r1_prebuilt_layout_loads_and_agrees(mini_index, tmp_path):
    """A bare flat IP index file + corpus JSONL (Search-R1's e5_Flat.index + wiki-18.jsonl)."""
    out, questions = mini_index
    prebuilt = tmp_path / "e5_Flat.index"
    faiss.write_index(faiss.read_index(str(out / builder.INDEX_FILE)), str(prebuilt))
    cfg = E5Config(index_path=str(prebuilt), corpus_path=str(HOTPOTQA_MINI / "corpus.jsonl"),
                   model_path="minilm")
    loaded = E5Retriever.from_config(cfg)
    built = E5Retriever.from_config(E5Config(index_dir=str(out), model_path="minilm"))
    queries = [q["question"] for q in questions[:10]]
    assert loaded.search_sync(queries, 3) == built.search_sync(queries, 3)
    assert prebuilt.with_suffix(".offsets.npy").is_file()  # the doc store's offsets, cached


# ---- FAISS index types --------------------------------------------------------------------

@pytest.fixture
def one_faiss_thread():
    """OpenMP threads spin; on a busy 2-core machine one thread is much faster."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.mark.parametrize("kind,min_recall", [("flat", 1.0), ("hnsw", 0.9), ("ivfpq", 0.3)])
def test_index_types_against_brute_force(kind, min_recall, one_faiss_thread):
    rng = np.random.default_rng(0)
    base = rng.standard_normal((1000, 32)).astype(np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = base[:50] + 0.05 * rng.standard_normal((50, 32)).astype(np.float32)
    spec = IndexSpec(kind, hnsw_m=16, ivf_nlist=8, pq_m=8, ivf_nprobe=4, pq_nbits=4)
    index = build_index(base, spec)
    if kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = spec.ivf_nprobe
    _, ids = search(index, queries, 5)
    truth = np.argsort(-(queries @ base.T), axis=1)[:, :5]
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(ids, truth, strict=True)])
    assert recall >= min_recall


def test_ivfpq_rejects_bad_settings(one_faiss_thread):
    with pytest.raises(ValueError, match="divide"):
        build_index(np.zeros((100, 30), np.float32), IndexSpec("ivfpq", pq_m=8))
    with pytest.raises(ValueError, match="ivf_nlist"):
        build_index(np.ones((10, 32), np.float32), IndexSpec("ivfpq", ivf_nlist=16, pq_m=8,
                                                             pq_nbits=4))
    with pytest.raises(ValueError, match="valid: flat, hnsw, ivfpq"):
        IndexSpec("lsh").factory_string()


# ---- build_index and the doc store --------------------------------------------------------

def test_build_index_resumes_after_a_kill(tmp_path):
    corpus = _write_corpus(tmp_path / "c.jsonl", TINY)
    killed = HashEncoder(fail_after_batches=2)  # dies encoding the third shard
    with pytest.raises(KeyboardInterrupt):
        builder.build(corpus, tmp_path / "idx", killed, IndexSpec(), shard_size=2, progress=False)
    shards = sorted(p.name for p in (tmp_path / "idx" / "shards").glob("emb_*.npy"))
    assert shards == ["emb_00000.npy", "emb_00001.npy"]
    assert not (tmp_path / "idx" / builder.META_FILE).exists()

    resumed = HashEncoder()
    builder.build(corpus, tmp_path / "idx", resumed, IndexSpec(), shard_size=2, progress=False)
    assert resumed.encoded == [TINY[4].contents]  # only the missing shard
    fresh = HashEncoder()
    builder.build(corpus, tmp_path / "fresh", fresh, IndexSpec(), shard_size=2, progress=False)
    a = faiss.read_index(str(tmp_path / "idx" / builder.INDEX_FILE))
    b = faiss.read_index(str(tmp_path / "fresh" / builder.INDEX_FILE))
    assert np.array_equal(faiss.rev_swig_ptr(a.get_xb(), a.ntotal * a.d),
                          faiss.rev_swig_ptr(b.get_xb(), b.ntotal * b.d))
    again = HashEncoder()
    builder.build(corpus, tmp_path / "idx", again, IndexSpec(), shard_size=2, progress=False)
    assert again.encoded == []  # complete: nothing to do


def test_build_index_refuses_shards_of_other_settings(tmp_path):
    corpus = _write_corpus(tmp_path / "c.jsonl", TINY)
    with pytest.raises(KeyboardInterrupt):
        builder.build(corpus, tmp_path / "idx", HashEncoder(1), IndexSpec(), shard_size=2,
                      progress=False)
    with pytest.raises(ValueError, match="other settings"):
        builder.build(corpus, tmp_path / "idx", HashEncoder(), IndexSpec(), shard_size=3,
                      progress=False)


def test_jsonl_doc_store_reads_rows_by_offset(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"id": "a", "contents": '"Été"\nça va'}, {"id": 7, "contents": '"B"\nb'}]
    path.write_text(json.dumps(rows[0], ensure_ascii=False) + "\n\n" + json.dumps(rows[1]) + "\n")
    store = JsonlDocStore(path)
    assert len(store) == 2
    assert store.get([1, 0]) == [Passage("7", '"B"\nb'), Passage("a", '"Été"\nça va')]


# ---- retriever wiring ---------------------------------------------------------------------

def test_in_memory_index_of_the_dataset_corpus(minilm):
    retriever = E5Retriever.from_passages(TINY, minilm)
    docs = asyncio.run(retriever.search(["Who wrote Hamlet?", "", "German capital"], topk=2))
    assert docs[0][0].id == "p5" and docs[1] == [] and docs[2][0].id == "p2"
    assert docs[0][0].score > docs[0][1].score
    assert retriever.metrics()["search/requests"] == 3


def test_from_config_builds_into_index_dir_once(tmp_path, monkeypatch):
    dataset = Dataset(train=[], dev=[], test=[], corpus=TINY)
    monkeypatch.setattr("searchr1.retrievers.e5.TextEncoder", lambda *a, **k: _FakeText())
    cfg = E5Config(index_dir=str(tmp_path / "idx"), model_path="hash")
    first = E5Retriever.from_config(cfg, dataset)
    assert (tmp_path / "idx" / "corpus.jsonl").is_file() and first.index.ntotal == 5
    second = E5Retriever.from_config(cfg, dataset)
    assert second.encoder.encoded == []  # loaded, not re-encoded
    assert second.search_sync([TINY[2].contents], 1)[0][0].id == "p3"


class _FakeText(HashEncoder):
    def __init__(self) -> None:
        super().__init__()


def test_from_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="retriever.index_dir"):
        E5Retriever.from_config(E5Config(model_path="minilm"), Dataset([], [], [], None))
    with pytest.raises(ValueError, match="corpus_path"):
        E5Retriever.from_config(E5Config(index_path="/nowhere/x.index"))


def test_build_index_command_line(tmp_path, monkeypatch, capsys):
    from searchr1.retrievers import build_index as cli

    corpus = _write_corpus(tmp_path / "c.jsonl", TINY)
    monkeypatch.setattr(cli, "TextEncoder", lambda *a, **k: HashEncoder())
    cli.main(["--corpus", str(corpus), "--out", str(tmp_path / "idx"), "--model", "minilm",
              "--index-type", "hnsw", "--shard-size", "2"])
    assert "index ready" in capsys.readouterr().out
    meta = json.loads((tmp_path / "idx" / builder.META_FILE).read_text())
    assert meta["count"] == 5 and meta["index"]["index_type"] == "hnsw"
    assert isinstance(faiss.read_index(str(tmp_path / "idx" / builder.INDEX_FILE)), faiss.IndexHNSW)
