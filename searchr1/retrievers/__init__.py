"""Retrievers (``retriever.name``): importing this package registers them all."""

from searchr1.retrievers.base import RETRIEVERS
from searchr1.retrievers import bm25  # noqa: F401  (registers "bm25")

try:
    from searchr1.retrievers import zhihu  # noqa: F401
except ImportError:  # pragma: no cover
    pass

__all__ = ["RETRIEVERS"]
