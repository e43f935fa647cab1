"""Keep credentials out of everything we log: configs, run names, log lines.

Secrets reach a logged config in two ways: a key that holds one (``retriever.api_key``,
``hf_token``) or a value resolved from the environment (``${oc.env:ZHIHU_SEARCH_KEYS}``).
``redact_config`` catches both: values under secret-looking keys become ``"***"``, and so
does a value equal to a secret present in the environment. Inside longer values (a data
path, a URL) only secrets no ordinary text contains are replaced (``is_distinctive``: 12+
characters with a letter and a digit), plus credential-shaped tokens (below): a secret
that happens to equal a word (``data``) must not turn ``/data/nq`` into ``/***/nq``.

``scrub_text`` cleans free text (log lines): every occurrence of a known secret (a word-like
one only as a whole token), and credential-shaped parts (``secret_shapes``: vendor-prefixed
keys, random-looking tokens, ``Bearer <token>``, a secret-shaped value after a credential's
name). Ordinary words are never replaced: ``Credentials: none were required`` and ``The key:
Paris is the answer`` stay as they are. ``SecretFilter`` applies ``scrub_text`` to every
``logging`` record that passes a handler.

Key matching works on words, not raw substrings, so that hyperparameters survive:
``max_tokens`` and ``tokenizer`` are not secrets, ``hf_token`` and ``apiKey`` are. Numbers
and booleans are never redacted: a credential is text.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from searchr1.utils.secret_shapes import (  # noqa: F401 - scrub_credentials is re-exported
    REDACTED, looks_random, scrub_credentials, secret_shaped, words as _words,
)

# Environment variables whose values are credentials. ``ZHIHU_SEARCH_KEYS`` is a comma list.
SECRET_ENV_VARS = (
    "WANDB_API_KEY",
    "PYTRIO_API_KEY",
    "TRIO_API_KEY",
    "SWANLAB_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)
LIST_SECRET_ENV_VARS = ("ZHIHU_SEARCH_KEYS", "ZHIHU_SEARCH_KEY", "ZHIHU_ACCESS_SECRET")
MIN_SECRET_LEN = 4  # shorter env values ("1", "") would scrub ordinary text
DISTINCTIVE_LEN = 12  # a secret this long with a letter and a digit is no ordinary text

_SECRET_WORDS = frozenset(
    {"key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password",
     "passwd", "passphrase", "authorization", "credential", "credentials"}
)
_SECRET_SUFFIXES = ("apikey", "token", "secret", "password")
_KEY_WORDS = frozenset({"key", "keys"})  # secret only last or before one of _KEY_TAILS
_KEY_TAILS = frozenset({"env", "file", "id", "value", "values", "list"})

def is_distinctive(secret: str) -> bool:
    """Whether a secret cannot be part of ordinary text (so replacing it inside a longer
    value is safe): 12+ characters with a letter and a digit. ``data`` or ``train`` is not."""
    return (len(secret) >= DISTINCTIVE_LEN and any(c.isdigit() for c in secret)
            and any(c.isalpha() for c in secret))


def env_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Credentials present in the environment, longest first (so overlaps scrub fully).

    Read at call time, never cached: a key set after import must still be caught. With the
    real environment (``environ`` None) the keys saved by ``trio login`` are included too, and
    those the environment held at start-up (``remember_environment_secrets``).
    """
    env = os.environ if environ is None else environ
    found: set[str] = set(login_secrets()) | set(_STARTUP) if environ is None else set()
    for name in SECRET_ENV_VARS:
        found.add(env.get(name, "").strip())
    for name in LIST_SECRET_ENV_VARS:
        found.update(item.strip() for item in env.get(name, "").split(","))
    return sorted((s for s in found if len(s) >= MIN_SECRET_LEN), key=len, reverse=True)


_STARTUP: set[str] = set()  # the environment's secrets when the entry point started


def remember_environment_secrets() -> None:
    """Keep the secrets the environment holds now as secrets for this whole process, so
    they are still scrubbed after ``hydra.job.env_set`` replaces a variable (a real key
    copied into another setting, then overridden for the job). Entry points call it once,
    before Hydra runs."""
    _STARTUP.update(env_secrets(dict(os.environ)))


_LOGIN_CACHE: dict[Path, tuple[int, tuple[str, ...]]] = {}


def login_secrets(home: str | os.PathLike | None = None) -> list[str]:
    """API keys saved by ``trio login``: ``api_key`` in ``~/.pytrio/config.toml`` and in each
    named profile's ``~/.pytrio/envs/<name>/config.toml`` (pytrio 0.2.9's layout).

    Each file is re-read only when its mtime changes (this runs for every log record).
    """
    root = Path(home or Path.home()) / ".pytrio"
    if not root.is_dir():
        return []
    keys: list[str] = []
    for path in [root / "config.toml", *sorted(root.glob("envs/*/config.toml"))]:
        keys += _login_file_keys(path)
    return keys


def _login_file_keys(path: Path) -> tuple[str, ...]:
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return ()
    cached = _LOGIN_CACHE.get(path)
    if cached and cached[0] == mtime:
        return cached[1]
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    value = data.get("api_key")
    keys = (value.strip(),) if isinstance(value, str) and value.strip() else ()
    _LOGIN_CACHE[path] = (mtime, keys)
    return keys


def is_secret_key(name: str) -> bool:
    """Whether a config key names a credential (``api_key``, ``hfToken``, ``authorization``)."""
    words = _words(str(name))
    for i, word in enumerate(words):
        if word in _KEY_WORDS:  # "key" names a credential at the end (api_key, keys_env),
            after = words[i + 1:]  # not inside a hyperparameter's name (max_key_wait_s)
            if not after or after[0] in _KEY_TAILS:
                return True
        elif word in _SECRET_WORDS or word.endswith(_SECRET_SUFFIXES):
            return True
    return False


def scrub_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """Free text (a log line) with every occurrence of a known secret and every
    credential-shaped part (``scrub_credentials``) replaced by ``***``. A secret that is not
    distinctive (``data``) is replaced only as a whole token, never inside a word."""
    if not isinstance(text, str) or not text:
        return text
    for secret in env_secrets() if secrets is None else secrets:
        if secret and secret in text:
            text = (text.replace(secret, REDACTED) if is_distinctive(secret)
                    else _whole_token(secret).sub(REDACTED, text))
    return scrub_credentials(text)


@functools.lru_cache(maxsize=256)
def _whole_token(secret: str) -> re.Pattern:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])")


class _Known:
    """Known secrets, as a config value is scrubbed of them: a value equal to one (after
    stripping blanks) is replaced whole; inside a longer value only distinctive ones are."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.all = {s.strip() for s in secrets if s and s.strip()}
        self.inner = sorted((s for s in self.all if is_distinctive(s)), key=len, reverse=True)

    def hide(self, text: str) -> str:
        return REDACTED if text.strip() in self.all else self.hide_inner(text)

    def hide_inner(self, text: str) -> str:
        """Distinctive secrets only (for names: a config key equal to a word stays)."""
        for secret in self.inner:
            text = text.replace(secret, REDACTED)
        return text

    def scrub(self, text: str) -> str:
        return scrub_credentials(self.hide(text)) if text else text


def scrub_value(text: str, secrets: Iterable[str] | None = None) -> str:
    """A config value (a path, a URL, a tag) scrubbed as ``redact_config`` scrubs strings:
    ``***`` if it equals a known secret; else distinctive secrets and credential-shaped
    parts replaced, an ordinary value left as it is even if a secret is a word in it."""
    return _Known(env_secrets() if secrets is None else secrets).scrub(text)


def _is_plain_scalar(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float))


def _redact(value: object, secret_key: bool, known: _Known) -> object:
    """Recursive worker: ``secret_key`` says an enclosing key named a credential."""
    if isinstance(value, Mapping):
        return {
            known.hide_inner(str(k)): _redact(v, secret_key or is_secret_key(str(k)), known)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_redact(v, secret_key, known) for v in value]
    if _is_plain_scalar(value):
        return value
    if secret_key:
        return REDACTED if str(value) else value
    return known.scrub(str(value))


def redact_config(cfg_dict: Mapping, secrets: Iterable[str] | None = None) -> dict:
    """A copy of a (resolved, plain) config with every credential replaced by ``***``.

    Strings under secret-looking keys are replaced whole; every other string goes through
    ``scrub_value`` (a value equal to an environment secret, distinctive secrets inside it,
    credential-shaped parts). Numbers, booleans and ``None`` pass through.
    """
    known = _Known(env_secrets() if secrets is None else secrets)
    return _redact(cfg_dict, False, known)  # type: ignore[return-value]


def _override_key_is_secret(key: str) -> bool:
    """Whether an override's dotted key (``+retriever.api_key``, ``+hydra.job.env_set.X``)
    names a credential."""
    parts = key.lstrip("+~").split(".")
    if is_secret_key(parts[-1]):
        return True
    return len(parts) >= 2 and parts[-2] == "env_set" and is_credential_env_name(parts[-1])


def redact_overrides(overrides: Iterable[str], secrets: Iterable[str] | None = None) -> list[str]:
    """Hydra override strings with secret values hidden: ``+retriever.api_key=***``; other
    values are scrubbed as config values (``scrub_value``), so ``data.path=/data/x`` stays
    whole even when some secret is ``data``."""
    known = _Known(env_secrets() if secrets is None else secrets)
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if sep and _override_key_is_secret(key):
            out.append(f"{key}={REDACTED}")
        elif sep:
            out.append(f"{known.hide_inner(key)}={known.scrub(value)}")
        else:
            out.append(known.scrub(item))
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


# ---- refusing credentials in the config, and cleaning what Hydra already wrote ------------

_CREDENTIAL_WORDS = frozenset({"apikey", "apikeys", "secret", "secrets", "token", "password",
                               "passwd", "passphrase", "authorization", "credential",
                               "credentials"})


def is_credential_key(name: str) -> bool:
    """Whether a config key may only ever hold a credential: ``*api_key*``, ``*secret*``,
    ``*token*`` (``hf_token``, ``apiKey``, ``client_secret``) and the like.

    Stricter than ``is_secret_key``: ``keys_env`` (the NAME of a variable) and
    ``max_turn_tokens`` / ``tokenizer`` (hyperparameters) are not credentials.
    """
    words = _words(str(name))
    pairs = {a + b for a, b in itertools.pairwise(words)}
    return any(w in _CREDENTIAL_WORDS or w.endswith(("apikey", "token", "secret"))
               for w in [*words, *pairs])


_ENV_CREDENTIAL_WORDS = frozenset({
    "key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password", "passwd",
    "pass", "pwd", "passphrase", "auth", "authorization", "credential", "credentials", "cookie"})


def is_credential_env_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential: the project's own
    (``WANDB_API_KEY``, ``ZHIHU_SEARCH_KEYS``, …) or a name with a credential word
    (``OPENAI_API_KEY``, ``AWS_SESSION_TOKEN``, ``DB_PASS``); ``TOKENIZERS_PARALLELISM`` is not."""
    name = str(name)
    if name in SECRET_ENV_VARS or name in LIST_SECRET_ENV_VARS:
        return True
    return is_credential_key(name) or any(w in _ENV_CREDENTIAL_WORDS for w in _words(name))


def hide(text: str, values: Iterable[str]) -> str:
    """``text`` with each literal value replaced by ``***`` (no pattern matching)."""
    for value in sorted(set(values) - {""}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text
