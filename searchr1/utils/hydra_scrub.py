"""Scrubbing what Hydra wrote before a job began (``.hydra/*.yaml``, a sweep's ``multirun.yaml``)
and the log records Hydra emits before our handlers exist."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from searchr1.utils.secrets import (REDACTED, SecretFilter, _Known, env_secrets,
                                    is_credential_env_name, is_credential_key)


def _scrub_value(value: object, literal: list[str], known: _Known, env_set: bool = False) -> object:
    """``value`` with credentials hidden: values under credential keys (any value under
    ``env_set`` whose variable name is a credential's), ``key=value`` overrides with such a
    key, ``literal`` secrets anywhere, and the environment's as config values (``_Known``)."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            k = known.hide_inner(k) if isinstance(k, str) else k
            if isinstance(v, (Mapping, list)):
                out[k] = _scrub_value(v, literal, known, env_set=str(k) == "env_set")
            elif env_set and is_credential_env_name(str(k)) and v not in (None, ""):
                out[k] = REDACTED
            elif is_credential_key(str(k)) and isinstance(v, str) and v:
                out[k] = REDACTED
            else:
                out[k] = _scrub_value(v, literal, known)
        return out
    if isinstance(value, list):
        return [_scrub_value(v, literal, known) for v in value]
    if isinstance(value, str):
        for secret in literal:
            value = value.replace(secret, REDACTED)
        value = known.hide(value)
        key, sep, rest = value.partition("=")
        parts = key.lstrip("+~").split(".")
        if sep and (is_credential_key(parts[-1]) or rest.strip() in known.all or (
                len(parts) >= 2 and parts[-2] == "env_set" and is_credential_env_name(parts[-1]))):
            value = f"{key}={REDACTED}"
    return value


def _env_set_secrets(data: object) -> list[str]:
    """The values a saved Hydra config gives credential variables (``hydra.job.env_set``)."""
    job = ((data or {}).get("hydra") or {}).get("job") if isinstance(data, Mapping) else None
    env_set = (job or {}).get("env_set") if isinstance(job, Mapping) else None
    if not isinstance(env_set, Mapping):
        return []
    return [item.strip() for name, value in env_set.items()
            if is_credential_env_name(str(name)) and isinstance(value, str) and value != REDACTED
            for item in value.split(",") if len(item.strip()) >= 4]


def scrub_hydra_dir(hydra_dir: str | os.PathLike, secrets: Iterable[str] = ()) -> list[Path]:
    """Rewrite the YAML files Hydra saved in ``hydra_dir`` (``config.yaml``,
    ``overrides.yaml``, ``hydra.yaml``; a sweep dir's ``multirun.yaml``) without credentials
    (see ``_scrub_value``); returns the files that changed.

    Hydra saves them before the task runs, so every job cleans them at start-up (a key given
    as ``+hydra.job.env_set.WANDB_API_KEY=…`` lands in ``hydra.yaml``), and a refused run
    too. ``secrets`` are literal values to hide wherever they appear (e.g. a key passed as
    ``retriever.keys_env``). Known secrets are hidden as config values (whole values,
    distinctive ones inside longer values and keys): the environment's now, those it held
    when the process started (``remember_environment_secrets``: ``env_set`` may have replaced
    them), and every value ``hydra.job.env_set`` gives a credential variable in these files.
    Each rewrite is atomic (a sweep's jobs may clean its ``multirun.yaml`` at once); an
    unreadable file is left alone.
    """
    import yaml

    literal = sorted(set(secrets) - {""}, key=len, reverse=True)
    loaded = {}
    for path in sorted(Path(hydra_dir).glob("*.yaml")):
        try:
            loaded[path] = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
    # the job's environment may differ from this process's: every credential an env_set names
    known = _Known([*env_secrets(), *(v for data in loaded.values() for v in _env_set_secrets(data))])
    changed = []
    for path, data in loaded.items():
        clean = _scrub_value(data, literal, known)
        if clean != data:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(yaml.safe_dump(clean, sort_keys=False, allow_unicode=True),
                           encoding="utf-8")
            os.replace(tmp, path)
            changed.append(path)
    return changed


def install_record_scrubber() -> None:
    """Scrub every log record at creation, whoever logs it and whichever handler shows it.

    Hydra logs overrides before our job's handlers exist (the multirun launcher's
    ``#0 : …`` lines) and after a failure (``Error executing job with overrides: …``); a
    record factory sees those too. Process-wide and idempotent.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, "searchr1_scrubs", False):
        return
    filt = SecretFilter()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            filt.filter(record)
        except Exception:  # noqa: BLE001 - a malformed record is left to logging's own handling
            pass
        return record

    factory.searchr1_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
