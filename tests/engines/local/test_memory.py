"""The start-up memory estimate and kv_slots sizing, with hand-computed bytes and fake free memory."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.base import LoopLimits
from searchr1.engines.local import memory
from searchr1.engines.local.config import LocalEngineConfig, ModelConfig
from searchr1.engines.local.service import plan_memory
from searchr1.engines.local.training.logprobs import DEFAULT_CHUNK
from searchr1.startup.errors import StartupError

ARCH = memory.Arch(params=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=50)


def plan(**kw) -> memory.Plan:
    base = dict(tuning="full", dtype_bytes=2, lora_params=0, micro_tokens=10, logits_chunk=4,
                activation_checkpointing=False, offload_optimizer=False, offload_in_rollout=False,
                sleep_between_phases=False, slot_sampler=True, max_seq_len=9)
    return memory.Plan(**{**base, **kw})


def test_full_estimate_matches_hand_counts() -> None:
    est = memory.estimate(ARCH, plan())
    assert (est.weights, est.grads, est.moments) == (4000, 4000, 8000)  # fp32 masters
    assert (est.reference, est.sampler_copy) == (2000, 2000)
    assert est.kv_per_slot == 2 * 2 * 1 * 4 * 10 * 2  # layers · k,v · kv_heads · head_dim · (9+1) · 2 B
    per_layer = 2 * (6 * 8 + (2 + 2) * 4 + 4 * 16)  # 2·(6h + qkv width + 4i)
    assert est.activations == 2 * per_layer * 10 + 4 * 50 * 12  # + one head chunk: 4 positions × 50 ids × 12 B
    assert est.peak(3) == 4000 + 2000 + 2000 + 4000 + 8000 + est.activations + 3 * 320


def test_sleep_and_offload_remove_their_buffers_from_the_phases() -> None:
    est = memory.estimate(ARCH, plan(sleep_between_phases=True, offload_optimizer=True))
    phases = est.phases(5)
    assert phases["rollout"] == 8000 + 5 * 320  # weights + reference + sampler + KV, no moments
    assert phases["training"] == 8000 + 4000 + est.activations  # no KV, no moments
    assert phases["step"] == 8000 + 4000 + 8000  # the moments come back for the step


def test_kv_slots_are_sized_to_the_largest_that_fits() -> None:
    est = memory.estimate(ARCH, plan())
    fixed = est.peak(0)
    free = int((fixed + 7 * 320 + 100) / memory.HEADROOM) + 1
    assert memory.auto_kv_slots(est, free) == 7
    assert memory.problem(est, 7, free) is None
    assert memory.auto_kv_slots(est, fixed) == 0


def test_the_refusal_names_the_components_and_the_options() -> None:
    est = memory.estimate(ARCH, plan())
    message = memory.problem(est, 4, 10_000)
    assert message is not None and "\n" not in message
    for part in ("training phase", "weights", "AdamW moments", "KV cache 4 slots", "model.tuning=lora",
                 "engine.activation_checkpointing=true", "engine.offload_optimizer=true",
                 "engine.sleep_between_phases=true", "engine.kv_slots"):
        assert part in message


def test_plan_memory_sizes_null_kv_slots_and_exits_2_when_nothing_fits() -> None:
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2))
    engine = LocalEngineConfig(kv_slots=None, sampler="slots", max_seq_len=64)
    model_cfg = ModelConfig(tuning="full")
    est = memory.estimate_for(model, model_cfg, engine, 128, 1024)
    sized = plan_memory(est, engine, 200 * 2**20)
    assert sized.kv_slots == memory.auto_kv_slots(est, 200 * 2**20) > 0
    with pytest.raises(StartupError) as err:
        plan_memory(est, engine, 50_000)
    assert err.value.code == 2 and "does not fit the GPU" in str(err.value)


def test_a_null_pool_follows_the_rollout_when_memory_allows_more() -> None:
    assert [memory.pool_cap(n) for n in (0, 1, 8, 160, 161, 5000)] == [1024, 8, 8, 160, 168, 1024]
    est = memory.estimate(ARCH, plan())
    roomy = int((est.peak(0) + 300 * 320) / memory.HEADROOM) + 1  # memory for ~300 slots
    engine = LocalEngineConfig(kv_slots=None, sampler="slots", max_seq_len=64, memory_check=False)
    fits = memory.auto_kv_slots(est, roomy)
    assert fits > 200
    assert plan_memory(est, engine, roomy, trajectories=160).kv_slots == 160  # the rollout binds
    assert plan_memory(est, engine, roomy, trajectories=5 * 512).kv_slots == fits  # memory binds
    assert plan_memory(est, engine, roomy).kv_slots == fits  # unknown rollout: memory alone
    explicit = dataclasses.replace(engine, kv_slots=300)
    assert plan_memory(est, explicit, roomy, trajectories=160).kv_slots == 300  # a set pool is kept


def test_usable_bytes_caps_the_free_memory_at_the_fraction_of_the_whole_gpu() -> None:
    assert memory.usable_bytes(80, 100, None) == 80
    assert memory.usable_bytes(80, 100, 0.25) == 25  # another process holds 20: the share binds
    assert memory.usable_bytes(10, 100, 0.25) == 10  # the GPU is fuller than the share: free binds
    for bad in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="memory_fraction"):
            memory.usable_bytes(80, 100, bad)


def test_service_caps_the_allocator_and_plans_kv_slots_within_its_share(monkeypatch, tiny_model_dir,
                                                                        tmp_path) -> None:
    """On CUDA (faked up to the device calls): the allocator cap is set to the fraction and
    ``kv_slots=null`` is sized from that share, not from all the free memory."""
    from searchr1.engines.local import service as svc

    gib, calls = 2**30, []
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(svc, "resolve_device", lambda *_: cuda)
    real_load = svc.load_model
    monkeypatch.setattr(svc, "load_model", lambda cfg, _device, dtype, cache: real_load(
        cfg, torch.device("cpu"), dtype, cache))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _d: (100 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda f, d: calls.append((f, d)))
    model_cfg = ModelConfig(name="tiny", hf_id=str(tiny_model_dir), gguf_file=None, lora_rank=4)
    slots = {}
    for fraction in (None, 0.002):
        engine = LocalEngineConfig(kv_slots=None, sampler="slots", max_seq_len=4096,
                                   memory_fraction=fraction)
        service = svc.LocalService(engine, model_cfg, tmp_path)
        slots[fraction] = service.engine_cfg.kv_slots
        est = memory.estimate_for(service.model, model_cfg, engine, 64_000, DEFAULT_CHUNK)
        usable = memory.usable_bytes(100 * gib, 140 * gib, fraction)
        assert slots[fraction] == max(1, memory.auto_kv_slots(est, usable))
    assert calls == [(0.002, 0)]  # only a set fraction touches the allocator, by device index (torch refuses "cuda")
    assert slots[0.002] < slots[None]
    engine = LocalEngineConfig(kv_slots=None, sampler="slots", max_seq_len=4096)
    rollout = svc.LocalService(engine, model_cfg, tmp_path, LoopLimits(rollout_trajectories=12 * 5))
    assert slots[None] > 64 and rollout.engine_cfg.kv_slots == 64  # 60 trajectories, rounded up to 8s


def test_the_refusal_names_the_largest_micro_batch_that_fits() -> None:
    """Only the activations are too large: the message gives the largest micro-batch (of the
    plan's 1,000 tokens) at which the run fits, and the estimate agrees at that size and one more."""
    est = memory.estimate(ARCH, plan(micro_tokens=1000, sleep_between_phases=True))
    other = est.peak(2) - est.activations  # every phase's bytes but the micro-batch's
    per_token = 2 * 2 * (6 * 8 + (2 + 2) * 4 + 4 * 16)  # layers · 2·(6h + qkv width + 4i)
    logits = 4 * 50 * 12  # one head chunk (4 positions) of the 50-id vocabulary: fp32 logits, softmax, logsumexp's temporary
    free = int((other + logits + 300 * per_token) / memory.HEADROOM) + 1  # room for 300 tokens
    message = memory.problem(est, 2, free)
    assert "trainer.max_padded_tokens_per_microbatch=256 (the largest that fits as it is)" in message
    exact = memory.largest_micro_tokens(memory.estimate(ARCH, plan(micro_tokens=301, sleep_between_phases=True)), 2, free)
    assert exact == 256  # 300 fits, rounded down to a multiple of 128
    at = lambda n: memory.estimate(ARCH, plan(micro_tokens=n, sleep_between_phases=True)).peak(2)  # noqa: E731
    assert at(300) <= int(free * memory.HEADROOM) < at(301)
    # nothing fits when the rest alone is over budget: the generic advice stays
    assert "a smaller trainer.max_padded_tokens_per_microbatch" in memory.problem(est, 2, other // 2)


def test_fp32_lora_compute_counts_the_adapted_inputs_fp32_copies() -> None:
    """``model.lora_compute=float32`` keeps an fp32 copy of every adapted linear's input: q, k,
    v, gate, up read h, o reads heads·head_dim, down reads i — 4 bytes each per token and layer."""
    lora = dict(tuning="lora", lora_params=100)
    base, fp32 = memory.estimate(ARCH, plan(**lora)), memory.estimate(ARCH, plan(**lora, lora_fp32_inputs=True))
    assert fp32.activations - base.activations == 2 * 4 * (5 * 8 + 2 * 4 + 16) * 10  # layers · 4 B · width · tokens
    ckpt = memory.estimate(ARCH, plan(**lora, lora_fp32_inputs=True, activation_checkpointing=True))
    ckpt_base = memory.estimate(ARCH, plan(**lora, activation_checkpointing=True))
    assert ckpt.activations - ckpt_base.activations == 4 * (5 * 8 + 2 * 4 + 16) * 10  # one layer's worth
    assert memory.estimate(ARCH, plan(lora_fp32_inputs=True)).activations == memory.estimate(ARCH, plan()).activations


def test_six_study_arms_at_a_sixth_of_an_h200_are_refused_at_12000_tokens_with_fp32_adapters() -> None:
    """2026-12-04: six arms (SmolLM2-135M, LoRA r8, lora_compute=float32, 136 KV slots of 2,048
    tokens) at engine.memory_fraction=0.16 ran out of memory in their first update at 12,000-token
    micro-batches (20.9 GiB allocated of 22.4 allowed, 0.75 GiB more asked for). The estimate
    refuses that, names lora_compute=base, and passes 8,000 tokens, as the arms ran at 4 per GPU."""
    arch = memory.Arch(params=134_515_008, layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3,
                       head_dim=64, vocab=49152)
    free = int(0.16 * 139.8 * memory.GIB)

    def study(micro: int, fp32: bool) -> memory.Estimate:
        return memory.estimate(arch, plan(tuning="lora", lora_params=4_884_480, micro_tokens=micro,
                                          logits_chunk=DEFAULT_CHUNK, max_seq_len=2048, lora_fp32_inputs=fp32))

    message = memory.problem(study(12000, True), 136, free)
    assert message is not None and "training phase" in message and "model.lora_compute=base" in message
    assert memory.problem(study(8000, True), 136, free) is None
    assert memory.problem(study(12000, False), 136, free) is None  # the base-dtype adapters fit
    assert memory.problem(study(12000, True), 136, int(0.24 * 139.8 * memory.GIB)) is None  # four per GPU ran


@pytest.mark.parametrize("dtype, compute, expect", [(torch.bfloat16, "float32", True), (torch.bfloat16, "base", False),
                                                    (torch.float32, "float32", False)])
def test_the_estimate_of_a_loaded_model_counts_fp32_copies_only_of_a_16_bit_base(dtype, compute, expect) -> None:
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2)).to(dtype)
    est = memory.estimate_for(model, ModelConfig(tuning="lora", lora_compute=compute, lora_rank=4),
                              LocalEngineConfig(sampler="slots", max_seq_len=64), 128, 1024)
    assert est.plan.lora_fp32_inputs is expect
