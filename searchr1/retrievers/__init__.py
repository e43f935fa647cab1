"""Retrievers (``retriever.name``): importing this package registers them all."""

from searchr1.retrievers.base import RETRIEVERS
from searchr1.retrievers import bm25, e5, http, zhihu  # noqa: F401  (register each name)

__all__ = ["RETRIEVERS"]
