"""Retrievers (``retriever.name``): importing this package registers them all."""

from searchr1.retrievers.base import RETRIEVERS
from searchr1.retrievers import bm25, zhihu  # noqa: F401  (register "bm25", "zhihu")

__all__ = ["RETRIEVERS"]
