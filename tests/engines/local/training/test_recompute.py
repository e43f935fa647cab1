"""Recomputed decoder layers and the CPU logits budget: same numbers, bounded training memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.training import logprobs
from searchr1.engines.local.training.recompute import decoder_layers, recompute_layers
from searchr1.engines.local.training.client import create_lora_training_client
from pytrio.types import Datum, ModelInput, TensorData

from tests.engines.local.training.test_client import batch, lora_grads, make_client

CPU = torch.device("cpu")


def outputs(out) -> list[torch.Tensor]:
    return [torch.tensor(o["logprobs"].data) for o in out.loss_fn_outputs]


@pytest.mark.parametrize(("layout", "loss_fn"), [("packed", "ppo"), ("padded", "cross_entropy")])
def test_recompute_keeps_loss_logprobs_and_gradients(tmp_path, layout: str, loss_fn: str) -> None:
    data = batch(6, seed=11)
    if loss_fn == "cross_entropy":
        data = [d.model_copy(update={"loss_fn_inputs": {
            "target_tokens": d.loss_fn_inputs["target_tokens"], "weights": d.loss_fn_inputs["mask"]}})
            for d in data]
    on = make_client(tmp_path / "on", layout=layout, recompute=True, max_batch_tokens=30)
    off = make_client(tmp_path / "off", layout=layout, recompute=False, max_batch_tokens=30)
    out_on, out_off = (c.forward_backward(data, loss_fn).result() for c in (on, off))
    assert out_on.metrics["loss_sum"] == pytest.approx(out_off.metrics["loss_sum"], abs=1e-12)
    for a, b in zip(outputs(out_on), outputs(out_off), strict=True):
        assert torch.allclose(a, b, atol=1e-12)
    a, b = lora_grads(on), lora_grads(off)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-12


def test_recompute_keeps_the_custom_loss_gradient(tmp_path) -> None:
    data = batch(4, seed=12)

    def loss_fn(datums, logps):
        return sum((lp * lp).sum() for lp in logps), {}

    on = make_client(tmp_path / "on", recompute=True)
    off = make_client(tmp_path / "off", recompute=False)
    for client in (on, off):
        client.forward_backward_custom(data, loss_fn).result()
    a, b = lora_grads(on), lora_grads(off)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-12


def test_recompute_wraps_only_inside_the_block_and_only_with_grad(tmp_path) -> None:
    model = make_client(tmp_path, recompute=False).model
    layers = decoder_layers(model)
    assert len(layers) == 2  # tiny_base: two decoder layers, found through the peft wrapper
    with torch.no_grad(), recompute_layers(model) as wrapped:
        assert wrapped == 0
    with recompute_layers(model, enabled=False) as wrapped:
        assert wrapped == 0
    with recompute_layers(model) as wrapped:
        assert wrapped == 2 and all("forward" in layer.__dict__ for layer in layers)
    assert all("forward" not in layer.__dict__ for layer in layers)


def test_recompute_defaults_to_cpu_only(tmp_path) -> None:
    assert make_client(tmp_path).passes.recompute is True  # the tiny client lives on the CPU


def test_cpu_chunk_is_a_byte_budget_and_cuda_keeps_its_positions() -> None:
    for vocab in (64, 49_152, 151_936, 10**9):
        chunk = logprobs.default_chunk(CPU, vocab, torch.float32)
        assert chunk >= 1
        assert chunk == 1 or chunk * vocab * 4 <= logprobs.CPU_LOGITS_BYTES
    assert logprobs.default_chunk(CPU, 49_152, torch.float32) == 341
    assert logprobs.default_chunk(torch.device("cuda"), 49_152, torch.float32) == logprobs.DEFAULT_CHUNK


# ----- memory: structural bounds on a tiny model with a large vocabulary ---------------------
BIG_VOCAB, HIDDEN, INTER, LAYERS = 8192, 16, 256, 2


def datum_of_length(g: torch.Generator, n: int) -> Datum:
    tokens = torch.randint(0, BIG_VOCAB, (n + 1,), generator=g).tolist()
    return Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[n]),
        "logprobs": TensorData(data=[-1.0] * n, dtype="float32", shape=[n]),
        "advantages": TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
    })


class _BigTokenizer:
    def __len__(self) -> int:
        return BIG_VOCAB


def big_vocab_client(tmp_path, **kwargs):
    cfg = LlamaConfig(
        vocab_size=BIG_VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        base = LlamaForCausalLM(cfg)
    return create_lora_training_client(base, _BigTokenizer(), rank=4, alpha=8, seed=0,
                                       checkpoint_dir=tmp_path, **kwargs)


class _LargestVocabTensor(TorchDispatchMode):
    """Records the largest tensor an op creates with a vocabulary-sized last dimension."""

    def __init__(self, skip_storages: set[int]) -> None:
        super().__init__()
        self.skip, self.largest = skip_storages, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == BIG_VOCAB
                    and t.untyped_storage().data_ptr() not in self.skip):
                self.largest = max(self.largest, t.numel())
        return out


def saved_bytes_and_largest_logits(client, data) -> tuple[int, int]:
    """Bytes autograd keeps (parameters excluded) and the largest [·, V] tensor of one call."""
    params = {p.untyped_storage().data_ptr() for p in client.model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    mode = _LargestVocabTensor(params)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), mode:
        client.forward_backward(data, "importance_sampling").result()
    return sum(saved.values()), mode.largest


def test_cpu_training_memory_is_bounded_independently_of_vocab_and_width(tmp_path, monkeypatch) -> None:
    """No [tokens, V] tensor, and a graph of about hidden_size floats per token and layer."""
    chunk = 8
    monkeypatch.setattr(logprobs, "CPU_LOGITS_BYTES", chunk * BIG_VOCAB * 4)
    g = torch.Generator().manual_seed(0)
    data = [datum_of_length(g, n) for n in (60, 90, 50)]
    tokens = 200
    bound = (LAYERS + 6) * tokens * HIDDEN * 4 + tokens * 64  # layer inputs + head + per-token scalars
    client = big_vocab_client(tmp_path / "new")
    assert client.passes.logits_chunk == chunk and client.passes.recompute
    saved, largest = saved_bytes_and_largest_logits(client, data)
    assert largest <= chunk * BIG_VOCAB  # one chunk of logits at a time, forward and backward
    assert saved <= bound
    # the same call without recomputation keeps every layer's MLP: the bound would catch it
    old = big_vocab_client(tmp_path / "old", recompute=False, logits_chunk=4096)
    old_saved, old_largest = saved_bytes_and_largest_logits(old, data)
    assert old_saved > 4 * bound and old_largest == tokens * BIG_VOCAB


def test_the_replay_in_backward_runs_inside_the_forwards_context(tmp_path) -> None:
    """Backward runs after the caller's block: each replay re-enters the block's context (here
    peft's input-cast switch, which the trainer's autocast sets), so a compiled layer sees what
    its forward saw instead of failing its guards and compiling another graph."""
    from peft.helpers import disable_input_dtype_casting

    model = make_client(tmp_path, recompute=False).model
    lora = next(m for name, m in model.named_modules() if name.endswith("q_proj") and hasattr(m, "lora_A"))
    seen: list[bool] = []
    lora.register_forward_pre_hook(lambda module, args: seen.append(module.cast_input_dtype_enabled))
    ids = torch.tensor([[1, 2, 3, 4, 5]])

    def run(outer, **replay) -> list[bool]:
        seen.clear()
        with outer(), recompute_layers(model, True, **replay) as wrapped:
            loss = model(input_ids=ids).logits.sum()
        assert wrapped == 2
        loss.backward()  # the replay: outside the block, as the trainer's backward is
        return list(seen)

    switch = lambda: disable_input_dtype_casting(model)  # noqa: E731
    assert run(switch, context=switch) == [False, False]  # the forward, then the replay: both with casting off
    assert lora.cast_input_dtype_enabled is True  # restored after each
    # the failure it prevents: a replay without the context sees the switch back on
    assert run(switch) == [False, True]
