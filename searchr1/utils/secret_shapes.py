"""What a credential looks like in free text, when no known value says so.

``scrub_credentials`` replaces with ``***``: ``sk-…`` / ``hf_…`` / ``ghp_…``-style keys,
long random-looking tokens, ``Bearer <token>``, and the value of ``name=value`` /
``name: value`` / ``"name": "value"`` where the name is a credential's (``api_key=…`` in a
query string, ``Authorization: …``). It never rewrites ordinary words: a value is replaced
only when it is shaped like a secret (``secret_shaped``: letters and digits mixed, a long
number, base64 padding, a random token) or sits in quoted data (``"password": "…"``), so
``Credentials: none were required``, ``The key: Paris``, ``the bearer must sign`` and a
traceback's ``sorted(runs, key=lambda r: r.seconds)`` stay as they are.
"""

from __future__ import annotations

import re

REDACTED = "***"

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")

# ``name=value`` / ``name: value`` / ``"name": "value"``; the name decides (_credential_name)
_NAME_SEP = re.compile(r"(?<![\w.-])([\"']?)([A-Za-z][\w.-]*)\1[ \t]*([:=])[ \t]*([\"']?)"
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
# values that say there is no credential
_NULLISH = frozenset({"", "none", "null", "nil", "undefined", "empty", "unset", "true", "false",
                      "n/a", REDACTED})
# keys with a vendor prefix: OpenAI/Anthropic ``sk-``, Hugging Face, GitHub, Slack, AWS, GitLab
_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|glpat-[A-Za-z0-9_-]{20,})(?![A-Za-z0-9_-])")
_LONG_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{24,}(?![A-Za-z0-9_-])")
_WORDLIKE = re.compile(r"[A-Z]?[a-z]{3,}|[A-Z]{4,}|[0-9]{2,}")
RANDOM_MAX_WORDLIKE = 0.55  # identifiers score 0.64+, random base62 keys mostly below 0.55
MIN_SECRET_DIGITS = 6  # a number this long under a credential's name is a PIN or password


def words(name: str) -> list[str]:
    """The lower-case words of an identifier (``hfToken`` → ``hf``, ``token``)."""
    return [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", name)) if w]


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


def secret_shaped(value: str) -> bool:
    """Whether one value (no blanks inside) could be a credential rather than a word, a name
    or a code expression: letters mixed with digits (``hunter2``, ``zk-one-1111``), a number
    of ``MIN_SECRET_DIGITS``+ digits, base64 with padding, or a random-looking token."""
    value = value.strip().strip("\"'")
    if value.lower() in _NULLISH or any(c.isspace() for c in value):
        return False
    letters, digits = any(c.isalpha() for c in value), sum(c.isdigit() for c in value)
    if letters and digits:
        return True
    if digits >= MIN_SECRET_DIGITS and digits == sum(c.isalnum() for c in value):
        return True
    return (len(value) >= 8 and value.endswith("=") and value.rstrip("=").isalnum()) \
        or looks_random(value)


def _shaped_value(value: str) -> bool:
    """``secret_shaped`` for a value or any item of a list value (``[a, b]`` / ``a,b``)."""
    return any(secret_shaped(item) for item in value.strip("[]").split(","))


def _credential_name(name: str, sep: str) -> bool:
    """Whether ``name`` (before ``sep``, ``=`` or ``:``) names a credential in free text."""
    ws = words(name)
    if not ws:
        return False
    last = ws[-1]
    if last in _STRONG_WORDS or last.endswith(("apikey", "password", "passwd")):
        return True
    if len(ws) >= 3 and last == "id" and ws[-2] == "key":  # access_key_id
        return True
    if last in _BARE_WORDS or last.endswith(("token", "secret")):
        if len(ws) == 1:
            return sep == "=" if last in _BARE_WORDS else True  # hftoken: / clientsecret:
        return ws[-2] not in _BENIGN_PREFIXES
    return False


def _scrub_assignments(text: str) -> str:
    """Secret values after a credential's name: a secret-shaped value (any form), a quoted
    value under a quoted name (``"password": "…"``, data rather than prose), a long value
    after an auth scheme (``Authorization: Basic …``)."""
    out, pos = [], 0
    for m in _NAME_SEP.finditer(text):
        name, sep, quoted_name = m.group(2), m.group(3), bool(m.group(1))
        if m.start() < pos or not (_credential_name(name, sep)
                                   or (quoted_name and _credential_name(name, "="))):
            continue
        value = _VALUE.match(text, m.end())
        if value is None or value.group().lower() in _NULLISH:
            continue
        data = quoted_name and bool(m.group(4)) and _credential_name(name, ":")
        if not (data or _shaped_value(value.group()) or (m.group(5) and len(value.group()) >= 8)):
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


def _scrub_bearer(m: re.Match) -> str:
    token = m.group(2)
    if secret_shaped(token) or len(token) >= 20:
        return m.group(1) + REDACTED
    return m.group()  # "the bearer must sign"


def scrub_credentials(text: str) -> str:
    """``text`` with credential-shaped parts replaced by ``***`` (no known values needed):
    credential assignments, ``Bearer <token>``, vendor-prefixed keys, random-looking tokens."""
    if not isinstance(text, str) or not text:
        return text
    text = _scrub_assignments(text)
    text = _BEARER.sub(_scrub_bearer, text)
    text = _PREFIXED.sub(_scrub_prefixed, text)
    return _LONG_TOKEN.sub(lambda m: REDACTED if looks_random(m.group()) else m.group(), text)
