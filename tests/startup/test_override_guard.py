"""A credential on the command line is refused (exit 2) before Hydra sees it, and the message
never holds its value; ordinary command lines pass."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from searchr1.startup.override_guard import overrides, secret_override_problems

ROOT = Path(__file__).resolve().parents[2]
WANDB_KEY = "0123456789abcdef0123456789abcdef0badc0de"
ENV = {"WANDB_API_KEY": WANDB_KEY, "ZHIHU_SEARCH_KEYS": "zk-one-1111,zk-two-2222",
       "HF_TOKEN": "hfvalue"}


@pytest.mark.parametrize("arg,says", [
    ("wandb.api_key=abc", "wandb.api_key holds a credential: set WANDB_API_KEY"),
    ("+engine.hf_token=abc", "engine.hf_token holds a credential: set HF_TOKEN"),
    ("+retriever.password=abc", "retriever.password holds a credential"),
    ("+retriever.search_keys=[a,b]", "retriever.search_keys holds a credential"),
    ("++model.clientSecret=abc", "model.clientSecret holds a credential"),
    ("retriever.keys_env=zk-pasted-123", "retriever.keys_env must be the NAME"),
    (f"wandb.project={WANDB_KEY}", "value of WANDB_API_KEY in the environment"),
    ("wandb.entity=zk-two-2222", "value of ZHIHU_SEARCH_KEYS in the environment"),
    ("wandb.entity=hfvalue", "value of HF_TOKEN in the environment"),
    (f"+wandb.tags=[a,{WANDB_KEY}]", "value of WANDB_API_KEY"),
    (f"data.path=/data/{WANDB_KEY}/x.jsonl", "value of WANDB_API_KEY"),
    ("seed=1,zk-one-1111", "value of ZHIHU_SEARCH_KEYS"),
    ("retriever.url=http://h/s?api_key=ab12cd34", "looks like a credential"),
    ("wandb.project=sk-proj-Ab12Cd34Ef56Gh78Ij90", "looks like a credential"),
])
def test_overrides_carrying_a_credential_are_named_without_their_value(arg, says):
    (problem,) = secret_override_problems(["experiment=smoke", arg], ENV)
    assert says in problem
    value = arg.partition("=")[2]
    for secret in (value, WANDB_KEY, "zk-two-2222", "hfvalue", "ab12cd34"):
        if secret in value:
            assert secret not in problem


def test_a_key_given_to_env_set_counts_as_a_secret_for_the_other_overrides():
    argv = ["+hydra.job.env_set.MY_SERVICE_TOKEN=svc-77aa88bb", "wandb.project=svc-77aa88bb"]
    (problem,) = secret_override_problems(argv, {})
    assert "wandb.project=…" in problem and "hydra.job.env_set.MY_SERVICE_TOKEN" in problem
    assert "svc-77aa88bb" not in problem


@pytest.mark.parametrize("argv", [
    ["experiment=smoke", "rollout.max_turn_tokens=64", "trainer.resume=auto"],
    ["-m", "hydra.sweep.dir=/tmp/s", "seed=1,2,3", "advantage=grpo_std,group_mean"],
    ["retriever=zhihu", "retriever.keys_env=MY_ZHIHU_KEYS", "+hydra.job.env_set.HF_HOME=/x"],
    [f"+hydra.job.env_set.WANDB_API_KEY={WANDB_KEY}", "logger=wandb", "wandb.project=searchr1"],
    ["--cfg", "job", "-cd", "/tmp/conf=x", "data.path=/data/nq/train.jsonl", "~wandb.entity"],
    ["model.path=/models/Qwen2.5-3B-Instruct-GPTQ-Int4", "data.path=/data/hfvalue_dir/x.jsonl"],
])
def test_ordinary_command_lines_pass(argv):
    assert secret_override_problems(argv, ENV) == []


def test_overrides_skip_flags_and_their_values():
    assert overrides(["-m", "--cfg", "job", "-cn", "config", "a=1", "--info", "b=2"]) == \
        ["a=1", "b=2"]


# ---- through python -m searchr1.main ---------------------------------------------------------


def _main(args: list[str], env: dict) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "searchr1.main", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    return out, time.monotonic() - start


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "HF_TOKEN")}
    return {**env, "HOME": str(tmp_path / "home"), **extra}


def test_a_key_typed_as_an_override_exits_2_before_hydra_and_is_never_echoed(tmp_path):
    """The issue's case: ``experiment=smoke wandb.api_key=<key>`` (Hydra said exit 1 and
    printed ``To append to your config use +wandb.api_key=<key>``)."""
    key = f"wk-{uuid.uuid4().hex}"
    run = tmp_path / "run"
    out, seconds = _main(["experiment=smoke", f"wandb.api_key={key}", f"hydra.run.dir={run}"],
                         _env(tmp_path))
    assert out.returncode == 2, out.stderr[-2000:]
    assert key not in out.stdout + out.stderr
    assert "wandb.api_key holds a credential: set WANDB_API_KEY" in out.stderr
    assert "Traceback" not in out.stderr and "To append" not in out.stderr
    assert not run.exists()  # Hydra never ran: no .hydra/ holding the key
    assert seconds < 60


def test_the_environment_s_key_copied_into_another_setting_exits_2(tmp_path):
    key = f"wk-{uuid.uuid4().hex}"
    run = tmp_path / "run"
    out, _ = _main([f"wandb.project={key}", "trainer.resume=/no/such/checkpoint",
                    f"hydra.run.dir={run}"], _env(tmp_path, WANDB_API_KEY=key))
    assert out.returncode == 2, out.stderr[-2000:]
    assert key not in out.stdout + out.stderr and not run.exists()
    assert "wandb.project=…: its value is a credential (the value of WANDB_API_KEY" in out.stderr
