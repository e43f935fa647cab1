"""The shifted layout of one datum by hand: one right shift of every array, the ignore label
off the mask, advantages masked whatever the caller passed, and truncation of every array."""

from __future__ import annotations

import numpy as np
import pytest

from searchr1.batch.shifted import IGNORE, shifted_arrays, truncate

# prompt [10, 11] · sampled [20, 21] · observation [30, 31, 32] · sampled [40, 41]
TOKENS = [10, 11, 20, 21, 30, 31, 32, 40, 41]
MASK = [0, 0, 1, 1, 0, 0, 0, 1, 1]
LOGPROBS = [0.0, 0.0, -0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -2.0]


def test_one_shift_of_every_array():
    a = shifted_arrays(TOKENS, MASK, LOGPROBS, np.arange(1.0, 10.0))  # advantage everywhere
    assert a["model_input"].tolist() == TOKENS[:-1]
    assert a["tokens_next"].tolist() == TOKENS[1:]
    assert a["target_tokens"].tolist() == [IGNORE, 20, 21, IGNORE, IGNORE, IGNORE, 40, 41]
    assert a["logprobs"].tolist() == LOGPROBS[1:]
    assert a["advantages"].tolist() == [0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 8.0, 9.0]
    assert a["mask"].tolist() == MASK[1:]


def test_truncation_keeps_the_first_positions_of_every_array():
    cut = truncate(shifted_arrays(TOKENS, MASK, LOGPROBS, np.zeros(9)), 3)
    assert {k: len(v) for k, v in cut.items()} == dict.fromkeys(cut, 3)
    assert cut["target_tokens"].tolist() == [IGNORE, 20, 21]


def test_unequal_or_too_short_inputs_are_refused():
    with pytest.raises(ValueError, match="equal length"):
        shifted_arrays(TOKENS, MASK[:-1], LOGPROBS, np.zeros(9))
    with pytest.raises(ValueError, match="two tokens"):
        shifted_arrays([1], [1], [0.0], np.zeros(1))
