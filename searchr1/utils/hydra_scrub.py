"""Scrubbing what Hydra wrote before a job began (``.hydra/*.yaml``, a sweep's ``multirun.yaml``)
and the log records Hydra emits before our handlers exist."""

from __future__ import annotations
import itertools
import logging
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from searchr1.utils.secrets import (  # noqa: F401
    REDACTED, SecretFilter, _Known, env_secrets, is_credential_env_name, is_credential_key,
    is_secret_key, login_secrets,
    scrub_text, scrub_value,
)


def _scrub_value(value: object, literal: list[str], known: _Known, env_set: bool = False) -> object:
    """``value`` with credentials hidden: values under credential keys (any value under
    ``env_set`` whose variable name is a credential's), ``key=value`` overrides with such a
    key, ``literal`` secrets anywhere, and the environment's as config values (``_Known``)."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
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


def scrub_hydra_dir(hydra_dir: str | os.PathLike, secrets: Iterable[str] = ()) -> list[Path]:
    """Rewrite the YAML files Hydra saved in ``hydra_dir`` (``config.yaml``,
    ``overrides.yaml``, ``hydra.yaml``; a sweep dir's ``multirun.yaml``) without credentials
    (see ``_scrub_value``); returns the files that changed.

    Hydra saves them before the task runs, so every job cleans them at start-up (a key given
    as ``+hydra.job.env_set.WANDB_API_KEY=…`` lands in ``hydra.yaml``), and a refused run
    too. ``secrets`` are literal values to hide wherever they appear (e.g. a key passed as
    ``retriever.keys_env``); the environment's are hidden as config values (whole values,
    distinctive ones inside longer values). Each rewrite is atomic (a sweep's jobs may
    clean its ``multirun.yaml`` at once); an unreadable file is left alone.
    """
    import yaml

    literal = sorted(set(secrets) - {""}, key=len, reverse=True)
    known = _Known(env_secrets())
    changed = []
    for path in sorted(Path(hydra_dir).glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
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
