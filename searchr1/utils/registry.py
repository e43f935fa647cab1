"""Name → factory registries: every config option is a registered name.

Each concept (retriever, protocol, reward, advantage, loss, engine, tracker) owns one
``Registry``. Options register themselves with ``@REGISTRY.register("name")``; a duplicate
name raises, and an unknown name lists the valid ones, so a config value maps to exactly one
piece of code that ``grep -r 'register("name")'`` finds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(KeyError, ValueError):
    """A name no option registered: a ``KeyError`` to a lookup, a ``ValueError`` to a setting."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """A named table of options for one concept."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            valid = ", ".join(sorted(self._items)) or "(none registered)"
            raise UnknownName(f"unknown {self.kind} {name!r}; valid: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items
