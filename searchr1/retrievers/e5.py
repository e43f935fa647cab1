"""Dense retrieval with an E5-style encoder and FAISS (``retriever=e5``), the paper's retriever.

Where the index comes from, first match wins:

1. ``index_dir`` holding ``meta.json`` (made by ``python -m searchr1.retrievers.build_index``):
   its ``index.faiss``, its doc store over the corpus named in ``meta.json``, and the encoder
   settings recorded there (model, prefixes, max length), so queries are embedded exactly as
   the passages were;
2. ``index_path`` + ``corpus_path``: a prebuilt index file and its corpus JSONL, row ``i`` =
   line ``i`` — the layout of Search-R1's wiki-18 release (``e5_Flat.index`` +
   ``wiki-18.jsonl``); the encoder comes from this config (E5-base-v2, E5 prefixes);
3. otherwise the passages (``corpus_path``, else the dataset's own corpus) are encoded at
   start-up and indexed in memory — or into ``index_dir`` when one is named, and reused later.

How it departs from the Search-R1 server: queries of one ``search`` call are encoded and
searched as one batch in a worker thread (the event loop keeps serving trajectories);
blank queries get no documents instead of a search for the bare prefix; the index may be
HNSW or IVF-PQ rather than flat, and moves to GPU only when asked (``use_gpu``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from searchr1.data.types import Passage
import searchr1.retrievers.dense_build as builder
from searchr1.retrievers.base import RETRIEVERS, Document, LocalRetriever
from searchr1.retrievers.bm25 import read_corpus_jsonl
from searchr1.retrievers.dense_docstore import JsonlDocStore, MemoryDocStore
from searchr1.retrievers.dense_encoder import TextEncoder
from searchr1.retrievers.faiss_index import (
    IndexSpec, build_index, load_index, maybe_to_gpu, search, set_search_params,
)
from searchr1.utils.schema import ranged


@dataclass
class E5Config(IndexSpec):
    """Hydra schema of ``retriever=e5`` (the index fields — ``index_type``, ``hnsw_m``, … —
    are ``IndexSpec``'s, in faiss_index.py)."""

    # registry name of the retriever
    name: str = "e5"
    # passages returned per query
    topk: int = ranged(3, ge=1)
    # folder made by build_index (index.faiss + meta.json); built there when absent
    index_dir: str | None = None
    # a prebuilt FAISS index file (Search-R1's e5_Flat.index); needs corpus_path
    index_path: str | None = None
    # corpus JSONL ({"id", "contents"}); None → the dataset's own corpus
    corpus_path: str | None = None
    # encoder: a local folder, an HF id, or "minilm" (the bundled all-MiniLM-L6-v2)
    model_path: str = "intfloat/e5-base-v2"
    # query / passage prefixes; None → the model's own ("" for minilm, E5's otherwise)
    query_prefix: str | None = None
    passage_prefix: str | None = None
    # tokens per text at encoding (Search-R1: 256)
    max_length: int = 256
    # texts per encoder forward pass
    batch_size: int = 64
    # encoder device: auto | cpu | cuda | cuda:N
    device: str = "auto"
    # encoder in half precision (GPU only)
    fp16: bool = False
    # move the index to the GPU(s) when this faiss build supports it
    use_gpu: bool = False
    # memory-map a loaded index file instead of reading it (large flat indexes, CPU)
    mmap: bool = False
    # most search calls encoding + searching at the same time
    max_concurrency: int = ranged(2, ge=1)


def _spec(cfg: E5Config) -> IndexSpec:
    return IndexSpec(**{f.name: getattr(cfg, f.name) for f in fields(IndexSpec)})


def _encoder(cfg: E5Config, recorded: dict | None = None) -> TextEncoder:
    """The query encoder: ``recorded`` settings (an index's meta.json) win over ``cfg``."""
    r = recorded or {}
    return TextEncoder(
        r.get("model_path", cfg.model_path),
        r.get("query_prefix", cfg.query_prefix),
        r.get("passage_prefix", cfg.passage_prefix),
        r.get("max_length", cfg.max_length),
        cfg.batch_size, cfg.device, cfg.fp16,
    )


@RETRIEVERS.register("e5")
class E5Retriever(LocalRetriever):
    """Encode queries, search a FAISS inner-product index, map rows to passages."""

    def __init__(self, encoder: TextEncoder, index, store, spec: IndexSpec | None = None,
                 use_gpu: bool = False, max_concurrency: int = 2) -> None:
        super().__init__(max_concurrency)
        if index.ntotal != len(store):
            raise ValueError(
                f"index has {index.ntotal} vectors but the doc store {len(store)} rows"
            )
        if index.d != encoder.dim:
            raise ValueError(f"index dimension {index.d} != encoder dimension {encoder.dim}")
        self.encoder = encoder
        set_search_params(index, spec or IndexSpec())
        self.index, self.on_gpu = maybe_to_gpu(index, use_gpu)
        self.store = store
        self.fingerprint = {"encoder": encoder.describe(), "rows": len(store),
                            "index": type(index).__name__}

    @classmethod
    def from_passages(cls, passages: list[Passage], encoder: TextEncoder,
                      spec: IndexSpec | None = None, **kwargs) -> E5Retriever:
        """Encode ``passages`` and index them in memory."""
        vectors = encoder.encode([p.contents for p in passages], "passage")
        return cls(encoder, build_index(vectors, spec or IndexSpec()), MemoryDocStore(passages),
                   spec, **kwargs)

    @classmethod
    def from_index_dir(cls, index_dir: str | Path, cfg: E5Config | None = None) -> E5Retriever:
        """Load a folder made by ``build_index`` (encoder settings from its meta.json)."""
        cfg = cfg or E5Config()
        folder = Path(index_dir)
        meta = json.loads((folder / builder.META_FILE).read_text())
        store = JsonlDocStore(meta["corpus_path"], folder / builder.OFFSETS_FILE)
        index = load_index(folder / builder.INDEX_FILE, mmap=cfg.mmap)
        return cls(_encoder(cfg, meta["encoder"]), index, store, _spec(cfg), cfg.use_gpu,
                   cfg.max_concurrency)

    @classmethod
    def from_config(cls, cfg: E5Config, dataset=None) -> E5Retriever:
        """``retriever=e5``: see the module docstring for where the index comes from."""
        if cfg.index_dir and (Path(cfg.index_dir) / builder.META_FILE).is_file():
            return cls.from_index_dir(cfg.index_dir, cfg)
        if cfg.index_path:
            if not cfg.corpus_path:
                raise ValueError(
                    "retriever.index_path needs retriever.corpus_path (its corpus JSONL)"
                )
            store = JsonlDocStore(cfg.corpus_path, Path(cfg.index_path).with_suffix(".offsets.npy"))
            index = load_index(cfg.index_path, mmap=cfg.mmap)
            return cls(_encoder(cfg), index, store, _spec(cfg), cfg.use_gpu, cfg.max_concurrency)
        return cls._build_from_corpus(cfg, dataset)

    @classmethod
    def _build_from_corpus(cls, cfg: E5Config, dataset) -> E5Retriever:
        corpus = cfg.corpus_path
        passages = None if corpus else getattr(dataset, "corpus", None)
        if not corpus and not passages:
            raise ValueError(
                "retriever=e5 needs an index or a corpus: set retriever.index_dir (a folder made "
                "by python -m searchr1.retrievers.build_index), retriever.index_path + "
                "retriever.corpus_path, or retriever.corpus_path=/path/to/corpus.jsonl"
            )
        encoder = _encoder(cfg)
        if not cfg.index_dir:
            passages = passages or read_corpus_jsonl(corpus)
            return cls.from_passages(passages, encoder, _spec(cfg), use_gpu=cfg.use_gpu,
                                     max_concurrency=cfg.max_concurrency)
        folder = Path(cfg.index_dir)
        if not corpus:  # the dataset's corpus: write it beside the index as the doc store
            corpus = folder / "corpus.jsonl"
            folder.mkdir(parents=True, exist_ok=True)
            with open(corpus, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(p.to_row()) + "\n" for p in passages)
        builder.build(corpus, folder, encoder, _spec(cfg))
        return cls.from_index_dir(folder, cfg)

    # ---- search --------------------------------------------------------------------------

    def _search_live(self, queries: list[str], topk: int) -> list[list[Document]]:
        """One encoder pass, one index search."""
        vectors = self.encoder.encode(queries, "query")
        scores, rows = search(self.index, vectors, topk)
        return [self._documents(rows[j], scores[j]) for j in range(len(queries))]

    def _documents(self, rows: np.ndarray, scores: np.ndarray) -> list[Document]:
        keep = [(int(r), float(s)) for r, s in zip(rows, scores, strict=True) if r >= 0]
        passages = self.store.get([r for r, _ in keep])
        return [Document(id=p.id, title=p.title, text=p.text, score=s, contents=p.contents)
                for p, (_, s) in zip(passages, keep, strict=True)]
