"""What vLLM is started with, and what it is given: a model folder, engine arguments, a memory
share, and the trainer's weights under HF names with the LoRA deltas folded in.

vLLM starts from a folder holding the model's ``config.json`` (and its tokenizer, when there is
a real one, so stop strings can be matched) with ``load_format=dummy``: it allocates and
compiles the model without reading a checkpoint, and the sampler then pushes the trainer's own
tensors into it (``hf_weights``). Its memory share is what the trainer leaves: the start-up
estimate (``engines/local/memory.py``) says what training keeps resident during a rollout
(weights, the KL reference, AdamW's moments unless offloaded); vLLM takes the rest of
``HEADROOM`` of the free memory, and a run where that is too small for vLLM's own weights and
one full-length sequence exits 2 before it starts.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from searchr1.engines.local.memory import HEADROOM
from searchr1.engines.local.sampling.slot_model import effective_weight, unwrap
from searchr1.utils.device_memory import GIB

_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def hf_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s weights as an HF checkpoint names them, LoRA deltas folded (none for the
    adapters-off view); one folded tensor alive at a time."""
    base, adapters_on = unwrap(model)
    for name, module in base.named_modules():
        parts = name.split(".")
        if "base_layer" in parts or any(p.startswith("lora_") for p in parts):
            continue  # inside a LoRA layer: read through the layer itself
        prefix = f"{name}." if name else ""
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            yield f"{prefix}weight", effective_weight(module, adapters_on).detach()
            bias = module.base_layer.bias
            if bias is not None:
                yield f"{prefix}bias", bias.detach()
            continue
        for pname, param in module.named_parameters(recurse=False):
            yield f"{prefix}{pname}", param.detach()


def sample_dtype(model) -> torch.dtype:
    """The dtype vLLM computes in: the slot sampler's (a bf16 copy of fp32 masters under full)."""
    base, _ = unwrap(model)
    return getattr(base, "searchr1_sample_dtype", base.dtype)


def model_folder(model, tokenizer, cache_dir: str | Path) -> tuple[Path, bool]:
    """A folder with ``model``'s config (and tokenizer, if it can be saved) for vLLM to start from;
    returns it and whether it holds the tokenizer. Named by the config's hash, so reused."""
    base, _ = unwrap(model)
    config = copy.deepcopy(base.config)
    config.architectures = [type(base).__name__]
    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    folder = Path(cache_dir).expanduser() / "vllm" / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    generation = getattr(base, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(folder)
    saves = callable(getattr(tokenizer, "save_pretrained", None))  # a real HF tokenizer
    if saves:
        tokenizer.save_pretrained(folder)
    return folder, saves


def engine_args(vllm_cfg, folder: Path, has_tokenizer: bool, dtype: torch.dtype, max_seq_len: int,
                memory_utilization: float, seed: int) -> dict:
    """vLLM ``EngineArgs`` keywords for the in-process sampler (``engine.vllm.*``)."""
    args = dict(
        model=str(folder), tokenizer=str(folder) if has_tokenizer else None,
        skip_tokenizer_init=not has_tokenizer, dtype=_DTYPES[dtype], load_format="dummy",
        max_model_len=max_seq_len + 1,  # the slot sampler's cap: prompt + generated ≤ max_seq_len + 1
        enable_prefix_caching=bool(vllm_cfg.prefix_caching), enable_sleep_mode=True,
        gpu_memory_utilization=memory_utilization, max_num_seqs=int(vllm_cfg.max_num_seqs),
        seed=seed, logprobs_mode="raw_logprobs", enforce_eager=bool(vllm_cfg.enforce_eager),
        disable_log_stats=True, tensor_parallel_size=1,
    )
    if vllm_cfg.max_num_batched_tokens is not None:
        args["max_num_batched_tokens"] = int(vllm_cfg.max_num_batched_tokens)
    return args


def memory_share(free: int, total: int, pending: int, fixed: float | None) -> float:
    """vLLM's ``gpu_memory_utilization``: ``engine.vllm.memory_utilization`` when set, else
    ``HEADROOM`` of the free memory less what training will still allocate, as a share of the GPU."""
    if fixed is not None:
        if not 0 < fixed < 1:
            raise ValueError(f"engine.vllm.memory_utilization={fixed} must be in (0, 1)")
        return float(fixed)
    return max(0.0, (free * HEADROOM - pending) / total)


def memory_problem(share: float, total: int, weights_bytes: int, kv_per_token: int, max_seq_len: int) -> str | None:
    """One paragraph when vLLM's share cannot hold its weights and one full-length sequence."""
    need = int(weights_bytes * 1.1) + kv_per_token * (max_seq_len + 1) + GIB  # + activations, graphs
    have = int(share * total)
    if have >= need:
        return None
    return (f"searchr1: engine.sampler=vllm does not fit beside training on this GPU: vLLM would get "
            f"{have / GIB:.1f} GiB (what training leaves of the free memory), and needs at least "
            f"{need / GIB:.1f} GiB for its weights, one {max_seq_len}-token sequence and its workspace. "
            f"Try engine.offload_optimizer_during_rollout=true, engine.offload_optimizer=true, "
            f"model.tuning=lora, a smaller engine.max_seq_len, or engine.sampler=slots.")
