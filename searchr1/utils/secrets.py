"""Keep credentials out of everything we log: configs, run names, log lines.

Secrets reach a logged config in two ways: a key that holds one (``retriever.api_key``,
``hf_token``) or a value resolved from the environment (``${oc.env:ZHIHU_SEARCH_KEYS}``).
``redact_config`` catches both: values under secret-looking keys become ``"***"``, and so
does a value equal to a secret present in the environment. Inside longer values (a data
path, a URL) only secrets no ordinary text contains are replaced (``is_distinctive``: 12+
characters with a letter and a digit), plus credential-shaped tokens (below): a secret
that happens to equal a word (``data``) must not turn ``/data/nq`` into ``/***/nq``.

``scrub_text`` cleans free text (log lines): every occurrence of a known secret, and
credential-shaped tokens: ``sk-…`` / ``hf_…`` / ``ghp_…``-style keys, long random-looking
strings, ``Bearer <token>``, and ``name=value`` / ``"name": "value"`` where the name is a
credential's (``api_key=…`` in a query string, ``Authorization: …``). A bare ``key`` or
``token`` followed by a colon is prose (``The key: Paris is the answer``) and stays.
``SecretFilter`` applies ``scrub_text`` to every ``logging`` record that passes a handler.

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
DISTINCTIVE_LEN = 12  # a secret this long with a letter and a digit is no ordinary text

_SECRET_WORDS = frozenset(
    {"key", "keys", "apikey", "apikeys", "token", "secret", "secrets", "password",
     "passwd", "passphrase", "authorization", "credential", "credentials"}
)
_SECRET_SUFFIXES = ("apikey", "token", "secret", "password")
_KEY_WORDS = frozenset({"key", "keys"})  # secret only last or before one of _KEY_TAILS
_KEY_TAILS = frozenset({"env", "file", "id", "value", "values", "list"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")

# ---- credential-shaped text ------------------------------------------------------------------

# ``name=value`` / ``name: value`` / ``"name": "value"``; the name decides (_credential_name)
_NAME_SEP = re.compile(r"(?<![\w.-])([\"']?)([A-Za-z][\w.-]*)\1[ \t]*([:=])[ \t]*[\"']?"
                       r"((?:bearer|basic|token)[ \t]+)?", re.IGNORECASE)
_VALUE = re.compile(r"\[[^\]\n]*\]|[^\s\"',;&}\])>]+(?:,[^\s\"',;&}\])>]+)*")  # [a, b] / a,b / a
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]{4,})")
# last words that alone name a credential only in ``name=value`` form (a query string's
# ``key=…``); ``The key: Paris`` is prose
_BARE_WORDS = frozenset({"key", "keys", "token", "secret", "secrets"})
_STRONG_WORDS = frozenset({"apikey", "apikeys", "password", "passwd", "passphrase", "pwd",
                           "authorization", "credential", "credentials"})
# ``pad_token``, ``sort_key``, ``public_key``, ``max_key``: named like credentials, are not
_BENIGN_PREFIXES = frozenset({
    "pad", "eos", "bos", "unk", "sep", "cls", "mask", "stop", "end", "start", "special",
    "max", "min", "num", "n", "sort", "cache", "primary", "foreign", "group", "dict", "hash",
    "lookup", "partition", "public", "next", "prev", "first", "last", "new", "old", "input",
    "output", "sequence", "row", "column", "index", "map"})
# keys with a vendor prefix: OpenAI/Anthropic ``sk-``, Hugging Face, GitHub, Slack, AWS, GitLab
_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|glpat-[A-Za-z0-9_-]{20,})(?![A-Za-z0-9_-])")
_LONG_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{24,}(?![A-Za-z0-9_-])")
_WORDLIKE = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{4,}|[0-9]{2,}")
RANDOM_MAX_WORDLIKE = 0.55  # identifiers score 0.64+, random base62 keys mostly below 0.55


def looks_random(token: str) -> bool:
    """Whether a 24+ character token looks like a generated key, not a name: upper and lower
    case letters and digits, and few of its characters in word-like runs (``Instruct``,
    ``GGUF``, ``2026``). Hex digests and dated run ids (no upper case) are not keys here."""
    alnum = [c for c in token if c.isalnum()]
    if len(alnum) < 20 or not (any(c.isupper() for c in alnum) and any(c.islower() for c in alnum)
                              and any(c.isdigit() for c in alnum)):
        return False
    wordlike = sum(len(m) for m in _WORDLIKE.findall(token))
    return wordlike / len(alnum) <= RANDOM_MAX_WORDLIKE


def _credential_name(name: str, sep: str) -> bool:
    """Whether ``name`` (before ``sep``, ``=`` or ``:``) names a credential in free text."""
    words = _words(name)
    if not words:
        return False
    last = words[-1]
    if last in _STRONG_WORDS or last.endswith(("apikey", "password", "passwd")):
        return True
    if len(words) >= 3 and last == "id" and words[-2] == "key":  # access_key_id
        return True
    if last in _BARE_WORDS or last.endswith(("token", "secret")):
        if len(words) == 1:
            return sep == "=" if last in _BARE_WORDS else True  # hftoken: / clientsecret:
        return words[-2] not in _BENIGN_PREFIXES
    return False


def _scrub_assignments(text: str) -> str:
    out, pos = [], 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < pos or not _credential_name(m.group(2), m.group(3)):
            continue
        value = _VALUE.match(text, m.end())
        if value is None or value.group() == REDACTED:
            continue
        out += [text[pos:m.end()], REDACTED]
        pos = value.end()
    return "".join(out) + text[pos:] if out else text


def _scrub_prefixed(m: re.Match) -> str:
    token = m.group()
    if token.startswith("sk-"):
        tail = token[3:]
        if len(tail) < 16 and not any(c.isdigit() for c in tail):
            return token  # sk-learn-intelex, not a key
    return REDACTED


def scrub_credentials(text: str) -> str:
    """``text`` with credential-shaped parts replaced by ``***`` (no known values needed):
    credential assignments, ``Bearer <token>``, vendor-prefixed keys, random-looking tokens."""
    if not isinstance(text, str) or not text:
        return text
    text = _scrub_assignments(text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _PREFIXED.sub(_scrub_prefixed, text)
    return _LONG_TOKEN.sub(lambda m: REDACTED if looks_random(m.group()) else m.group(), text)


def is_distinctive(secret: str) -> bool:
    """Whether a secret cannot be part of ordinary text (so replacing it inside a longer
    value is safe): 12+ characters with a letter and a digit. ``data`` or ``train`` is not."""
    return (len(secret) >= DISTINCTIVE_LEN and any(c.isdigit() for c in secret)
            and any(c.isalpha() for c in secret))


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
    """Free text (a log line) with every occurrence of a known secret and every
    credential-shaped part (``scrub_credentials``) replaced by ``***``."""
    if not isinstance(text, str) or not text:
        return text
    for secret in env_secrets() if secrets is None else secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return scrub_credentials(text)


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
