"""model.tuning=full on a tiny fp32 Llama: AdamW equality, live sampler, frozen reference, resume."""

from __future__ import annotations

import copy

import pytest
import torch
from pytrio.types import AdamParams, Datum, ModelInput, TensorData
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.config import LocalEngineConfig
from searchr1.engines.local.sampling.sampling_client import LocalSamplingClient
from searchr1.engines.local.training.client import LocalTrainingClient
from searchr1.engines.local.training.setup import build_trainable
from tests.conftest import tiny_tokenizer

F32 = torch.float32
ADAM = AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.5)


def tiny_model(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                      pad_token_id=0, eos_token_id=1, bos_token_id=1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).to(F32)


def datum(g: torch.Generator, vocab: int) -> Datum:
    n = int(torch.randint(6, 12, (), generator=g))
    tokens = torch.randint(3, vocab, (n + 1,), generator=g).tolist()
    mask = [0.0] * 2 + [1.0] * (n - 2)
    return Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": TensorData.from_torch(torch.tensor(tokens[1:])),
        "weights": TensorData.from_torch(torch.tensor(mask)),
        "logprobs": TensorData.from_torch(torch.full((n,), -3.0) * torch.tensor(mask)),
        "advantages": TensorData.from_torch(torch.randn(n, generator=g) * torch.tensor(mask)),
    })


def create_full_training_client(model, tokenizer, **client_kwargs) -> LocalTrainingClient:
    """Every weight of ``model`` trained, as the local service builds it for model.tuning=full."""
    trainable = build_trainable(model, "full", rank=0, alpha=0, seed=0, device="cpu")
    return LocalTrainingClient(trainable, tokenizer, **client_kwargs)


@pytest.fixture()
def setup(tmp_path):
    tok = tiny_tokenizer()
    client = create_full_training_client(tiny_model(len(tok)), tok, checkpoint_dir=tmp_path,
                                         engine_cfg=LocalEngineConfig(sampler="hf", device="cpu"))
    g = torch.Generator().manual_seed(0)
    return client, tok, [datum(g, len(tok)) for _ in range(4)]


def test_every_weight_trains_and_the_step_equals_plain_adamw(setup) -> None:
    client, _, data = setup
    twin = copy.deepcopy(client.model)
    twin_params = [p for p in twin.parameters()]
    assert len(client.trainable.params) == len(twin_params)  # every parameter is trained
    reference = torch.optim.AdamW(twin_params, lr=ADAM.learning_rate, betas=(ADAM.beta1, ADAM.beta2),
                                  eps=ADAM.eps, weight_decay=ADAM.weight_decay)
    for _ in range(2):
        client.forward_backward(data, "importance_sampling").result()
        for mine, theirs in zip(client.model.parameters(), twin_params):
            theirs.grad = mine.grad.clone()
        torch.nn.utils.clip_grad_norm_(twin_params, ADAM.grad_clip_norm)
        reference.step()
        client.optim_step(ADAM).result()
    for mine, theirs in zip(client.model.parameters(), twin_params):
        assert torch.allclose(mine, theirs, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(client.model.parameters(),
                                                     client.trainable.reference.parameters()))


def test_reference_logprobs_stay_the_initial_models_while_the_policy_moves(setup) -> None:
    client, _, data = setup
    before_ref = client.compute_reference_logprobs(data)
    before_pol = [torch.tensor(o["logprobs"].tolist()) for o in client.forward(data).result().loss_fn_outputs]
    for _ in range(2):
        client.forward_backward(data, "importance_sampling").result()
        client.optim_step(ADAM).result()
    after_ref = client.compute_reference_logprobs(data)
    after_pol = [torch.tensor(o["logprobs"].tolist()) for o in client.forward(data).result().loss_fn_outputs]
    assert all(torch.equal(a, b) for a, b in zip(before_ref, after_ref))
    assert all(torch.allclose(a, b.float(), atol=1e-6) for a, b in zip(before_ref, before_pol))
    assert max(float((a - b).abs().max()) for a, b in zip(after_pol, before_pol)) > 1e-3


async def test_sampler_after_a_step_equals_a_fresh_model_with_the_new_weights(setup, tmp_path) -> None:
    client, tok, data = setup
    sampler = client.save_weights_and_get_sampling_client()
    client.forward_backward(data, "importance_sampling").result()
    client.optim_step(ADAM).result()
    fresh_model = tiny_model(len(tok))
    fresh_model.load_state_dict(client.model.state_dict())
    fresh = LocalSamplingClient(fresh_model, tok, LocalEngineConfig(sampler="hf", device="cpu"))
    from pytrio.types import SamplingParams

    prompt = ModelInput.from_ints(tok.encode("hello"))
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    got = await sampler.sample_async(prompt, 2, params)
    want = await fresh.sample_async(prompt, 2, params)
    for a, b in zip(got.sequences, want.sequences):
        assert a.tokens == b.tokens
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_checkpoint_round_trip_resumes_exactly_and_sampler_save_loads(setup, tmp_path) -> None:
    client, tok, data = setup
    client.forward_backward(data, "importance_sampling").result()
    client.optim_step(ADAM).result()
    saved = client.save_state("step_1").result().path
    client.forward_backward(data, "importance_sampling").result()
    client.optim_step(ADAM).result()
    uninterrupted = [p.detach().clone() for p in client.model.parameters()]

    resumed = create_full_training_client(tiny_model(len(tok)), tok, checkpoint_dir=tmp_path / "b")
    resumed.load_state_with_optimizer(saved).result()
    assert resumed.step == 1
    resumed.forward_backward(data, "importance_sampling").result()
    resumed.optim_step(ADAM).result()
    for a, b in zip(resumed.model.parameters(), uninterrupted):
        assert torch.equal(a, b)

    folder = client.save_weights_for_sampler("final").result().path
    loaded = LlamaForCausalLM.from_pretrained(folder)
    for (name, a), b in zip(loaded.state_dict().items(), client.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert len(type(tok).from_pretrained(folder)) == len(tok)
