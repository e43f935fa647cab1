"""The log scrubber replaces secrets and secret-shaped tokens, never ordinary words: a corpus
of ordinary log lines passes unchanged, the same lines with planted keys come out masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchr1.utils.secrets import REDACTED, scrub_text

ROOT = Path(__file__).resolve().parents[2]

PROSE = [
    "Credentials: none were required",
    "credentials: not needed for the embedded world",
    "Password: see the team vault",
    "password: required (set it in the environment)",
    "Authorization: denied for this profile, run `trio login`",
    "API key: missing; set WANDB_API_KEY",
    "the bearer must sign the form",
    "Token: expired, refreshing",
    "secret: keep it simple",
    "The key: Paris is the answer",
    "access token: none",
    "passphrase: ask the owner",
    "hf_token: unset, downloads are anonymous",
]
# source lines as a traceback prints them: code, not credentials
TRACEBACK_LINES = [
    '    return sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]',
    "    worst = max(phases, key=phases.get)",
    '        key = "self_cuda_time_total" if args.device.startswith("cuda") else "x"',
    "    client = Client(api_key=api_key, token=token)",
    "    self.password = password",
    "        cache, token = out.past_key_values, ids[:, -1:]",
    '    secret = os.environ.get("ZHIHU_ACCESS_SECRET")',
    "    headers = {'Authorization': f'Bearer {self.api_key}'}",
    "  File \"/x/searchr1/engines/trio.py\", line 114, in check_credentials",
]


def _repo_log_lines() -> list[str]:
    """Every line of the run and benchmark logs kept under ``experiments/``."""
    lines = [line for path in sorted((ROOT / "experiments").rglob("*.log"))
             for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    return [line for line in lines if line.strip()]


def test_ordinary_lines_pass_unchanged():
    corpus = PROSE + TRACEBACK_LINES + _repo_log_lines()
    assert len(corpus) > 1000
    changed = [(line, scrub_text(line, [])) for line in corpus if scrub_text(line, []) != line]
    assert changed == []


PLANTED = {  # a key as it shows up in a log line → the key
    "GET https://z.example/search?q=paris&key=Zk7Qm2Vx9Lp4": "Zk7Qm2Vx9Lp4",
    "retrying with api_key=ab12cd34ef56": "ab12cd34ef56",
    "Credentials: hunter2-Bravo": "hunter2-Bravo",
    "Password: 739104": "739104",
    "header Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl": "eyJhbGciOiJIUzI1NiJ9",
    "Authorization: Basic dXNlcjpwYXNzd29yZA==": "dXNlcjpwYXNzd29yZA==",
    '{"user": "ana", "password": "tulip", "retries": 3}': "tulip",
    "{'api_key': 'orchid'}": "orchid",
    "using sk-proj-Ab12Cd34Ef56Gh78Ij90 now": "sk-proj-Ab12Cd34Ef56Gh78Ij90",
    "pushed with hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "git remote uses ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW": "ghp_aB3dE5fG7hI9jK1lM3nO5pQ7rS9tU1vW",
    "AWS AKIAIOSFODNN7EXAMPLE in env": "AKIAIOSFODNN7EXAMPLE",
    "slack xoxb-1234567890-abcdefghij posted": "xoxb-1234567890-abcdefghij",
    "random kF9xQ2mZ7pL4vR8tN3wB6yH1sD5c here": "kF9xQ2mZ7pL4vR8tN3wB6yH1sD5c",
    "ZHIHU_SEARCH_KEYS=zk-one-1111,zk-two-2222 exported": "zk-two-2222",
}


@pytest.mark.parametrize("line,key", PLANTED.items())
def test_planted_keys_are_masked(line, key):
    out = scrub_text(line, [])
    assert key not in out and REDACTED in out, out


GENERATED = [k for k in PLANTED.values() if k not in ("tulip", "orchid", "739104")]


def test_keys_planted_in_real_log_lines_are_all_masked():
    """Generated keys (never ordinary words) after a credential's name, as a bearer token,
    and bare where they have a vendor's prefix: masked, the rest of the line kept."""
    lines = _repo_log_lines()[::50][:40]
    for i, line in enumerate(lines):
        key = GENERATED[i % len(GENERATED)]
        planted = [f"{line} api_key={key}", f"{line} Authorization: Bearer {key}",
                   f"{line} password: {key}", f"{line} {{\"token\": \"{key}\"}}"]
        if key.startswith(("sk-", "hf_", "ghp_", "AKIA", "xox")):
            planted.append(f"{key} {line}")
        for text in planted:
            out = scrub_text(text, [])
            assert key not in out, text
            assert line.strip()[:20] in out  # the rest of the line is kept


def test_a_known_secret_is_masked_everywhere_and_a_word_like_one_only_as_a_word():
    key = "0123456789abcdef0123456789abcdef01234567"
    assert scrub_text(f"wandb login {key}; project={key[:8]}x", [key]) == \
        "wandb login ***; project=01234567x"
    assert scrub_text(f"id{key}tail", [key]) == "id***tail"  # distinctive: inside words too
    word = "data"  # a (bad) secret that is an ordinary word
    assert scrub_text("loading data from /data/nq (metadata ok)", [word]) == \
        "loading *** from /***/nq (metadata ok)"
