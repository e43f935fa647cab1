"""The step's scoring passes on hand-made batches: each whole trajectory scored by the sampler
(the observation-mask ablation), KL by hand, and the targets-only datums the passes send."""

from __future__ import annotations

from types import SimpleNamespace
import asyncio

import numpy as np
import pytest

from searchr1.engines.base import EngineCapabilities
from searchr1.batch.step_batch import build_step_batch
from searchr1.losses.config import KLConfig
from searchr1.loop.step_scoring import kl_stage, observation_logprobs, recompute_logprobs, reference_logprobs
from tests.helpers.step_batches import group_batch, one_turn, trajectory, two_turn


def test_observation_logprobs_score_each_whole_trajectory_with_the_sampler():
    seen = []

    class Sampler:
        async def compute_logprobs_async(self, prompt):
            seen.append(prompt.to_ints())
            return [None] + [-float(x) for x in prompt.to_ints()[1:]]

    out = asyncio.run(observation_logprobs([two_turn(), one_turn()], Sampler()))
    assert seen == [two_turn().tokens_T, one_turn().tokens_T]
    assert out[1] == [None, -12.0, -50.0, -51.0, -52.0]


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
