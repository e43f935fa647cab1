"""Starting vLLM: the errors a user meets (exit 2, one paragraph) and the memory share's arithmetic."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from searchr1.engines.local.config import LocalEngineConfig, VllmConfig
from searchr1.engines.local.memory import HEADROOM
from searchr1.engines.local.sampling.vllm_api import VllmApi, VllmMissing
from searchr1.engines.local.sampling.vllm_setup import engine_args, memory_problem, memory_share, model_folder
from searchr1.engines.local.sampling.vllm_start import start_vllm
from searchr1.startup.errors import StartupError
from tests.helpers.fake_vllm import FakeVllmApi

GIB = 2**30


def _model():
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_api_says_how_to_install_it() -> None:
    with pytest.raises(VllmMissing, match=r'pip install "vllm==0\.22\.1"'):
        VllmApi()


def test_start_refuses_a_cpu_device_and_a_missing_vllm_with_exit_2() -> None:
    cfg = LocalEngineConfig(sampler="vllm")
    with pytest.raises(StartupError) as err:
        start_vllm(_model(), None, cfg, None, torch.device("cpu"))
    assert err.value.code == 2 and "first CUDA device" in str(err.value)

    def missing():
        raise VllmMissing("engine.sampler=vllm needs vLLM, which is not installed (no module). Install it: x.")

    with pytest.raises(StartupError) as err:
        start_vllm(_model(), None, cfg, None, torch.device("cuda"), api_factory=missing)
    assert err.value.code == 2 and "needs vLLM" in str(err.value) and "\n" not in str(err.value)


def test_a_failed_vllm_start_is_one_paragraph_with_the_share_and_what_to_try(monkeypatch, tmp_path) -> None:
    """vLLM's own error (several lines, a CUDA-graph capture failure seen on an H100) becomes exit
    2 naming the share it was given and the option that lowers it."""
    class Refusing(FakeVllmApi):
        def open_engine(self, args):
            self.args = args
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture\n"
                               "Search for `cudaErrorStreamCaptureInvalidated' in the CUDA docs")

    class Estimate:
        def phases(self, slots):
            return {"rollout": 0}

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _d: (80 * GIB, 100 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda _d: 0)
    api = Refusing()
    cfg = LocalEngineConfig(sampler="vllm", max_seq_len=64, cache_dir=str(tmp_path))
    with pytest.raises(StartupError) as err:
        start_vllm(_model(), None, cfg, Estimate(), torch.device("cuda"), api_factory=lambda: api)
    message = str(err.value)
    assert err.value.code == 2 and "\n" not in message
    assert api.args["gpu_memory_utilization"] == pytest.approx(0.9 * 80 / 100)
    for part in ("with 0.72 of the GPU", "during capture", "engine.vllm.memory_utilization=0.6",
                 "engine.sampler=slots"):
        assert part in message


def test_the_share_is_what_training_leaves_of_the_free_memory() -> None:
    # 80 GiB free of 100, training will still allocate 20 GiB (AdamW's moments): 0.9·80 − 20 = 52
    assert memory_share(80 * GIB, 100 * GIB, 20 * GIB, None) == pytest.approx((0.9 * 80 - 20) / 100)
    assert HEADROOM == 0.9
    assert memory_share(10 * GIB, 100 * GIB, 20 * GIB, None) == 0.0
    assert memory_share(80 * GIB, 100 * GIB, 20 * GIB, 0.3) == 0.3  # engine.vllm.memory_utilization
    with pytest.raises(ValueError, match="memory_utilization"):
        memory_share(80 * GIB, 100 * GIB, 0, 1.5)


def test_a_share_too_small_for_weights_and_one_sequence_is_one_paragraph() -> None:
    # 6 GiB of weights (+10 %), 36 KiB a token × 4,097 tokens, 1 GiB of workspace
    need = int(6 * GIB * 1.1) + 36 * 1024 * 4097 + GIB
    assert memory_problem(need / (100 * GIB) + 1e-9, 100 * GIB, 6 * GIB, 36 * 1024, 4096) is None
    message = memory_problem(0.05, 100 * GIB, 6 * GIB, 36 * 1024, 4096)
    assert message is not None and "\n" not in message
    for part in ("5.0 GiB", f"{need / GIB:.1f} GiB", "engine.offload_optimizer_during_rollout=true",
                 "engine.sampler=slots"):
        assert part in message


def test_engine_args_start_from_dummy_weights_with_raw_logprobs_and_the_slot_cap(tmp_path) -> None:
    args = engine_args(VllmConfig(max_num_batched_tokens=8192), tmp_path, True, torch.bfloat16, 4096, 0.4, 3)
    assert args["load_format"] == "dummy" and args["logprobs_mode"] == "raw_logprobs"
    assert args["max_model_len"] == 4097 and args["enable_sleep_mode"] is True
    assert (args["gpu_memory_utilization"], args["seed"], args["dtype"]) == (0.4, 3, "bfloat16")
    assert args["enable_prefix_caching"] is True and args["max_num_batched_tokens"] == 8192
    no_tok = engine_args(VllmConfig(prefix_caching=False), tmp_path, False, torch.float16, 100, 0.4, 3)
    assert no_tok["skip_tokenizer_init"] is True and no_tok["tokenizer"] is None
    assert no_tok["enable_prefix_caching"] is False and "max_num_batched_tokens" not in no_tok


def test_the_model_folder_names_the_architecture_and_is_reused(tmp_path) -> None:
    model = _model()
    folder, has_tokenizer = model_folder(model, object(), tmp_path)
    assert not has_tokenizer
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["hidden_size"] == 16
    again, _ = model_folder(_model(), object(), tmp_path)
    assert again == folder
