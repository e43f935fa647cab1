"""The step batch under data parallelism: the packing plan follows this rank's shares of the
global mini-batches, an empty share still takes its optimizer step and sends nothing, a
share's built-in loss is scaled by the global mini-batch's tokens, and a rank that kept no
datum builds an empty batch whose scoring calls no engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from searchr1.advantages import ADVANTAGES, fill_advantages
from searchr1.advantages.config import AdvantageConfig
from searchr1.distributed.split import MinibatchShare, global_minibatches
from searchr1.losses.config import KLConfig, LossConfig
from searchr1.loop.step_scoring import kl_stage, scoring_stage
from searchr1.engines.base import EngineCapabilities
from searchr1.loop.train_step import Selected, batch_stage
from searchr1.losses.aggregation import GlobalTotals
from searchr1.loop.update import UpdateSettings, collect_minibatch, plan_update, submit_minibatch
from tests.helpers.step_batches import batch_from_rows


def _settings(size: int = 0, max_datums: int = 1) -> UpdateSettings:
    return UpdateSettings(LossConfig(name="importance_sampling"), minibatch_trajectories=size,
                          max_datums_per_microbatch=max_datums)


def test_the_plan_packs_this_ranks_share_of_each_global_minibatch():
    # ranks hold 3 + 3 datums, mini-batches of 4: global [0..3] [4, 5]; rank 1 holds the
    # last of the first (offset 3) and all of the second
    shares = global_minibatches([3, 3], 1, 4)
    plan = plan_update([5, 3, 4], _settings(4), shares)
    assert plan.minibatches == [[0], [1, 2]]
    assert [(s.offset, s.size) for s in plan.shares] == [(3, 4), (0, 2)]
    assert plan.bins == [[[0]], [[2], [1]]]  # one datum per bin, longest first (FFD)
    assert plan.sent(1) == [2, 1]
    one = plan_update([5, 3, 4], _settings(2))  # one process: the batch's own mini-batches
    assert one.minibatches == [[0, 1], [2]] and one.shares == global_minibatches([3], 0, 2)


class Client:
    """Records the training calls; forward_backward echoes −1 per target."""

    capabilities = EngineCapabilities()  # a remote-like engine: nothing in process

    def __init__(self):
        self.calls = []

    def _done(self, value):
        return type("Future", (), {"result": lambda self: value})()

    def forward_backward(self, data, loss_fn, config=None):
        self.calls.append(("forward_backward", data))
        out = [{"logprobs": np.full(len(d.model_input.to_ints()), -1.0)} for d in data]
        return self._done(type("FB", (), {"metrics": {"loss:mean": 0.5}, "loss_fn_outputs": out})())

    def forward_backward_custom(self, data, loss_fn):
        raise AssertionError("importance_sampling goes through the built-in loss")

    def optim_step(self, adam):
        self.calls.append(("optim_step", adam.learning_rate))
        return self._done(type("Opt", (), {"metrics": {}})())


def test_an_empty_share_sends_nothing_and_still_steps_and_a_share_is_scaled_globally():
    batch = batch_from_rows([[1, 2, 3]], [[1, 1]], [[-1.0, -1.0]], [[2.0, 2.0]])
    shares = [MinibatchShare([], 0, 3), MinibatchShare([0], 2, 3)]
    batch.plan = plan_update(batch.lengths_D, _settings(3), shares)
    s, client = _settings(3), Client()
    out = collect_minibatch(submit_minibatch(client, batch, 0, s, 1e-3,
                                               GlobalTotals(4.0, 1.0, (4.0,), 3, 0, 3), True))
    assert client.calls == [("optim_step", 1e-3)] and out["train/lr"] == 1e-3
    # the global mini-batch has 8 loss tokens, this share 2: the engine's token mean over
    # 2 tokens becomes the global one when each advantage is scaled by 2 / 8
    submit_minibatch(client, batch, 1, s, 1e-3, GlobalTotals(8.0, 1.0, (8.0,), 3, 2, 3), True)
    (_, data), _ = client.calls[1:]
    assert data[0].loss_fn_inputs["advantages"].to_numpy().tolist() == pytest.approx([0.5, 0.5])


class NoEngine:
    def __getattr__(self, name):
        raise AssertionError(f"a rank without datums called {name}")


@pytest.mark.parametrize("name", ["grpo_std", "ppo_gae"])
def test_a_rank_without_datums_has_an_empty_batch_and_calls_no_engine(name):
    batch = asyncio.run(batch_stage(Selected(n_trajectories=4), 100, sampler=NoEngine()))
    assert batch.size == 0 and batch.n_trajectories == 4.0  # counted in the global totals
    critic = NoEngine() if name == "ppo_gae" else None
    kl = KLConfig(coef=0.1, placement="reward")
    asyncio.run(scoring_stage(NoEngine(), NoEngine(), critic, batch, "recompute", kl))
    assert batch.old_T.size == batch.ref_T.size == 0
    assert kl_stage(batch, kl) == {} and batch.penalty_T.size == 0
    fill_advantages(batch, ADVANTAGES.get(name), AdvantageConfig(name=name))
    assert batch.advantages_T.size == 0
