"""Trackers: local files, fan-out and finishing, and real wandb/swanlab runs of a 2×2 sweep.

The backend tests launch a real ``@hydra.main`` app in multirun mode (a subprocess, as a
user would) with wandb in offline mode and swanlab writing locally, then read back what
the SDKs wrote to disk: wandb's ``.wandb`` transaction log (a LevelDB-style record log of
protobufs) and swanlab's run store and ``files/config.yaml``.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from searchr1.trackers import base as tracker_base
from searchr1.trackers.console import ConsoleTracker
from searchr1.trackers.jsonl import JsonlTracker
from searchr1.trackers.wandb import wandb_init_kwargs
from searchr1.trackers.session import (
    TRACKERS,
    MultiTracker,
    RunInfo,
    Tracker,
    WandbConfig,
    build_trackers,
    open_trackers,
    tracker_names,
)

SECRETS = {
    "ZHIHU_SEARCH_KEYS": "zhk-AAAA1111secret,zhk-BBBB2222secret",
    "WANDB_API_KEY": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4",
    "PYTRIO_API_KEY": "trio-DDDD4444secret",
}
CONFIG_SECRET = "cfg-EEEE5555secret"
CLI_SECRET = "cli-FFFF6666secret"
ALL_SECRETS = [*SECRETS["ZHIHU_SEARCH_KEYS"].split(","), SECRETS["WANDB_API_KEY"],
               SECRETS["PYTRIO_API_KEY"], CONFIG_SECRET, CLI_SECRET]


# ---------------------------------------------------------------- local trackers, fan-out


def test_jsonl_tracker_flushes_each_line_and_merges_summary(tmp_path):
    tracker = JsonlTracker(tmp_path)
    tracker.log({"reward/mean": 0.25, "rollout/search_calls": 2}, step=0)
    tracker.log({"eval/em/macro": float("nan")}, step=1)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # before finish: flushed
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "reward/mean": 0.25, "rollout/search_calls": 2},
        {"step": 1, "eval/em/macro": None},
    ]
    tracker.summary({"eval/em/macro": 0.3, "steps": 2})
    tracker.summary({"wall_seconds": 1.5})
    tracker.finish()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"eval/em/macro": 0.3, "steps": 2, "wall_seconds": 1.5}


def test_console_tracker_prints_only_summary_and_failure(capsys):
    tracker = ConsoleTracker(title="advantage=grpo_std")
    for step in range(3):
        tracker.log({"reward/mean": 0.1 * step, "other": 1.0}, step=step)
    assert capsys.readouterr().out == ""
    tracker.summary({"eval/em/macro": 0.31426, "steps": 3})
    tracker.finish(exit_code=1)
    out = capsys.readouterr().out
    assert out.startswith("summary of advantage=grpo_std:\n")
    assert "eval/em/macro  0.3143" in out and "steps          3" in out
    assert "failed (exit code 1)" in out


class _Recorder(Tracker):
    """A fake tracker that records calls, optionally failing in ``finish``."""

    def __init__(self, fail_finish: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_finish = fail_finish

    def log(self, metrics, step):
        self.calls.append(("log", dict(metrics), step))

    def summary(self, metrics):
        self.calls.append(("summary", dict(metrics)))

    def finish(self, exit_code=0, reason=None):
        self.calls.append(("finish", exit_code))
        if self.fail_finish:
            raise RuntimeError("finish failed")


def test_multitracker_fans_out_and_finishes_every_tracker_once():
    first, second = _Recorder(fail_finish=True), _Recorder()
    multi = MultiTracker([first, second])
    multi.log({"a": 1.0}, step=3)
    multi.summary({"b": 2.0})
    with pytest.raises(RuntimeError, match="finish failed"):
        multi.finish(exit_code=0)
    multi.finish(exit_code=0)  # idempotent
    for rec in (first, second):
        assert rec.calls == [("log", {"a": 1.0}, 3), ("summary", {"b": 2.0}), ("finish", 0)]


def test_tracker_names_from_either_logger_shape():
    assert tracker_names({"trackers": ["console", "jsonl", "wandb"]}) == ["jsonl", "console", "wandb"]
    assert tracker_names({"console": False, "wandb": True, "swanlab": True}) == [
        "jsonl", "wandb", "swanlab"]
    assert tracker_names(None) == ["jsonl"]


def test_failed_block_finishes_trackers_with_exit_code_1(monkeypatch, tmp_path):
    made: list[_Recorder] = []

    class Fake(_Recorder):
        @classmethod
        def create(cls, run_info, cfg_dict, options):
            made.append(cls())
            made[-1].options = options
            return made[-1]

    monkeypatch.setitem(TRACKERS._items, "fake", Fake)
    info = RunInfo(run_dir=str(tmp_path))
    with pytest.raises(ValueError, match="boom"), \
            build_trackers(["fake", "jsonl", "fake"], info, {}, None) as tracker:
        tracker.log({"x": 1.0}, step=0)
        raise ValueError("boom")
    assert len(made) == 1 and made[0].calls[-1] == ("finish", 1)
    cfg = {"logger": {"trackers": ["fake"]}, "fake": {"project": "p"}}
    with pytest.raises(KeyError), open_trackers(cfg, tmp_path / "run") as tracker:
        raise KeyError("lost")
    assert made[1].calls == [("finish", 1)]
    with open_trackers(cfg, tmp_path / "run") as tracker:
        tracker.summary({"eval/em/macro": 0.5})
    assert made[2].calls == [("summary", {"eval/em/macro": 0.5}), ("finish", 0)]
    assert (tmp_path / "run" / "summary.json").is_file()  # jsonl always runs


def test_a_failing_finish_does_not_mask_the_run_error():
    with pytest.raises(ValueError, match="the real error"), \
            MultiTracker([_Recorder(fail_finish=True)]):
        raise ValueError("the real error")
    with pytest.raises(RuntimeError, match="finish failed"), \
            MultiTracker([_Recorder(fail_finish=True)]):
        pass


def test_build_trackers_closes_started_ones_when_a_later_one_fails(monkeypatch, tmp_path):
    started = _Recorder()

    class Good(_Recorder):
        @classmethod
        def create(cls, run_info, cfg_dict, options):
            return started

    class Bad(_Recorder):
        @classmethod
        def create(cls, run_info, cfg_dict, options):
            raise ConnectionError("backend down")

    monkeypatch.setitem(TRACKERS._items, "good", Good)
    monkeypatch.setitem(TRACKERS._items, "bad", Bad)
    with pytest.raises(ConnectionError):
        build_trackers(["good", "bad"], RunInfo(run_dir=str(tmp_path)), {}, {})
    assert started.calls == [("finish", 1)]
    with pytest.raises(KeyError, match="valid: .*console"):
        build_trackers(["nope"], RunInfo(run_dir=str(tmp_path)), {}, {})


# ---------------------------------------------------------------- run identity, payloads


def test_run_info_names_group_tags_and_redacts():
    info = RunInfo(
        run_dir="/x/multirun/2026-11-29/20-05-17/3",
        sweep_dir="/x/multirun/2026-11-29/20-05-17",
        experiment=None,
        group_choices={"advantage": "grpo_std", "retriever": "bm25", "hydra/launcher": "basic"},
        overrides=["advantage=grpo_std", "rollout.group_size=4", f"+retriever.api_key={CLI_SECRET}"],
    )
    assert info.group == "2026-11-29_20-05-17"
    assert info.job_type == "custom"
    assert info.tags == ["advantage=grpo_std", "retriever=bm25"]
    assert info.name == "advantage=grpo_std,rollout.group_size=4,+retriever.api_key=***"
    assert RunInfo(run_dir="/o/run7", sweep_dir="/o/sweepA").group == "sweepA"
    assert RunInfo(run_dir="/o/run7").name == "run7" and RunInfo(run_dir="/o/r").group is None


def test_wandb_payload_mode_precedence_and_redacted_config(tmp_path):
    info = RunInfo(run_dir=str(tmp_path), experiment="lab", group_choices={"experiment": "lab"},
                   overrides=["experiment=lab"])
    cfg = {"retriever": {"api_key": CONFIG_SECRET, "topk": 3}, "rollout": {"max_tokens": 1024}}
    opts = WandbConfig(project="p", mode="online")
    kwargs = wandb_init_kwargs(info, cfg, opts, environ={"WANDB_MODE": "disabled"})
    assert kwargs["mode"] == "disabled"
    assert wandb_init_kwargs(info, cfg, opts, environ={})["mode"] == "online"
    assert kwargs["job_type"] == "lab" and kwargs["group"] is None and kwargs["dir"] == str(tmp_path)
    assert kwargs["config"]["retriever"] == {"api_key": "***", "topk": 3}
    assert kwargs["config"]["rollout"] == {"max_tokens": 1024}
    assert kwargs["config"]["hydra"]["overrides"] == ["experiment=lab"]
    with pytest.raises(ValueError, match="valid: online, offline, disabled"):
        wandb_init_kwargs(info, cfg, WandbConfig(mode="cloud"), environ={})


def test_resolve_mode_aliases():
    assert tracker_base.resolve_mode("x", "dryrun", None, ("offline",), {"dryrun": "offline"}) == "offline"


# ---------------------------------------------------------------- real backends, 2×2 sweep

APP = '''
import hydra
from searchr1.utils.secrets import install_secret_filter
from searchr1.trackers.session import open_trackers

@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    install_secret_filter()
    with open_trackers(cfg) as tracker:
        for step in range(3):
            tracker.log({"reward/mean": 0.1 * step + cfg.rollout.group_size}, step=step)
        tracker.summary({"eval/em/macro": 0.5, "steps": 3})
        if cfg.fail:
            raise RuntimeError("job failed on purpose")

main()
'''

CONF = {
    "config.yaml": """
        defaults:
          - advantage: group_mean
          - retriever: bm25
          - logger: all
          - experiment: null
          - _self_
        fail: false
        wandb: {project: searchr1-test, entity: null, mode: online}
        swanlab: {project: searchr1-test, mode: local}
        rollout:
          group_size: 2
          max_tokens: 500
        """,
    "advantage/group_mean.yaml": "name: group_mean\n",
    "advantage/grpo_std.yaml": "name: grpo_std\neps: 1.0e-6\n",
    "retriever/bm25.yaml": f"""
        topk: 3
        api_key: ${{oc.env:ZHIHU_SEARCH_KEYS}}
        endpoint: https://search.example/api?auth=${{oc.env:PYTRIO_API_KEY}}
        token: {CONFIG_SECRET}
        """,
    "logger/all.yaml": """
        console: true
        wandb: true
        swanlab: true
        """,
    "experiment/smoke.yaml": "# @package _global_\nrollout:\n  group_size: 3\n",
}


def _write_app(root: Path) -> Path:
    for rel, text in CONF.items():
        path = root / "conf" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    (root / "app.py").write_text(APP)
    return root / "app.py"


def _run_app(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **SECRETS, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(root / "wandb_cfg"), "WANDB_CACHE_DIR": str(root / "wandb_cache"),
           "WANDB_DATA_DIR": str(root / "wandb_data")}
    env.pop("SWANLAB_MODE", None)
    return subprocess.run([sys.executable, str(root / "app.py"), *args], cwd=root, env=env, check=False,
                          capture_output=True, text=True, timeout=300)


def _wandb_records(run_dir: Path) -> list[dict]:
    """Decode the offline ``.wandb`` log: 7-byte header, 32 KiB blocks of CRC-framed chunks."""
    from google.protobuf.json_format import MessageToDict
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(MessageToDict(record))
    return records


def _swanlab_records(run_dir: Path) -> list[dict]:
    from google.protobuf.json_format import MessageToDict
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(str(run_dir / "swanlog" / "run-*" / "*.swanlab"))
    reader = DataStoreReader()
    reader.open(path)
    out = []
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        out.append(MessageToDict(record))
    reader.close()
    return out


def _assert_no_secrets(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in ALL_SECRETS:
                assert secret.encode() not in data, f"{secret} leaked into {path}"


def _kind(records: list[dict], kind: str) -> list[dict]:
    return [r[kind] for r in records if kind in r]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("hydra_app")
    _write_app(root)
    sweep_dir = root / "multirun" / "sweep_2x2"
    proc = _run_app(root, "-m", "advantage=group_mean,grpo_std", "rollout.group_size=2,4",
                    f"+retriever.password={CLI_SECRET}", f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, sweep_dir


def test_sweep_wandb_runs_carry_group_tags_name_and_redacted_config(sweep):
    _root, sweep_dir = sweep
    names = []
    for job in range(4):
        records = _wandb_records(sweep_dir / str(job))
        (run,) = _kind(records, "run")
        config = {u["key"]: json.loads(u["valueJson"]) for u in run["config"]["update"]}
        adv, size = config["advantage"]["name"], config["rollout"]["group_size"]
        assert run["project"] == "searchr1-test"
        assert run["runGroup"] == "sweep_2x2" and run["jobType"] == "custom"
        assert run["tags"] == [f"advantage={adv}", "logger=all", "retriever=bm25"]
        assert run["displayName"] == f"advantage={adv},rollout.group_size={size},+retriever.password=***"
        assert config["retriever"]["api_key"] == "***" and config["retriever"]["token"] == "***"
        assert config["retriever"]["endpoint"] == "https://search.example/api?auth=***"
        assert config["retriever"]["password"] == "***" and config["rollout"]["max_tokens"] == 500
        assert config["hydra"]["sweep_dir"] == str(sweep_dir)
        history = [{i["nestedKey"][0]: json.loads(i["valueJson"]) for i in h["item"]}
                   for h in _kind(records, "history")]
        assert [h["reward/mean"] for h in history] == pytest.approx([size, size + 0.1, size + 0.2])
        summary = {i.get("key") or i["nestedKey"][0]: json.loads(i["valueJson"])
                   for s in _kind(records, "summary") for i in s["update"]}
        assert summary["eval/em/macro"] == 0.5
        assert _kind(records, "exit")[0].get("exitCode", 0) == 0
        names.append(run["displayName"])
    assert len(set(names)) == 4


def test_sweep_swanlab_runs_and_local_files(sweep):
    _root, sweep_dir = sweep
    for job in range(4):
        records = _swanlab_records(sweep_dir / str(job))
        (start,) = _kind(records, "start")
        adv = "group_mean" if job < 2 else "grpo_std"
        size = 2 if job % 2 == 0 else 4
        assert start["project"] == "searchr1-test" and start["group"] == "sweep_2x2"
        assert start["jobType"] == "custom"
        assert start["name"] == f"advantage={adv},rollout.group_size={size},+retriever.password=***"
        assert start["tags"] == [f"advantage={adv}", "logger=all", "retriever=bm25"]
        scalars = {(s["key"], int(s.get("step", 0))): s["value"].get("number", 0.0)
                   for s in _kind(records, "scalar")}
        assert scalars[("reward/mean", 2)] == pytest.approx(size + 0.2)
        assert scalars[("summary/eval/em/macro", 2)] == 0.5
        assert _kind(records, "finish")[0]["state"] == "RUN_STATE_FINISHED"
        (cfg_file,) = glob.glob(str(sweep_dir / str(job) / "swanlog" / "run-*" / "files" / "config.yaml"))
        logged = yaml.safe_load(Path(cfg_file).read_text())
        assert logged["retriever"]["value"]["api_key"] == "***"
        assert logged["hydra"]["value"]["choices"]["advantage"] == adv


def test_sweep_writes_contract_files_and_leaks_no_secret(sweep):
    _root, sweep_dir = sweep
    for job in range(4):
        run_dir = sweep_dir / str(job)
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2]
        assert json.loads((run_dir / "summary.json").read_text()) == {"eval/em/macro": 0.5, "steps": 3}
        _assert_no_secrets(run_dir / "wandb")
        _assert_no_secrets(run_dir / "swanlog")


def test_failed_single_run_is_closed_as_failed(sweep):
    root, _ = sweep
    run_dir = root / "single_fail"
    proc = _run_app(root, "experiment=smoke", "fail=true", f"hydra.run.dir={run_dir}")
    assert proc.returncode != 0 and "job failed on purpose" in proc.stderr
    records = _wandb_records(run_dir)
    (run,) = _kind(records, "run")
    assert "runGroup" not in run and run["jobType"] == "smoke"
    assert run["displayName"] == "experiment=smoke,fail=true"
    assert run["tags"] == ["advantage=group_mean", "experiment=smoke", "logger=all", "retriever=bm25"]
    assert _kind(records, "exit")[0]["exitCode"] == 1
    sw = _swanlab_records(run_dir)
    assert _kind(sw, "finish")[0]["state"] == "RUN_STATE_CRASHED"
    assert "failed (exit code 1)" in proc.stdout
    _assert_no_secrets(run_dir / "wandb")
    _assert_no_secrets(run_dir / "swanlog")
