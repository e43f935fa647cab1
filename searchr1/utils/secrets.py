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

import itertools
import logging
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

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
LIST_SECRET_ENV_VARS = ("ZHIHU_SEARCH_KEYS", "ZHIHU_SEARCH_KEY", "ZHIHU_ACCESS_SECRET")
MIN_SECRET_LEN = 4  # shorter env values ("1", "") would scrub ordinary text

_SECRET_WORDS = frozenset(
    {"key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password",
     "passwd", "passphrase", "authorization", "credential", "credentials"}
)
_SECRET_SUFFIXES = ("apikey", "token", "secret", "password")
_KEY_WORDS = frozenset({"key", "keys"})  # secret only last or before one of _KEY_TAILS
_KEY_TAILS = frozenset({"env", "file", "id", "value", "values", "list"})
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

    Read at call time, never cached: a key set after import must still be caught. With the
    real environment (``environ`` None) the keys saved by ``trio login`` are included too.
    """
    env = os.environ if environ is None else environ
    found: set[str] = set(login_secrets()) if environ is None else set()
    for name in SECRET_ENV_VARS:
        found.add(env.get(name, "").strip())
    for name in LIST_SECRET_ENV_VARS:
        found.update(item.strip() for item in env.get(name, "").split(","))
    return sorted((s for s in found if len(s) >= MIN_SECRET_LEN), key=len, reverse=True)


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


def _words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", name)) if w]


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


def hide(text: str, values: Iterable[str]) -> str:
    """``text`` with each literal value replaced by ``***`` (no pattern matching)."""
    for value in sorted(set(values) - {""}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def _scrub_value(value: object, secrets: list[str]) -> object:
    """``value`` with credentials hidden: nested keys, ``key=value`` overrides, known secrets."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_credential_key(str(k)) and isinstance(v, str) and v
                else _scrub_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_value(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        key, sep, _ = value.partition("=")
        if sep and is_credential_key(key.split(".")[-1].lstrip("+~")):
            value = f"{key}={REDACTED}"
    return value


def scrub_hydra_dir(hydra_dir: str | os.PathLike, secrets: Iterable[str] = ()) -> list[Path]:
    """Rewrite Hydra's ``config.yaml``, ``overrides.yaml`` and ``hydra.yaml`` in ``hydra_dir``
    without credentials (see ``_scrub_value``); returns the files that changed.

    Hydra saves them before the task runs, so a refused run must clean up after it.
    ``secrets`` are literal values to hide wherever they appear (e.g. a key passed as
    ``retriever.keys_env``), on top of the environment's.
    """
    import yaml

    known = sorted({*secrets, *env_secrets()} - {""}, key=len, reverse=True)
    changed = []
    for path in sorted(Path(hydra_dir).glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        clean = _scrub_value(data, known)
        if clean != data:
            path.write_text(yaml.safe_dump(clean, sort_keys=False, allow_unicode=True),
                            encoding="utf-8")
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
