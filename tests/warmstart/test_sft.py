"""``run_sft`` shows each step on a bar (an SFT step is minutes on a CPU, and was silent)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from searchr1.data.types import QAExample
from searchr1.rollout.types import Trajectory
from searchr1.warmstart.sft import run_sft


class FakeClient:
    """forward_backward gives every target logprob −1; optim_step does nothing."""

    def forward_backward(self, datums, loss_fn):
        outputs = [{"logprobs": -np.ones(len(d.model_input))} for d in datums]
        return SimpleNamespace(result=lambda: SimpleNamespace(loss_fn_outputs=outputs))

    def optim_step(self, params):
        return SimpleNamespace(result=lambda: None)


def _traj() -> Trajectory:
    t = Trajectory.start(QAExample(id="q", question="?", golden_answers=("a",), data_source="s"), 0, [5, 6])
    t.append_sampled([7, 8, 9], [-0.1, -0.2, -0.3])
    return t


def test_each_sft_step_shows_on_a_bar(capsys):
    losses = run_sft(FakeClient(), [_traj(), _traj()], steps=3, batch_size=2, learning_rate=1e-3,
                     seed=0, adam={}, max_tokens=100)
    assert losses == [1.0, 1.0, 1.0]
    err = capsys.readouterr().err
    assert "sft (2 trajectories a step)" in err and "3/3" in err
    assert "step 1: forward-backward of 8 tokens" in err and "loss 1.0000" in err
