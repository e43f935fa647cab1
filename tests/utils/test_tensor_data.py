"""``tensor_data`` builds exactly what pytrio's validating constructors build."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pytrio.types import Datum, ModelInput, TensorData

from searchr1.utils.tensor_data import tensor_data


@pytest.mark.parametrize("values", [
    np.array([0.5, -1.25, 3e-8], dtype=np.float32),
    np.array([[1, -100], [7, 2]], dtype=np.int64),
    torch.tensor([0.1, 0.2], dtype=torch.float64),  # cast to float32, as from_torch does
    torch.tensor([3, 4], dtype=torch.int32),
    np.zeros(0, dtype=np.float32),
])
def test_equals_pytrios_validated_tensor_data(values) -> None:
    want = TensorData.from_torch(values) if isinstance(values, torch.Tensor) else TensorData.from_numpy(values)
    got = tensor_data(values)
    assert got.model_dump() == want.model_dump()
    assert type(got.data[0]) is type(want.data[0]) if want.data else got.data == []
    assert np.array_equal(got.to_numpy(), want.to_numpy())


def test_refuses_other_dtypes() -> None:
    with pytest.raises(TypeError, match="float32 or int64"):
        tensor_data(np.array([1.0]))  # float64 arrays: the caller casts


def test_a_datum_keeps_it_as_is() -> None:
    td = tensor_data(np.array([1, 2], dtype=np.int64))
    d = Datum(model_input=ModelInput.from_ints([5, 6]), loss_fn_inputs={"target_tokens": td})
    assert d.loss_fn_inputs["target_tokens"].data == [1, 2]
    assert d.model_dump() == Datum(model_input=ModelInput.from_ints([5, 6]),
                                   loss_fn_inputs={"target_tokens": np.array([1, 2])}).model_dump()
