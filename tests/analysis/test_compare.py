"""Compare: a synthetic 2×2 multirun tree (and the same runs behind a fake wandb Api)
gives an exact table, a CSV and PNG plots of the documented pixel sizes."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pandas as pd
import pytest
import yaml

from searchr1.analysis.compare import (
    compare_frame,
    find_run_dirs,
    format_table,
    load_local_runs,
    load_wandb_runs,
    main,
    parse_overrides,
)

NAN = math.nan
COMMON = "experiment=smoke"
# (advantage, group_size, (1hop, 2hop, format) at eval step 0, the same at eval step 2)
JOBS = [
    ("group_mean", 4, (0.2, 0.4, 0.6), (0.5, 0.7, 0.9)),
    ("group_mean", 8, (0.6, 0.4, 0.5), (0.5, 0.3, 0.8)),  # gets worse: best != final
    ("grpo_std", 4, (0.1, 0.1, 0.2), (0.3, 0.5, 0.7)),
    ("grpo_std", 8, (0.0, 0.2, 0.4), (0.4, 0.4, 1.0)),  # killed after step 2 of 3: no summary.json
]
STEPS = 3


def _eval_row(step: int, scores: tuple) -> dict:
    one, two, fmt = scores
    return {"step": step, "eval/em/world_1hop": one, "eval/em/world_2hop": two,
            "eval/em/macro": (one + two) / 2, "eval/format_rate": fmt}


def _history(job: int) -> list[dict]:
    """The trainer's layout: the eval before training at step 0, train rows at steps 1…3
    (logged after each step), the final eval at step 3; job 3 was killed after step 2."""
    rows = [_eval_row(0, JOBS[job][2])]
    for step in range(1, (2 if job == 3 else STEPS) + 1):
        rows.append({"step": step, "reward/mean": 0.1 * step + 0.01 * job,
                     "rollout/search_calls": 0.5 + 0.5 * step, "time/step_seconds": 2.0})
    if job != 3:
        rows.append(_eval_row(STEPS, JOBS[job][3]))
    return rows


def _summary(job: int) -> dict | None:
    if job == 3:
        return None
    last = _eval_row(2, JOBS[job][3])
    del last["step"]
    extra = {"eval/search_calls": 1.5} if job == 2 else {}
    return {**last, **extra, "steps": 3, "wall_seconds": 6.5, "sampled_tokens": 1000 * (job + 1),
            "trained_tokens": 800 * (job + 1), "search_calls": 12 * (job + 1)}


def _overrides(job: int) -> list[str]:
    adv, size, *_ = JOBS[job]
    return [COMMON, f"advantage={adv}", f"rollout.group_size={size}"]


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    sweep = tmp_path / "multirun" / "2026-11-29" / "20-05-17"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job in range(4):
        run = sweep / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "config.yaml").write_text("rollout: {group_size: 4}\ntrainer: {steps: 3}\n")
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(_overrides(job)))
        lines = [json.dumps(r) for r in _history(job)]
        if job == 3:
            lines.append('{"step": 3, "reward/me')  # cut short by the crash
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        if (summary := _summary(job)) is not None:
            (run / "summary.json").write_text(json.dumps(summary))
        (run / "eval" / "step_2").mkdir(parents=True)
        (run / "eval" / "step_2" / "trajectories.jsonl").write_text("")
    return sweep


def _expected(labels: list[str], wall_3: float) -> pd.DataFrame:
    """Job 3 did not finish: no finals (its step-0 eval is not one), 2 steps trained."""
    return pd.DataFrame({
        "run": labels,
        "status": ["done", "done", "done", "unfinished (step 2 of 3)"],
        "advantage": ["group_mean", "group_mean", "grpo_std", "grpo_std"],
        "rollout.group_size": [4, 8, 4, 8],
        "em/macro/final": [0.6, 0.4, 0.4, NAN],
        "em/macro/best": [0.6, 0.5, 0.4, 0.1],
        "em/world_1hop/final": [0.5, 0.5, 0.3, NAN],
        "em/world_1hop/best": [0.5, 0.6, 0.3, 0.0],
        "em/world_2hop/final": [0.7, 0.3, 0.5, NAN],
        "em/world_2hop/best": [0.7, 0.4, 0.5, 0.2],
        "format_rate": [0.9, 0.8, 0.7, NAN],
        "searches_per_traj": [2.0, 2.0, 1.5, NAN],
        "steps": [3.0, 3.0, 3.0, 2.0],
        "wall_seconds": [6.5, 6.5, 6.5, wall_3],
        "sampled_tokens": [1000.0, 2000.0, 3000.0, NAN],
        "trained_tokens": [800.0, 1600.0, 2400.0, NAN],
        "search_calls": [12.0, 24.0, 36.0, NAN],
    })


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_parse_overrides_and_discovery_order(tmp_path):
    assert parse_overrides(["+a.b=4", "~c", "lr=1e-6", "name='x y'", "hydra.run.dir=/x"]) == {
        "a.b": 4, "c": "<deleted>", "lr": 1e-6, "name": "x y"}
    for name in ("10", "2", "b", "wandb"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text("{}")
    assert [p.name for p in find_run_dirs([tmp_path])] == ["2", "10", "b"]


def test_local_multirun_gives_exact_frame(sweep_dir):
    frame = compare_frame(load_local_runs([sweep_dir]))
    pd.testing.assert_frame_equal(frame, _expected(["0", "1", "2", "3"], wall_3=4.0))
    table = format_table(frame)
    assert table.splitlines()[0].startswith("| run | status                   | advantage  |")
    assert "| 3   | unfinished (step 2 of 3) | grpo_std   |" in table and " - |" in table


def test_single_run_shows_all_its_overrides(sweep_dir):
    frame = compare_frame(load_local_runs([sweep_dir / "1"]))
    assert list(frame.columns[:5]) == ["run", "status", "experiment", "advantage", "rollout.group_size"]
    assert frame.loc[0, "run"] == "1" and frame.loc[0, "em/macro/best"] == pytest.approx(0.5)


def test_main_writes_csv_and_plots_of_expected_size(sweep_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main([str(sweep_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "em/macro/final" in printed and "compare.csv" in printed
    assert "1 of 4 runs did not finish" in printed and "3: unfinished (step 2 of 3)" in printed
    csv = pd.read_csv(out / "compare.csv", dtype={"run": str})
    pd.testing.assert_frame_equal(csv, _expected(["0", "1", "2", "3"], wall_3=4.0))
    sizes = {"curves.png": (1500, 450), "macro_em.png": (900, 500), "heatmap.png": (800, 600)}
    for name, size in sizes.items():
        path = out / name
        assert path.stat().st_size > 5000, name
        assert _png_size(path) == size


def test_one_axis_sweep_has_bars_but_no_heatmap(sweep_dir, tmp_path):
    out = tmp_path / "one_axis"
    assert main([str(sweep_dir / "0"), str(sweep_dir / "1"), "--out", str(out)]) == 0
    assert (out / "curves.png").is_file() and (out / "macro_em.png").is_file()
    assert not (out / "heatmap.png").exists()
    assert list(pd.read_csv(out / "compare.csv").columns[:3]) == ["run", "status", "rollout.group_size"]


# ---------------------------------------------------------------- wandb (fake Api)


class FakeSummary:
    """Mimics wandb's HTTPSummary: ``keys()`` and ``[]``, not a dict."""

    def __init__(self, values: dict) -> None:
        self._values = values

    def keys(self):
        return self._values.keys()

    def __getitem__(self, key):
        return self._values[key]


class FakeRun:
    """Mimics ``wandb.apis.public.Run``: name, id, config, summary, ``history()``."""

    def __init__(self, job: int, with_hydra_block: bool) -> None:
        self.id = f"run{job}"
        self.name = ",".join(_overrides(job))
        self.group = "20-05-17"
        hydra = {"overrides": _overrides(job), "choices": {}} if with_hydra_block else None
        self.config = {"rollout": {"group_size": JOBS[job][1]}, "trainer": {"steps": STEPS},
                       **({"hydra": hydra} if hydra else {})}
        summary = dict(_summary(job) or {})
        summary.update({"_runtime": 7.0, "_step": 2, "_wandb": {"runtime": 7}})
        self.summary = FakeSummary(summary)
        self._rows = _history(job)

    def history(self, samples=500, keys=None, x_axis="_step", pandas=True, stream="default"):
        assert pandas and stream == "default" and samples >= 1000
        merged: dict[int, dict] = {}
        for row in self._rows:  # wandb keeps one row per step, NaN where a key was not logged
            step = row["step"]
            merged.setdefault(step, {"_step": step, "_runtime": 1.0 + step, "_timestamp": 1e9})
            merged[step].update({k: v for k, v in row.items() if k != "step"})
        return pd.DataFrame(list(merged.values()))


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._runs = [FakeRun(job, with_hydra_block=job != 2) for job in range(4)]

    def runs(self, path=None, filters=None, order="+created_at", per_page=50,
             include_sweeps=False, lazy=True):
        self.calls.append((path, filters))
        return iter([r for r in self._runs if r.group == (filters or {}).get("group")])


def test_wandb_group_gives_the_same_frame(tmp_path, capsys):
    api = FakeApi()
    runs = load_wandb_runs(api, "lab/searchr1", "20-05-17")
    assert api.calls == [("lab/searchr1", {"group": "20-05-17"})]
    labels = [",".join(_overrides(j)) for j in range(4)]
    pd.testing.assert_frame_equal(compare_frame(runs), _expected(labels, wall_3=7.0))
    out = tmp_path / "wb"
    assert main(["--wandb", "lab/searchr1", "--group", "20-05-17", "--out", str(out)], api=api) == 0
    assert _png_size(out / "heatmap.png") == (800, 600)
    assert runs[0].source == "wandb:lab/searchr1/run0"


def test_cli_requires_paths_or_wandb_group():
    with pytest.raises(SystemExit):
        main([])
    with pytest.raises(SystemExit):
        main(["--wandb", "lab/searchr1"])


def test_a_stopped_run_is_not_done_and_has_no_finals(sweep_dir):
    summary = json.loads((sweep_dir / "0" / "summary.json").read_text())
    (sweep_dir / "0" / "summary.json").write_text(json.dumps({**summary, "steps": 2,
                                                              "stopped_reason": "stopped by SIGTERM"}))
    frame = compare_frame(load_local_runs([sweep_dir]))
    assert frame.loc[0, "status"] == "stopped at step 2 of 3 (stopped by SIGTERM)"
    assert math.isnan(frame.loc[0, "em/macro/final"]) and frame.loc[0, "steps"] == 2.0


def test_wandb_without_a_login_is_one_paragraph_and_exit_2(monkeypatch, tmp_path, capsys):
    """``compare --wandb`` where wandb has no key: advice instead of wandb's traceback."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    code = main(["--wandb", "lab/searchr1", "--group", "g", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot read wandb project lab/searchr1" in err and "wandb login" in err
    assert "searchr1.analysis.compare outputs/multirun" in err and "Traceback" not in err


def test_identical_curves_are_drawn_apart_and_counted(sweep_dir, tmp_path):
    """Runs that differ only in an option that never binds give one line each in the same place:
    the later ones are dashed and the panel says how many coincide."""
    from matplotlib.figure import Figure

    from searchr1.analysis import plots

    runs = load_local_runs([sweep_dir / "0", sweep_dir / "0", sweep_dir / "1"])
    figures = []
    original = plots._save
    plots._save = lambda fig, path: figures.append(fig) or original(fig, path)
    try:
        plots.plot_learning_curves(runs, ["rollout.group_size"], tmp_path / "curves.png")
    finally:
        plots._save = original
    (fig,) = figures
    assert isinstance(fig, Figure)
    reward = fig.axes[0]
    styles = [line.get_linestyle() for line in reward.get_lines()]
    assert styles == ["-", "--", "-"]
    notes = [t.get_text() for t in reward.texts]
    assert notes == ["1 of 3 curves identical to an earlier one (dashed, x)"]
