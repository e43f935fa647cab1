"""Starting the vLLM sampler beside training: the memory share, the model folder, the engine.

Called once, when the local service is built with ``engine.sampler=vllm``, so a run whose
rollout and training phases cannot share the GPU exits 2 (``StartupError``) before any work,
and vLLM's own start-up (allocation, ``torch.compile``, CUDA-graph capture) happens before the
first step rather than inside it.
"""

from __future__ import annotations

import logging
import time

import torch

from searchr1.engines.local.memory import Estimate
from searchr1.engines.local.sampling.slot_model import Dims, unwrap
from searchr1.engines.local.sampling.vllm_api import VllmApi, VllmMissing
from searchr1.engines.local.sampling.vllm_engine import VllmEngine
from searchr1.engines.local.sampling.vllm_setup import (engine_args, hf_weights, memory_problem, memory_share,
                                                        model_folder, sample_dtype)
from searchr1.startup.errors import StartupError

log = logging.getLogger(__name__)


def start_vllm(model, tokenizer, engine_cfg, est: Estimate, device: torch.device,
               api_factory=VllmApi) -> tuple[VllmEngine, bool]:
    """Open vLLM for ``model`` in this process; returns the engine's worker and whether vLLM
    has the tokenizer (then it matches stop strings itself)."""
    if device.type != "cuda" or device.index not in (None, 0):
        raise StartupError(f"searchr1: engine.sampler=vllm needs the process's first CUDA device "
                           f"(engine.device is {device}); use engine.sampler=slots or hf elsewhere.")
    try:
        api = api_factory()
    except VllmMissing as error:
        raise StartupError(f"searchr1: {error}") from error
    free, total = torch.cuda.mem_get_info(device)
    pending = max(0, est.phases(0)["rollout"] - torch.cuda.memory_allocated(device))
    share = memory_share(free, total, pending, engine_cfg.vllm.memory_utilization)
    dims, dtype = Dims.of(unwrap(model)[0].config), sample_dtype(model)
    bytes_per = torch.finfo(dtype).bits // 8
    weights = sum(p.numel() for p in unwrap(model)[0].parameters()) * bytes_per
    kv_per_token = dims.layers * 2 * dims.kv_heads * dims.head_dim * bytes_per
    problem = memory_problem(share, total, weights, kv_per_token, engine_cfg.max_seq_len)
    if problem is not None and engine_cfg.memory_check:
        raise StartupError(problem)
    folder, has_tokenizer = model_folder(model, tokenizer, engine_cfg.cache_dir)
    args = engine_args(engine_cfg.vllm, folder, has_tokenizer, dtype, engine_cfg.max_seq_len, share,
                       engine_cfg.seed)
    start = time.perf_counter()
    try:
        engine = api.open_engine(args)
    except (ValueError, RuntimeError) as error:  # vLLM's "not enough memory for the KV cache" & co
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StartupError(f"searchr1: vLLM could not start with {share:.2f} of the GPU "
                           f"(engine.vllm.memory_utilization): {first}. A smaller share may start: on an H100 "
                           f"beside a 3B LoRA trainer the estimated 0.82 failed in CUDA-graph capture and "
                           f"engine.vllm.memory_utilization=0.6 started; or use engine.sampler=slots.") from error
    log.info("vLLM %s started in %.1f s with %.2f of the GPU (%s)", api.version, time.perf_counter() - start,
             share, folder)
    worker = VllmEngine(api, engine, hf_weights, engine_cfg.vllm.sleep_level, release_cache=torch.cuda.empty_cache)
    return worker, has_tokenizer
