"""Chunked log-probs, packed micro-batches and the FLOP count, against direct computations."""

from __future__ import annotations

import types
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from pytrio.client.training_batch import plan_training_batch
from pytrio.model.limits import TrainingLimits
from pytrio.types import AdamParams, Datum, ModelInput, TensorData
from transformers import LlamaConfig

from searchr1.engines.local.training import flops
from searchr1.engines.local.training.padded import pad_samples, target_logprobs
from searchr1.engines.local.training.logprobs import (
    add_weight_grad, label_logprobs, label_logprobs_entropy, output_weight, packed_logprobs, padded_logprobs,
)
from searchr1.engines.local.training.packing import pack_samples, packed_attention, split_by_tokens
from tests.engines.local.training.test_client import VOCAB, _Tokenizer, batch, lora_grads, tiny_base

F32 = torch.float32
CPU = torch.device("cpu")


def f32_client(tmp_path, **kwargs):
    """The tiny LoRA client in float32 with nonzero adapters (so they change the hidden states)."""
    from searchr1.engines.local.training.client import create_lora_training_client

    client = create_lora_training_client(
        tiny_base().to(F32), _Tokenizer(), rank=4, alpha=8, seed=0, checkpoint_dir=tmp_path, **kwargs
    )
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(100)
        for name, p in client.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    return client


def samples(data, auto_shift: bool):
    limits = TrainingLimits(None, None, None)
    plan = plan_training_batch(
        data, loss_fn="importance_sampling", auto_shift=auto_shift, limits=limits, tokenizer_vocab_size=VOCAB
    )
    return plan.chunks[0].samples


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_chunked_label_logprobs_equal_log_softmax_values_and_gradients(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, VOCAB, (13,), generator=g)
    upstream = torch.randn(13, generator=g, dtype=torch.float64)
    got = label_logprobs(hidden, weight, labels, torch.float64, chunk)
    (got * upstream).sum().backward()
    got_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want = torch.log_softmax(hidden @ weight.T, -1).gather(-1, labels[:, None])[:, 0]
    (want * upstream).sum().backward()
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.allclose(got_grads[0], hidden.grad, atol=1e-12)
    assert torch.allclose(got_grads[1], weight.grad, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_chunked_label_logprob_gradients_with_masked_positions_equal_dense(chunk: int) -> None:
    """Off-mask positions (zero upstream gradient) are skipped in backward; the gradients
    still equal autograd through full log-softmax, zero rows of ``hidden`` included."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(11, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(VOCAB, 8, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, VOCAB, (11,), generator=g)
    mask = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1], dtype=torch.float64)
    upstream = torch.randn(11, generator=g, dtype=torch.float64) * mask
    (label_logprobs(hidden, weight, labels, torch.float64, chunk) * upstream).sum().backward()
    got_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want = torch.log_softmax(hidden @ weight.T, -1).gather(-1, labels[:, None])[:, 0]
    (want * upstream).sum().backward()
    assert torch.allclose(got_grads[0], hidden.grad, atol=1e-12)
    assert torch.allclose(got_grads[1], weight.grad, atol=1e-12)
    assert (got_grads[0][mask == 0] == 0).all() and got_grads[0][mask == 1].abs().sum() > 0


@pytest.mark.parametrize("entropy", [False, True])
def test_backward_under_autocast_runs_in_the_forward_dtype(entropy: bool) -> None:
    """Full fine-tuning: fp32 master weights, forward under bf16 autocast. The chunked head's
    backward must compute in bf16 as autograd through autocast does (its input gradient equals
    the dense autocast path's exactly), not in fp32 (which autograd would not do, and which
    made the head's backward GEMMs fp32 ones)."""
    g = torch.Generator().manual_seed(5)
    hidden0, weight0 = torch.randn(40, 64, generator=g), torch.randn(300, 64, generator=g) * 0.3
    labels, upstream = torch.randint(0, 300, (40,), generator=g), torch.randn(40, generator=g)

    def grads(fn, autocast: bool):
        h, w = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = fn(h, w)
        (out * upstream).sum().backward()
        return h.grad, w.grad

    def chunked(h, w):
        if entropy:
            logp, ent = label_logprobs_entropy(h, w, labels, F32, 7)
            return logp + 0.0 * ent
        return label_logprobs(h, w, labels, F32, 7)

    dense = lambda h, w: torch.log_softmax(torch.nn.functional.linear(h, w).float(), -1).gather(  # noqa: E731
        -1, labels[:, None])[:, 0]
    (got_h, got_w), (bf_h, bf_w), (fp_h, fp_w) = grads(chunked, True), grads(dense, True), grads(dense, False)
    assert got_h.dtype == F32 and got_w.dtype == F32
    assert (got_h - bf_h).abs().max() <= 1e-6 < (got_h - fp_h).abs().max()
    # the weight gradient accumulates the bf16 products in fp32 (the dense path rounds it to bf16)
    assert (got_w - bf_w).abs().mean() < 0.5 * (got_w - fp_w).abs().mean()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the bf16 GEMM with an fp32 output is the CUDA path"))])
def test_head_weight_gradient_of_bf16_inputs_accumulates_in_float32(device: str) -> None:
    """Two chunks of bf16 inputs added into an fp32 gradient: the exact product of the bf16
    values (computed in float64) to fp32 rounding, not to bf16's; a bf16 accumulator would
    be off by ~1e-2 relative."""
    g = torch.Generator().manual_seed(3)
    parts = [(torch.randn(64, 40, generator=g).bfloat16(), torch.randn(64, 32, generator=g).bfloat16())
             for _ in range(2)]
    acc = torch.full((40, 32), 0.5, device=device)
    for grad_CV, hidden_CH in parts:
        add_weight_grad(acc, grad_CV.to(device), hidden_CH.to(device))
    want = 0.5 + sum(a.double().T @ b.double() for a, b in parts)
    err = (acc.double().cpu() - want).abs().max() / want.abs().max()
    assert acc.dtype == torch.float32 and err < 1e-6
    rounded = sum((a.T @ b).double() for a, b in parts)  # per-chunk bf16 results
    assert (rounded + 0.5 - want).abs().max() / want.abs().max() > 1e-4  # what the fp32 output avoids


@pytest.mark.parametrize("auto_shift", [False, True])
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_chunked_logprobs_equal_full_logits_in_float32(tmp_path, layout: str, auto_shift: bool) -> None:
    """Values ≤ 1e-6 and adapter gradients ≤ 1e-5 against the full-logits padded path."""
    model = f32_client(tmp_path).model
    batch_samples = samples(batch(5, seed=3), auto_shift)
    padded = pad_samples(batch_samples, auto_shift, CPU, F32)
    upstream = torch.randn(padded.active_BS.shape, generator=torch.Generator().manual_seed(1))
    want = target_logprobs(model, padded, auto_shift, F32)
    (want * upstream).sum().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    want_rows = padded.rows(want.flatten())
    if layout == "packed":
        packed = pack_samples(batch_samples, auto_shift, CPU, F32)
        got = packed_logprobs(model, packed, F32, chunk=7)
        got_rows = packed.rows(got)
        (got * packed.scatter_rows(padded.rows(upstream.flatten()))).sum().backward()
    else:
        got = padded_logprobs(model, padded, auto_shift, F32, chunk=7)
        got_rows = padded.rows(got)
        (got * upstream.flatten()).sum().backward()
    assert max(float((a - b).abs().max()) for a, b in zip(got_rows, want_rows)) <= 1e-6
    assert max(float((p.grad - want_grads[n]).abs().max())
               for n, p in model.named_parameters() if p.requires_grad) <= 1e-5
    if auto_shift:
        assert all(float(row[0]) == 0.0 for row in got_rows)


def test_packed_samples_do_not_see_each_other(tmp_path) -> None:
    model = f32_client(tmp_path).model
    data = batch(3, seed=4)
    with torch.no_grad():
        together = pack_samples(samples(data, False), False, CPU, F32)
        rows = together.rows(packed_logprobs(model, together, F32))
        alone = pack_samples(samples(data[1:2], False), False, CPU, F32)
        single = alone.rows(packed_logprobs(model, alone, F32))[0]
    assert together.position_ids_1T[0, : together.lengths_B[0] + 1].tolist()[-1] == 0  # restarts
    assert torch.allclose(rows[1], single, atol=1e-6)


def test_forward_backward_packed_chunked_equals_the_naive_padded_loop(tmp_path) -> None:
    data = batch(6, seed=5)
    new = f32_client(tmp_path / "a", max_batch_tokens=40)
    naive = f32_client(tmp_path / "b", layout="padded", logits_chunk=None, max_batch_datums=2)
    out_new = new.forward_backward(data, "ppo").result()
    out_naive = naive.forward_backward(data, "ppo").result()
    assert out_new.metrics["loss_sum"] == pytest.approx(out_naive.metrics["loss_sum"], abs=1e-5)
    assert out_new.metrics["token_count"] == out_naive.metrics["token_count"]
    assert out_new.metrics["tokens_per_second"] > 0 and "mfu" not in out_new.metrics  # CPU: no MFU
    a, b = lora_grads(new), lora_grads(naive)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5
    for x, y in zip(out_new.loss_fn_outputs, out_naive.loss_fn_outputs):
        assert torch.allclose(torch.tensor(x["logprobs"].data), torch.tensor(y["logprobs"].data), atol=1e-6)


def datum_of_length(g: torch.Generator, n: int) -> Datum:
    tokens = torch.randint(0, VOCAB, (n + 1,), generator=g).tolist()
    return Datum(model_input=ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": TensorData(data=tokens[1:], dtype="int64", shape=[n]),
        "logprobs": TensorData(data=[-1.0] * n, dtype="float32", shape=[n]),
        "advantages": TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
    })


def test_packing_wastes_no_tokens_where_padding_wastes_many(tmp_path) -> None:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 21, (24,), generator=g).tolist()  # uniform 10–20, like 1k–2k scaled
    data = [datum_of_length(g, n) for n in lengths]
    packed = f32_client(tmp_path / "a", max_batch_tokens=64)
    padded = f32_client(tmp_path / "b", layout="padded", max_batch_datums=8, max_batch_tokens=None)
    plan = packed.passes.plan(data, "importance_sampling", False)
    packed_batches = list(packed.passes.batches(plan, False))
    assert sum(b.input_ids_1T.numel() for b in packed_batches) == sum(lengths)  # 0% waste
    assert all(b.input_ids_1T.numel() <= 64 for b in packed_batches)
    padded_tokens = sum(b.input_ids_BS.numel() for b in padded.passes.batches(plan, False))
    assert 1 - sum(lengths) / padded_tokens > 0.10  # what packing saves on this distribution


def test_split_by_tokens_hand_worked() -> None:
    items = [types.SimpleNamespace(input_length=n) for n in (5, 9, 3, 8, 20, 2)]
    parts = split_by_tokens(items, 17)
    assert [[s.input_length for s in p] for p in parts] == [[5, 9, 3], [8], [20], [2]]
    assert split_by_tokens(items, None) == [items] and split_by_tokens([], 10) == []


def test_weights_version_counts_adapter_changes_and_reaches_the_sampler(tmp_path) -> None:
    seen = {}

    class FakePool:  # the service's sampler pool: ``client(model, lock, weights_version)``
        def client(self, model, model_lock=None, weights_version=None):
            seen["version"] = weights_version

    client = f32_client(tmp_path, samplers=FakePool())
    assert client.weights_version == 0
    client.save_weights_and_get_sampling_client()
    client.forward_backward(batch(2), "importance_sampling").result()
    assert client.weights_version == 0  # gradients alone change no weight
    client.optim_step(AdamParams(learning_rate=1e-3)).result()
    assert client.weights_version == 1 and seen["version"]() == 1
    path = client.save_state("s").result().path
    client.load_state(path).result()
    client.load_state_with_optimizer(path).result()
    assert seen["version"]() == 3


def test_flop_count_hand_worked() -> None:
    shape = flops.ModelShape(base_linear_params=100, lora_params=10, attention_width=4, layers=2)
    # attention: (2·3² + 2·1²)·4·2 = 160; forward: 2·110·4 + 160 = 1040
    assert flops.attention_flops(shape, [3, 1]) == 160.0
    assert flops.step_flops(shape, [3, 1], backward=False) == 1040.0
    # forward + backward: 2·1040 + 160 + 2·10·4 = 2320
    assert flops.step_flops(shape, [3, 1], backward=True) == 2320.0
    assert flops.mfu(2320.0, 2.0, 1160.0) == 1.0
    on_gpu = flops.throughput_metrics(shape, [3, 1], 2.0, True, torch.device("cuda"), 1160.0)
    assert on_gpu == {"tokens_per_second": 2.0, "mfu": 1.0}
    assert flops.throughput_metrics(shape, [3, 1], 2.0, True, CPU, 1160.0) == {"tokens_per_second": 2.0}
    with pytest.raises(ValueError, match="must be positive"):
        flops.mfu(1.0, 1.0, 0.0)


def test_model_shape_counts_frozen_linears_and_adapters(tmp_path) -> None:
    client = f32_client(tmp_path)
    shape = flops.model_shape(client.model)
    h, i, layers = 16, 32, 2  # tiny_base: 2 heads × 8, 2 kv heads
    per_layer = 4 * h * h + 3 * h * i
    assert shape.base_linear_params == layers * per_layer + VOCAB * h
    assert shape.lora_params == sum(p.numel() for p in client.model.parameters() if p.requires_grad)
    assert (shape.attention_width, shape.layers) == (16, 2)


def test_unsupported_heads_and_calls_fail_clearly() -> None:
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(cfg)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        output_weight(model)
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        packed_attention(torch.nn.Module(), q, q, q, None)
    with pytest.raises(ValueError, match="layout must be"):
        f32_client_bad_layout()


def test_padded_fallback_equals_per_sample_attention_and_compiles_as_one_graph() -> None:
    """The CPU / float32 fallback: per-sample causal attention, with its row width taken from
    ``max_length_q`` (a Python int), so a compiled layer has no host sync and no graph break."""
    gen = torch.Generator().manual_seed(0)
    sizes = [3, 5, 2]
    cu = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    q, k, v = (torch.randn(1, 2, sum(sizes), 4, generator=gen) for _ in range(3))  # [1, H, T, D]

    def attend(q, k, v):
        return packed_attention(torch.nn.Module(), q, k, v, None, scaling=0.5,
                                cu_seq_lens_q=cu, max_length_q=max(sizes))[0]

    expected = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        one = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], is_causal=True, scale=0.5)
        expected.append(one.transpose(1, 2))
    torch.testing.assert_close(attend(q, k, v), torch.cat(expected, dim=1), rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(attend)(q, k, v)
    torch._dynamo.reset()  # leave no compiled frames behind for later tests
    assert explained.graph_break_count == 0, [str(b.reason)[:120] for b in explained.break_reasons]


def f32_client_bad_layout():
    from searchr1.engines.local.training.client import LocalTrainingClient

    return LocalTrainingClient(None, _Tokenizer(), layout="rows")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (varlen flash/cuDNN kernel)")
def test_cuda_bf16_packed_varlen_matches_padded_sdpa(tmp_path) -> None:
    client = f32_client(tmp_path)
    model = client.model.to("cuda", torch.bfloat16)
    batch_samples = samples(batch(6, seed=8), False)
    cuda = torch.device("cuda")
    with torch.no_grad():
        packed = pack_samples(batch_samples, False, cuda, F32)
        padded = pad_samples(batch_samples, False, cuda, F32)
        got = packed.rows(packed_logprobs(model, packed, F32))
        want = padded.rows(target_logprobs(model, padded, False, F32).flatten())
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 0.05  # bf16 kernels differ


def test_tied_head_qwen2_packed_equals_full_logits() -> None:
    """Qwen2 (qkv biases, tied embeddings): the shape of the Qwen2.5 benchmark model."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    batch_samples = samples(batch(4, seed=9), True)
    with torch.no_grad():
        packed = pack_samples(batch_samples, True, CPU, F32)
        padded = pad_samples(batch_samples, True, CPU, F32)
        got = packed.rows(packed_logprobs(model, packed, F32, chunk=5))
        want = padded.rows(target_logprobs(model, padded, True, F32).flatten())
    assert max(float((a - b).abs().max()) for a, b in zip(got, want)) <= 1e-6
    shape = flops.model_shape(model)  # q, o 16×16; k, v 8×16; gate, up, down 16×32; the head once
    assert shape.base_linear_params == 2 * (16 * 16 * 2 + 16 * 8 * 2 + 3 * 16 * 32) + VOCAB * 16
    assert shape.lora_params == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (varlen flash/cuDNN kernel)")
def test_cuda_bf16_packed_forward_backward_matches_the_naive_loop(tmp_path) -> None:
    """The varlen kernel's backward: loss and adapter gradients close to the padded sdpa path's."""
    data = batch(6, seed=10)
    clients = []
    for name, layout in (("a", {}), ("b", {"layout": "padded", "logits_chunk": None})):
        client = f32_client(tmp_path / name, device="cuda", **layout)
        client.model.to(torch.bfloat16)  # the loss math stays float32 (fixed at construction)
        clients.append(client)
    outs = [c.forward_backward(data, "importance_sampling").result() for c in clients]
    assert outs[0].metrics["loss_sum"] == pytest.approx(outs[1].metrics["loss_sum"], rel=0.02, abs=0.02)
    assert 0 < outs[0].metrics["mfu"] < 1
    a, b = (lora_grads(c) for c in clients)
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), rtol=0.1, atol=0.02 * float(b[key].abs().max()))


class _LiveBytes(TorchDispatchMode):
    """The most bytes that tensors made inside the block held at once (their storages, each
    counted once, freed when the last tensor on it dies). An op's own internal temporaries are
    not seen; the head's constant allows 4 bytes per logit for logsumexp's."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.seen:
                ptr, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
                self.seen.add(ptr)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, ptr, n)
        return out

    def _free(self, ptr: int, n: int) -> None:
        self.live -= n
        self.seen.discard(ptr)


@pytest.mark.parametrize("entropy", [True, False])
def test_the_head_holds_one_chunks_logits_at_a_time_within_its_memory_constant(entropy: bool) -> None:
    """2026-12-05: an H100 arm ran out of memory in this head, which kept the previous chunk's
    fp32 tensors alive while the next chunk's were made (16 bytes per logit, measured here
    before the fix). Forward and backward now stay within the constant the start-up estimate
    counts (``HEAD_BYTES_PER_LOGIT`` less logsumexp's unseen 4), plus the [V, H] and [N, H]
    gradients and per-row vectors."""
    from searchr1.engines.local.training.logprobs import HEAD_BYTES_PER_LOGIT

    n, h, v, c = 1024, 32, 4096, 256
    torch.manual_seed(0)
    hidden = torch.randn(n, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    small = v * h * (4 + 2) + n * h * 2 * 2 + n * 4 * 8  # grad_w fp32 + bf16, grad_h, row vectors
    with _LiveBytes() as live:
        if entropy:
            logp, ent = label_logprobs_entropy(hidden, weight, labels, F32, c)
            loss = logp.sum() + ent.sum()
        else:
            loss = label_logprobs(hidden, weight, labels, F32, c).sum()
        forward, live.peak = live.peak, live.live
        loss.backward()
    allowed = (HEAD_BYTES_PER_LOGIT - 4) * c * v + small
    assert forward <= allowed and live.peak <= allowed, (forward / (c * v), live.peak / (c * v))
    assert live.peak >= c * v * 4  # it did see the chunk's fp32 logits
