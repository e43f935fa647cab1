"""The step batch and the stages around it: datums equal to ``rollout/datum.py``'s on
hand-made trajectories (truncation and the observation-mask ablation included), the
registered estimators on the batch's columns against hand-computed numbers, the scoring
passes' inputs, and a tiny-model step whose sent datums, token counts and group sums hold."""

from __future__ import annotations

from types import SimpleNamespace
import asyncio
import math

import numpy as np
import pytest

from searchr1.engines.base import EngineCapabilities
from searchr1.advantages import ADVANTAGES
from searchr1.advantages.config import AdvantageConfig
from searchr1.losses.config import KLConfig, LossConfig
from searchr1.loop.step_batch import build_step_batch, trained_columns
from searchr1.loop.step_scoring import kl_stage, observation_logprobs, recompute_logprobs, reference_logprobs
from searchr1.loop.train_step import advantage_stage, select_stage
from searchr1.rollout.datum import build_datum, shifted_arrays, to_datum, token_advantages
from tests.helpers.step_batches import EX, trajectory
from searchr1.rollout.types import Trajectory


def two_turn(reward: float = 0.0, index: int = 0) -> Trajectory:
    """prompt [10, 11] · sampled [20, 21] · observation [30, 31, 32] · sampled [40, 41]."""
    t = Trajectory.start(EX, index, [10, 11])
    t.append_sampled([20, 21], [-0.5, -0.25])
    t.append_observation([30, 31, 32])
    t.append_sampled([40, 41], [-1.0, -2.0])
    t.reward = reward
    return t


def one_turn(reward: float = 0.0, index: int = 0) -> Trajectory:
    t = Trajectory.start(EX, index, [10, 12])
    t.append_sampled([50, 51, 52], [-0.1, -0.2, -0.3])
    t.reward = reward
    return t


def group_batch(trajs, max_tokens=100, obs=None, name="group_mean"):
    """One group of ``trajs``: old log-probs = sampler, advantages from estimator ``name``."""
    n = len(trajs)
    batch = build_step_batch(trajs, [0] * n, range(n), [np.array([t.reward for t in trajs])], n,
                             max_tokens, obs)
    batch.old_T = batch.sampler_T.copy()
    advantage_stage(batch, ADVANTAGES.get(name), AdvantageConfig(name=name))
    return batch


def assert_same_datum(got, want):
    assert got.model_input.to_ints() == want.model_input.to_ints()
    assert set(got.loss_fn_inputs) == set(want.loss_fn_inputs)
    for key, value in want.loss_fn_inputs.items():
        a, b = got.loss_fn_inputs[key].to_numpy(), value.to_numpy()
        assert a.dtype == b.dtype, key
        np.testing.assert_array_equal(a, b, err_msg=key)


@pytest.mark.parametrize("max_tokens", [100, 4])
def test_datums_equal_rollout_datums_built_one_by_one(max_tokens):
    trajs = [two_turn(1.0), one_turn(0.0, 1)]
    batch = group_batch(trajs, max_tokens)
    for d, (t, scalar) in enumerate(zip(trajs, (0.5, -0.5))):  # group_mean of [1, 0]
        want, _ = build_datum(t, token_advantages(t, scalar), max_tokens)
        assert_same_datum(batch.datums([d])[0], want)
    assert batch.lengths_D.tolist() == [min(8, max_tokens), min(4, max_tokens)]


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
    assert_same_datum(got, to_datum(hand))
    assert (t.mask_T, t.logprobs_T) == before  # never patched
    with pytest.raises(ValueError, match="8 tokens"):
        trained_columns(t, [None, -1.0])


def test_observation_logprobs_score_each_whole_trajectory_with_the_sampler():
    seen = []

    class Sampler:
        async def compute_logprobs_async(self, prompt):
            seen.append(prompt.to_ints())
            return [None] + [-float(x) for x in prompt.to_ints()[1:]]

    out = asyncio.run(observation_logprobs([two_turn(), one_turn()], Sampler()))
    assert seen == [two_turn().tokens_T, one_turn().tokens_T]
    assert out[1] == [None, -12.0, -50.0, -51.0, -52.0]


def test_select_keeps_whole_datums_with_their_groups_and_their_advantages():
    trajs = [two_turn(1.0, 0), one_turn(0.0, 1), one_turn(0.5, 0), two_turn(0.0, 1)]
    batch = build_step_batch(trajs, [0, 0, 1, 1], [0, 1, 0, 1], [np.array([1.0, 0.0]), np.array([0.5, 0.0])],
                             8, 100)
    batch.old_T = batch.sampler_T.copy()
    est, cfg = ADVANTAGES.get("grpo_std"), AdvantageConfig()
    advantage_stage(batch, est, cfg)
    part = batch.select([2, 3])  # the second group alone, as a data-parallel rank would hold it
    assert part.group_D.tolist() == [1, 1] and part.n_trajectories == 4.0
    assert part.lengths_D.tolist() == batch.lengths_D[[2, 3]].tolist()
    for name in ("input_T", "mask_T", "old_T", "advantages_T"):
        for got, want in zip(part.rows(name), batch.rows(name, [2, 3])):
            np.testing.assert_array_equal(got, want)
    redone = part.select(range(2))
    advantage_stage(redone, est, cfg)  # the group's advantages do not depend on the other groups
    np.testing.assert_array_equal(redone.advantages_T, part.advantages_T)
    with pytest.raises(ValueError, match="row lengths"):
        part.set_rows("values_T", [np.zeros(3), np.zeros(3)])
    with pytest.raises(ValueError, match="not filled"):
        part.row("ref_T", 0)


def test_group_estimator_uses_the_whole_group_and_subtracts_the_penalty():
    empty = Trajectory.start(EX, 2, [10, 11])  # no action token: no datum, but in the group
    empty.reward = 0.5
    groups = [[two_turn(1.0, 0), one_turn(0.0, 1), empty]]
    sel = select_stage(groups, ADVANTAGES.get("grpo_std"), skip_degenerate=True)
    assert [t.group_index for t in sel.trajs_D] == [0, 1] and sel.member_D == [0, 1]
    batch = build_step_batch(sel.trajs_D, sel.group_D, sel.member_D, sel.rewards_G, sel.n_trajectories, 100)
    batch.penalty_T = np.zeros_like(batch.mask_T)
    batch.penalty_T[2] = 0.25  # the first datum's second target (an action token)
    advantage_stage(batch, ADVANTAGES.get("grpo_std"), AdvantageConfig(eps=0.0))
    # rewards [1, 0, 0.5]: mean 0.5, unbiased std 0.5 → A = +1, −1
    a0, a1 = batch.rows("advantages_T")
    np.testing.assert_allclose(a0, [0, 1, 1 - 0.25, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(a1, [0, -1, -1, -1])
    # per group: Σ (token advantages + penalty) / trained tokens sums to 0 (mean-centred)
    assert sum((a + p).sum() / m.sum() for a, p, m in zip(batch.rows("advantages_T"), batch.rows("penalty_T"),
                                                           batch.rows("mask_T"))) == pytest.approx(0.0)


def test_degenerate_groups_are_a_group_baseline_notion():
    groups = [[one_turn(1.0), one_turn(1.0, 1)], [one_turn(1.0), one_turn(0.0, 1)]]
    grpo = select_stage(groups, ADVANTAGES.get("grpo_std"), skip_degenerate=True)
    assert grpo.degenerate_rate == 0.5 and grpo.group_D == [0, 0] and len(grpo.rewards_G) == 1
    kept = select_stage(groups, ADVANTAGES.get("grpo_std"), skip_degenerate=False)
    assert kept.degenerate_rate == 0.5 and kept.group_D == [0, 0, 1, 1]
    gae = select_stage(groups, ADVANTAGES.get("ppo_gae"), skip_degenerate=True)
    assert gae.degenerate_rate == 0.0 and len(gae.trajs_D) == 4  # a critic sees signal anyway
    only_obs = trajectory([1, 2, 3], [0, 0, 0], [0, 0, 0], prompt_len=1)  # observation, no action
    assert select_stage([[only_obs]], ADVANTAGES.get("grpo_std"), True).trajs_D == []
    assert len(select_stage([[only_obs]], ADVANTAGES.get("grpo_std"), True, mask_observations=False).trajs_D) == 1


def test_ppo_gae_on_the_batch_columns_by_hand():
    # shifted masks [0, 1, 1] and [1, 1]; values 0; rewards 1 and 0; γ = λ = 1
    a = trajectory([5, 6, 7, 8], [0, 0, 1, 1], [0, 0, -1, -1], reward=1.0)
    b = trajectory([5, 6, 7], [0, 1, 1], [0, -1, -1], reward=0.0)
    batch = build_step_batch([a, b], [0, 1], [0, 0], [np.ones(1), np.zeros(1)], 2, 100)
    batch.set_rows("values_T", [np.zeros(3), np.zeros(2)])
    batch.penalty_T = np.array([0, 0.1, 0.2, 0, 0])
    advantage_stage(batch, ADVANTAGES.get("ppo_gae"), AdvantageConfig(name="ppo_gae"))
    # rewards per token: a [0, −0.1, 1 − 0.2], b [0, 0] → returns a [0, 0.7, 0.8], b [0, 0]
    np.testing.assert_allclose(batch.returns_T, [0, 0.7, 0.8, 0, 0])
    flat = np.array([0.7, 0.8, 0.0, 0.0])  # whitened over the batch's action tokens
    mean, std = flat.mean(), math.sqrt(flat.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(batch.advantages_T, [0, *(flat - mean) / std])


def test_kl_stage_by_hand():
    t = trajectory([5, 6, 7, 8], [0, 1, 0, 1], [0, -1.0, 0, -2.0])  # shifted mask [1, 0, 1]
    batch = build_step_batch([t], [0], [0], [np.zeros(1)], 1, 100)
    batch.old_T = batch.sampler_T.copy()
    batch.set_rows("ref_T", [np.array([-1.5, -9.0, -2.0])])
    m = kl_stage(batch, KLConfig(coef=0.2, estimator="k1", placement="reward"))
    assert m == {"train/kl_sampled": pytest.approx(0.25), "train/kl": pytest.approx(0.25)}
    np.testing.assert_allclose(batch.penalty_T, [0.1, 0.0, 0.0])
    batch.penalty_T = None
    assert kl_stage(batch, KLConfig(coef=0.2, estimator="k1", placement="loss")) == {
        "train/kl_sampled": pytest.approx(0.25)}
    assert batch.penalty_T is None


def test_scoring_passes_send_the_batch_targets_only():
    batch = group_batch([two_turn(1.0), one_turn(0.0, 1)], max_tokens=6)

    class Out:
        def __init__(self, x):
            self.x = x

        def tolist(self):
            return self.x

    class Client:
        sent = []

        def forward(self, data, loss_fn):
            self.sent.append((data, loss_fn))
            fb = type("FB", (), {})()
            fb.loss_fn_outputs = [{"logprobs": Out([-1.0] * len(d.model_input.to_ints()))} for d in data]
            return type("F", (), {"result": lambda self: fb})()

    client = Client()
    old = recompute_logprobs(client, batch)
    ((data, loss_fn),) = client.sent
    assert loss_fn == "cross_entropy" and all(set(d.loss_fn_inputs) == {"target_tokens"} for d in data)
    assert [d.model_input.to_ints() for d in data] == [r.tolist() for r in batch.rows("input_T")]
    np.testing.assert_array_equal(old[0], -batch.row("mask_T", 0))

    class Reference:  # PyTRIO's path: one whole sequence per datum
        seqs = []

        async def compute_logprobs_async(self, prompt):
            self.seqs.append(prompt.to_ints())
            return [None] + [-0.5] * (len(prompt.to_ints()) - 1)

    remote = SimpleNamespace(capabilities=EngineCapabilities())  # no in-process reference pass
    ref = asyncio.run(reference_logprobs(remote, Reference(), batch))
    assert Reference.seqs == [two_turn().tokens_T[:7], one_turn().tokens_T]
    assert [len(r) for r in ref] == batch.lengths_D.tolist()


def test_a_step_sends_the_planned_datums_once_and_packs_once(tiny_model_dir, tmp_path, monkeypatch):
    import searchr1.loop.update as update
    from tests.loop.test_train_step import QS, make_runner

    calls = []
    real = update.pack_ffd
    monkeypatch.setattr(update, "pack_ffd", lambda *a: calls.append(a) or real(*a))
    runner, client, _ = make_runner(tiny_model_dir, tmp_path, LossConfig(name="importance_sampling"),
                                    group_size=3, minibatch_trajectories=2)
    metrics = asyncio.run(runner.run(client, QS[:2], 0, 0, lambda k: 1e-3))
    assert len(calls) == len(client.calls) == 3  # one packing per mini-batch, not one more
    sent = [d for _, data, _ in client.calls for d in data]
    targets = [d.loss_fn_inputs["target_tokens"].to_numpy() for d in sent]
    assert metrics["train/loss_tokens_per_rollout_batch"] == float(sum((t != -100).sum() for t in targets))
    assert metrics["train/datums"] == metrics["train/datums_per_rollout_batch"] == len(sent) == 6
    assert metrics["train/tokens_per_rollout_batch"] == float(sum(len(t) for t in targets))
    # grpo_std is mean-centred per group: the scalars of each question's datums sum to 0
    by_question = {}
    for d, t in zip(sent, targets):
        scalar = float(d.loss_fn_inputs["advantages"].to_numpy()[t != -100][0])
        by_question.setdefault(tuple(d.model_input.to_ints()[:14]), []).append(scalar)
    assert sorted(len(v) for v in by_question.values()) == [3, 3]
    assert all(abs(sum(v)) < 1e-5 for v in by_question.values())
