"""Every known secret is scrubbed from Hydra's ``.hydra/*.yaml``, wherever it was copied:
the environment's (even once ``env_set`` replaced it for the job) and every ``env_set`` one."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from searchr1.utils import secrets
from searchr1.utils.hydra_scrub import scrub_hydra_dir

ROOT = Path(__file__).resolve().parents[2]


def _leaks(folder: Path, values: list[str]) -> list[str]:
    return [f"{value} in {path}" for path in folder.rglob("*") if path.is_file()
            for value in values if value.encode() in path.read_bytes()]


def test_a_real_key_copied_into_other_fields_never_reaches_the_hydra_dumps(tmp_path):
    """WANDB_API_KEY=A in the environment, the job's replaced by env_set (B), A copied into
    ``wandb.project`` and a custom credential C (``MY_SERVICE_TOKEN``) into ``wandb.entity``
    by a config file (the command line would be refused). The run is refused after Hydra
    wrote ``.hydra/`` (a missing checkpoint): A, B and C must be in none of its files."""
    a, b, c = (f"{tag}-{uuid.uuid4().hex}" for tag in ("real", "jobkey", "svc"))
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "copied.yaml").write_text(f"# @package _global_\nwandb:\n  project: {a}\n"
                                      f"  entity: {c}\n")
    run = tmp_path / "run"
    run.mkdir()  # a file of the user's keeps the refused run's dir (an empty one is removed)
    (run / "notes.txt").write_text("kept\n")
    env = {**{k: v for k, v in os.environ.items() if k != "HF_TOKEN"},
           "WANDB_API_KEY": a, "HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-m", "searchr1.main", "--config-dir", str(tmp_path / "conf"),
         "experiment=copied", f"+hydra.job.env_set.WANDB_API_KEY={b}",
         f"+hydra.job.env_set.MY_SERVICE_TOKEN={c}", "trainer.resume=/no/such/checkpoint",
         f"hydra.run.dir={run}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert (run / ".hydra" / "config.yaml").is_file()
    assert _leaks(run, [a, b, c]) == []
    config = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert config["wandb"] == {"project": "***", "entity": "***", "mode": "offline"}
    assert all(v not in out.stdout + out.stderr for v in (a, b, c))


def test_env_set_values_and_startup_secrets_are_known_to_the_scrub(tmp_path, monkeypatch):
    monkeypatch.setattr(secrets, "_STARTUP", set())
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_API_KEY", "original-key-1234")
    secrets.remember_environment_secrets()
    monkeypatch.setenv("WANDB_API_KEY", "job-key-5678")  # what env_set does for the job
    (tmp_path / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {
        "env_set": {"MY_SERVICE_TOKEN": "svc-token-90ab", "TOKENIZERS_PARALLELISM": "false"},
        "override_dirname": "wandb.project=original-key-1234,x=svc-token-90ab"}}}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "wandb": {"project": "original-key-1234", "entity": "svc-token-90ab"},
        "tags": {"svc-token-90ab": 1}, "data": {"path": "/data/false/x"}}))
    scrub_hydra_dir(tmp_path)
    text = "".join(p.read_text() for p in tmp_path.glob("*.yaml"))
    assert "original-key-1234" not in text and "svc-token-90ab" not in text
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {
        "wandb": {"project": "***", "entity": "***"}, "tags": {"***": 1},
        "data": {"path": "/data/false/x"}}  # a non-credential env_set value is left alone
