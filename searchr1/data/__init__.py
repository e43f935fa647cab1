"""Data sources: questions (and, where local, the corpus) keyed by ``data.name``.

``DATASETS`` maps each name to a loader taking that option's schema dataclass and
returning a ``Dataset``. The loaders' modules are light (their heavy readers, such as
pyarrow for parquet, are imported where a file is read), so they are imported here.
"""

from __future__ import annotations

from searchr1.data.jsonl import load_lab_jsonl
from searchr1.data.nq_hotpotqa import load_nq_hotpotqa
from searchr1.data.types import Dataset
from searchr1.data.world import generate_world
from searchr1.utils.registry import Registry

DATASETS: Registry = Registry("data")
DATASETS.register("world")(generate_world)
DATASETS.register("lab_jsonl")(load_lab_jsonl)
DATASETS.register("nq_hotpotqa")(load_nq_hotpotqa)

__all__ = ["DATASETS", "Dataset"]
