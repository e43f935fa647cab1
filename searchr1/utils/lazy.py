"""Import a heavy module on first attribute access, so that schemas can be composed without it.

``import searchr1.config`` must stay fast and torch-free (a sweep composes configs in a launcher
process); modules whose schemas live beside heavy code (``retrievers/e5.py`` → FAISS and a
transformers encoder) bind those dependencies with ``lazy("faiss")`` instead of ``import faiss``.
Unlike ``importlib.util.LazyLoader`` this leaves ``sys.modules`` untouched until first use.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class lazy:  # noqa: N801 - used like a module
    """A stand-in for module ``name`` that imports it when an attribute is first read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)
