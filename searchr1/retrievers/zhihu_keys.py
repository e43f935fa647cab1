"""Zhihu search credentials: reading keys from the environment and rotating them safely.

Where keys come from (the lab's fallbacks, ``search.py`` ``from_env``): the first non-empty
of ``ZHIHU_SEARCH_KEYS``, ``ZHIHU_SEARCH_KEY``, ``ZHIHU_ACCESS_SECRET`` (after
``retriever.keys_env`` when that names another variable), each read from the process
environment first and then from a ``.env`` file (``retriever.env_file``), which — like
``load_dotenv`` — never overrides a variable that is set. The ``.env`` file is parsed here
(``KEY=VALUE`` lines, optional ``export``, quotes, ``#`` comments) and never copied into
``os.environ``, so the keys do not leak into child processes.

A key is a bearer secret, so nothing here ever formats one into text: a key is named by its
fingerprint (position + sha256 prefix), ``Key.__repr__`` hides the secret, and ``redact``
scrubs key strings out of any server text before it reaches a log or an exception.
``KeyPool`` is the rotation state of one retriever: round-robin over live keys, rate-limited
keys set aside until a monotonic deadline, exhausted keys retired for the run.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

#: the lab's variables, in the order it tries them
KEY_ENV_VARS = ("ZHIHU_SEARCH_KEYS", "ZHIHU_SEARCH_KEY", "ZHIHU_ACCESS_SECRET")
_DOTENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


class MissingCredentialsError(RuntimeError):
    """No Zhihu search key is configured; the message says how to set one."""


def parse_keys(raw: str) -> list[str]:
    """Split a comma/newline separated key list, stripping blanks and duplicates."""
    return list(dict.fromkeys(k.strip() for k in re.split(r"[,\n]", raw) if k.strip()))


def read_dotenv(path: str | Path | None) -> dict[str, str]:
    """``KEY=VALUE`` pairs of a ``.env`` file ({} when ``path`` is None or absent)."""
    if path is None or not Path(path).is_file():
        return {}
    out: dict[str, str] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        match = _DOTENV_LINE.match(line)
        if match is None or line.lstrip().startswith("#"):
            continue
        value = match.group(2)
        if len(value) > 1 and value[0] in "\"'" and value[-1] == value[0]:
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[match.group(1)] = value
    return out


def key_sources(env_name: str) -> tuple[str, ...]:
    """The variables tried, in order: ``env_name``, then the lab's fallbacks."""
    return tuple(dict.fromkeys((env_name, *KEY_ENV_VARS)))


def find_keys(env_name: str, env_file: str | Path | None = None) -> tuple[list[str], str | None]:
    """(keys, where they came from) by the rule in the module docstring; ([], None) if none."""
    dotenv = read_dotenv(env_file)
    for name in key_sources(env_name):
        candidates = ((os.environ.get(name), name), (dotenv.get(name), f"{name} in {env_file}"))
        for value, where in candidates:
            keys = parse_keys(value or "")
            if keys:
                return keys, where
    return [], None


def missing_message(env_name: str, env_file: str | Path | None) -> str:
    """What to set when no key is found anywhere."""
    names = ", ".join(key_sources(env_name))
    where = f" or the file {env_file}" if env_file else ""
    return (
        f"retriever=zhihu needs at least one Zhihu search API key: none of {names} is set "
        f"in the environment{where}. Set one before running, e.g. "
        f"`export {env_name}=key1,key2` (comma or newline separated); keys are issued "
        f"by the Zhihu open-data platform (https://developer.zhihu.com/)."
    )


def key_fingerprint(index: int, secret: str) -> str:
    """A loggable name for a key: its position and a short sha256 prefix, never the key."""
    return f"key#{index}[sha256:{hashlib.sha256(secret.encode()).hexdigest()[:8]}]"


@dataclass
class Key:
    """One credential and its state; ``repr`` shows only the fingerprint."""

    index: int
    secret: str = field(repr=False)
    fingerprint: str = ""
    ready_at: float = 0.0  # monotonic time before which the key is set aside
    retired: bool = False


class KeyPool:
    """Round-robin over live keys; rate-limited keys wait, exhausted keys retire."""

    def __init__(self, secrets: list[str]) -> None:
        self._keys = [Key(i, s, key_fingerprint(i, s)) for i, s in enumerate(secrets)]
        self._next = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"KeyPool({len(self._keys)} keys, {self.retired_count} retired)"

    @property
    def retired_count(self) -> int:
        return sum(k.retired for k in self._keys)

    def pick(self, now: float) -> Key | None:
        """The next live key that is not set aside, in round-robin order."""
        for _ in range(len(self._keys)):
            key = self._keys[self._next]
            self._next = (self._next + 1) % len(self._keys)
            if not key.retired and key.ready_at <= now:
                return key
        return None

    def wait_time(self, now: float) -> float | None:
        """Seconds until some live key is free again; None when every key is retired."""
        waits = [k.ready_at - now for k in self._keys if not k.retired]
        return max(0.0, min(waits)) if waits else None

    def set_aside(self, key: Key, seconds: float, now: float) -> None:
        key.ready_at = max(key.ready_at, now + seconds)

    def retire(self, key: Key) -> None:
        key.retired = True

    def redact(self, text: str) -> str:
        """``text`` with every key string replaced by its fingerprint."""
        for key in self._keys:
            text = text.replace(key.secret, key.fingerprint)
        return text
