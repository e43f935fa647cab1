"""The frozen KL reference adapter (``engines/local/training/reference.py``): the warm start, not the base."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pytrio.types import AdamParams

from searchr1.engines.local.training import reference
from tests.engines.local.training.test_client import batch, direct_logprobs, make_client, tiny_base


def _trained(client) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in client.model.named_parameters() if p.requires_grad}


def test_after_freeze_the_reference_is_the_policy_of_now_not_the_base(tmp_path):
    client = make_client(tmp_path)  # nonzero B: the "warm start" moved the policy off the base
    data = batch(3)
    base = tiny_base()
    before = client.compute_reference_logprobs(data)
    with torch.no_grad():  # no frozen copy yet: adapters off, i.e. the base model
        assert all(torch.allclose(r, direct_logprobs(base, d), atol=1e-12) for d, r in zip(data, before))
        policy = [direct_logprobs(client.model, d) for d in data]
    assert not torch.allclose(before[0], policy[0], atol=1e-3)
    rng = torch.get_rng_state()
    trained = set(_trained(client))
    client.freeze_reference()
    assert torch.equal(torch.get_rng_state(), rng)  # the copy's init draws from a forked RNG
    assert set(_trained(client)) == trained  # the copy is frozen; the optimizer's set unchanged
    frozen = client.compute_reference_logprobs(data)
    for f, p in zip(frozen, policy):  # KL(policy ‖ reference) = 0 at the start of RL
        assert torch.allclose(f, p, atol=1e-12)
    for _ in range(2):  # training moves the policy, not the reference
        client.forward_backward(data, "importance_sampling").result()
        client.optim_step(AdamParams(learning_rate=1e-2)).result()
    after = client.compute_reference_logprobs(data)
    with torch.no_grad():
        moved = [direct_logprobs(client.model, d) for d in data]
    assert all(torch.allclose(a, f, atol=1e-12) for a, f in zip(after, frozen))
    assert not torch.allclose(moved[0], frozen[0], atol=1e-4)
    assert client.model.active_adapters == [reference.POLICY]


def test_the_reference_survives_a_checkpoint_and_stays_out_of_sampler_saves(tmp_path):
    client = make_client(tmp_path / "a")
    data = batch(2)
    client.freeze_reference()
    client.forward_backward(data, "importance_sampling").result()
    client.optim_step(AdamParams(learning_rate=1e-2)).result()
    expected = client.compute_reference_logprobs(data)
    state = client.save_state("step 1").result().path
    resumed = make_client(tmp_path / "b", seed=5)  # other adapters, no reference copy
    resumed.load_state_with_optimizer(state).result()
    got = resumed.compute_reference_logprobs(data)
    assert all(torch.allclose(g, e, atol=1e-12) for g, e in zip(got, expected))
    sampler = client.save_weights_for_sampler("export").result().path  # what a user loads
    files = sorted(p.relative_to(sampler).as_posix() for p in Path(sampler).rglob("*"))
    assert not [f for f in files if "reference" in f] and "adapter_model.safetensors" in files, files
    from safetensors import safe_open

    with safe_open(str(Path(sampler) / "adapter_model.safetensors"), "pt") as f:
        assert f.keys() and not [k for k in f.keys() if "reference" in k]
    assert json.loads((Path(sampler) / "adapter_config.json").read_text())["r"] == 4


def test_a_checkpoint_without_a_reference_keeps_adapters_off(tmp_path):
    client = make_client(tmp_path / "a")
    state = client.save_state("plain").result().path
    resumed = make_client(tmp_path / "b")
    resumed.load_state_with_optimizer(state).result()
    assert not reference.has(resumed.model)
    data = batch(2)
    with torch.no_grad():
        base = [direct_logprobs(tiny_base(), d) for d in data]
    got = resumed.compute_reference_logprobs(data)
    assert all(torch.allclose(g, b, atol=1e-12) for g, b in zip(got, base))
