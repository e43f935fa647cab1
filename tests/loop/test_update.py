"""The update's schedule on engine=trio: each call is queued before the previous result is
awaited, and the results are exactly those of the call-by-call schedule.

pytrio 0.2.9's real training client runs against ``tests/helpers/trio_actor.QueuedTrio``
(the Actor accepts events at once, runs them one at a time in order and answers long polls;
a forward's log-probs depend on how many optimizer steps ran before it), through
``StepRunner.train``. ``Recording`` logs when each call is submitted and awaited;
``Sequential`` makes every call wait for its result (the schedule before pipelining).
"""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from searchr1.advantages.config import AdvantageConfig
from searchr1.engines.trio import TrioService
from searchr1.loop.config import TrainerConfig
from searchr1.loop.train_step import StepRunner, StepSettings
from searchr1.loop.update import UpdateSettings
from searchr1.losses.config import LossConfig
from searchr1.rollout.config import RolloutConfig
from tests.engines.test_trio import engine_cfg, model_cfg, tok_dir  # noqa: F401
from tests.helpers.step_batches import random_groups
from tests.helpers.trio_actor import FB, OPTIM, QueuedTrio, Recording, Sequential

BUILTIN = LossConfig(name="importance_sampling")
#: the custom objective (an entropy bonus), mini-batch 0 on-policy (old log-probs recomputed)
CUSTOM = LossConfig(name="ppo", entropy_coef=0.01, entropy="sampled", old_logprobs="recompute")


@pytest.fixture()
def logged_in(monkeypatch):
    from pytrio.config.config import auth_state

    monkeypatch.setattr(auth_state, "api_key", "sk-test")
    monkeypatch.setattr(auth_state, "config_error", None)


def train(monkeypatch, tok_dir, tmp_path, wrap, loss=BUILTIN, groups=3, group_size=4,  # noqa: F811
          minibatch=4):
    """One ``StepRunner.train`` on a fresh QueuedTrio: (metrics, wrapped client, server, batch)."""
    fake = QueuedTrio(str(tok_dir), rtt=0.002, compute={FB: 0.01, OPTIM: 0.005}).install(monkeypatch)
    batch = random_groups(len(AutoTokenizer.from_pretrained(tok_dir)), groups, group_size)
    tcfg = TrainerConfig(minibatch_trajectories=minibatch)
    settings = StepSettings(RolloutConfig(group_size=group_size), AdvantageConfig(name="group_mean"),
                            UpdateSettings.from_configs(loss, tcfg), seed=0)
    service = TrioService(engine_cfg(), model_cfg(), tmp_path, tcfg)
    try:
        client = wrap(service.create_lora_training_client(rank=32, seed=0))
        metrics = asyncio.run(StepRunner(settings, None, None).train(client, batch, 0, lambda k: 1e-4 * (k + 1)))
    finally:
        service.close()
    assert not fake.unexpected, fake.unexpected
    return metrics, client, fake, batch


def test_each_call_is_queued_before_the_previous_result_is_awaited(monkeypatch, tok_dir, tmp_path,  # noqa: F811
                                                                   logged_in):
    _, client, fake, _ = train(monkeypatch, tok_dir, tmp_path, Recording)
    calls = client.submitted()
    assert calls == ["forward_backward#0", "optim_step#0", "forward_backward#1", "optim_step#1",
                     "forward_backward#2", "optim_step#2"]  # 12 trajectories, 3 mini-batches
    at = {entry: i for i, entry in enumerate(client.log)}
    for before, call in zip(calls, calls[1:]):
        assert at["submit", call] < at["await", before], (call, before, client.log)
    assert [label for what, label in client.log if what == "await"] == calls  # in order
    assert [kind for kind, _, _ in fake.runs if kind in (FB, OPTIM)] == [FB, OPTIM] * 3


@pytest.mark.parametrize("loss", [BUILTIN, CUSTOM], ids=["builtin", "custom_on_policy"])
def test_results_equal_the_call_by_call_schedule(monkeypatch, tok_dir, tmp_path, logged_in, loss):  # noqa: F811
    runs = {name: train(monkeypatch, tok_dir, tmp_path / name, wrap, loss)
            for name, wrap in (("pipelined", Recording), ("sequential", Sequential))}
    (m_pipe, _, fake_pipe, b_pipe), (m_seq, _, fake_seq, b_seq) = runs["pipelined"], runs["sequential"]
    assert m_pipe == m_seq  # exact: every loss, mismatch, grad norm and lr
    assert m_pipe["train/optimizer_steps"] == 3.0
    sent = lambda fake: [(e["type"], e["metadata"]["step"], e["payload"]) for e in fake.events]  # noqa: E731
    assert sent(fake_pipe) == sent(fake_seq)  # same events, same gradient-accumulation steps
    assert (b_pipe.old_T == b_seq.old_T).all()  # the on-policy mini-batch's baseline too
    assert fake_pipe.version == fake_seq.version == 3
