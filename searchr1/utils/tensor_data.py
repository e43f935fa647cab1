"""pytrio ``TensorData`` from arrays this package made, without per-element re-validation.

pytrio's constructors check and convert every element in Python (``float(x)`` per value), and
a NumPy array passed to a ``Datum`` is converted twice; at 80k tokens a step that spends
most of its host time there. An array of a supported dtype already holds exactly the values
that validation would produce (``tolist`` of float32 / int64 gives Python floats / ints),
so the model is built directly; any other dtype is refused.
"""

from __future__ import annotations

import numpy as np
import torch
from pytrio.types import TensorData

_DTYPES = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64"}


def tensor_data(values: np.ndarray | torch.Tensor) -> TensorData:
    """``TensorData`` of a float32 / int64 array or tensor (a float tensor is cast to float32)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float32 if values.is_floating_point() else torch.int64).numpy()
    dtype = _DTYPES.get(values.dtype)
    if dtype is None:
        raise TypeError(f"tensor_data takes float32 or int64 arrays, got {values.dtype}")
    return TensorData.model_construct(data=values.reshape(-1).tolist(), dtype=dtype, shape=list(values.shape))
