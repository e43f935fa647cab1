"""The one-pass gradient of a separable custom loss against the two-pass custom contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from searchr1.losses.config import Aggregation, KLConfig, KLEstimator, KLPlacement, LossConfig
from searchr1.loop.update import UpdateSettings, objective
from tests.engines.local.training.test_client import VOCAB, lora_grads, make_client
from tests.helpers.step_batches import batch_from_rows


def step_batch(n: int = 7, seed: int = 0):
    rng = np.random.default_rng(seed)
    tokens, masks, logprobs, advantages = [], [], [], []
    for _ in range(n):
        length = int(rng.integers(5, 13))
        tokens.append(rng.integers(0, VOCAB, size=length))
        mask = (rng.random(length - 1) < 0.7).astype(float)
        mask[0] = 1.0
        masks.append(mask)
        logprobs.append((-rng.random(length - 1) - 3.0) * mask)
        advantages.append(np.full(length - 1, rng.normal()))
    batch = batch_from_rows(tokens, masks, logprobs, advantages, n_trajectories=n + 2)
    batch.ref_T = (batch.sampler_T - 0.3 * rng.random(batch.sampler_T.shape)) * batch.mask_T
    return batch


def plain(loss_fn):
    """The same loss without its ``separable`` form: the engine scores first, then backprops."""
    def two_pass(data, logprobs_D, *, entropy_D=None):
        return loss_fn(data, logprobs_D, entropy_D=entropy_D)

    two_pass.wants_entropy = loss_fn.wants_entropy
    return two_pass


@pytest.mark.parametrize("layout", ["packed", "padded"])
@pytest.mark.parametrize("mode", ["microbatch_token_mean", "token_mean", "seq_mean_token_mean"])
def test_separable_objective_gradient_equals_the_two_pass_gradient(tmp_path, layout, mode) -> None:
    batch = step_batch()
    loss = LossConfig(name="ppo", aggregation=Aggregation(mode), entropy_coef=0.05,
                      kl=KLConfig(coef=0.2, estimator=KLEstimator.low_var_kl, placement=KLPlacement.loss))
    s = UpdateSettings(loss, microbatch_trajectories=3)
    part, sent = list(range(batch.size)), [3, 0, 6, 1, 5, 2, 4]
    results = []
    for name, wrap in (("one", lambda f: f), ("two", plain)):
        # ≤ 20 tokens per engine micro-batch: the 7 datums span several micro-batches
        client = make_client(tmp_path / name, layout=layout, max_batch_tokens=20, logits_chunk=4)
        loss_fn = wrap(objective(s, batch, part, sent))
        calls = []
        hook = client.model.get_input_embeddings().register_forward_hook(lambda *a: calls.append(1))
        out = client.forward_backward_custom(batch.datums(sent), loss_fn).result()
        hook.remove()
        results.append((out, lora_grads(client), len(calls)))
    (one, g_one, n_one), (two, g_two, n_two) = results
    assert n_one >= 2 and n_two == 2 * n_one  # one forward per micro-batch instead of two
    for key in g_two:
        assert torch.allclose(g_one[key], g_two[key], rtol=1e-9, atol=1e-12), key
    assert max(float(g.abs().max()) for g in g_two.values()) > 1e-6  # the loss has a gradient
    shared = {k for k in two.metrics if not k.startswith(("tokens_per_second", "mfu", "seconds"))}
    for key in shared & {"loss", "loss_mean", "loss_policy", "entropy", "kl", "token_count", "ratio_mean",
                         "clip_fraction"}:
        assert one.metrics[key] == pytest.approx(two.metrics[key], rel=1e-9, abs=1e-12), key
    assert {"loss_mean", "entropy", "kl", "token_count"} <= one.metrics.keys()
    for a, b in zip(one.loss_fn_outputs, two.loss_fn_outputs):
        assert a["logprobs"].tolist() == b["logprobs"].tolist()


def test_separable_parts_sum_to_the_whole_objective() -> None:
    """Any split of the datums: the parts' losses and metric sums add up to the whole call's."""
    batch = step_batch(5, seed=3)
    loss = LossConfig(name="ppo", aggregation=Aggregation.microbatch_token_mean, entropy_coef=0.1,
                      kl=KLConfig(coef=0.5, estimator=KLEstimator.k3, placement=KLPlacement.loss))
    sent = [4, 2, 0, 1, 3]
    fn = objective(UpdateSettings(loss, microbatch_trajectories=2), batch, list(range(5)), sent)
    rng = np.random.default_rng(1)
    logp = [torch.tensor(batch.row("sampler_T", i) + 0.1 * rng.normal(size=batch.lengths_D[i]))
            for i in sent]
    ent = [torch.tensor(rng.random(batch.lengths_D[i])) for i in sent]
    whole, metrics = fn(None, logp, entropy_D=ent)
    sums: dict = {}
    total = 0.0
    for idx in ([0, 3], [1], [2, 4]):
        part_loss, part_sums = fn.separable.part(idx, [logp[i] for i in idx], [ent[i] for i in idx])
        total += float(part_loss)
        for k, v in part_sums.items():
            sums[k] = sums.get(k, 0.0) + v
    assert total == pytest.approx(float(whole.detach()), rel=1e-12)
    assert fn.separable.metrics(sums) == pytest.approx(metrics, rel=1e-12)
