"""How the local engine answers pytrio's futures.

The local engine computes eagerly, in the caller's thread, so every training call returns a
future that is already done: a real ``pytrio.APIFuture`` (``result()``, ``await``, ``map``),
so the loop reads both engines' results the same way (``engines/base.py``).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TypeVar

from pytrio.types import APIFuture

T = TypeVar("T")


def completed(value: T) -> APIFuture[T]:
    """A future that already holds ``value``."""
    future: Future[T] = Future()
    future.set_result(value)
    return APIFuture(future)
