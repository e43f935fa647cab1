"""Fingerprints, the on-disk cache and the compact adapter format of the warm start.

Two fingerprints (sha256 of sorted JSON, 16 hex digits):

- ``compat``: what an adapter's behaviour depends on, so what it must match to be used at
  all — the model and its tokenizer (name, hf_id, gguf file, revision, LoRA rank/alpha), the
  protocol's config and a digest of the texts it shows the model. Which retriever, cache,
  concurrency or data a run trains with is not part of it;
- ``full``: ``compat`` + everything else the SFT result depends on — data (with the world's
  generator version), retriever, engine, rollout limits, warm-start steps, batch size, lr,
  mix, seeds, Adam settings, datum length.

The cache entry ``<engine cache_dir>/warmstart/<full>/`` is written atomically (temp dir +
rename) under an ``flock``-ed lock file, so a sweep's concurrent jobs compute it once. The
compact form — what ``mode=sft`` exports and what ships as an embedded asset — is the peft
adapter directory with the LoRA weights cast to bfloat16 and a ``fingerprint.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from searchr1.data.world import WORLD_GENERATOR_VERSION
from searchr1.protocols import tags, tool_call_text

#: Bump when the oracle or the SFT loop changes what a given config produces.
WARMSTART_VERSION = 1
FINGERPRINT_FILE = "fingerprint.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ASSETS = Path(__file__).resolve().parent / "assets"


def _plain(node) -> object:
    """A config node as plain JSON values (enums as their values)."""
    if not isinstance(node, DictConfig):
        return node
    return json.loads(json.dumps(OmegaConf.to_container(node, resolve=True),
                                 default=lambda v: getattr(v, "value", str(v))))


def protocol_texts_digest(protocol: DictConfig) -> str:
    """16 hex digits over every text the configured protocol shows the model."""
    texts = tags.prompt_texts if protocol.name == "tags" else tool_call_text.prompt_texts
    return fingerprint(texts(protocol))


def compat_inputs(cfg: DictConfig) -> dict:
    """What an adapter's behaviour depends on: model + tokenizer, protocol and its texts."""
    m = cfg.model
    return {
        "model": {k: m.get(k) for k in ("name", "hf_id", "gguf_file", "revision",
                                        "lora_rank", "lora_alpha")},
        "protocol": _plain(cfg.protocol),
        "protocol_texts": protocol_texts_digest(cfg.protocol),
    }


def full_inputs(cfg: DictConfig) -> dict:
    """``compat_inputs`` plus every setting the SFT result depends on."""
    ws, r, t = cfg.warmstart, cfg.rollout, cfg.trainer
    data = _plain(cfg.data)
    if cfg.data.name == "world":
        data = {**data, "generator_version": WORLD_GENERATOR_VERSION}
    return {
        **compat_inputs(cfg),
        "data": data,
        "retriever": _plain(cfg.retriever),
        "warmstart_version": WARMSTART_VERSION,
        "engine": cfg.engine.name,
        "seed": cfg.seed,
        "rollout": {k: r[k] for k in ("max_searches", "max_turns", "max_turn_tokens",
                                      "max_observation_tokens", "max_trajectory_tokens")},
        "warmstart": {k: _plain(ws[k]) for k in ("steps", "batch_size", "learning_rate",
                                                 "mix", "seed")},
        "trainer": {k: t[k] for k in ("beta1", "beta2", "eps", "weight_decay",
                                      "grad_clip_norm", "max_datum_tokens")},
    }


def fingerprint(inputs: dict) -> str:
    """16 hex digits of sha256 over the sorted JSON of ``inputs``."""
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_root(cfg: DictConfig) -> Path:
    """``<engine cache_dir>/warmstart`` (``~/.cache/searchr1`` for engines without one)."""
    base = cfg.engine.get("cache_dir", None) or "~/.cache/searchr1"
    return Path(base).expanduser() / "warmstart"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if needed) for the block's duration."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fingerprint_record(cfg: DictConfig, **extra) -> dict:
    """What ``fingerprint.json`` holds: both fingerprints, the compat inputs, extras."""
    return {"compat": fingerprint(compat_inputs(cfg)), "full": fingerprint(full_inputs(cfg)),
            "inputs": compat_inputs(cfg), **extra}


def write_compact(source_dir: Path, final_dir: Path, record: dict) -> Path:
    """Atomically write ``source_dir``'s peft adapters as bf16 safetensors + fingerprint."""
    import torch
    from safetensors.torch import load_file, save_file

    # lazy: torch, which the start-up checks (they import this module) must not load
    from searchr1.engines.local.training.checkpoint import write_atomically  # lazy: torch

    def write(tmp: Path) -> None:
        weights = load_file(str(Path(source_dir) / ADAPTER_WEIGHTS))
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
                  str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        shutil.copy(Path(source_dir) / ADAPTER_CONFIG, tmp / ADAPTER_CONFIG)
        (tmp / FINGERPRINT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))

    write_atomically(Path(final_dir), True, write)
    return Path(final_dir)


def write_remote(final_dir: Path, record: dict, remote_path: str) -> Path:
    """A cache entry for an engine whose state lives remotely: the path in fingerprint.json."""
    from searchr1.engines.local.training.checkpoint import write_atomically  # lazy: torch (write_compact)

    payload = {**record, "remote_path": remote_path}
    write_atomically(Path(final_dir), True, lambda tmp: (tmp / FINGERPRINT_FILE).write_text(
        json.dumps(payload, indent=2, sort_keys=True)))
    return Path(final_dir)


def read_record(directory: Path) -> dict:
    path = Path(directory) / FINGERPRINT_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def load_path(directory: Path) -> str:
    """What to pass to ``client.load_state``: the remote path or the adapter directory."""
    return read_record(directory).get("remote_path") or str(directory)


def check_rank(directory: Path, lora_rank: int, lora_alpha: int) -> None:
    """Refuse adapters whose LoRA rank / alpha differ from the model config's."""
    config_path = Path(directory) / ADAPTER_CONFIG
    if not config_path.exists():
        return  # remote state: the engine checks it
    saved = json.loads(config_path.read_text())
    if (saved.get("r"), saved.get("lora_alpha")) != (lora_rank, lora_alpha):
        raise ValueError(
            f"adapters at {directory} have LoRA rank {saved.get('r')} / alpha "
            f"{saved.get('lora_alpha')}, but this run creates rank {lora_rank} / alpha "
            f"{lora_alpha}; set model.lora_rank={saved.get('r')} "
            f"model.lora_alpha={saved.get('lora_alpha')} to load them")


def asset_problem(directory: Path, cfg: DictConfig) -> str | None:
    """Why the embedded asset at ``directory`` does not fit ``cfg`` (one paragraph), or None."""
    record = read_record(directory)
    if not record:
        return (f"warmstart=embedded: no packaged adapter at {directory} (missing "
                f"{FINGERPRINT_FILE}); make one with `python -m searchr1.main mode=sft "
                f"warmstart=oracle_sft`, or use warmstart=none")
    current = compat_inputs(cfg)
    if record.get("compat") == fingerprint(current):
        return None
    saved = record.get("inputs", {})
    diffs = []
    for group in current:
        old, new = saved.get(group), current[group]
        if isinstance(old, dict) and isinstance(new, dict) and old.get("name") != new.get("name"):
            diffs.append(f"{group}: adapter {old.get('name')!r}, this run {new.get('name')!r}")
        elif isinstance(old, dict) and isinstance(new, dict):
            diffs += [f"{group}.{k}: adapter {old.get(k)!r}, this run {new.get(k)!r}"
                      for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        elif old != new:
            diffs.append(f"{group}: adapter {old!r}, this run {new!r}")
    return (f"warmstart=embedded: the packaged adapter {directory.name} was made for another "
            f"model or protocol, so it would not fit this run ({'; '.join(diffs) or 'unknown'}). "
            f"Either start RL from the base model with warmstart=none, or train a warm start "
            f"for these settings with `python -m searchr1.main mode=sft warmstart=oracle_sft "
            f"<your overrides>` and pass its folder as warmstart.init_from")


def check_asset(directory: Path, cfg: DictConfig) -> None:
    """Raise ``ValueError`` with ``asset_problem``'s paragraph when the asset does not fit."""
    problem = asset_problem(directory, cfg)
    if problem:
        raise ValueError(problem)


def rank_problem(directory: Path, lora_rank: int, lora_alpha: int) -> str | None:
    try:
        check_rank(directory, lora_rank, lora_alpha)
    except ValueError as err:
        return str(err)
    return None


def startup_problems(cfg: DictConfig) -> list[str]:
    """The warm start's start-up checks: the embedded asset must fit a fresh training run."""
    ws = cfg.get("warmstart")
    if ws is None or str(getattr(cfg.mode, "value", cfg.mode)) != "train":
        return []
    local_adapters = ws.name != "none" or (ws.init_from and not str(ws.init_from).startswith("trio://"))
    if local_adapters and cfg.model.get("tuning", "lora") == "full":
        return [f"warmstart={ws.name}{' (init_from)' if ws.init_from else ''} gives LoRA adapters, "
                "and model.tuning=full trains every weight from the loaded model: use warmstart=none "
                "with full, or model.tuning=lora"]
    if ws.init_from or ws.name != "embedded":
        return []
    directory = ASSETS / ws.asset
    problem = asset_problem(directory, cfg)
    if problem is None:
        problem = rank_problem(directory, cfg.model.lora_rank, cfg.model.lora_alpha)
    return [problem] if problem else []
