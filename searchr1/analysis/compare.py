"""Compare runs: run folders (or a wandb group) → one table, a CSV and plots.

    python -m searchr1.analysis.compare outputs/multirun/2026-11-29/20-05-17 [more paths…] [--out DIR]
    python -m searchr1.analysis.compare --wandb ENTITY/PROJECT --group SWEEP [--out DIR]

One row per run. The first columns are the sweep axes: the overrides (from
``.hydra/overrides.yaml``, or the ``hydra.overrides`` block our wandb tracker logs) whose
values differ between runs; overrides shared by every run are left out. Then come final
and best dev EM per data source (``em/<source>/final``, ``em/<source>/best``, from
``eval/em/<source>``), format rate, searches per trajectory, steps, wall time and the cost
proxies. "Final" prefers ``summary.json`` and falls back to the last logged value; "best"
is the maximum over the whole history.

Runs evaluated on the paper's benchmarks (``eval/paper_em/*``) get a second table in the
paper's Table 2 layout — final EM per benchmark, ``Avg.`` and the lab's macro EM beside
it — printed and written to ``paper_table.csv``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from searchr1.analysis import paper_table
from searchr1.startup.config_errors import renamed

RUN_MARKERS = ("metrics.jsonl", "summary.json", ".hydra/config.yaml")
SKIP_DIRS = {"wandb", "swanlog", "eval", "compare", ".hydra", "__pycache__"}
EM_PATTERN = re.compile(r"^eval/em/(.+)$")
SEARCH_METRICS = ("eval/searches_per_traj", "eval/search_calls", "rollout/search_calls")
COST_COLUMNS = ("sampled_tokens", "trained_tokens", "search_calls")
MISSING_AXIS = "(default)"
HISTORY_SAMPLES = 100_000


@dataclass
class RunData:
    """One run, wherever it came from: its overrides, per-step history and summary."""

    label: str
    source: str  # a folder, or ``wandb:<entity>/<project>/<run id>``
    overrides: dict[str, Any]
    history: pd.DataFrame  # index: step; columns: metric names
    summary: dict[str, Any]


# ------------------------------------------------------------------- reading run folders


def is_run_dir(path: Path) -> bool:
    return any((path / marker).is_file() for marker in RUN_MARKERS)


def _child_order(path: Path) -> tuple:
    """Numbered job folders in numeric order (``2`` before ``10``), then the rest by name."""
    return (not path.name.isdigit(), int(path.name) if path.name.isdigit() else 0, path.name)


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Every run folder at or below ``paths`` (a run's own subfolders are not searched)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if is_run_dir(path):
            found.append(path)
        elif path.is_dir():
            children = sorted((c for c in path.iterdir() if c.is_dir() and
                               c.name not in SKIP_DIRS and not c.name.startswith(".")),
                              key=_child_order)
            found.extend(find_run_dirs(children))
    return found


def typed_value(text: str) -> Any:
    """``"4"`` → 4, ``"1e-6"`` → 1e-06, anything else stays a string (quotes stripped)."""
    text = text.strip().strip("'\"")
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``["+a.b=4", "~c"]`` → ``{"a.b": 4, "c": "<deleted>"}``; Hydra's own keys dropped, and
    a key that has since moved read under its new name (an old run folder's ``trainer.compile_layers``
    is ``engine.compile_layers``: ``startup/config_errors.py: MOVED_KEYS``)."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, value = renamed(str(item)).partition("=")
        key = key.lstrip("+~")
        if not key or key.startswith("hydra."):
            continue
        parsed[key] = typed_value(value) if sep else "<deleted>"
    return parsed


def read_history(path: Path) -> pd.DataFrame:
    """``metrics.jsonl`` → one row per step (several lines of a step merged; bad lines skipped)."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
    if not rows:
        return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
    frame = pd.DataFrame(rows).groupby("step", sort=True).last()
    return frame.apply(pd.to_numeric, errors="coerce")


def load_run(run_dir: Path, label: str) -> RunData:
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return RunData(label=label, source=str(run_dir), overrides=parse_overrides(overrides or []),
                   history=read_history(run_dir / "metrics.jsonl"), summary=summary)


def load_local_runs(paths: Sequence[str | Path]) -> list[RunData]:
    """Runs under ``paths``, labelled by their path below the folders' common ancestor."""
    dirs = [d.resolve() for d in find_run_dirs(paths)]
    if len(dirs) <= 1:
        labels = [d.name for d in dirs]
    else:
        root = Path(os.path.commonpath(dirs))
        labels = [str(d.relative_to(root)) if d != root else d.name for d in dirs]
    return [load_run(d, label) for d, label in zip(dirs, labels)]


# ------------------------------------------------------------------- reading wandb


def _overrides_from_name(name: str) -> list[str]:
    """Our tracker names runs ``a=1,b=2``; use that when a run lacks the ``hydra`` block."""
    parts = (name or "").split(",")
    return parts if all("=" in p for p in parts) else []


def _wandb_history(run: Any) -> pd.DataFrame:
    history = run.history(samples=HISTORY_SAMPLES, pandas=True)
    frame = history if isinstance(history, pd.DataFrame) else pd.DataFrame(list(history))
    if frame.empty or "_step" not in frame:
        return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
    frame = frame.rename(columns={"_step": "step"}).groupby("step", sort=True).last()
    frame = frame[[c for c in frame.columns if not str(c).startswith("_")]]
    return frame.apply(pd.to_numeric, errors="coerce")


def _wandb_summary(summary: Any) -> dict[str, Any]:
    """A plain dict of a run's summary; wandb's ``_runtime`` stands in for ``wall_seconds``."""
    plain = {k: summary[k] for k in summary.keys()}  # noqa: SIM118 - HTTPSummary has no __iter__
    if "wall_seconds" not in plain and "_runtime" in plain:
        plain["wall_seconds"] = plain["_runtime"]
    return {k: v for k, v in plain.items() if not k.startswith("_")}


def load_wandb_runs(api: Any, path: str, group: str) -> list[RunData]:
    """Runs of one wandb group, via ``wandb.Api().runs(path, filters={"group": group})``."""
    runs = list(api.runs(path, filters={"group": group}))
    names = [r.name for r in runs]
    out = []
    for run in runs:
        config = dict(run.config or {})
        overrides = (config.get("hydra") or {}).get("overrides") or _overrides_from_name(run.name)
        label = run.name if names.count(run.name) == 1 else f"{run.name} ({run.id})"
        out.append(RunData(label=label, source=f"wandb:{path}/{run.id}",
                           overrides=parse_overrides(overrides), history=_wandb_history(run),
                           summary=_wandb_summary(run.summary)))
    return out


# ------------------------------------------------------------------- the table


def sweep_axes(runs: Sequence[RunData]) -> list[str]:
    """Override keys whose value differs between runs (all keys when there is one run)."""
    keys = list(dict.fromkeys(k for run in runs for k in run.overrides))
    if len(runs) == 1:
        return keys
    return [k for k in keys if len({repr(r.overrides.get(k, MISSING_AXIS)) for r in runs}) > 1]


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def final_value(run: RunData, metric: str) -> float:
    """The summary's value, else the last logged one, else NaN."""
    if metric in run.summary and not math.isnan(_number(run.summary[metric])):
        return _number(run.summary[metric])
    if metric in run.history:
        series = run.history[metric].dropna()
        if len(series):
            return float(series.iloc[-1])
    return math.nan


def best_value(run: RunData, metric: str) -> float:
    values = [_number(run.summary.get(metric))]
    if metric in run.history:
        values += [float(v) for v in run.history[metric].dropna()]
    values = [v for v in values if not math.isnan(v)]
    return max(values) if values else math.nan


def em_sources(runs: Sequence[RunData]) -> list[str]:
    """Data sources with an ``eval/em/<source>`` metric anywhere, sorted; macro excluded."""
    names = {m.group(1) for run in runs for key in [*run.summary, *run.history.columns]
             if (m := EM_PATTERN.match(str(key)))}
    return sorted(names - {"macro"})


def metric_row(run: RunData, sources: Sequence[str]) -> dict[str, float]:
    """The metric columns of one run's row."""
    row = {"em/macro/final": final_value(run, "eval/em/macro"),
           "em/macro/best": best_value(run, "eval/em/macro")}
    for source in sources:
        row[f"em/{source}/final"] = final_value(run, f"eval/em/{source}")
        row[f"em/{source}/best"] = best_value(run, f"eval/em/{source}")
    row["format_rate"] = final_value(run, "eval/format_rate")
    searches = [final_value(run, m) for m in SEARCH_METRICS]
    row["searches_per_traj"] = next((v for v in searches if not math.isnan(v)), math.nan)
    steps = _number(run.summary.get("steps"))
    if math.isnan(steps) and len(run.history.index):
        steps = float(run.history.index.max()) + 1  # steps count from 0
    row["steps"] = steps
    wall = _number(run.summary.get("wall_seconds"))
    if math.isnan(wall) and "time/step_seconds" in run.history:
        wall = float(run.history["time/step_seconds"].sum())
    row["wall_seconds"] = wall
    for name in COST_COLUMNS:
        row[name] = _number(run.summary.get(name))
    return row


def compare_frame(runs: Sequence[RunData]) -> pd.DataFrame:
    """The comparison table: ``run``, the sweep axes, then the metric columns."""
    axes = sweep_axes(runs)
    sources = em_sources(runs)
    rows = []
    for run in runs:
        row: dict[str, Any] = {"run": run.label}
        row.update({axis: run.overrides.get(axis, MISSING_AXIS) for axis in axes})
        row.update(metric_row(run, sources))
        rows.append(row)
    frame = pd.DataFrame(rows)
    for axis in axes:
        if all(isinstance(v, (int, float)) for v in frame[axis]):
            frame[axis] = pd.to_numeric(frame[axis])
    return frame


def paper_frame(runs: Sequence[RunData]) -> pd.DataFrame:
    """The Table 2 layout, one row per run with paper metrics: run, sweep axes, EM columns."""
    axes = sweep_axes(runs)
    keys = [f"{paper_table.PREFIX}{s}" for s, _ in paper_table.BENCHMARKS]
    keys += [f"{paper_table.PREFIX}avg", "eval/em/macro"]
    rows = []
    for run in runs:
        if not any(k in run.summary or k in run.history for k in keys[:-1]):
            continue
        row: dict[str, Any] = {"run": run.label}
        row.update({axis: run.overrides.get(axis, MISSING_AXIS) for axis in axes})
        row.update(paper_table.table_row({k: final_value(run, k) for k in keys}))
        rows.append(row)
    return pd.DataFrame(rows)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return str(int(value)) if value.is_integer() and abs(value) >= 1 else f"{value:.4g}"
    return str(value)


def format_table(frame: pd.DataFrame) -> str:
    """A markdown table (no extra packages): right-aligned numbers, ``-`` for missing."""
    cells = [[_cell(v) for v in row] for row in frame.itertuples(index=False)]
    header = [str(c) for c in frame.columns]
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(items: list[str], align: bool) -> str:
        padded = [s.rjust(w) if align and num else s.ljust(w)
                  for s, w, num in zip(items, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if num else "-") for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line(header, False), rule, *(line(r, True) for r in cells)])


# ------------------------------------------------------------------- command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m searchr1.analysis.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="run folders or multirun folders")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read a wandb group instead")
    parser.add_argument("--group", help="the wandb group (a sweep folder's name)")
    parser.add_argument("--out", help="output folder (default: <first path>/compare)")
    parser.add_argument("--no-plots", action="store_true", help="write only the table")
    args = parser.parse_args(argv)
    if not args.paths and not args.wandb:
        parser.error("give run folders, or --wandb ENTITY/PROJECT --group G")
    if args.wandb and not args.group:
        parser.error("--wandb needs --group")
    return args


def main(argv: Sequence[str] | None = None, api: Any = None) -> int:
    """Entry point; ``api`` replaces ``wandb.Api()`` (tests pass a fake)."""
    args = parse_args(argv)
    runs = load_local_runs(args.paths)
    if args.wandb:
        if api is None:
            import wandb

            api = wandb.Api()
        runs += load_wandb_runs(api, args.wandb, args.group)
    if not runs:
        print("no runs found", file=sys.stderr)
        return 1
    frame = compare_frame(runs)
    default_out = Path(args.paths[0]) / "compare" if args.paths else Path("outputs/compare") / args.group
    out = Path(args.out) if args.out else default_out
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "compare.csv", index=False)
    print(format_table(frame))
    print(f"\nwrote {out / 'compare.csv'}")
    paper = paper_frame(runs)
    if len(paper):
        paper.to_csv(out / "paper_table.csv", index=False)
        print(f"\nSearch-R1 Table 2 layout (final EM)\n{format_table(paper)}")
        print(f"\nwrote {out / 'paper_table.csv'}")
    if not args.no_plots:
        from searchr1.analysis.plots import write_plots  # lazy: matplotlib, only when plotting

        for path in write_plots(frame, runs, sweep_axes(runs), out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
