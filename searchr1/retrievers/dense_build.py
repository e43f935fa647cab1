"""Building a dense index: corpus JSONL → embeddings (in shards) → FAISS index + doc store.

The command line is ``python -m searchr1.retrievers.build_index`` (``build_index.py``).
The output folder holds ``index.faiss``, ``offsets.npy`` (the doc store's row → byte offset
of the corpus JSONL, which stays where it is) and ``meta.json`` (encoder, prefixes, index
settings, corpus path and size), written last, so a folder with ``meta.json`` is complete;
``retriever=e5 retriever.index_dir=<out>`` loads it. Embeddings are written as
``shards/emb_<n>.npy`` (``shard_size`` rows each, written atomically); a rerun after an
interruption skips the shards already on disk, provided ``shards/manifest.json`` (encoder,
shard size, corpus size) matches, and refuses to mix shards of different settings.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from searchr1.retrievers.dense_docstore import iter_corpus, load_offsets
from searchr1.retrievers.dense_encoder import TextEncoder
from searchr1.retrievers.faiss_index import IndexSpec, new_index, save_index

INDEX_FILE = "index.faiss"
META_FILE = "meta.json"
OFFSETS_FILE = "offsets.npy"
#: most vectors used to train an IVF-PQ index (faiss warns above ~256 per centroid)
MAX_TRAIN = 256 * 4096


def build(
    corpus_path: str | Path,
    out_dir: str | Path,
    encoder: TextEncoder,
    spec: IndexSpec,
    shard_size: int = 50_000,
    progress: bool = True,
) -> Path:
    """Build (or finish building) the index of ``corpus_path`` in ``out_dir``; returns it."""
    corpus, out = Path(corpus_path).resolve(), Path(out_dir)
    offsets = load_offsets(corpus, out / OFFSETS_FILE)
    identity = _identity(corpus, len(offsets), encoder, shard_size)
    meta = {**identity, "index": build_fields(spec), "corpus_path": str(corpus)}
    if _read_json(out / META_FILE) == meta and (out / INDEX_FILE).is_file():
        return out
    shard_dir = out / "shards"
    _check_manifest(shard_dir, identity)
    n_shards = -(-len(offsets) // shard_size)
    _encode_missing_shards(corpus, shard_dir, encoder, shard_size, n_shards, len(offsets), progress)
    index = _index_from_shards(shard_dir, n_shards, encoder.dim, spec)
    save_index(index, out / INDEX_FILE)
    _write_json(out / META_FILE, meta)
    return out


def build_fields(spec: IndexSpec) -> dict:
    """The index settings fixed at build time (search-time ones may change on load)."""
    fields = asdict(spec)
    return {k: fields[k] for k in ("index_type", "hnsw_m", "ivf_nlist", "pq_m", "pq_nbits")}


def _identity(corpus: Path, count: int, encoder: TextEncoder, shard_size: int) -> dict:
    """What the shards depend on: the corpus (size, rows) and the encoder settings."""
    return {
        "format": 1,
        "count": count,
        "corpus_bytes": corpus.stat().st_size,
        "encoder": encoder.describe(),
        "shard_size": shard_size,
    }


def _check_manifest(shard_dir: Path, identity: dict) -> None:
    manifest = shard_dir / "manifest.json"
    found = _read_json(manifest)
    if found is None:
        shard_dir.mkdir(parents=True, exist_ok=True)
        _write_json(manifest, identity)
    elif found != identity:
        raise ValueError(
            f"{shard_dir} holds shards of other settings ({found}); delete it or choose "
            f"another --out to build with {identity}"
        )


def shard_path(shard_dir: Path, n: int) -> Path:
    return shard_dir / f"emb_{n:05d}.npy"


def _encode_missing_shards(corpus, shard_dir, encoder, shard_size, n_shards, total, progress):
    """Encode each shard not yet on disk; the bar starts at the rows already done."""
    done = [n for n in range(n_shards) if shard_path(shard_dir, n).is_file()]
    initial = sum(min(shard_size, total - n * shard_size) for n in done)
    bar = tqdm(total=total, initial=initial, unit="passage", desc="encode", disable=not progress)
    batch: list[str] = []
    for row, passage in iter_corpus(corpus):
        n = row // shard_size
        if n in done:
            continue
        batch.append(passage.contents)
        if len(batch) == shard_size or row == total - 1:
            _write_shard(shard_path(shard_dir, n), encoder.encode(batch, "passage", progress=bar))
            batch = []
    bar.close()


def _write_shard(path: Path, vectors: np.ndarray) -> None:
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, vectors)
    os.replace(tmp, path)  # atomic: a killed run leaves no half shard


def _index_from_shards(shard_dir: Path, n_shards: int, dim: int, spec: IndexSpec):
    index = new_index(dim, spec)
    if not index.is_trained:
        parts, rows = [], 0
        for n in range(n_shards):
            if rows >= MAX_TRAIN:
                break
            parts.append(np.load(shard_path(shard_dir, n)))
            rows += len(parts[-1])
        index.train(np.concatenate(parts)[:MAX_TRAIN])
    for n in range(n_shards):
        index.add(np.load(shard_path(shard_dir, n), mmap_mode="r")[:])
    return index


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
