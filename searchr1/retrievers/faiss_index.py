"""FAISS inner-product indexes for dense retrieval: flat, HNSW or IVF-PQ, CPU or GPU.

Vectors are L2-normalised, so inner product is cosine similarity. ``flat`` is exact (the
Search-R1 wiki-18 index is a flat IP index, ``e5_Flat.index``: 21M × 768 fp32 = 64.6 GB);
``hnsw`` trades a little recall for sub-linear search with the vectors kept; ``ivfpq``
compresses the vectors (``pq_m`` codes of ``pq_nbits`` bits each) for indexes that do not
fit in memory. GPU placement (``use_gpu``) applies only when the installed faiss has GPU
support and a GPU is visible; otherwise the CPU index is used and ``on_gpu`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from searchr1.utils.lazy import lazy

faiss = lazy("faiss")  # imported on first use: composing a config must not load FAISS

INDEX_TYPES = ("flat", "hnsw", "ivfpq")


@dataclass
class IndexSpec:
    """How to build and search an index; ``retriever=e5``'s config inherits these fields."""

    # FAISS index type when building: flat | hnsw | ivfpq
    index_type: str = "flat"
    # HNSW graph degree, and its search breadth
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    # IVF-PQ: lists, codes per vector (must divide the dimension), lists probed per query,
    # bits per code
    ivf_nlist: int = 1024
    pq_m: int = 64
    ivf_nprobe: int = 32
    pq_nbits: int = 8

    def factory_string(self) -> str:
        if self.index_type == "flat":
            return "Flat"
        if self.index_type == "hnsw":
            return f"HNSW{self.hnsw_m},Flat"
        if self.index_type == "ivfpq":
            return f"IVF{self.ivf_nlist},PQ{self.pq_m}x{self.pq_nbits}"
        raise ValueError(f"unknown index_type {self.index_type!r}; valid: {', '.join(INDEX_TYPES)}")


def new_index(dim: int, spec: IndexSpec) -> faiss.Index:
    """An empty inner-product index of ``spec``'s type (IVF-PQ still needs ``train``)."""
    if spec.index_type == "ivfpq" and dim % spec.pq_m:
        raise ValueError(f"pq_m={spec.pq_m} must divide the embedding dimension {dim}")
    return faiss.index_factory(dim, spec.factory_string(), faiss.METRIC_INNER_PRODUCT)


def build_index(vectors: np.ndarray, spec: IndexSpec) -> faiss.Index:
    """An index over ``vectors`` ([N, dim] float32), trained first when the type needs it."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = new_index(vectors.shape[1], spec)
    if not index.is_trained:
        if len(vectors) < spec.ivf_nlist:
            raise ValueError(
                f"ivfpq needs at least ivf_nlist={spec.ivf_nlist} vectors to train, got "
                f"{len(vectors)}; lower retriever.ivf_nlist"
            )
        index.train(vectors)
    index.add(vectors)
    return index


def set_search_params(index: faiss.Index, spec: IndexSpec) -> None:
    """Apply ``hnsw_ef_search`` / ``ivf_nprobe`` to a loaded or built CPU index."""
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = spec.hnsw_ef_search
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = spec.ivf_nprobe


def gpu_available() -> bool:
    """True when this faiss build has GPU support and sees at least one GPU."""
    return hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0


def maybe_to_gpu(index: faiss.Index, use_gpu: bool, fp16: bool = True) -> tuple[faiss.Index, bool]:
    """(index on all GPUs, sharded, True) when asked and possible, else (index, False)."""
    if not use_gpu or not gpu_available():
        return index, False
    options = faiss.GpuMultipleClonerOptions()
    options.shard = True
    options.useFloat16 = fp16
    return faiss.index_cpu_to_all_gpus(index, co=options), True


def save_index(index: faiss.Index, path: str | Path) -> None:
    faiss.write_index(index, str(path))


def load_index(path: str | Path, mmap: bool = False) -> faiss.Index:
    """Read an index file; ``mmap`` maps it instead of reading (large flat indexes)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no FAISS index at {path}")
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    return faiss.read_index(str(path), flags)


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k], row ids [Q, k]); ids of -1 mark missing hits (fewer than k rows)."""
    k = max(1, min(k, index.ntotal))
    scores, ids = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    return scores, ids
