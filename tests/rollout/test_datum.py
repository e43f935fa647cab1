"""Datum building on a hand-made two-turn trajectory: exact arrays after the shift."""

import numpy as np
import pytest

from searchr1.data.types import QAExample
from searchr1.rollout.datum import PrefixError, build_datum, check_prefix, token_advantages
from searchr1.rollout.types import Trajectory

EX = QAExample(id="q", question="?", golden_answers=("a",), data_source="t")


def two_turn():
    # prompt [10, 11] | turn 1 sampled [20, 21] | observation [30, 31, 32] | turn 2 sampled [40, 41]
    t = Trajectory.start(EX, 0, [10, 11])
    t.append_sampled([20, 21], [-0.5, -0.25])
    t.append_observation([30, 31, 32])
    t.append_sampled([40, 41], [-1.0, -2.0])
    return t


def test_exact_arrays_after_one_shift():
    t = two_turn()
    assert t.tokens_T == [10, 11, 20, 21, 30, 31, 32, 40, 41]
    assert t.mask_T == [0, 0, 1, 1, 0, 0, 0, 1, 1]
    datum, arr = build_datum(t, token_advantages(t, 0.5), max_tokens=100)
    assert arr["model_input"].tolist() == [10, 11, 20, 21, 30, 31, 32, 40]
    assert arr["tokens_next"].tolist() == [11, 20, 21, 30, 31, 32, 40, 41]
    # prompt and observation targets carry pytrio's ignore label
    assert arr["target_tokens"].tolist() == [-100, 20, 21, -100, -100, -100, 40, 41]
    assert arr["logprobs"].tolist() == [0.0, -0.5, -0.25, 0.0, 0.0, 0.0, -1.0, -2.0]
    assert arr["advantages"].tolist() == [0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5, 0.5]
    assert datum.model_input.to_ints() == [10, 11, 20, 21, 30, 31, 32, 40]
    assert datum.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert datum.loss_fn_inputs["advantages"].tolist() == [0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5, 0.5]


def test_observation_tokens_never_carry_advantage_even_if_passed():
    t = two_turn()
    per_token = np.arange(1, 10, dtype=float)  # a caller passing advantage everywhere
    _, arr = build_datum(t, per_token, max_tokens=100)
    targets_are_obs = np.array(t.mask_T[1:]) == 0
    assert np.all(arr["advantages"][targets_are_obs] == 0.0)
    assert np.all(arr["logprobs"][targets_are_obs] == 0.0)
    assert arr["advantages"].tolist() == [0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 8.0, 9.0]


def test_truncation_and_prefix_check():
    _, arr = build_datum(two_turn(), token_advantages(two_turn(), 1.0), max_tokens=4)
    assert arr["target_tokens"].tolist() == [-100, 20, 21, -100]
    check_prefix([1, 2], [1, 2, 3])
    with pytest.raises(PrefixError, match="first difference at token 1"):
        check_prefix([1, 2, 3], [1, 9, 3, 4])


def test_datum_passes_pytrio_client_validation():
    from pytrio.client.training_batch import plan_training_batch
    from pytrio.model.limits import TrainingLimits

    datum, _ = build_datum(two_turn(), token_advantages(two_turn(), 0.5), 100)
    plan = plan_training_batch(
        [datum], loss_fn="importance_sampling", auto_shift=False,
        limits=TrainingLimits(None, None, None), tokenizer_vocab_size=64,
    )
    assert plan.totals.total_active_tokens == 4  # only action targets are active
    assert plan.totals.total_advantage_tokens == 4
    with pytest.raises(Exception, match="vocabulary"):
        plan_training_batch([datum], loss_fn="ppo", auto_shift=False,
                            limits=TrainingLimits(None, None, None), tokenizer_vocab_size=40)
