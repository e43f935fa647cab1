"""The paper-findings study's resume files: an unfinished arm moves to another machine with only
its newest checkpoint, within what one device call returns, and resumes there from it."""

from __future__ import annotations

import gzip
import json
import random
import tarfile
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from searchr1.loop.checkpoint import STATE_FILE, TrainerState, checkpoint_dir, newest_state
from tests.helpers.scripts import load_script

MiB = 1 << 20
REFERENCE = random.Random(7).randbytes(2 * MiB)  # one warm start's frozen KL reference: every arm's


def _carry_runs():
    return load_script("experiments/paper_findings/carry_runs.py")


def _arm(study: Path, name: str, steps=(10, 20), finished=False, weight_bytes=MiB + 1) -> Path:
    """A run folder as the loop leaves it: a checkpoint per step, the sampler's weights equal to
    the engine state's, the reference adapter the same in every arm."""
    run = study / name
    (run / ".hydra").mkdir(parents=True, exist_ok=True)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "trajectories.jsonl").write_text("{}\n")
    (run / ".searchr1.lock").write_text("")
    for step in steps:
        weights = random.Random(f"{name}{step}").randbytes(weight_bytes)  # incompressible
        state = run / "checkpoints" / "engine" / "state" / f"step_{step:06d}"
        sampler = run / "checkpoints" / "engine" / "sampler" / f"step_{step:06d}"
        for d in (state, sampler):
            d.mkdir(parents=True)
            (d / "adapter_model.safetensors").write_bytes(weights)
            (d / "adapter_config.json").write_text('{"r": 8}')
        (state / "trainer_state.pt").write_bytes(random.Random(f"opt{name}{step}").randbytes(weight_bytes))
        (state / "reference_adapter").mkdir()
        (state / "reference_adapter" / "adapter_model.safetensors").write_bytes(REFERENCE)
        loop = checkpoint_dir(run, step)
        loop.mkdir(parents=True)
        (loop / STATE_FILE).write_text(json.dumps(asdict(TrainerState(
            step=step, cursor=step, engine_state=f"checkpoints/engine/state/step_{step:06d}",
            sampler_weights=f"checkpoints/engine/sampler/step_{step:06d}"))))
        ev = run / "eval" / f"step_{step:06d}"
        ev.mkdir(parents=True)
        (ev / "summary.json").write_text("{}")
        (ev / "trajectories.jsonl").write_text("{}\n")
    if finished:
        (run / "summary.json").write_text("{}")
    return run


def _newest_files(run: Path) -> dict[str, bytes]:
    """The bytes of what resuming ``run`` reads: its newest checkpoint, config, metrics, evals."""
    state = newest_state(run)
    assert state is not None
    roots = [Path(state.engine_state), Path(state.sampler_weights), run / "checkpoints" / f"step_{state.step:06d}"]
    files = {p for root in roots for p in root.rglob("*") if p.is_file()}
    files |= {run / "metrics.jsonl", run / ".hydra" / "overrides.yaml"}
    files |= set((run / "eval").rglob("summary.json"))
    return {p.relative_to(run).as_posix(): p.read_bytes() for p in files}


def test_arms_move_with_their_newest_checkpoint_and_shared_weights_travel_once(tmp_path):
    carry = _carry_runs()
    study, out = tmp_path / "study", tmp_path / "out"
    _arm(study, "grpo_s1", finished=True)
    lab, ppo = _arm(study, "lab_s1"), _arm(study, "ppo_s1")
    written = carry.pack(study, out, budget_bytes=64 * MiB)
    names = sorted(p.name for p in written)
    blobs = [n for n in names if n.startswith("blob_")]
    assert len(blobs) == 1  # the reference, used by both arms, is written once
    assert "resume_lab_s1-step20.tgz" in names and "resume_ppo_s1-step20.tgz" in names
    assert not any("grpo_s1" in n for n in names)  # a finished arm needs nothing
    with tarfile.open(out / "resume_lab_s1-step20.tgz") as tar:
        members = tar.getnames()
    assert sum(m.startswith("blobs/") for m in members) == 2  # adapters once (sampler = state), optimizer
    assert not any("step_000010" in m and "checkpoints" in m for m in members)  # older ones stay
    assert not any(m.endswith("trajectories.jsonl") or m.endswith(".searchr1.lock") for m in members)
    other = tmp_path / "machine2"
    assert carry.unpack(out, other) == ["lab_s1", "ppo_s1"]
    for run in (lab, ppo):
        assert _newest_files(other / run.name) == _newest_files(run)
        state = newest_state(other / run.name)
        assert state is not None and state.step == 20
        assert Path(state.engine_state).resolve().is_relative_to(other.resolve())


def test_a_file_over_the_per_file_limit_is_split_and_joined_back(tmp_path):
    carry = _carry_runs()
    study, out = tmp_path / "study", tmp_path / "out"
    run = _arm(study, "ppo_s1", weight_bytes=3 * MiB)
    written = carry.pack(study, out, budget_bytes=64 * MiB, max_files=20, max_file_bytes=MiB)
    assert all(p.stat().st_size <= MiB for p in written)
    assert any(".part0" in p.name for p in written)
    carry.unpack(out, tmp_path / "m2")
    assert _newest_files(tmp_path / "m2" / "ppo_s1") == _newest_files(run)
    next(p for p in written if p.name.endswith(".part01")).unlink()
    with pytest.raises(SystemExit, match="a part is missing"):
        carry.unpack(out, tmp_path / "m3")


def test_a_corrupt_part_is_refused(tmp_path):
    carry = _carry_runs()
    study, out = tmp_path / "study", tmp_path / "out"
    _arm(study, "lab_s1")
    _arm(study, "ppo_s1")
    archive = next(p for p in carry.pack(study, out, budget_bytes=64 * MiB) if p.name.startswith("blob_"))
    data = bytearray(gzip.decompress(archive.read_bytes()))
    data[100] ^= 0xFF  # one flipped byte in the shared reference
    archive.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(SystemExit, match="does not match its manifest"):
        carry.unpack(out, tmp_path / "m2")


def test_packs_take_turns_within_the_budget_and_never_resend(tmp_path, capsys):
    carry = _carry_runs()
    study = tmp_path / "study"
    _arm(study, "lab_s1")
    _arm(study, "ppo_s1")
    one_arm = 5 * MiB  # room for one arm and the shared reference, not two arms
    first = carry.pack(study, tmp_path / "c1", budget_bytes=one_arm)
    assert {p.name.split("-step")[0] for p in first if p.name.startswith("resume_")} == {"resume_lab_s1"}
    assert "ppo_s1" in capsys.readouterr().err  # told why it waits
    second = carry.pack(study, tmp_path / "c2", budget_bytes=one_arm)
    assert [p.name for p in second] == ["resume_ppo_s1-step20.tgz"]  # the reference went in the first
    assert carry.pack(study, tmp_path / "c3", budget_bytes=one_arm) == []  # nothing new
    _arm(study, "lab_s1", steps=(30,))  # lab trains on and saves again
    fourth = carry.pack(study, tmp_path / "c4", budget_bytes=one_arm)
    assert [p.name for p in fourth] == ["resume_lab_s1-step30.tgz"]
    gathered = tmp_path / "gathered"  # every call's files in one folder, as the README says
    gathered.mkdir()
    for p in first + second + fourth:
        (gathered / p.name).write_bytes(p.read_bytes())
    carry.unpack(gathered, tmp_path / "m2")
    assert newest_state(tmp_path / "m2" / "lab_s1").step == 30  # the newest of two packs
    assert newest_state(tmp_path / "m2" / "ppo_s1").step == 20
    record = json.loads((tmp_path / "m2" / carry.RECORD).read_text())
    assert record["arms"] == {"lab_s1": 30, "ppo_s1": 20}


def test_an_arm_too_large_for_any_pack_is_refused_with_its_size(tmp_path):
    carry = _carry_runs()
    study = tmp_path / "study"
    _arm(study, "ppo_s1")
    with pytest.raises(SystemExit, match=r"exceed one pack \(1 MB, 7 files\)"):
        carry.pack(study, tmp_path / "out", budget_bytes=MiB)
    assert not list((tmp_path / "out").iterdir())


def test_the_plan_carries_each_arms_newest_step_within_the_call_limit(tmp_path):
    carry = _carry_runs()
    study = tmp_path / "study"
    _arm(study, "lab_s1")
    _arm(study, "ppo_s1")
    folder = tmp_path / "gathered"
    carry.pack(study, folder, budget_bytes=64 * MiB)
    stale = folder / "resume_lab_s1-step10.tgz"
    stale.write_bytes(b"an older pack")
    calls = carry.plan(folder, max_bytes=6 * MiB)
    carried = [p for call in calls for p in call]
    assert stale not in carried
    assert sorted(carried) == sorted(p for p in folder.iterdir() if p != stale)
    assert all(sum(p.stat().st_size for p in call) <= 6 * MiB for call in calls)
    assert len(calls) >= 2


def _kept_run(study: Path, name: str, steps: list[int], with_trajectories: bool) -> Path:
    run = study / name
    (run / "eval").mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in steps))
    for s in steps[::10]:
        ev = run / "eval" / f"step_{s:06d}"
        ev.mkdir(exist_ok=True)
        (ev / "summary.json").write_text(json.dumps({"eval/em/macro": s / 100}))
        if with_trajectories:
            (ev / "trajectories.jsonl").write_text(json.dumps({"id": f"q{s}", "reward": 1.0}) + "\n")
    return run


def test_kept_runs_are_not_replaced_by_a_restart_and_keep_their_per_question_files(tmp_path):
    keep = load_script("experiments/paper_findings/keep_runs.py")
    kept = tmp_path / "runs"
    first = _kept_run(tmp_path / "call1", "grpo_s2", list(range(0, 41)), with_trajectories=True)
    keep.replace_run(first, kept / "grpo_s2")
    restarted = _kept_run(tmp_path / "call2", "grpo_s2", list(range(0, 11)), with_trajectories=True)
    keep.replace_run(restarted, kept / "grpo_s2")
    assert keep.last_step(kept / "grpo_s2") == 40  # the restart got less far: the kept copy stays
    # resumed elsewhere from step 40: earlier evals came back as summaries only
    resumed = _kept_run(tmp_path / "call3", "grpo_s2", list(range(0, 61)), with_trajectories=False)
    ev = resumed / "eval" / "step_000060"
    (ev / "trajectories.jsonl").write_text(json.dumps({"id": "q60", "reward": 0.0}) + "\n")
    keep.replace_run(resumed, kept / "grpo_s2")
    assert keep.last_step(kept / "grpo_s2") == 60
    for step in (0, 10, 20, 30, 40, 60):  # the old per-question files kept, the new one added
        rows = gzip.decompress((kept / "grpo_s2" / "eval" / f"step_{step:06d}" / "trajectories.jsonl.gz")
                               .read_bytes()).decode().splitlines()
        assert json.loads(rows[0])["id"] == f"q{step}"
    assert not (kept / "grpo_s2" / "eval" / "step_000050" / "trajectories.jsonl.gz").exists()
    keep.replace_run(restarted, kept / "grpo_s2", force=True)
    assert keep.last_step(kept / "grpo_s2") == 10


#: what each study arm must change relative to paper GRPO (grpo), read from its composed config
ARM_CHANGES = {
    "ppo": {"advantage.name": "ppo_gae"},
    "unmasked": {"rollout.mask_observations": False},
    "search1": {"rollout.max_searches": 1},
    "search2": {"rollout.max_searches": 2},
    "reward_em_format_paper": {"reward.name": "em_format_paper"},
    "reward_em_format": {"reward.name": "em_format"},
    "group2": {"rollout.group_size": 2, "trainer.questions_per_step": 64},
    "group5": {"rollout.group_size": 5, "trainer.questions_per_step": 26, "trainer.minibatch_trajectories": 65},
    "topk1": {"retriever.topk": 1},
    "topk5": {"retriever.topk": 5},
}


def _study_arms(study: Path) -> dict[str, list[str]]:
    return _arm_lines(study)


def _arm_lines(study: Path, **env: str) -> dict[str, list[str]]:
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["bash", "experiments/paper_findings/run_study.sh", "arms"], cwd=root,
                         env={**os.environ, "R": str(study), **env}, capture_output=True,
                         text=True, check=True).stdout
    return {line.split(":", 1)[0]: line.split(":", 1)[1].split() for line in out.splitlines()}


@pytest.mark.parametrize("per_gpu, micro, fraction", [("4", "12000", "0.24"), ("6", "8000", "0.16"),
                                                      ("32", "2048", "0.03")])
def test_more_arms_per_gpu_get_smaller_micro_batches_and_extra_overrides_win(tmp_path, per_gpu, micro, fraction):
    """Six arms at 0.16 of an H200 ran out of memory at 12,000-token micro-batches: past four
    per GPU the limit is 48,000 / arms (never below one 2,048-token sequence). EXTRA's keys
    replace COMMON's and the arm's own, each key given once."""
    extra = "rollout.group_size=4 trainer.steps=5"
    arms = _arm_lines(tmp_path / "study", ARMS_PER_GPU=per_gpu, EXTRA=extra)
    for name, words in arms.items():
        keys = [w.split("=", 1)[0] for w in words]
        assert len(keys) == len(set(keys)), (name, words)
        values = dict(w.split("=", 1) for w in words)
        assert values["trainer.max_padded_tokens_per_microbatch"] == micro, name
        assert values["engine.memory_fraction"] == fraction, name
        assert values["rollout.group_size"] == "4" and values["trainer.steps"] == "5", name
    assert dict(w.split("=", 1) for w in arms["group2"])["trainer.questions_per_step"] == "64"


def test_every_study_arm_composes_passes_the_start_up_checks_and_changes_only_its_keys(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from searchr1.config import register_configs
    from searchr1.startup.checks import check_config

    arms = _study_arms(tmp_path / "study")
    assert set(arms) == set(ARM_CHANGES) | {"grpo", "lab"}
    register_configs()
    conf = Path(__file__).resolve().parents[2] / "conf"
    flat = {}
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        for name, overrides in arms.items():
            cfg = compose(config_name="config", overrides=overrides)
            problems = check_config(cfg, run_dir=tmp_path / name).problems
            assert not [p for p in problems if "memory_fraction" not in p], (name, problems)
            flat[name] = {k: v for k, v in _flatten(OmegaConf.to_container(cfg, resolve=True))}
    for name, changes in ARM_CHANGES.items():
        differs = {k for k in flat["grpo"] if flat[name].get(k) != flat["grpo"][k]} - {"seed"}
        assert {k: flat[name][k] for k in changes} == changes, name
        if name != "ppo":  # ppo is another preset: it differs in its algorithm's many keys
            assert differs - _derived(differs) == set(changes), (name, sorted(differs))


def _derived(keys: set[str]) -> set[str]:
    """Keys an option group brings along with its name (a reward's own fields)."""
    return {k for k in keys if k.startswith("reward.") and k != "reward.name"}


def _flatten(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def test_pack_without_resume_files_returns_the_evals_alone(tmp_path):
    """``RESUME=0 run_study.sh pack``: study.tgz holds the arm's metrics and per-question evals,
    no checkpoint, and no resume file is written; without it the unfinished arm's checkpoint
    goes too."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    study = tmp_path / "study"
    _arm(study, "grpo_s1")
    for resume, out in (("0", tmp_path / "slim"), ("1", tmp_path / "full")):
        out.mkdir()
        subprocess.run(["bash", "experiments/paper_findings/run_study.sh", "pack"], cwd=root, check=True,
                       env={**os.environ, "R": str(study), "OUT": str(out), "RESUME": resume},
                       capture_output=True, text=True)
        with tarfile.open(out / "study.tgz") as tar:
            names = tar.getnames()
        assert "./grpo_s1/metrics.jsonl" in names and "./grpo_s1/eval/step_000020/trajectories.jsonl" in names
        assert not [n for n in names if "checkpoints" in n]
        resumes = sorted(p.name for p in out.iterdir() if p.name.startswith("resume_"))
        assert resumes == ([] if resume == "0" else ["resume_grpo_s1-step20.tgz"]), resumes


FAKE_MPS_CONTROL = """#!/bin/sh
# stands in for nvidia-cuda-mps-control: a marker file is the daemon
marker="$CUDA_MPS_PIPE_DIRECTORY/fake-daemon"
if [ "$1" = "-d" ]; then echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$LOG"; touch "$marker"; exit 0; fi
read -r cmd
case $cmd in
  get_server_list) [ -e "$marker" ] ;;
  quit) echo "quit $CUDA_MPS_PIPE_DIRECTORY" >> "$LOG"; rm -f "$marker" ;;
esac
"""


@pytest.mark.parametrize("mps, per_gpu, expect", [("1", "3", True), ("0", "3", False), ("1", "1", False)])
def test_study_arms_share_the_gpu_through_a_private_mps_daemon(tmp_path, mps, per_gpu, expect):
    """``launch`` starts an MPS daemon (once) with its pipes under R/mps when arms share a GPU;
    ``wait`` stops it once no arm runs; MPS=0 or one arm per GPU leave MPS alone."""
    import os
    import stat
    import subprocess

    root = Path(__file__).resolve().parents[2]
    study, log, bin_dir = tmp_path / "study", tmp_path / "mps.log", tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_MPS_CONTROL)
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    _arm(study, "grpo_s1")
    (study / "grpo_s1" / "summary.json").write_text("{}")  # done: launch starts no process
    env = {**os.environ, "R": str(study), "ARMS": "grpo", "SEEDS": "1", "MPS": mps, "ARMS_PER_GPU": per_gpu,
           "LOG": str(log), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = lambda *a: subprocess.run(["bash", "experiments/paper_findings/run_study.sh", *a], cwd=root,  # noqa: E731
                                    env=env, capture_output=True, text=True, check=True).stdout
    first, second = run("launch"), run("launch")
    assert "grpo_s1: done" in first
    run("wait", "1")
    lines = log.read_text().splitlines() if log.exists() else []
    if not expect:
        assert lines == []
        return
    pipe = f"{study.resolve()}/mps/pipe"
    assert lines == [f"start {pipe} {study.resolve()}/mps/log", f"quit {pipe}"]
    assert "MPS daemon started" in first and "MPS daemon already up" in second


FAKE_PYTHON = """#!/bin/sh
# stands in for python3 in launch: one GPU, and an arm that runs until killed
if [ "$1" = "-c" ]; then echo 1; exit 0; fi
case $1 in *progress.py) echo "step -"; exit 0 ;; esac  # status lines
exec sleep 300
"""


def _kill_launched(study: Path) -> None:
    """Kill every arm a test's ``launch`` started (each runs in its own session, setsid)."""
    import os
    import signal

    for pid_file in study.glob("*.pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _fake_python_study(tmp_path: Path, **env: str) -> tuple[Path, Path, dict[str, str]]:
    """The checkout's root, a study folder and run_study.sh's environment with ``python3``
    replaced by FAKE_PYTHON (one GPU; each arm a process that sleeps until killed), MPS off."""
    import os
    import stat

    study, bin_dir = tmp_path / "study", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return (Path(__file__).resolve().parents[2], study,
            {**os.environ, "R": str(study), "MPS": "0", "PATH": f"{bin_dir}:{os.environ['PATH']}", **env})


def _stop_arm(study: Path, name: str) -> None:
    """SIGTERM the arm ``name`` that ``launch`` started (fails if it is not running) and wait
    until its process is gone."""
    import os
    import signal
    import subprocess

    pid = int((study / f"{name}.pid").read_text())
    os.killpg(pid, signal.SIGTERM)
    for _ in range(200):
        if subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode:
            return
        time.sleep(0.05)


def test_launch_starts_no_more_arms_than_the_gpus_take(tmp_path):
    """Three arms for one GPU of two: two start, the third is not started until one ends."""
    import subprocess

    root, study, env = _fake_python_study(tmp_path, ARMS="grpo ppo lab", SEEDS="1", ARMS_PER_GPU="2")
    run = lambda: subprocess.run(["bash", "experiments/paper_findings/run_study.sh", "launch"], cwd=root,  # noqa: E731
                                 env=env, capture_output=True, text=True, check=True).stdout
    try:
        first = run()
        assert "grpo_s1: started on GPU 0" in first and "ppo_s1: started on GPU 0" in first
        assert "lab_s1: not started" in first and not (study / "lab_s1.pid").exists()
        (study / "grpo_s1").mkdir(parents=True, exist_ok=True)
        (study / "grpo_s1" / "summary.json").write_text("{}")  # grpo finishes
        _stop_arm(study, "grpo_s1")
        second = run()
        assert "grpo_s1: done" in second and "ppo_s1: already running" in second
        assert "lab_s1: started on GPU 0" in second
    finally:
        _kill_launched(study)


def test_runs_names_the_arms_and_seeds_to_launch_and_refuses_a_name_without_a_seed(tmp_path):
    """``RUNS="ppo_s2 reward_em_format_s1"`` starts exactly those two (an arm name with
    underscores keeps them), whatever ARMS and SEEDS say; a name with no ``_sSEED`` exits 2."""
    import subprocess

    root, study, env = _fake_python_study(tmp_path, ARMS="grpo lab", SEEDS="1 3", ARMS_PER_GPU="4")
    launch = lambda runs: subprocess.run(  # noqa: E731
        ["bash", "experiments/paper_findings/run_study.sh", "launch"], cwd=root,
        env={**env, "RUNS": runs}, capture_output=True, text=True)
    try:
        out = launch("ppo_s2 reward_em_format_s1")
        assert out.returncode == 0, out.stderr
        assert sorted(p.name for p in study.glob("*.pid")) == ["ppo_s2.pid", "reward_em_format_s1.pid"]
        assert "ppo_s2: started" in out.stdout and "reward_em_format_s1: started" in out.stdout
        bad = launch("lab")
        assert bad.returncode == 2 and "not ARM_sSEED" in bad.stderr
        unknown = launch("nosuch_s1")
        assert unknown.returncode == 2 and "unknown arm nosuch" in unknown.stderr
    finally:
        _kill_launched(study)


def test_wait_with_fill_starts_a_never_started_run_in_a_finished_arms_place(tmp_path):
    """``FILL=1 run_study.sh wait``: with one of two slots freed by a finished arm, the run never
    started takes it; a run that was started and stopped without a summary stays stopped."""
    import subprocess

    root, study, env = _fake_python_study(tmp_path, RUNS="grpo_s1 ppo_s1 lab_s1 unmasked_s1", ARMS_PER_GPU="2")
    run = lambda *a, **extra: subprocess.run(  # noqa: E731
        ["bash", "experiments/paper_findings/run_study.sh", *a], cwd=root, env={**env, **extra},
        capture_output=True, text=True, check=True).stdout

    try:
        first = run("launch")
        assert "grpo_s1: started" in first and "ppo_s1: started" in first and "lab_s1: not started" in first
        (study / "grpo_s1").mkdir(parents=True, exist_ok=True)
        (study / "grpo_s1" / "summary.json").write_text("{}")  # grpo finishes
        _stop_arm(study, "grpo_s1")
        plain = run("wait", "1")
        assert "started" not in plain and not (study / "lab_s1.pid").exists()  # without FILL: nothing
        _stop_arm(study, "ppo_s1")  # ppo stops without a summary (a crash): FILL must not restart it
        filled = run("wait", "1", FILL="1")
        assert "lab_s1: started" in filled and "unmasked_s1: started" in filled
        assert "ppo_s1: started" not in filled and "grpo_s1: started" not in filled
        assert sorted(p.name for p in study.glob("*.pid")) == [
            "grpo_s1.pid", "lab_s1.pid", "ppo_s1.pid", "unmasked_s1.pid"]
    finally:
        _kill_launched(study)
