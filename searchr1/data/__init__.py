"""Data sources: questions (and, where local, the corpus) keyed by ``data.name``.

``DATASETS`` maps each name to a loader taking that option's schema dataclass and
returning a ``Dataset``; loaders are imported lazily so an optional source never slows
down or breaks the others.
"""

from __future__ import annotations

from searchr1.data.types import Dataset
from searchr1.utils.registry import Registry

DATASETS: Registry = Registry("data")


@DATASETS.register("world")
def _world(cfg) -> Dataset:
    from searchr1.data.world import generate_world

    return generate_world(cfg)


@DATASETS.register("lab_jsonl")
def _lab_jsonl(cfg) -> Dataset:
    from searchr1.data.jsonl import load_lab_jsonl

    return load_lab_jsonl(cfg)


@DATASETS.register("nq_hotpotqa")
def _nq_hotpotqa(cfg) -> Dataset:
    from searchr1.data.nq_hotpotqa import load_nq_hotpotqa

    return load_nq_hotpotqa(cfg)
