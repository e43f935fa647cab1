"""Zhihu search credentials: reading keys from the environment and rotating them safely.

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


class MissingCredentialsError(RuntimeError):
    """No Zhihu search key is configured; the message says how to set one."""


def parse_keys(raw: str) -> list[str]:
    """Split a comma/newline separated key list, stripping blanks and duplicates."""
    return list(dict.fromkeys(k.strip() for k in re.split(r"[,\n]", raw) if k.strip()))


def load_keys(env_name: str) -> list[str]:
    """Keys from ``env_name``, or ``MissingCredentialsError`` saying how to provide them."""
    keys = parse_keys(os.environ.get(env_name, ""))
    if not keys:
        raise MissingCredentialsError(
            f"retriever=zhihu needs at least one Zhihu search API key in the environment "
            f"variable {env_name} (unset or empty). Set it before running, e.g. "
            f"`export {env_name}=key1,key2` (comma or newline separated); keys are issued "
            f"by the Zhihu open-data platform (https://developer.zhihu.com/)."
        )
    return keys


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
