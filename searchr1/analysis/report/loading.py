"""Runs for the study report: run folders, a running sweep or a wandb export → runs
(``arms`` groups them into arms).

A run folder is any folder holding one of ``RUN_FILES``; below a sweep folder every run is
found (a run's own subfolders are not searched). Two layouts are read:

- a Hydra run folder: ``metrics.jsonl``, ``summary.json`` (written at the end of a run),
  ``.hydra/overrides.yaml`` (or ``overrides.yaml`` beside the metrics, as a study keeps
  them), ``.hydra/config.yaml`` and ``eval/step_<N>/trajectories.jsonl`` (or ``.jsonl.gz``,
  as a study keeps them);
- a wandb export, one folder per run: ``history.csv`` (``run.history(pandas=True)
  .to_csv()``, steps in ``_step`` or ``step``), ``config.json`` (``run.config``: our
  tracker logs the resolved config plus ``hydra.overrides``; a plain ``overrides`` list
  also works) and, for a finished run only, ``summary.json`` (``dict(run.summary)``).
  Trajectory files, when copied in as ``eval/step_<N>/trajectories.jsonl``, are used too.

An arm is the runs whose overrides are equal except ``seed`` and the placement keys
(``PLACEMENT_KEYS``: memory share, resume, device, admission rounds, the prefill's mode,
the engine's micro-batch limits, activation checkpointing, optimizer offload, compiled layers;
``hydra.*``). A key that has since moved is read under its new name (``parse_overrides``), so
an old run folder's ``trainer.compile_layers`` groups with a new one's ``engine.compile_layers``. A run is partial when it has
no ``summary.json`` (still running, or stopped) or, for a training run, when its last
logged step is below ``trainer.steps``; an arm is partial when one of its runs is.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from searchr1.analysis.compare import MISSING_AXIS, SKIP_DIRS, parse_overrides, read_history

RUN_FILES = ("metrics.jsonl", "summary.json", "history.csv", ".hydra/config.yaml",
             ".hydra/overrides.yaml")
SEED_KEY = "seed"
# overrides that say where and how a run was placed, not what it trains: runs differing only in
# these (arms sharing a GPU take a smaller memory share; a resumed run sets trainer.resume)
# belong to one arm; engine.admit_every and engine.admit_behind_window only regroup and reorder the
# sampler's prefills (the draws are equal);
# the engine's micro-batch limits only cut one call into forward passes, each normalised by the
# whole call's totals, so the gradient is the same (tests/engines/local/training/test_client.py);
# recomputed activations and compiled decoder layers give the same values and gradients
# (tests/engines/local/training/test_recompute.py, test_compiled.py), and offloaded AdamW
# moments move between host and GPU, not the step's math (engines/local/training/optimizer.py)
PLACEMENT_KEYS = frozenset({"engine.memory_fraction", "trainer.resume", "engine.device",
                            "engine.admit_every", "engine.admit_behind_window", "engine.prefill_graphs",
                            "engine.compile_prefill",
                            "trainer.max_padded_tokens_per_microbatch",
                            "trainer.max_datums_per_microbatch", "engine.activation_checkpointing",
                            "engine.offload_optimizer", "engine.compile_layers"})
EVAL_STEP = re.compile(r"^step_(\d+)$")
TRAJECTORY_FILES = ("trajectories.jsonl", "trajectories.jsonl.gz")  # the first found is read
QUESTION_COLUMNS = ("id", "source", "em", "format", "searches", "turns", "tokens")


class ReportInputError(ValueError):
    """Input the report cannot use; the command line prints it as one paragraph and exits 2."""


@dataclass
class Run:
    """One run: its overrides, per-step history, summary, config and per-question evals."""

    label: str
    source: str
    layout: str  # "run folder" or "wandb export"
    overrides: dict[str, Any]
    history: pd.DataFrame
    summary: dict[str, Any] | None  # None: no summary file (running or stopped)
    config: dict[str, Any]
    questions: dict[int, pd.DataFrame] = field(default_factory=dict)  # eval step → rows

    @property
    def seed(self) -> Any:
        return self.overrides.get(SEED_KEY, MISSING_AXIS)

    @property
    def arm_overrides(self) -> dict[str, Any]:
        return {k: v for k, v in self.overrides.items()
                if k != SEED_KEY and k not in PLACEMENT_KEYS and not k.startswith("hydra.")}

    @property
    def last_step(self) -> int | None:
        return int(self.history.index.max()) if len(self.history.index) else None

    def configured_steps(self) -> int | None:
        """``trainer.steps`` for a training run (override first, then the config), else None."""
        mode = str(self.overrides.get("mode", self.config.get("mode", "train")))
        if mode != "train":
            return None
        steps = self.overrides.get("trainer.steps", (self.config.get("trainer") or {}).get("steps"))
        try:
            return int(steps)
        except (TypeError, ValueError):
            return None

    def partial_reasons(self) -> list[str]:
        """Why this run is not finished: no summary, fewer steps than configured (or [])."""
        reasons = []
        if self.summary is None:
            reasons.append("no summary.json")
        configured, last = self.configured_steps(), self.last_step
        if configured is not None and (last is None or last < configured):
            reasons.append(f"{0 if last is None else last} of {configured} steps")
        return reasons

    def series(self, key: str) -> pd.Series:
        """Metric ``key`` by the steps that logged it (an eval metric such as ``eval/em/macro``:
        its eval steps; ``time/step_seconds``: every step), NaN rows dropped."""
        if key in self.history:
            return self.history[key].dropna()
        return pd.Series(dtype=float)


@dataclass
class Arm:
    """Runs with the same overrides except the seed."""

    label: str
    overrides: dict[str, Any]
    runs: list[Run]
    ident: str = ""  # "A1", "A2", ... in order of first appearance
    left_out: dict[str, Any] = field(default_factory=dict)  # usual values its label does not show

    def partial_runs(self) -> dict[str, list[str]]:
        return {r.label: why for r in self.runs if (why := r.partial_reasons())}

    @property
    def seeds(self) -> list[Any]:
        return [r.seed for r in self.runs]


# ------------------------------------------------------------------- finding and reading


def is_run_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in RUN_FILES)


def find_run_dirs(paths: Iterable[str | Path], skip: set[Path] = frozenset()) -> list[Path]:
    """Every run folder at or below ``paths``, numbered job folders in numeric order."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.resolve() in skip:
            continue
        if is_run_dir(path):
            found.append(path)
        elif path.is_dir():
            children = [c for c in path.iterdir() if c.is_dir() and c.name not in SKIP_DIRS
                        and not c.name.startswith(".")]
            children.sort(key=lambda c: (not c.name.isdigit(), int(c.name) if c.name.isdigit()
                                         else 0, c.name))
            found.extend(find_run_dirs(children, skip))
    return found


def _load_structured(path: Path, loader: Any) -> Any:
    try:
        return loader(path.read_text(encoding="utf-8"))
    except (ValueError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"{path} is malformed and cannot be read ({exc}). "
                               "Fix or remove the file and run the report again.") from None


def _json_dict(path: Path) -> dict | None:
    if not path.is_file():
        return None
    data = _load_structured(path, json.loads)
    if not isinstance(data, dict):
        raise ReportInputError(f"{path} should hold a JSON object, not {type(data).__name__}.")
    return data


def read_csv_history(path: Path) -> pd.DataFrame:
    """A wandb history CSV → one row per step (``_step`` or ``step``; ``_*`` columns dropped)."""
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"{path} is not a readable CSV ({exc}).") from None
    step = "_step" if "_step" in frame else "step" if "step" in frame else None
    if step is None:
        raise ReportInputError(f"{path} has no '_step' or 'step' column; a wandb history export "
                               "(run.history(pandas=True).to_csv()) keeps '_step'.")
    frame = frame.rename(columns={step: "step"}).dropna(subset=["step"])
    frame["step"] = frame["step"].astype(int)
    frame = frame[[c for c in frame.columns if not str(c).startswith("_")]]
    return frame.groupby("step", sort=True).last().apply(pd.to_numeric, errors="coerce")


def question_rows(records: Sequence[dict]) -> pd.DataFrame:
    """Trajectory records → one row per question id: EM, format, searches, turns, tokens.

    EM is ``scores.em`` (else ``scores.correct``, else reward ≥ 1); several records of one
    question are averaged, so a group of samples counts as one question's success rate.
    """
    rows = []
    for rec in records:
        scores = rec.get("scores") or {}
        em = scores.get("em", scores.get("correct"))
        if not isinstance(em, (int, float)):
            em = float(float(rec.get("reward") or 0.0) >= 1.0)
        fmt = scores.get("format")
        rows.append((str(rec.get("id")), str(rec.get("data_source") or "(none)"), float(em),
                     float(fmt) if isinstance(fmt, (int, float)) else math.nan,
                     float(rec.get("num_searches") or 0), float(len(rec.get("turns") or [])),
                     float(rec.get("num_tokens") or 0)))
    frame = pd.DataFrame(rows, columns=list(QUESTION_COLUMNS))
    return frame.groupby(["id", "source"], sort=True, as_index=False).mean()


def read_trajectories(path: Path) -> pd.DataFrame:
    """``trajectories.jsonl`` (or ``.jsonl.gz``) → question rows; a file with lines but no valid
    record is an error."""
    records, lines = [], 0
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as exc:  # BadGzipFile is an OSError
        raise ReportInputError(f"{path} is not a readable gzip file ({exc}).") from None
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        lines += 1
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short while the file was being written
        if isinstance(rec, dict) and "id" in rec:
            records.append(rec)
    if lines and not records:
        raise ReportInputError(f"{path} has {lines} lines but no trajectory record (a JSON object "
                               "with an 'id'); it is not an eval trajectories file.")
    return question_rows(records)


def read_evals(run_dir: Path) -> dict[int, pd.DataFrame]:
    """``eval/step_<N>/trajectories.jsonl`` of a run, by step (empty files skipped)."""
    out = {}
    eval_dir = run_dir / "eval"
    for child in sorted(eval_dir.iterdir()) if eval_dir.is_dir() else []:
        match = EVAL_STEP.match(child.name)
        found = [child / n for n in TRAJECTORY_FILES if (child / n).is_file()]
        if match and found:
            rows = read_trajectories(found[0])
            if len(rows):
                out[int(match.group(1))] = rows
    return dict(sorted(out.items()))


def load_run(run_dir: Path, label: str) -> Run:
    """One run folder or wandb export folder."""
    if (run_dir / "history.csv").is_file():
        config = _json_dict(run_dir / "config.json") or {}
        overrides = (config.get("hydra") or {}).get("overrides") or config.get("overrides") or []
        history, layout = read_csv_history(run_dir / "history.csv"), "wandb export"
    else:
        config_file = run_dir / ".hydra" / "config.yaml"
        config = _load_structured(config_file, yaml.safe_load) if config_file.is_file() else {}
        candidates = [run_dir / ".hydra" / "overrides.yaml", run_dir / "overrides.yaml"]
        found = next((p for p in candidates if p.is_file()), None)
        overrides = _load_structured(found, yaml.safe_load) if found else []
        history, layout = read_history(run_dir / "metrics.jsonl"), "run folder"
    if not isinstance(overrides, list):
        raise ReportInputError(f"the overrides of {run_dir} are not a list of 'key=value' strings.")
    return Run(label=label, source=str(run_dir), layout=layout,
               overrides=parse_overrides(overrides), history=history,
               summary=_json_dict(run_dir / "summary.json"), config=config or {},
               questions=read_evals(run_dir))


def load_runs(paths: Sequence[str | Path], skip: Sequence[Path] = (),
              assume: Sequence[str] = ()) -> list[Run]:
    """Runs under ``paths`` labelled by their path below the common ancestor; none → error.

    ``assume`` (``KEY=VALUE``, the report's ``--assume``): a run that does not override KEY
    is read as if it did with VALUE — for an option whose default changed during a study,
    so that runs made before the change join the arms of the runs that pin the old value.
    """
    assumed = parse_overrides(list(assume))
    bad = [a for a in assume if "=" not in a]
    if bad:
        raise ReportInputError(f"--assume takes KEY=VALUE, not {', '.join(bad)}.")
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise ReportInputError(f"no such file or folder: {', '.join(missing)}.")
    dirs = [d.resolve() for d in find_run_dirs(paths, {Path(s).resolve() for s in skip})]
    if not dirs:
        raise ReportInputError(
            f"no runs found under {', '.join(map(str, paths))}: a run folder holds one of "
            f"{', '.join(RUN_FILES)}; give run "
            "folders, sweep folders or wandb export folders.")
    root = Path(os.path.commonpath(dirs)) if len(dirs) > 1 else dirs[0].parent
    runs = [load_run(d, str(d.relative_to(root)) if d != root else d.name) for d in dirs]
    for run in runs:
        run.overrides = {**assumed, **run.overrides}
    return runs


def has_eval(run: Run) -> bool:
    """Whether the run logged an eval (per-question rows or ``eval/em/macro``)."""
    return bool(run.questions) or bool(len(run.series("eval/em/macro")))
