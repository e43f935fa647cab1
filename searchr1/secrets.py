"""Keep credentials out of everything we log: configs, run names, log lines.

Secrets reach a logged config in two ways: a key that holds one (``retriever.api_key``,
``hf_token``) or a value resolved from the environment (``${oc.env:ZHIHU_SEARCH_KEYS}``).
``redact_config`` catches both: values under secret-looking keys become ``"***"``, and any
occurrence of a secret present in the environment is replaced wherever it appears in a
string. ``scrub_text`` does the same for free text (log lines, override strings), and
``SecretFilter`` applies it to every ``logging`` record that passes a handler.

Key matching works on words, not raw substrings, so that hyperparameters survive:
``max_tokens`` and ``tokenizer`` are not secrets, ``hf_token`` and ``apiKey`` are. Numbers
and booleans are never redacted: a credential is text.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping

REDACTED = "***"

# Environment variables whose values are credentials. ``ZHIHU_SEARCH_KEYS`` is a comma list.
SECRET_ENV_VARS = (
    "WANDB_API_KEY",
    "PYTRIO_API_KEY",
    "TRIO_API_KEY",
    "SWANLAB_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)
LIST_SECRET_ENV_VARS = ("ZHIHU_SEARCH_KEYS",)
MIN_SECRET_LEN = 4  # shorter env values ("1", "") would scrub ordinary text

_SECRET_WORDS = frozenset(
    {"key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password",
     "passwd", "passphrase", "authorization", "credential", "credentials"}
)
_SECRET_SUFFIXES = ("apikey", "token", "secret", "password")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")

# ``api_key=abc``, ``"token": "abc"``, ``Authorization: Bearer abc`` in free text.
_ASSIGNMENT = re.compile(
    r"(?i)(\b(?:[\w.-]*[_.-])?(?:api[_-]?key|apikey|keys?|token|secrets?|password|passwd"
    r"|authorization)\b[\"']?\s*[:=]\s*[\"']?(?:bearer\s+)?)([^\s\"',;&}\])>]+)"
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{4,})")


def env_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Credentials present in the environment, longest first (so overlaps scrub fully).

    Read at call time, never cached: a key set after import must still be caught.
    """
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for name in SECRET_ENV_VARS:
        found.add(env.get(name, "").strip())
    for name in LIST_SECRET_ENV_VARS:
        found.update(item.strip() for item in env.get(name, "").split(","))
    return sorted((s for s in found if len(s) >= MIN_SECRET_LEN), key=len, reverse=True)


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", name)) if w]


def is_secret_key(name: str) -> bool:
    """Whether a config key names a credential (``api_key``, ``hfToken``, ``authorization``)."""
    for word in _words(str(name)):
        if word in _SECRET_WORDS or word.endswith(_SECRET_SUFFIXES):
            return True
    return False


def scrub_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Replace known secrets and ``key=value``-style credentials in free text with ``***``."""
    if not isinstance(text, str) or not text:
        return text
    for secret in env_secrets() if secrets is None else secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, text)
    return _BEARER.sub(lambda m: m.group(1) + REDACTED, text)


def _is_plain_scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float))


def _redact(value: object, secret_key: bool, secrets: list[str]) -> object:
    """Recursive worker: ``secret_key`` says an enclosing key named a credential."""
    if isinstance(value, Mapping):
        return {
            scrub_text(str(k), secrets): _redact(v, secret_key or is_secret_key(str(k)), secrets)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact(v, secret_key, secrets) for v in value]
    if _is_plain_scalar(value):
        return value
    if secret_key:
        return REDACTED if str(value) else value
    return scrub_text(str(value), secrets)


def redact_config(cfg_dict: Mapping, secrets: Iterable[str] | None = None) -> dict:
    """A copy of a (resolved, plain) config with every credential replaced by ``***``.

    Strings under secret-looking keys are replaced whole; every other string has the
    environment's secrets scrubbed out. Numbers, booleans and ``None`` pass through.
    """
    known = env_secrets() if secrets is None else list(secrets)
    return _redact(cfg_dict, False, known)  # type: ignore[return-value]


def redact_overrides(overrides: Iterable[str], secrets: Iterable[str] | None = None) -> list[str]:
    """Hydra override strings with secret values hidden: ``+retriever.api_key=***``."""
    known = env_secrets() if secrets is None else list(secrets)
    out = []
    for item in overrides:
        key, sep, _value = item.partition("=")
        if sep and is_secret_key(key.split(".")[-1].lstrip("+~")):
            out.append(f"{key}={REDACTED}")
        else:
            out.append(scrub_text(item, known))
    return out


def argv_has_secret(argv: Iterable[str], secrets: Iterable[str] | None = None) -> bool:
    """Whether a command line carries a credential (trackers then skip recording it)."""
    known = env_secrets() if secrets is None else list(secrets)
    args = list(argv)
    return args != redact_overrides(args, known)


class SecretFilter(logging.Filter):
    """A logging filter that scrubs secrets from each record's message and traceback.

    Attach it to handlers (``install_secret_filter``): a filter on a logger does not see
    records propagated from child loggers, a filter on a handler sees them all.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = env_secrets()
        record.msg = scrub_text(record.getMessage(), secrets)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub_text(record.exc_text, secrets)
        return True


def install_secret_filter(logger: logging.Logger | None = None) -> SecretFilter:
    """Attach one ``SecretFilter`` to every handler of ``logger`` (default: root); return it."""
    target = logger or logging.getLogger()
    filt = SecretFilter()
    for handler in target.handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(filt)
    return filt
