"""Compare runs: run folders (or a wandb group) → one table, a CSV and plots.

    python -m searchr1.analysis.compare outputs/multirun/2026-11-29/20-05-17 [more paths…] [--out DIR]
    python -m searchr1.analysis.compare --wandb ENTITY/PROJECT --group SWEEP [--out DIR]

One row per run. The first columns are the sweep axes: the overrides (from
``.hydra/overrides.yaml``, or the ``hydra.overrides`` block our wandb tracker logs) whose
values differ between runs; overrides shared by every run are left out. ``status`` says
whether the run finished (``run_data``: ``done``, ``unfinished (step k of N)`` or ``stopped
at step k (reason)``). Then come final and best dev EM per data source
(``em/<source>/final``, ``em/<source>/best``, from ``eval/em/<source>``), format rate,
searches per trajectory, steps trained, wall time and the cost proxies. "Final" prefers
``summary.json`` and falls back to the last logged value, and only a finished run has one
(an unfinished run's last eval is not its final); "best" is the maximum over the whole
history. Output goes to ``<first path>/compare/`` unless ``--out`` says otherwise.

Runs evaluated on the paper's benchmarks (``eval/paper_em/*``) get a second table in the
paper's Table 2 layout — final EM per benchmark, ``Avg.`` and the lab's macro EM beside
it — printed and written to ``paper_table.csv``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from searchr1.analysis import paper_table
from searchr1.analysis.run_data import (SKIP_DIRS, RunData, find_run_dirs, load_local_runs,  # noqa: F401
                                        parse_overrides, read_history, trained_steps, typed_value)
from searchr1.analysis.wandb_runs import WandbUnavailable, load_wandb_runs, open_api

EM_PATTERN = re.compile(r"^eval/em/(.+)$")
SEARCH_METRICS = ("eval/searches_per_traj", "eval/search_calls", "rollout/search_calls")
COST_COLUMNS = ("sampled_tokens", "trained_tokens", "search_calls")
MISSING_AXIS = "(default)"
EXIT_UNAVAILABLE = 2


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
    """The metric columns of one run's row; an unfinished run has no finals (NaN)."""
    def final(metric: str) -> float:
        return final_value(run, metric) if run.finished else math.nan

    row = {"em/macro/final": final("eval/em/macro"),
           "em/macro/best": best_value(run, "eval/em/macro")}
    for source in sources:
        row[f"em/{source}/final"] = final(f"eval/em/{source}")
        row[f"em/{source}/best"] = best_value(run, f"eval/em/{source}")
    row["format_rate"] = final("eval/format_rate")
    searches = [final(m) for m in SEARCH_METRICS]
    row["searches_per_traj"] = next((v for v in searches if not math.isnan(v)), math.nan)
    steps = _number(run.summary.get("steps"))
    if math.isnan(steps):  # rows of step k are logged after k steps trained
        steps = float(trained_steps(run.history))
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
        row: dict[str, Any] = {"run": run.label, "status": run.status}
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
        if not run.finished or not any(k in run.summary or k in run.history for k in keys[:-1]):
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
        try:
            runs += load_wandb_runs(api or open_api(args.wandb), args.wandb, args.group)
        except WandbUnavailable as err:  # no login, no network: one paragraph, exit 2
            print(err, file=sys.stderr)
            return EXIT_UNAVAILABLE
    if not runs:
        print("no runs found", file=sys.stderr)
        return 1
    frame = compare_frame(runs)
    default_out = Path(args.paths[0]) / "compare" if args.paths else Path("outputs/compare") / args.group
    out = Path(args.out) if args.out else default_out
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "compare.csv", index=False)
    print(format_table(frame))
    unfinished = [run for run in runs if not run.finished]
    if unfinished:
        print(f"\n{len(unfinished)} of {len(runs)} runs did not finish (no summary.json, stopped, or "
              "fewer steps than planned): their final columns are left empty — "
              + "; ".join(f"{run.label}: {run.status}" for run in unfinished))
    print(f"\nwrote {out / 'compare.csv'}")
    paper = paper_frame(runs)
    if len(paper):
        paper.to_csv(out / "paper_table.csv", index=False)
        print(f"\nSearch-R1 Table 2 layout (final EM)\n{format_table(paper)}")
        print(f"\nwrote {out / 'paper_table.csv'}")
    if not args.no_plots:
        from searchr1.analysis.plots import write_plots

        for path in write_plots(frame, runs, sweep_axes(runs), out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
