"""A hub model that cannot be fetched, found before any work: say so, and how to run from a folder.

``model.hf_id`` is a Hugging Face hub id (``Qwen/Qwen2.5-3B``), a local folder, or
``embedded:<package>``. A hub id that is neither in the local cache nor reachable used to end,
after ten retries printed twice each, in a 40-line ``OSError``. Here it is one line of the
start-up message (exit 2) that names the missing network and the fix: download the model
where there is network and point ``model.hf_id`` at the folder. The probe is one TCP connection
to the hub's host (``HF_ENDPOINT``, else huggingface.co) with a short timeout; with
``HF_HUB_OFFLINE`` set the cache alone counts.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from omegaconf import DictConfig

PROBE_TIMEOUT_S = 3.0
TRUE = ("1", "true", "yes", "on")


def is_hub_id(hf_id: str) -> bool:
    """``owner/name`` that is not a path on this machine, nor an embedded package."""
    if hf_id.startswith(("embedded:", "/", "./", "../", "~")) or Path(hf_id).expanduser().exists():
        return False
    return hf_id.count("/") == 1


def in_cache(hf_id: str, filename: str, revision: str | None) -> bool:
    """Whether the hub cache holds ``filename`` of ``hf_id`` at ``revision``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(hf_id, filename, revision=revision), str)
    except Exception:  # noqa: BLE001 - a malformed id or cache: let the loader say what is wrong
        return True


def unreachable(env=os.environ, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached from here, or None when a connection opens."""
    if env.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE:
        return "HF_HUB_OFFLINE is set"
    url = urlparse(env.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return f"{host} cannot be reached: {err}"
    return None


def hub_problems(cfg: DictConfig, env=os.environ) -> list[str]:
    """The start-up problem of a hub model this machine cannot fetch (``engine=local``)."""
    if cfg.engine.name != "local":
        return []
    model = cfg.model
    hf_id = str(model.hf_id)
    if not is_hub_id(hf_id) or in_cache(hf_id, model.gguf_file or "config.json", model.revision):
        return []
    why = unreachable(env)
    if why is None:
        return []
    folder = f"/path/to/{hf_id.split('/')[-1]}"
    return [f"model.hf_id={hf_id} is a Hugging Face hub model that is not in the local cache, and "
            f"there is no network to fetch it ({why}). Download it on a machine with network "
            f"(`uv run hf download {hf_id} --local-dir {folder}`), copy the folder here and point the "
            f"run at it: `model.hf_id={folder} model.gguf_file=null`"]
