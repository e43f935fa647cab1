"""BM25 over an in-memory corpus (``retriever=bm25``), built with ``bm25s``.

The embedded default searches the generated world's corpus with this retriever, and tests
use it on real Wikipedia paragraphs, so it must be fast to build, deterministic and offline.
The index covers each passage's whole ``contents`` (title line + text), tokenised by
``bm25s`` with English stop words and PyStemmer stemming, scored with Lucene BM25.

How it departs from a plain ``bm25s`` call:

- documents scoring 0 (no query term in common) are dropped, as Lucene/Pyserini do, so a
  query of unknown words or only stop words returns fewer than ``topk`` passages, and an
  empty or whitespace query returns none (rather than raising);
- ``topk`` is clamped to the corpus size;
- all queries of one ``search`` call go to one ``retrieve`` call, run in a worker thread so
  the event loop keeps serving other trajectories;
- documents from a corpus file carry the row's ``contents`` verbatim, so the tags protocol
  shows the official ``Doc i(Title: "…") …`` line; those of the dataset's own corpus (the
  generated world) do not, and show the unquoted title the packaged warm start was trained
  on (``verbatim_titles`` overrides either way);
- with ``index_dir`` the index is saved next to a fingerprint of the corpus and the
  tokeniser settings, and reused only when the fingerprint matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from searchr1.data.jsonl import load_corpus_jsonl
from searchr1.data.types import Passage
from searchr1.utils.lazy import lazy
from searchr1.retrievers.base import RETRIEVERS, Document, LocalRetriever
from searchr1.utils.schema import ranged

bm25s = lazy("bm25s")  # imported on first use (numba start-up): composing a config stays fast
Stemmer = lazy("Stemmer")

FINGERPRINT_FILE = "searchr1_fingerprint.json"


@dataclass
class BM25Config:
    """Hydra schema of ``retriever=bm25``."""

    # registry name of the retriever
    name: str = "bm25"
    # passages returned per query
    topk: int = ranged(3, ge=1)
    # corpus JSONL ({"id", "contents"} rows); None → the dataset's own corpus (embedded world)
    corpus_path: str | None = None
    # folder to save the index in and reload it from (None → build in memory every run)
    index_dir: str | None = None
    # PyStemmer algorithm name ("english", …); "none" disables stemming
    stemmer: str = "english"
    # most search calls running retrieval threads at the same time
    max_concurrency: int = ranged(16, ge=1)
    # documents carry the row's contents verbatim ('"Title"\ntext', the official observation);
    # null = yes for corpus_path, no for the dataset's own corpus (the world's unquoted titles)
    verbatim_titles: bool | None = None


@RETRIEVERS.register("bm25")
class BM25Retriever(LocalRetriever):
    """Lucene BM25 over ``passages``; ``await search(queries, topk)`` → ranked Documents."""

    # A query sharing no term with the corpus legitimately returns nothing: an empty result is
    # the model's (bad) query, not a tool failure, so the tool-error policy must not drop it.
    promises_results = False

    def __init__(
        self,
        passages: list[Passage],
        stemmer: str | None = "english",
        stopwords: str | list[str] | None = "en",
        index_dir: str | Path | None = None,
        max_concurrency: int = 16,
        verbatim_titles: bool = False,
    ) -> None:
        super().__init__(max_concurrency)
        self.verbatim_titles = verbatim_titles
        if not passages:
            raise ValueError("BM25Retriever needs a non-empty corpus")
        self.passages = list(passages)
        self.stopwords = stopwords
        self.stemmer_name = stemmer
        self._stemmer = _make_stemmer(stemmer)
        self.fingerprint = corpus_fingerprint(self.passages, stemmer, stopwords)
        self.loaded_from_disk = False
        self.model = self._load_or_build(Path(index_dir) if index_dir else None)

    @classmethod
    def from_corpus_file(cls, path: str | Path, **kwargs) -> BM25Retriever:
        """Build from a Search-R1 / FlashRAG corpus JSONL (``{"id", "contents"}`` rows)."""
        return cls(read_corpus_jsonl(path), **kwargs)

    @classmethod
    def from_config(cls, cfg: BM25Config, dataset) -> BM25Retriever:
        """``retriever=bm25``: over ``cfg.corpus_path`` if set, else the dataset's corpus."""
        kwargs = dict(stemmer=cfg.stemmer, index_dir=cfg.index_dir, max_concurrency=cfg.max_concurrency)
        verbatim = getattr(cfg, "verbatim_titles", None)
        if cfg.corpus_path:
            return cls.from_corpus_file(cfg.corpus_path, verbatim_titles=verbatim is not False, **kwargs)
        if not dataset.corpus:
            raise ValueError(
                "retriever=bm25 needs a corpus: this dataset ships none, so set "
                "retriever.corpus_path=/path/to/corpus.jsonl"
            )
        return cls(dataset.corpus, verbatim_titles=bool(verbatim), **kwargs)

    # ---- index ---------------------------------------------------------------------------

    def _load_or_build(self, index_dir: Path | None) -> bm25s.BM25:
        """Reuse a saved index whose fingerprint matches this corpus, else build (and save)."""
        # bm25s sets its logger to DEBUG when imported: every run's log carried its index notes
        bm25s.BM25  # noqa: B018 - import it now, so its level is set after its own
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        if index_dir is not None and _read_fingerprint(index_dir) == self.fingerprint:
            self.loaded_from_disk = True
            return bm25s.BM25.load(str(index_dir), show_progress=False)
        model = self._build()
        if index_dir is not None:
            index_dir.mkdir(parents=True, exist_ok=True)
            model.save(str(index_dir), show_progress=False)
            (index_dir / FINGERPRINT_FILE).write_text(json.dumps(self.fingerprint, indent=1))
        return model

    def _build(self) -> bm25s.BM25:
        tokens = bm25s.tokenize(
            [p.contents for p in self.passages],
            stopwords=self.stopwords,
            stemmer=self._stemmer,
            show_progress=False,
        )
        model = bm25s.BM25()
        model.index(tokens, show_progress=False)
        return model

    # ---- search --------------------------------------------------------------------------

    def _search_live(self, queries: list[str], topk: int) -> list[list[Document]]:
        query_tokens = bm25s.tokenize(
            queries,
            stopwords=self.stopwords,
            stemmer=self._stemmer,
            show_progress=False,
            return_ids=False,
        )
        k = min(topk, len(self.passages))
        # numpy top-k: "auto" picks jax when installed, and jax grabs 75% of a GPU on import
        ids, scores = self.model.retrieve(query_tokens, k=k, show_progress=False,
                                          backend_selection="numpy")
        return [self._documents(ids[row], scores[row]) for row in range(len(queries))]

    def _documents(self, ids: np.ndarray, scores: np.ndarray) -> list[Document]:
        """Documents for one query's ranked ids, dropping zero-score (non-matching) ones."""
        docs = []
        for idx, score in zip(ids.tolist(), scores.tolist(), strict=True):
            if score <= 0.0:
                continue
            p = self.passages[idx]
            docs.append(Document(id=p.id, title=p.title, text=p.text, score=float(score),
                                 contents=p.contents if self.verbatim_titles else None))
        return docs


def read_corpus_jsonl(path: str | Path) -> list[Passage]:
    """Passages of a corpus JSONL file (``data/jsonl.py``: a bad row or byte names its line)."""
    return load_corpus_jsonl(path)


def corpus_fingerprint(
    passages: list[Passage], stemmer: str | None, stopwords: str | list[str] | None
) -> dict:
    """Identity of an index: passage count, a hash of the ids and the tokeniser settings."""
    digest = hashlib.sha256()
    for p in passages:
        digest.update(p.id.encode("utf-8"))
        digest.update(b"\x00")
    return {
        "count": len(passages),
        "ids_sha256": digest.hexdigest(),
        "stemmer": stemmer,
        "stopwords": stopwords,
        "bm25s": bm25s.__version__,
    }


def _read_fingerprint(index_dir: Path) -> dict | None:
    path = index_dir / FINGERPRINT_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _make_stemmer(name: str | None) -> Stemmer.Stemmer | None:
    """A PyStemmer stemmer, or None when stemming is off (``None`` or ``"none"``)."""
    if name is None or name.lower() == "none":
        return None
    return Stemmer.Stemmer(name)
