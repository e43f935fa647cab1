"""Secret redaction: configs, free text, log records, and what the trackers write to disk."""

from __future__ import annotations

import json
import logging
import os
import subprocess

import pytest

from searchr1.utils.secrets import (
    REDACTED,
    SecretFilter,
    argv_has_secret,
    env_secrets,
    install_secret_filter,
    is_secret_key,
    redact_config,
    redact_overrides,
    scrub_text,
)
from searchr1.trackers.session import RunInfo, build_trackers

ENV = {
    "ZHIHU_SEARCH_KEYS": " zk-one-11111111 , zk-two-22222222,",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "TRIO_API_KEY": "trio-33333333",
    "SWANLAB_API_KEY": "swl-44444444",
}
ENV_SECRETS = ["zk-one-11111111", "zk-two-22222222", ENV["WANDB_API_KEY"], "trio-33333333",
               "swl-44444444"]
LITERAL = "literal-55555555"


@pytest.fixture
def secret_env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))  # no `trio login` keys
    for name in ("PYTRIO_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    return ENV_SECRETS


def _config() -> dict:
    return {
        "retriever": {
            "name": "zhihu",
            "keys": ["zk-one-11111111", "zk-two-22222222"],  # as resolved from oc.env
            "url": "https://zhihu.example/search?Count=3&key=zk-two-22222222",
            "headers": {"Authorization": f"Bearer {LITERAL}"},
            "topk": 3,
        },
        "model": {"name": "Qwen/Qwen3.5-4B", "tokenizer": "Qwen/Qwen3.5-4B", "hfToken": LITERAL},
        "rollout": {"max_tokens": 1024, "max_obs_tokens": 500, "stop_tokens": ["</search>"]},
        "engine": {"api_key": None, "note": "uses trio-33333333 for auth", "password": 1234},
        "logger": {"wandb": {"mode": "offline", "project": "searchr1"}},
    }


def test_env_secrets_reads_every_variable_at_call_time(secret_env, monkeypatch):
    assert sorted(env_secrets()) == sorted(secret_env)
    monkeypatch.setenv("PYTRIO_API_KEY", "late-66666666")
    monkeypatch.setenv("HF_TOKEN", "1")  # too short to be a secret worth scrubbing
    assert "late-66666666" in env_secrets() and "1" not in env_secrets()


@pytest.mark.parametrize("key,secret", [
    ("api_key", True), ("apiKey", True), ("hf_token", True), ("Authorization", True),
    ("zhihu_search_keys", True), ("client_secret", True), ("db_password", True),
    ("max_tokens", False), ("tokenizer", False), ("stop_tokens", False), ("monkey", False),
    ("keyword", False), ("project", False), ("keys_env", True), ("access_key_id", True),
    ("max_key_wait_s", False),  # a timeout: a resume command must keep its value
])
def test_is_secret_key(key, secret):
    assert is_secret_key(key) is secret


def test_redact_config_removes_keys_and_env_values_but_keeps_hyperparameters(secret_env):
    cfg = _config()
    red = redact_config(cfg)
    assert red["retriever"]["keys"] == [REDACTED, REDACTED]
    assert red["retriever"]["url"] == "https://zhihu.example/search?Count=3&key=***"
    assert red["retriever"]["headers"] == {"Authorization": REDACTED}
    assert red["model"] == {"name": "Qwen/Qwen3.5-4B", "tokenizer": "Qwen/Qwen3.5-4B",
                            "hfToken": REDACTED}
    assert red["rollout"] == cfg["rollout"]
    assert red["engine"] == {"api_key": None, "note": "uses *** for auth", "password": 1234}
    assert red["logger"] == cfg["logger"]
    assert cfg["retriever"]["keys"][0] == "zk-one-11111111"  # input left untouched
    dump = json.dumps(red)
    for secret in [*secret_env, LITERAL]:
        assert secret not in dump


def test_scrub_text_and_overrides(secret_env):
    line = f"GET /search key=zk-one-11111111 Authorization: Bearer {LITERAL} max_tokens=1024"
    assert scrub_text(line) == "GET /search key=*** Authorization: Bearer *** max_tokens=1024"
    overrides = ["advantage=grpo_std", f"+retriever.api_key={LITERAL}",
                 "retriever.url=http://x/?q=trio-33333333", "rollout.max_tokens=512"]
    assert redact_overrides(overrides) == [
        "advantage=grpo_std", "+retriever.api_key=***", "retriever.url=http://x/?q=***",
        "rollout.max_tokens=512"]
    assert argv_has_secret(["main.py", f"+engine.token={LITERAL}"])
    assert not argv_has_secret(["main.py", "rollout.max_tokens=512"])


def test_secret_filter_scrubs_messages_args_and_tracebacks(secret_env):
    logger = logging.getLogger("searchr1.test_secrets")
    records: list[str] = []

    class ListHandler(logging.Handler):
        def emit(self, record):
            records.append(self.format(record))

    handler = ListHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        filt = install_secret_filter(logger)
        install_secret_filter(logger)  # idempotent: one filter per handler
        assert isinstance(filt, SecretFilter) and len(handler.filters) == 1
        logger.warning("key %s rejected (%s)", "zk-two-22222222", f"token={LITERAL}")
        try:
            raise RuntimeError("quota for swl-44444444 exhausted")
        except RuntimeError:
            logger.exception("search failed")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert "key *** rejected (token=***)" in text
    assert "quota for *** exhausted" in text and "RuntimeError" in text
    for secret in [*secret_env, LITERAL]:
        assert secret not in text


def test_no_secret_in_wandb_or_swanlab_files(secret_env, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_cfg"))
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    run_dir = tmp_path / "run"
    info = RunInfo(run_dir=str(run_dir), group_choices={"retriever": "zhihu"},
                   overrides=["retriever=zhihu", f"+model.hfToken={LITERAL}"])
    with build_trackers(["jsonl", "wandb", "swanlab"], info, _config()) as tracker:
        tracker.log({"reward/mean": 0.5}, step=0)
        tracker.summary({"eval/em/macro": 0.25})
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.suffix == ".swanlab" for p in files)
    assert any(p.name == "config.yaml" and "swanlog" in p.parts for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in [*secret_env, LITERAL]:
            assert secret.encode() not in data, f"{secret} leaked into {path}"


# ---- trio login keys, credential keys, .hydra scrubbing, the record scrubber ---------------


def test_keys_saved_by_trio_login_are_secrets(tmp_path, monkeypatch):
    from searchr1.utils.secrets import login_secrets

    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / ".pytrio"
    (root / "envs" / "dev").mkdir(parents=True)
    (root / "config.toml").write_text('api_key = "trio-login-77777777"\n')
    (root / "envs" / "dev" / "config.toml").write_text(
        'api_key = "trio-dev-88888888"\nbase_url = "https://beta.example"\n')
    assert sorted(login_secrets()) == ["trio-dev-88888888", "trio-login-77777777"]
    assert "trio-dev-88888888" in env_secrets()
    assert scrub_text("sent trio-login-77777777") == "sent ***"
    (root / "config.toml").write_text('api_key = "trio-new-99999999"\n')
    os.utime(root / "config.toml", ns=(1, 2))  # a rewrite is re-read (mtime changed)
    assert "trio-new-99999999" in login_secrets()
    (root / "config.toml").write_text("api_key = [broken\n")
    os.utime(root / "config.toml", ns=(3, 4))
    assert login_secrets() == ["trio-dev-88888888"]  # unreadable file: no crash


def test_is_credential_key_is_stricter_than_is_secret_key():
    from searchr1.utils.secrets import is_credential_key

    for name in ("api_key", "apiKey", "hf_token", "client_secret", "password", "api_keys"):
        assert is_credential_key(name), name
    for name in ("keys_env", "max_turn_tokens", "tokenizer", "stop_tokens", "key", "monkey"):
        assert not is_credential_key(name), name
    assert is_secret_key("keys_env")  # the loose matcher still redacts it in logged configs


def test_scrub_hydra_dir_rewrites_only_credentials(tmp_path, secret_env):
    import yaml

    from searchr1.utils.hydra_scrub import scrub_hydra_dir

    (tmp_path / "overrides.yaml").write_text(yaml.safe_dump(
        ["+retriever.api_key=lit-12345678", "rollout.max_turn_tokens=64",
         "retriever.keys_env=pasted-key-999"]))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"retriever": {"api_key": "lit-12345678", "keys_env": "pasted-key-999", "topk": 3},
         "rollout": {"max_turn_tokens": 64}}))
    (tmp_path / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"job": {"override_dirname": "+retriever.api_key=lit-12345678,x=1"}}}))
    changed = scrub_hydra_dir(tmp_path, ["pasted-key-999"])
    assert len(changed) == 3
    assert yaml.safe_load((tmp_path / "overrides.yaml").read_text()) == [
        "+retriever.api_key=***", "rollout.max_turn_tokens=64", "retriever.keys_env=***"]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {
        "retriever": {"api_key": "***", "keys_env": "***", "topk": 3},
        "rollout": {"max_turn_tokens": 64}}
    assert "lit-12345678" not in (tmp_path / "hydra.yaml").read_text()
    assert scrub_hydra_dir(tmp_path, ["pasted-key-999"]) == []  # idempotent


def test_record_scrubber_cleans_records_no_handler_filters(secret_env):
    from searchr1.utils.hydra_scrub import install_record_scrubber

    previous = logging.getLogRecordFactory()  # maybe already the scrubber (searchr1.main installs it)
    try:
        logging.setLogRecordFactory(logging.LogRecord)  # start from logging's own factory
        install_record_scrubber()
        installed = logging.getLogRecordFactory()
        install_record_scrubber()  # idempotent: wraps once
        assert installed is not logging.LogRecord and logging.getLogRecordFactory() is installed
        record = logging.getLogger("hydra.fake").makeRecord(
            "hydra.fake", logging.INFO, __file__, 1, "#0 : %s", ("+retriever.api_key=abc123",),
            None)
        assert record.getMessage() == "#0 : +retriever.api_key=***"
        failed = logging.getLogger("hydra.core.utils").makeRecord(
            "hydra.core.utils", logging.ERROR, __file__, 1,
            "Error executing job with overrides: ['+engine.hf_token=abc123', 'x=zk-one-11111111']",
            None, None)
        assert failed.getMessage() == (
            "Error executing job with overrides: ['+engine.hf_token=***', 'x=***']")
        bad = logging.getLogger("x").makeRecord("x", logging.INFO, __file__, 1, "%d", ("s",), None)
        assert bad.msg == "%d"  # a malformed record is left for logging to report
    finally:
        logging.setLogRecordFactory(previous)


# ---- known values and credential shapes, not words after "key" (free text and configs) ------


def test_prose_after_key_or_token_survives(secret_env):
    for line in ["The key: Paris is the answer", "token: Paris", "the secret: keep it simple",
                 "pad_token=<pad> eos_token: </s> max_tokens=1024", "sort_key=name",
                 "model Qwen2-7B-Instruct-GPTQ-Int4 at /models/HuggingFaceTB_SmolLM2_135M",
                 "commit 9f1c2ab37de04b5e8a61c0d2f3b4a5968e7d1c20 offline-run-20261201_1624-d3"]:
        assert scrub_text(line) == line


def test_known_values_and_credential_shaped_tokens_are_scrubbed(secret_env):
    key = ENV["WANDB_API_KEY"]
    assert scrub_text(f"logged in with {key}.") == "logged in with ***."
    cases = {
        "using sk-proj-Ab12Cd34Ef56Gh78Ij90 now": "using *** now",
        "OPENAI_API_KEY is sk-abc123def456": "OPENAI_API_KEY is ***",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 pushed": "*** pushed",
        "header Authorization: Bearer eyJhbGciOiJI.UzI1NiJ9": "header Authorization: Bearer ***",
        "GET https://h.example/s?q=1&api_key=abc123&n=2": "GET https://h.example/s?q=1&api_key=***&n=2",
        '{"api_key": "abc123", "token": "Paris"}': '{"api_key": "***", "token": "Paris"}',
        "random kF9xQ2mZ7pL4vR8tN3wB6yH1sD5c here": "random *** here",
        "sk-learn-intelex is a package": "sk-learn-intelex is a package",
    }
    for line, scrubbed in cases.items():
        assert scrub_text(line) == scrubbed, line


def test_a_secret_equal_to_a_word_does_not_mangle_tracked_paths(secret_env, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "data")  # a (bad) secret that is an ordinary word
    cfg = {"data": {"path": "/data/nq/train.jsonl", "name": "nq"}, "engine": {"note": "data"},
           "retriever": {"url": "https://z.example/s?q=trio-33333333"}}
    info = RunInfo(run_dir="/runs/data/1", overrides=["data.path=/data/x.jsonl", "seed=1"])
    tracked = info.tracked_config(cfg)
    assert tracked["data"] == cfg["data"]  # a path with the word in it: kept whole
    assert tracked["engine"]["note"] == REDACTED  # a value equal to a secret: replaced
    assert tracked["retriever"]["url"] == "https://z.example/s?q=***"  # a distinctive one inside
    assert tracked["hydra"]["overrides"] == ["data.path=/data/x.jsonl", "seed=1"]
    assert info.name == "data.path=/data/x.jsonl,seed=1"
    assert redact_overrides(["+engine.note=data"]) == ["+engine.note=***"]


def test_env_set_credentials_are_scrubbed_from_hydra_files_and_overrides(tmp_path, secret_env):
    import yaml

    from searchr1.utils.hydra_scrub import scrub_hydra_dir
    from searchr1.utils.secrets import is_credential_env_name

    for name in ("WANDB_API_KEY", "ZHIHU_SEARCH_KEYS", "OPENAI_API_KEY", "DB_PASS", "HF_TOKEN"):
        assert is_credential_env_name(name), name
    for name in ("TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "WANDB_MODE"):
        assert not is_credential_env_name(name), name
    hydra = {"hydra": {
        "overrides": {"hydra": ["hydra.run.dir=/r", "+hydra.job.env_set.WANDB_API_KEY=sk-x",
                                "+hydra.job.env_set.ZHIHU_SEARCH_KEYS=a1,b2",
                                "+hydra.job.env_set.TOKENIZERS_PARALLELISM=false"],
                      "task": ["mode=eval"]},
        "job": {"env_set": {"WANDB_API_KEY": "sk-x", "ZHIHU_SEARCH_KEYS": "a1,b2",
                            "TOKENIZERS_PARALLELISM": "false"}, "env_copy": []}}}
    (tmp_path / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"data": {"path": "/data/x"}}))
    assert scrub_hydra_dir(tmp_path) == [tmp_path / "hydra.yaml"]
    clean = yaml.safe_load((tmp_path / "hydra.yaml").read_text())["hydra"]
    assert clean["job"]["env_set"] == {"WANDB_API_KEY": REDACTED, "ZHIHU_SEARCH_KEYS": REDACTED,
                                       "TOKENIZERS_PARALLELISM": "false"}
    assert clean["overrides"]["hydra"] == [
        "hydra.run.dir=/r", "+hydra.job.env_set.WANDB_API_KEY=***",
        "+hydra.job.env_set.ZHIHU_SEARCH_KEYS=***", "+hydra.job.env_set.TOKENIZERS_PARALLELISM=false"]
    assert redact_overrides(["+hydra.job.env_set.DB_PASS=hunter2"]) == [
        "+hydra.job.env_set.DB_PASS=***"]
    assert argv_has_secret(["main.py", "+hydra.job.env_set.WANDB_API_KEY=sk-x"])


# ---- through python -m searchr1.main: a key given as hydra.job.env_set ---------------------


def _main(args: list[str], env: dict) -> "subprocess.CompletedProcess":
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    return subprocess.run([sys.executable, "-m", "searchr1.main", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)


def _leaks(folder, secrets: list[str]) -> list[str]:
    return [f"{secret} in {path}" for path in folder.rglob("*") if path.is_file()
            for secret in secrets if secret.encode() in path.read_bytes()]


def _clean_env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (
        "WANDB_API_KEY", "PYTRIO_API_KEY", "TRIO_API_KEY", "SWANLAB_API_KEY", "HF_TOKEN")}
    return {**env, "HOME": str(tmp_path / "home"), "WANDB_MODE": "offline",
            "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "wandb_cfg")}


def test_env_set_secret_never_lands_in_the_run_dir_of_an_eval_run(tmp_path):
    """``M +hydra.job.env_set.WANDB_API_KEY=…`` with wandb (offline): Hydra writes the key
    into .hydra/hydra.yaml before our code runs; the job scrubs it at start-up, and neither
    the tracker's files nor the logs get it."""
    import uuid

    wandb_key = f"sk-envset-{uuid.uuid4().hex}"
    other = f"hunter-{uuid.uuid4().hex[:12]}"
    run = tmp_path / "run"
    out = _main([f"hydra.run.dir={run}", "mode=eval", "logger=wandb", "eval.max_questions=1",
                 "rollout.max_turns=1", "rollout.max_turn_tokens=8",
                 f"+hydra.job.env_set.WANDB_API_KEY={wandb_key}",
                 f"+hydra.job.env_set.MY_SERVICE_TOKEN={other}"], _clean_env(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run / "summary.json").is_file() and any((run / "wandb").rglob("*.wandb"))
    hydra_yaml = (run / ".hydra" / "hydra.yaml").read_text()
    assert "WANDB_API_KEY: '***'" in hydra_yaml and "MY_SERVICE_TOKEN: '***'" in hydra_yaml
    assert _leaks(run, [wandb_key, other]) == []
    assert wandb_key not in out.stdout + out.stderr


def test_env_set_secret_is_scrubbed_from_a_refused_multirun(tmp_path):
    """A run refused at start-up (exit 2) is scrubbed too, the sweep's multirun.yaml included."""
    import uuid

    key = f"sk-envset-{uuid.uuid4().hex}"
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)  # a file of the user's keeps the refused job's dir
    (sweep / "0" / "notes.txt").write_text("kept\n")
    out = _main(["-m", f"hydra.sweep.dir={sweep}", "mode=eval", "trainer.resume=/no/such/ckpt",
                 f"+hydra.job.env_set.WANDB_API_KEY={key}"], _clean_env(tmp_path))
    assert out.returncode == 2, out.stderr[-3000:]
    assert (sweep / "multirun.yaml").is_file() and (sweep / "0" / ".hydra" / "hydra.yaml").is_file()
    assert _leaks(sweep, [key]) == []
