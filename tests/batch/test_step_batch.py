"""The step batch: datums equal to each trajectory's built alone on hand-made trajectories
(truncation and the observation-mask ablation included) and accepted by PyTRIO's client, and
``select`` keeping whole datums."""

from __future__ import annotations

import numpy as np
import pytest

from searchr1.advantages import ADVANTAGES, fill_advantages
from searchr1.advantages.config import AdvantageConfig
from searchr1.batch.shifted import shifted_arrays
from searchr1.batch.step_batch import build_step_batch, trained_columns
from searchr1.rollout.types import Trajectory
from tests.helpers.step_batches import EX, as_datum, group_batch, one_turn, reference_datum, two_turn


def assert_same_datum(got, want):
    assert got.model_input.to_ints() == want.model_input.to_ints()
    assert set(got.loss_fn_inputs) == set(want.loss_fn_inputs)
    for key, value in want.loss_fn_inputs.items():
        a, b = got.loss_fn_inputs[key].to_numpy(), value.to_numpy()
        assert a.dtype == b.dtype, key
        np.testing.assert_array_equal(a, b, err_msg=key)


@pytest.mark.parametrize("max_tokens", [100, 4])
def test_datums_equal_each_trajectorys_datum_built_alone(max_tokens):
    trajs = [two_turn(1.0), one_turn(0.0, 1)]
    batch = group_batch(trajs, max_tokens)
    for d, (t, scalar) in enumerate(zip(trajs, (0.5, -0.5))):  # group_mean of [1, 0]
        want, _ = reference_datum(t, scalar, max_tokens)
        assert_same_datum(batch.datums([d])[0], want)
    assert batch.lengths_D.tolist() == [min(8, max_tokens), min(4, max_tokens)]


def test_datums_pass_pytrio_client_validation():
    from pytrio.client.training_batch import plan_training_batch
    from pytrio.model.limits import TrainingLimits

    datums = group_batch([two_turn(1.0), one_turn(0.0, 1)]).datums([0])
    plan = plan_training_batch(datums, loss_fn="importance_sampling", auto_shift=False,
                               limits=TrainingLimits(None, None, None), tokenizer_vocab_size=64)
    assert plan.totals.total_active_tokens == 4  # only action targets are active
    assert plan.totals.total_advantage_tokens == 4
    with pytest.raises(Exception, match="vocabulary"):
        plan_training_batch(datums, loss_fn="ppo", auto_shift=False,
                            limits=TrainingLimits(None, None, None), tokenizer_vocab_size=40)


def test_the_observation_ablation_is_a_column_rule_and_leaves_the_trajectory_alone():
    t = Trajectory.start(EX, 0, [1, 2, 3])
    t.append_sampled([4, 5], [-0.5, -0.6])
    t.append_observation([6, 7])
    t.append_sampled([8], [-0.8])
    t.reward = 1.0
    before = (list(t.mask_T), list(t.logprobs_T))
    scored = [None, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0]
    mask, logprobs = trained_columns(t, scored)
    assert mask.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]  # the prompt stays masked
    # sampled tokens keep the sampler's log-probs; observation tokens take the scored ones
    assert logprobs.tolist() == [0.0, 0.0, 0.0, -0.5, -0.6, -5.0, -6.0, -0.8]
    batch = group_batch([t, one_turn(0.0, 1)], obs=[scored, [None] * 5])
    (got,) = batch.datums([0])
    assert got.loss_fn_inputs["target_tokens"].to_numpy().tolist() == [-100, -100, 4, 5, 6, 7, 8]
    hand = shifted_arrays(t.tokens_T, [0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, -0.5, -0.6, -5, -6, -0.8],
                          0.5 * np.array([0, 0, 0, 1, 1, 1, 1, 1.0]))
    assert_same_datum(got, as_datum(hand))
    assert (t.mask_T, t.logprobs_T) == before  # never patched
    with pytest.raises(ValueError, match="8 tokens"):
        trained_columns(t, [None, -1.0])


def test_select_keeps_whole_datums_with_their_groups_and_their_advantages():
    trajs = [two_turn(1.0, 0), one_turn(0.0, 1), one_turn(0.5, 0), two_turn(0.0, 1)]
    batch = build_step_batch(trajs, [0, 0, 1, 1], [0, 1, 0, 1], [np.array([1.0, 0.0]), np.array([0.5, 0.0])],
                             8, 100)
    batch.old_T = batch.sampler_T.copy()
    est, cfg = ADVANTAGES.get("grpo_std"), AdvantageConfig()
    fill_advantages(batch, est, cfg)
    part = batch.select([2, 3])  # the second group alone, as a data-parallel rank would hold it
    assert part.group_D.tolist() == [1, 1] and part.n_trajectories == 4.0
    assert part.lengths_D.tolist() == batch.lengths_D[[2, 3]].tolist()
    for name in ("input_T", "mask_T", "old_T", "advantages_T"):
        for got, want in zip(part.rows(name), batch.rows(name, [2, 3])):
            np.testing.assert_array_equal(got, want)
    redone = part.select(range(2))
    fill_advantages(redone, est, cfg)  # the group's advantages do not depend on the other groups
    np.testing.assert_array_equal(redone.advantages_T, part.advantages_T)
    with pytest.raises(ValueError, match="row lengths"):
        part.set_rows("values_T", [np.zeros(3), np.zeros(3)])
    with pytest.raises(ValueError, match="not filled"):
        part.row("ref_T", 0)
