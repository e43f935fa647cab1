"""Refuse command-line overrides that carry a credential, before Hydra sees them.

Hydra echoes an override in its errors (``To append to your config use +wandb.api_key=<key>``),
logs it in a sweep's ``#0 : …`` lines and saves it under ``.hydra/``, so a key typed on the
command line lands in shell history, SLURM and CI logs. ``guard_command_line`` runs first in
``python -m searchr1.main``: an override that carries a credential exits 2 with one paragraph
that names the override's key and where the credential belongs, never its value, and nothing
is run or written. An override carries a credential when

- its key names one (``wandb.api_key``, ``+engine.hf_token``, ``+retriever.password``,
  ``+retriever.search_keys``: ``is_credential_key``, or a last word ``key``/``keys``);
- it is a ``*_env`` setting (``retriever.keys_env``) whose value is not a variable's NAME;
- its value, or an item of a list or sweep, equals a secret of the environment (or of a
  ``+hydra.job.env_set`` credential on the same line), contains a distinctive one, or is
  credential-shaped (``api_key=…`` inside a URL, a vendor-prefixed or random-looking key).

``+hydra.job.env_set.WANDB_API_KEY=…`` stays allowed: it is how a job is given a key in its
environment, and its value is scrubbed from ``.hydra/`` and the logs. The environment's
secrets are also remembered here, before Hydra's ``env_set`` replaces any of them, so the
dumps and logs are scrubbed of the original values too (``remember_environment_secrets``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from searchr1.startup.errors import exit_with
from searchr1.utils.secret_shapes import scrub_credentials, words
from searchr1.utils.secrets import (LIST_SECRET_ENV_VARS, SECRET_ENV_VARS, env_secrets,
                                    is_credential_env_name, is_credential_key, is_distinctive,
                                    login_secrets, remember_environment_secrets)

# Hydra's flags that take a value (the value is not an override)
_VALUE_FLAGS = frozenset({"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                          "-p", "--package", "-c", "--cfg", "--experimental-rerun",
                          "-sc", "--shell-completion"})
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_BENIGN_KEY_PREFIXES = frozenset({"sort", "max", "min", "num", "cache", "group", "primary",
                                  "public", "partition", "hash", "lookup", "dict", "map"})


def overrides(argv: list[str]) -> list[str]:
    """The override arguments of a Hydra command line (flags and their values left out)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in _VALUE_FLAGS  # ``--cfg job``; ``--cfg=job`` carries its own value
        else:
            out.append(arg)
    return out


def _names_credential(key: str) -> bool:
    last = key.lstrip("+~").split(".")[-1]
    ws = words(last)
    if is_credential_key(last):
        return True
    return bool(ws) and ws[-1] in ("key", "keys") and (len(ws) == 1 or
                                                      ws[-2] not in _BENIGN_KEY_PREFIXES)


def _env_set(key: str) -> str | None:
    """The variable an ``hydra.job.env_set.<NAME>`` override sets, else None."""
    parts = key.lstrip("+~").split(".")
    return parts[-1] if len(parts) == 4 and parts[:3] == ["hydra", "job", "env_set"] else None


def _items(value: str) -> list[str]:
    """A value and its items (``[a,b]`` lists, ``a,b`` sweeps, ``choice(a,b)``)."""
    inner = re.sub(r"^\w+\((.*)\)$", r"\1", value.strip()).strip("[]")
    return [value, *(item.strip().strip("\"'") for item in inner.split(","))]


def _where(secret: str, environ: Mapping[str, str], env_set: dict[str, str]) -> str:
    for name in (*SECRET_ENV_VARS, *LIST_SECRET_ENV_VARS):
        if secret in (v.strip() for v in environ.get(name, "").split(",")):
            return f"the value of {name} in the environment"
    for name, value in env_set.items():
        if secret in (v.strip() for v in value.split(",")):
            return f"the value given to hydra.job.env_set.{name}"
    return "a key saved by `trio login`"


def _where_to_set(key: str) -> str:
    from searchr1.startup.checks import CREDENTIAL_ENV

    parts = key.lstrip("+~").split(".")
    if {"hf", "huggingface"} & set(words(parts[-1])):
        return "HF_TOKEN"
    return CREDENTIAL_ENV.get(parts[0]) or ("the variable the option documents "
                                            "(ZHIHU_SEARCH_KEYS for retriever=zhihu)")


def _problem(arg: str, secrets: list[str], environ, env_set: dict[str, str]) -> str | None:
    key, sep, value = arg.partition("=")
    name = key.lstrip("+~")
    if not sep or _env_set(key) is not None:
        return None
    if _names_credential(key):
        return f"{name} holds a credential: set {_where_to_set(key)} in the environment instead"
    if words(name.split(".")[-1])[-1:] == ["env"] and value and not _ENV_NAME.fullmatch(value):
        return (f"{name} must be the NAME of an environment variable (like ZHIHU_SEARCH_KEYS), "
                f"never a key itself: put the keys in that variable")
    for item in _items(value):
        found = [s for s in secrets if s == item.strip() or (is_distinctive(s) and s in item)]
        if found:
            return f"{name}=…: its value is a credential ({_where(found[0], environ, env_set)})"
    if scrub_credentials(value) != value:
        return (f"{name}=…: its value looks like a credential (a key, a token, or "
                f"`name=<secret>` in a URL)")
    return None


def secret_override_problems(argv: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per override of ``argv`` that carries a credential (no value in any line)."""
    env = os.environ if environ is None else environ
    args = overrides(argv)
    env_set = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        var = _env_set(key)
        if sep and var and is_credential_env_name(var) and value:
            env_set[var] = value
    secrets = set(env_secrets(env)) | {v.strip() for value in env_set.values()
                                       for v in value.split(",") if len(v.strip()) >= 4}
    if environ is None:
        secrets |= set(login_secrets())
    found = [_problem(arg, sorted(secrets, key=len, reverse=True), env, env_set) for arg in args]
    return [p for p in found if p]


def guard_command_line(argv: list[str] | None = None) -> None:
    """Exit 2 (one paragraph) when the command line carries a credential; else remember the
    environment's secrets for the scrubbers and return. Call it before Hydra runs."""
    found = secret_override_problems(sys.argv[1:] if argv is None else argv)
    if found:
        lines = "\n".join(f"  - {p}" for p in found)
        exit_with(f"searchr1: cannot start this run:\n{lines}\nCredentials are read from the "
                  f"environment, never the command line, where Hydra would echo them into logs "
                  f"and save them under .hydra/. No value is shown here; nothing was run or "
                  f"written.")
    remember_environment_secrets()
