"""How the local engine answers pytrio's asynchronous surface.

The local engine computes eagerly, in the caller's thread, so every call returns a future
that is already done. It is a real ``pytrio.APIFuture`` (``result()``, ``await``, ``map``)
plus Tinker's ``result_async()``, so trainer code written against either client works.
``AsyncTwins`` gives a client the ``*_async`` methods pytrio's ``TrainingClient`` has; each
runs its synchronous twin, so ``await client.forward_backward_async(...)`` blocks the
event loop for the duration of the computation (the local engine has no server to await).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, TypeVar

from pytrio.types import APIFuture

T = TypeVar("T")


class LocalFuture(APIFuture[T]):
    """An ``APIFuture`` that also offers ``await future.result_async()``."""

    async def result_async(self, timeout: float | None = None) -> T:
        """Return the result; the local engine never has to wait."""
        return self.result(timeout=timeout)


def completed(value: T) -> LocalFuture[T]:
    """A future that already holds ``value``."""
    future: Future[T] = Future()
    future.set_result(value)
    return LocalFuture(future)


class AsyncTwins:
    """``x_async(...)`` = ``x(...)`` for each pytrio ``TrainingClient`` method ``x``."""

    async def forward_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)  # type: ignore[attr-defined]

    async def forward_backward_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_backward(*args, **kwargs)  # type: ignore[attr-defined]

    async def forward_backward_custom_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward_backward_custom(*args, **kwargs)  # type: ignore[attr-defined]

    async def optim_step_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.optim_step(*args, **kwargs)  # type: ignore[attr-defined]

    async def save_state_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.save_state(*args, **kwargs)  # type: ignore[attr-defined]

    async def save_weights_for_sampler_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.save_weights_for_sampler(*args, **kwargs)  # type: ignore[attr-defined]

    async def load_state_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.load_state(*args, **kwargs)  # type: ignore[attr-defined]

    async def load_state_with_optimizer_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.load_state_with_optimizer(*args, **kwargs)  # type: ignore[attr-defined]

    async def save_weights_and_get_sampling_client_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.save_weights_and_get_sampling_client(*args, **kwargs)  # type: ignore[attr-defined]

    async def create_sampling_client_async(self, *args: Any, **kwargs: Any) -> Any:
        return self.create_sampling_client(*args, **kwargs)  # type: ignore[attr-defined]
