"""LocalTrainingClient on a tiny random float64 Llama, against direct computations."""

from __future__ import annotations

import types

import pytest
import torch
from pytrio.client.training_batch import plan_training_batch
from pytrio.model.limits import TrainingLimits
from pytrio.types import AdamParams, Datum, ForwardBackwardOutput, ModelInput, TensorData
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.training.client import LocalTrainingClient, create_lora_training_client
from searchr1.losses import kl_loss_term

VOCAB = 64
F64 = torch.float64


class _Tokenizer:
    """The trainer only needs ``len(tokenizer)`` (pytrio's token-ID bound)."""

    def __len__(self) -> int:
        return VOCAB


def tiny_base(seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(cfg).to(F64)


def make_client(tmp_path, seed: int = 0, **kwargs) -> LocalTrainingClient:
    client = create_lora_training_client(
        tiny_base(), _Tokenizer(), rank=4, alpha=8, seed=seed, checkpoint_dir=tmp_path, **kwargs
    )
    with torch.no_grad(), torch.random.fork_rng():  # nonzero B: every adapter gets a gradient
        torch.manual_seed(seed + 100)
        for name, p in client.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return client


def trajectory(g: torch.Generator, advantage: float) -> Datum:
    """prompt (mask 0) → action (1) → observation (0, logprob 0) → action (1), pre-shifted."""
    n_prompt, n_act, n_obs, n_act2 = (int(x) for x in torch.randint(2, 5, (4,), generator=g))
    tokens = torch.randint(0, VOCAB, (n_prompt + n_act + n_obs + n_act2,), generator=g).tolist()
    mask = [0] * n_prompt + [1] * n_act + [0] * n_obs + [1] * n_act2
    old = [(-1.0 - 4.0 * float(torch.rand((), generator=g))) * m for m in mask]
    L = len(tokens) - 1
    return Datum(
        model_input=ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[L]),
            "logprobs": TensorData(data=old[1:], dtype="float32", shape=[L]),
            "advantages": TensorData(data=[advantage * m for m in mask[1:]], dtype="float32", shape=[L]),
            "mask": TensorData(data=[float(m) for m in mask[1:]], dtype="float32", shape=[L]),
        },
    )


def batch(n: int = 6, seed: int = 0) -> list[Datum]:
    g = torch.Generator().manual_seed(seed)
    return [trajectory(g, advantage=float(torch.randn((), generator=g))) for _ in range(n)]


def field(datum: Datum, name: str) -> torch.Tensor:
    tensor = datum.loss_fn_inputs[name]
    return torch.tensor(tensor.data, dtype=torch.long if tensor.dtype == "int64" else F64)


def direct_logprobs(model: torch.nn.Module, datum: Datum) -> torch.Tensor:
    """One datum alone through the model: log softmax at each position, gathered at targets."""
    logits = model(input_ids=torch.tensor([datum.model_input.to_ints()])).logits[0]
    return torch.log_softmax(logits, -1).gather(-1, field(datum, "target_tokens")[:, None])[:, 0]


def lora_grads(client: LocalTrainingClient) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in client.model.named_parameters() if p.requires_grad}


def lora_params(client: LocalTrainingClient) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in client.model.named_parameters() if p.requires_grad}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_datums_pass_pytrios_planner_with_expected_totals() -> None:
    data = batch()
    limits = TrainingLimits(max_batch_size=2, max_tokens_per_request=None, max_seq_len=None)
    plan = plan_training_batch(data, loss_fn="ppo", auto_shift=False, limits=limits, tokenizer_vocab_size=VOCAB)
    assert len(plan.chunks) == 3
    assert plan.totals.total_samples == 6
    assert plan.totals.total_active_tokens == sum(len(d.model_input) for d in data)
    assert plan.totals.total_advantage_tokens == sum(int((field(d, "advantages") != 0).sum()) for d in data)


def test_forward_backward_logprobs_equal_a_direct_forward(tmp_path) -> None:
    client = make_client(tmp_path, max_batch_datums=4)
    data = batch()
    out = client.forward_backward(data, "importance_sampling").result()
    assert isinstance(out, ForwardBackwardOutput) and len(out.loss_fn_outputs) == len(data)
    with torch.no_grad():
        for datum, output in zip(data, out.loss_fn_outputs):
            got = torch.tensor(output["logprobs"].data, dtype=F64)
            assert torch.allclose(got, direct_logprobs(client.model, datum), atol=1e-6)  # float32 wire
    assert {"loss_sum", "loss_mean", "token_count", "ratio_mean"} <= out.metrics.keys()


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"])
def test_micro_batched_gradient_equals_single_batch_gradient(tmp_path, loss_fn: str) -> None:
    data = batch()
    whole = make_client(tmp_path / "a", max_batch_datums=None, max_batch_tokens=None)
    chunked = make_client(tmp_path / "b", max_batch_datums=2)  # 6 datums → 3 pytrio chunks
    assert max_diff(lora_params(whole), lora_params(chunked)) == 0.0
    out_whole = whole.forward_backward(data, loss_fn).result()
    out_chunked = chunked.forward_backward(data, loss_fn).result()
    assert max_diff(lora_grads(whole), lora_grads(chunked)) <= 1e-10
    assert out_chunked.metrics["loss_sum"] == pytest.approx(out_whole.metrics["loss_sum"], abs=1e-10)
    assert out_chunked.metrics["token_count"] == out_whole.metrics["token_count"]


def test_importance_sampling_gradient_equals_autograd_of_the_direct_formula(tmp_path) -> None:
    client = make_client(tmp_path, max_batch_datums=2)
    data = batch()
    client.forward_backward(data, "importance_sampling").result()
    got = lora_grads(client)
    client.model.zero_grad(set_to_none=True)
    n_active = sum(len(d.model_input) for d in data)  # pytrio counts every valid label
    total = sum(
        -(torch.exp(direct_logprobs(client.model, d) - field(d, "logprobs")) * field(d, "advantages")).sum()
        for d in data
    )
    (total / n_active).backward()
    assert max_diff(got, lora_grads(client)) <= 1e-10


def test_auto_shift_matches_the_pre_shifted_datums(tmp_path) -> None:
    shifted = batch(3)
    unshifted = []
    for d in shifted:  # full sequence as input and targets; inputs padded with a dummy first label
        seq = d.model_input.to_ints() + [int(d.loss_fn_inputs["target_tokens"].data[-1])]
        pad = lambda name: [0.0] + list(d.loss_fn_inputs[name].data)  # noqa: E731
        unshifted.append(Datum(model_input=ModelInput.from_ints(seq), loss_fn_inputs={
            "target_tokens": TensorData(data=seq, dtype="int64", shape=[len(seq)]),
            "logprobs": TensorData(data=pad("logprobs"), dtype="float32", shape=[len(seq)]),
            "advantages": TensorData(data=pad("advantages"), dtype="float32", shape=[len(seq)]),
        }))
    a, b = make_client(tmp_path / "a"), make_client(tmp_path / "b")
    out_a = a.forward_backward(shifted, "ppo").result()
    out_b = b.forward_backward(unshifted, "ppo", auto_shift=True).result()
    assert max_diff(lora_grads(a), lora_grads(b)) <= 1e-10
    assert out_b.loss_fn_outputs[0]["logprobs"].data[0] == 0.0  # the dropped first label
    assert out_a.metrics["token_count"] == out_b.metrics["token_count"]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_one_step_moves_target_logprobs_with_the_advantage_sign(tmp_path, sign: float) -> None:
    client = make_client(tmp_path)
    datum = trajectory(torch.Generator().manual_seed(7), advantage=sign)
    action = field(datum, "mask") > 0
    with torch.no_grad():
        before = direct_logprobs(client.model, datum)[action].sum()
    client.forward_backward([datum], "importance_sampling").result()
    response = client.optim_step(AdamParams(learning_rate=1e-3)).result()
    with torch.no_grad():
        after = direct_logprobs(client.model, datum)[action].sum()
    assert sign * (after - before) > 0
    assert response.metrics["grad_norm"] > 0 and client.step == 1


def test_grad_norm_is_reported_before_clipping(tmp_path) -> None:
    client = make_client(tmp_path)
    client.forward_backward(batch(2), "importance_sampling").result()
    norm = torch.sqrt(sum((g**2).sum() for g in lora_grads(client).values()))
    response = client.optim_step(AdamParams(learning_rate=1e-3, grad_clip_norm=float(norm) / 10)).result()
    assert response.metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-9)
    assert client.last_grad_norm == response.metrics["grad_norm"]
    assert all(p.grad is None for p in client.model.parameters())


def test_reference_logprobs_stay_the_base_models_after_training(tmp_path) -> None:
    base_copy = tiny_base()
    client = make_client(tmp_path)
    data = batch(3)
    for _ in range(2):
        client.forward_backward(data, "importance_sampling").result()
        client.optim_step(AdamParams(learning_rate=1e-2)).result()
    reference = client.compute_reference_logprobs(data)
    with torch.no_grad():
        for datum, ref in zip(data, reference):
            assert torch.allclose(ref, direct_logprobs(base_copy, datum), atol=1e-12)
            assert not torch.allclose(ref, direct_logprobs(client.model, datum), atol=1e-3)


def test_save_and_load_with_optimizer_reproduces_the_next_step_exactly(tmp_path) -> None:
    data, adam = batch(4), AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)
    original = make_client(tmp_path / "a")
    original.forward_backward(data, "ppo").result()
    original.optim_step(adam).result()
    saved = original.save_state("step 1").result()
    assert saved.path.endswith("step-1") and saved.size > 0
    original.forward_backward(data, "ppo").result()
    original.optim_step(adam).result()

    resumed = make_client(tmp_path / "b", seed=5)  # different init: everything must come from disk
    resumed.load_state_with_optimizer(saved.path).result()
    assert resumed.step == 1
    resumed.forward_backward(data, "ppo").result()
    resumed.optim_step(adam).result()
    assert max_diff(lora_params(original), lora_params(resumed)) == 0.0

    weights_only = make_client(tmp_path / "c", seed=5)  # fresh AdamW moments: a different step
    weights_only.load_state(saved.path).result()
    weights_only.forward_backward(data, "ppo").result()
    weights_only.optim_step(adam).result()
    assert max_diff(lora_params(original), lora_params(weights_only)) > 0.0


def test_checkpoints_are_atomic_named_and_refuse_silent_overwrite(tmp_path) -> None:
    client = make_client(tmp_path)
    path = client.save_state("ckpt").result().path
    with pytest.raises(FileExistsError):
        client.save_state("ckpt")
    client.save_state("ckpt", overwrite=True).result()
    sampler_path = client.save_weights_for_sampler("w").result().path
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["ckpt"]  # no temp dirs left
    assert {"adapter_model.safetensors", "adapter_config.json", "trainer_state.pt"} <= {
        p.name for p in (tmp_path / "state" / "ckpt").iterdir()
    }
    assert path.startswith(str(tmp_path)) and (tmp_path / "sampler" / "w" / "adapter_model.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="no optimizer state"):
        client.load_state_with_optimizer(sampler_path)


def test_invalid_inputs_raise_pytrios_errors(tmp_path) -> None:
    client = make_client(tmp_path)
    with pytest.raises(ValueError, match="Unsupported loss function type: grpo"):
        client.forward_backward(batch(1), "grpo")
    with pytest.raises(ValueError, match="does not accept loss_fn_config keys"):
        client.forward_backward(batch(1), "ppo", {"clip_low": 0.2})
    bad = batch(1)[0].model_copy(deep=True)
    bad.loss_fn_inputs["target_tokens"].data[0] = VOCAB
    with pytest.raises(Exception, match="outside the tokenizer vocabulary"):
        client.forward([bad], "importance_sampling")


def test_forward_backward_custom_kl_gradient_equals_autograd(tmp_path) -> None:
    client = make_client(tmp_path, max_batch_datums=2)
    data = batch(4)
    reference = client.compute_reference_logprobs(data)
    n_active = float(sum(len(d.model_input) for d in data))

    def kl_loss(datums, logprobs):
        loss = sum(
            kl_loss_term(lp, ref, field(d, "mask"), coef=0.5, estimator="k3", denominator=n_active)
            for d, lp, ref in zip(datums, logprobs, reference)
        )
        return loss, {"kl": float(loss.detach())}

    out = client.forward_backward_custom(data, kl_loss).result()
    assert out.metrics["kl"] > 0
    got = lora_grads(client)
    client.model.zero_grad(set_to_none=True)
    direct, _ = kl_loss(data, [direct_logprobs(client.model, d) for d in data])
    direct.backward()
    assert max_diff(got, lora_grads(client)) <= 1e-10


class FakePool:
    """The service's sampler pool as the training client uses it: ``client(model, lock, version)``."""

    def __init__(self) -> None:
        self.made = []

    def client(self, model, model_lock=None, weights_version=None):
        self.made.append(types.SimpleNamespace(model=model, model_lock=model_lock, weights_version=weights_version))
        return self.made[-1]


def test_sampling_client_wraps_the_live_model(tmp_path) -> None:
    pool = FakePool()
    client = make_client(tmp_path, samplers=pool)
    sampler = client.save_weights_and_get_sampling_client()
    assert sampler.model is client.model and sampler.model_lock is client.model_lock
    assert sampler.weights_version() == client.weights_version
    assert client.save_weights_and_get_sampling_client("s1") is sampler
    assert (tmp_path / "sampler" / "s1").is_dir()
    snapshot = client.create_sampling_client(str(tmp_path / "sampler" / "s1"))
    assert snapshot.model is not client.model and max_diff(
        {n: p.detach() for n, p in snapshot.model.named_parameters() if p.requires_grad}, lora_params(client)
    ) == 0.0


async def test_futures_come_back_resolved_and_awaitable(tmp_path) -> None:
    client = make_client(tmp_path)
    future = client.forward_backward(batch(1), "importance_sampling")
    assert future.done()  # the local engine computed it in the call
    assert isinstance(future.result(), ForwardBackwardOutput)
    assert isinstance(await future, ForwardBackwardOutput)
    step = await client.optim_step(AdamParams())
    assert step.metrics["step"] == 1.0
    assert client.get_tokenizer() is client.tokenizer
