"""Every user mistake is one paragraph, exit code 2, before the model loads; credentials given
as overrides are refused and never reach ``.hydra/``, stderr or any run file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from searchr1.config import register_configs
from searchr1.startup.checks import check_config

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def run_main(args: list[str], tmp_path: Path, env: dict | None = None):
    """``python -m searchr1.main`` with a model cache that must stay untouched."""
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags must precede overrides
    cmd = [sys.executable, "-m", "searchr1.main", *flags,
           f"engine.cache_dir={tmp_path / 'model_cache'}", *(a for a in args if a not in flags)]
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    return out, time.monotonic() - start


def assert_refused_before_work(out, seconds: float, tmp_path: Path) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Error executing job" not in out.stderr
    assert not (tmp_path / "model_cache").exists()  # the model was never loaded
    assert seconds < 120
    assert out.stderr.count("searchr1: cannot start this run:") == 1


def _compose(overrides: list[str]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


BAD_NUMBERS = {
    "rollout.max_searches=-1": "rollout.max_searches=-1 must be >= 0",
    "rollout.max_turn_tokens=0": "rollout.max_turn_tokens=0 must be > 0",
    "rollout.temperature=-1": "rollout.temperature=-1.0 must be >= 0",
    "rollout.top_p=1.5": "rollout.top_p=1.5 must be in (0, 1]",
    "trainer.steps=-1": "trainer.steps=-1 must be >= 0",
    "trainer.questions_per_step=0": "trainer.questions_per_step=0 must be >= 1",
    "rollout.group_size=0": "rollout.group_size=0 must be >= 1",
    "retriever.topk=0": "retriever.topk=0 must be >= 1",
    "rollout.max_trajectory_tokens=10": "rollout.max_trajectory_tokens=10 leaves no room",
    "eval.max_questions=-1": "eval.max_questions=-1 must be null",
    "eval.split=validation": "eval.split='validation' is unknown (valid: train, dev, test)",
    "trainer.resume=/nonexistent/ckpt": "trainer.resume=/nonexistent/ckpt: no such checkpoint",
    "trainer.breaker.window=0": "trainer.breaker.window=0 must be >= 1",
    "engine.memory_fraction=1.5": "engine.memory_fraction=1.5 must be in (0, 1]",
    "engine.prefix_cache_tokens=-1": "engine.prefix_cache_tokens=-1 must be >= 0",
    "critic.max_tokens_per_pass=0": "critic.max_tokens_per_pass=0 must be >= 1",
    "model.lora_rank=0": "model.lora_rank=0 must be >= 1",
    "model.dtype=int4": "model.dtype='int4' is unknown (valid: auto, float32, bfloat16, float16)",
}


def test_every_bad_number_is_listed_at_once_before_the_model_loads(tmp_path):
    out, seconds = run_main([f"hydra.run.dir={tmp_path / 'run'}", *BAD_NUMBERS], tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    for message in BAD_NUMBERS.values():
        assert message in out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_data_files_are_checked_for_existence_emptiness_and_json(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    (tmp_path / "bad.jsonl").write_text("id,question\n1,what\n")
    (tmp_path / "ok.jsonl").write_text('{"id": "1", "contents": "\\"T\\"\\ntext"}\n')
    cfg = _compose(["data=lab_jsonl", f"data.train_path={tmp_path / 'missing.jsonl'}",
                    f"data.dev_path={tmp_path / 'empty.jsonl'}",
                    f"data.test_path={tmp_path / 'blank.jsonl'}",
                    f"data.corpus_path={tmp_path / 'bad.jsonl'}"])
    problems = check_config(cfg).problems
    assert any("data.train_path=" in p and "no such file" in p for p in problems)
    assert any("data.dev_path=" in p and "the file is empty" in p for p in problems)
    assert any("data.test_path=" in p and "has no rows" in p for p in problems)
    assert any("data.corpus_path=" in p and "not JSON" in p for p in problems)
    ok = _compose(["data=lab_jsonl", *(f"data.{k}={tmp_path / 'ok.jsonl'}"
                                       for k in ("train_path", "dev_path", "corpus_path"))])
    assert check_config(ok).problems == []
    missing = _compose(["data=lab_jsonl"])
    assert "data.train_path is required (data=lab_jsonl)" in check_config(missing).problems


def test_bm25_over_a_data_set_without_corpus_names_retriever_corpus_path(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    (tmp_path / "c.jsonl").write_text('{"id": "1", "contents": "\\"T\\"\\ntext"}\n')
    files = [f"data.{k}={tmp_path / 'q.jsonl'}" for k in ("train_path", "dev_path")]
    bare = [p for p in check_config(_compose(["data=lab_jsonl", *files])).problems if "bm25" in p]
    assert len(bare) == 1 and "retriever.corpus_path=" in bare[0] and "data.corpus_path=" in bare[0]
    for corpus in (f"data.corpus_path={tmp_path / 'c.jsonl'}",
                   f"retriever.corpus_path={tmp_path / 'c.jsonl'}"):
        assert check_config(_compose(["data=lab_jsonl", *files, corpus])).problems == []
    remote = _compose(["data=lab_jsonl", *files, "retriever=http"])  # remote search needs no corpus
    assert not any("ships no corpus" in p for p in check_config(remote).problems)
    nq = check_config(_compose(["data=nq_hotpotqa"])).problems
    assert any(p.startswith("retriever=bm25 with data=nq_hotpotqa needs retriever.corpus_path=")
               for p in nq)


def test_default_config_has_no_problem_and_split_sizes_are_checked(tmp_path):
    assert check_config(_compose([]), tmp_path / "run").problems == []
    problems = check_config(_compose(["data.dev_questions=0", "data.train_questions=0"])).problems
    assert any("data.dev_questions=0" in p and "eval split" in p for p in problems)
    assert any("data.train_questions=0" in p for p in problems)
    assert check_config(_compose(["data.train_questions=0", "trainer.steps=0"])).problems == []


BAD_BREAKER = {
    "trainer.breaker.window=0": "trainer.breaker.window=0 must be >= 1",
    "trainer.breaker.threshold=0": "trainer.breaker.threshold=0.0 must be in (0, 1]",
    "trainer.breaker.threshold=1.5": "trainer.breaker.threshold=1.5 must be in (0, 1]",
    "trainer.breaker.grace_steps=-1": "trainer.breaker.grace_steps=-1 must be >= 0",
    "trainer.breaker.backoff_s=-0.5": "trainer.breaker.backoff_s=-0.5 must be >= 0",
}


@pytest.mark.parametrize("override", list(BAD_BREAKER))
def test_circuit_breaker_settings_are_range_checked(override):
    assert BAD_BREAKER[override] in check_config(_compose([override])).problems


def test_circuit_breaker_edges_are_accepted():
    edges = ["trainer.breaker.window=1", "trainer.breaker.threshold=1.0",
             "trainer.breaker.grace_steps=0", "trainer.breaker.backoff_s=0"]
    assert not any("breaker" in p for p in check_config(_compose(edges)).problems)


def test_unwritable_folder_is_reported(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    problems = check_config(_compose([]), blocker / "run").problems
    assert f"run directory {blocker / 'run'} cannot be created: {blocker} is a file, not a folder" \
        in problems


def test_a_run_dir_below_a_file_is_one_paragraph_before_hydra(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out, seconds = run_main([f"hydra.run.dir={blocker}/deeper/run"], tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    assert f"hydra.run.dir {blocker}/deeper/run cannot be created: {blocker} is a file" in out.stderr
    assert out.stderr.strip().count("\n") == 0 and blocker.read_text() == "not a folder"


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (unwritable as root)")
def test_an_unwritable_sweep_dir_is_one_paragraph_before_hydra(tmp_path):
    out, seconds = run_main(["-m", "hydra.sweep.dir=/proc/searchr1-no/sweep"], tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    assert "hydra.sweep.dir /proc/searchr1-no/sweep is not writable" in out.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_run_dir_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    out, seconds = run_main([f"hydra.run.dir={folder}/run"], tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    assert f"hydra.run.dir {folder}/run is not writable" in out.stderr


def test_finished_run_dir_refuses_unless_resume_auto(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    out, seconds = run_main([f"hydra.run.dir={run}"], tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    assert "holds a finished run" in out.stderr and "trainer.resume=auto" in out.stderr
    assert check_config(_compose(["trainer.resume=auto"]), run).problems == []


CANARIES = {"api": "canary-API-7f3a9c", "token": "canary-TOK-1b2c3d", "keys": "canaryKEY8e7d6c"}


def _no_canary_anywhere(folder: Path, *texts: str) -> None:
    for text in texts:
        for canary in CANARIES.values():
            assert canary not in text
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for canary in CANARIES.values():
                assert canary.encode() not in data, f"{canary} leaked into {path}"


def test_credentials_as_overrides_are_refused_and_scrubbed(tmp_path):
    """Refused from the command line before Hydra runs (``startup/override_guard.py``): no
    run dir, so no ``.hydra/`` file ever held them."""
    run = tmp_path / "run"
    args = [f"hydra.run.dir={run}", "retriever=zhihu",
            f"+retriever.api_key={CANARIES['api']}", f"+engine.hf_token={CANARIES['token']}",
            f"retriever.keys_env={CANARIES['keys']}", "rollout.max_turn_tokens=64"]
    out, seconds = run_main(args, tmp_path, env={"ZHIHU_SEARCH_KEYS": ""})
    assert_refused_before_work(out, seconds, tmp_path)
    assert "retriever.api_key holds a credential" in out.stderr
    assert "engine.hf_token holds a credential" in out.stderr and "HF_TOKEN" in out.stderr
    assert "retriever.keys_env must be the NAME of an environment variable" in out.stderr
    _no_canary_anywhere(run, out.stdout, out.stderr)
    assert not run.exists()


def test_multirun_credentials_never_reach_logs_or_the_sweep_dir(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", f"hydra.sweep.dir={sweep}", f"+retriever.api_key={CANARIES['api']}",
            "rollout.group_size=2"]
    out, seconds = run_main(args, tmp_path)
    assert_refused_before_work(out, seconds, tmp_path)
    assert "retriever.api_key holds a credential" in out.stderr
    _no_canary_anywhere(sweep, out.stdout, out.stderr)
    assert not sweep.exists()  # refused before Hydra: no multirun.yaml, no "#0 : …" line


@pytest.mark.parametrize("key,refused", [
    ("api_key", True), ("hf_token", True), ("client_secret", True), ("apiKey", True),
    ("max_turn_tokens", False), ("tokenizer", False), ("keys_env", False), ("stop_tokens", False),
])
def test_only_credential_key_names_with_string_values_are_refused(key, refused):
    cfg = _compose([f"+model.extra.{key}=some-value-123", "+model.extra.numeric_token=5"])
    problems = check_config(cfg).problems
    assert any(f"model.extra.{key} holds a credential" in p for p in problems) is refused
    assert not any("numeric_token" in p for p in problems)  # a number is not a credential


def _all_options() -> list[str]:
    skip = {"local", "hydra", "sweep"}
    return [f"{g.name}={o.stem}" for g in sorted(CONF.iterdir()) if g.is_dir() and g.name not in skip
            for o in sorted(g.glob("*.yaml")) if f"{g.name}={o.stem}" != "data=lab_jsonl"]


NEEDS_CORPUS = ("data=nq_hotpotqa", "experiment=paper_grpo", "experiment=paper_grpo_format",
                "experiment=paper_ppo")  # NQ/HotpotQA ship no corpus: the user points to wiki-18


def test_every_shipped_option_passes_validation(tmp_path):
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"T\\"\\ntext"}\n')
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        bad = {o: check_config(compose(config_name="config", overrides=[o] + (
                   [f"retriever.corpus_path={corpus}"] if o in NEEDS_CORPUS else []))).problems
               for o in _all_options()}
    assert {o: p for o, p in bad.items() if p} == {}
    assert "experiment=lab" in bad and "retriever=bm25" in bad


def test_closed_string_choices_and_the_lab_answer_rule_are_checked():
    cfg = _compose(["reward.answer_rule=lab", "reward.normalize=latin", "eval.selection=random",
                    "trainer.data_order=shuffled", "eval.per_source=0", "advantage.name=gae"])
    problems = "\n".join(check_config(cfg).problems)
    assert "advantage.name='gae' is unknown (valid: group_mean, grpo_std, ppo_gae)" in problems
    assert "reward.normalize='latin' is unknown (valid: ascii, unicode, lab)" in problems
    assert "eval.selection='random' is unknown" in problems
    assert "trainer.data_order='shuffled' is unknown" in problems
    assert "eval.per_source=0 must be null" in problems
    assert "reward.answer_rule=lab" in problems and "protocol=tool_call" in problems
    ok = _compose(["reward.answer_rule=lab", "protocol=tool_call"])
    assert not any("answer_rule" in p for p in check_config(ok).problems)


def test_scripted_policy_needs_the_tag_protocol():
    message = "rollout.scripted_policy writes <search>/<answer> tags: it needs protocol=tags"
    scripted = "rollout.scripted_policy=search_until_budget"
    assert message in check_config(_compose([scripted, "protocol=tool_call"])).problems
    assert message not in check_config(_compose([scripted, "protocol=tags"])).problems
