"""The critic's algorithm half: its update is the mean over loss micro-batches (cut from the
global mini-batch) of their token-mean value loss, whatever the value model."""

from __future__ import annotations

import numpy as np
from transformers import AutoModelForCausalLM

from searchr1.advantages.config import CriticConfig
from searchr1.advantages.critic import CriticBatch, critic_batch, update_critic
from searchr1.distributed.split import MinibatchShare
from searchr1.engines.local.training.critic import Critic
from tests.helpers.step_batches import batch_from_rows


def test_value_loss_is_the_mean_of_micro_batch_token_means(tiny_model_dir):
    """Zero head: V = 0, so the loss is ½·mean over micro-batches of the token mean of R²."""
    cfg = CriticConfig(lora_rank=4, lora_alpha=8, learning_rate=1e-2, warmup_ratio=0.0,
                       cliprange_value=10.0, microbatch_trajectories=2, max_tokens_per_pass=10_000)
    critic = Critic(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg, 10, 0, "cpu")
    lengths, r = (6, 4, 5), (1.0, 2.0, 3.0)
    inputs = [np.arange(3, 3 + n) for n in lengths]
    masks = [np.r_[0, np.ones(n - 1)] for n in lengths]  # 5, 3, 4 fitted tokens
    returns = [ri * m for ri, m in zip(r, masks)]
    got = update_critic(critic, CriticBatch(inputs, [np.zeros(n) for n in lengths], returns, masks))
    first = 0.5 * (5 * 1.0 + 3 * 4.0) / 8  # micro-batch {0, 1}
    second = 0.5 * 9.0  # micro-batch {2}
    assert abs(got["critic/value_loss"] - (first + second) / 2) < 1e-6


class Recorded:
    """A ``ValueModel`` that records the weights its update asks for."""

    microbatch_trajectories = 2

    def __init__(self):
        self.weights, self.steps = None, []

    def backward(self, batch, weights_D):
        self.weights = list(weights_D)
        return {"value_loss": 0.25, "vf_clipfrac": 0.0}

    def optimizer_step(self, step=None, dp=None):
        self.steps.append(step)
        return 1e-3


class Summed:
    """Data parallelism's ``all_sum`` as if another rank added ``other`` to the vector."""

    def __init__(self, other):
        self.other = other

    def all_sum(self, values):
        return [v + o for v, o in zip(values, self.other)]


def test_a_ranks_share_is_weighted_by_its_global_micro_batches():
    # this rank holds datums 1..2 (positions) of a global mini-batch of 4 in micro-batches of
    # 2: position 1 is in micro-batch 0 (with the other rank's datum 0, 3 tokens), position 2
    # in micro-batch 1 (with the other rank's datum 3, 1 token)
    masks = [np.array([0.0, 1.0, 1.0]), np.array([1.0, 1.0, 1.0, 0.0])]
    batch = CriticBatch([np.arange(3), np.arange(4)], [np.zeros(3), np.zeros(4)], [m * 0.5 for m in masks], masks)
    model = Recorded()
    got = update_critic(model, batch, step=7, share=MinibatchShare([0, 1], 1, 4), dp=Summed([4.0, 3.0, 1.0]))
    # micro-batch 0: 3 + 2 tokens, micro-batch 1: 3 + 1 tokens; 2 micro-batches
    assert model.weights == [1 / (5 * 2), 1 / (4 * 2)] and model.steps == [7]
    assert got == {"critic/value_loss": 0.25, "critic/vf_clipfrac": 0.0, "critic/lr": 1e-3}


def test_the_critic_batch_reads_the_value_columns_of_its_datums():
    batch = batch_from_rows([[1, 2, 3], [4, 5, 6, 7]], [[1, 1], [0, 1, 1]], [[-1.0, -1.0], [0.0, -1.0, -1.0]],
                            [[1.0, 1.0], [0.0, 1.0, 1.0]])
    batch.set_rows("values_T", [np.array([0.1, 0.2]), np.array([0.3, 0.4, 0.5])])
    batch.set_rows("returns_T", [np.array([1.0, 1.0]), np.array([0.0, 2.0, 2.0])])
    batch.value_mask_T = batch.mask_T.copy()
    part = critic_batch(batch, [1])
    assert [x.tolist() for x in part.inputs_D] == [[4, 5, 6]]
    assert [x.tolist() for x in part.old_values_D] == [[0.3, 0.4, 0.5]]
    assert [x.tolist() for x in part.returns_D] == [[0.0, 2.0, 2.0]]
    assert [x.tolist() for x in part.masks_D] == [[0.0, 1.0, 1.0]]
