"""The dev eval before and after training, side by side, with what a change of that size means.

The default run evaluates 8 dev questions (2 per source) before and after 3 steps. One answer
there moves a source's EM by 0.5 and the macro EM by 0.125, so "em/macro 0.500 → 0.250" is
read by a newcomer as damage when it is noise. Beside every change the table prints a 95%
paired bootstrap interval over the questions: each resample draws one set of questions
(within each data source, as the eval set's per-source counts are fixed) shared by before and
after, so a question's difficulty cancels out (``analysis/report/bootstrap.paired``). Under
the table: what the run does show (the loop trains: trained tokens, degenerate groups, the
format rate of the sampled trajectories, per step), and, when the macro EM's interval holds 0,
where learning is shown instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from searchr1.analysis.report.bootstrap import paired

RESAMPLES, LEVEL, SEED = 2000, 0.95, 0
EVAL_PREFIXES = ("eval/em/", "eval/format_rate", "eval/searches", "eval/no_search_rate", "eval/turns")
LEARNING = ("experiments/world_learning/README.md shows it on one GPU: +23 to +35 points of "
            "held-out macro EM in 100 steps of 128 trajectories")
STEP_FIGURES = (("train/loss_tokens_per_rollout_batch", "trained tokens", "{:.0f}"),
                ("rollout/degenerate_group_rate", "degenerate groups", "{:.2f}"),
                ("reward/format", "format of sampled trajectories", "{:.2f}"))


def read_questions(path: Path) -> list[dict] | None:
    """Per-question records of an eval's ``trajectories.jsonl``; None when it is missing."""
    if not path.is_file():
        return None
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        scores = r.get("scores") or {}
        out.append({"id": r["id"], "source": r["data_source"], "em": float(scores.get("em", 0.0)),
                    "format": float(scores.get("format", 0.0)), "searches": float(r["num_searches"]),
                    "turns": float(len(r["turns"]))})
    return out


def _column(name: str, rows: list[dict]) -> tuple[np.ndarray, list[str], bool] | None:
    """(per-question values, strata, macro) behind the metric ``name``; None if unknown."""
    part = name.split("/")
    if part[0] in ("em", "searches") and len(part) == 2 and part[1] not in ("micro",):
        field = "em" if part[0] == "em" else "searches"
        if part[1] == "macro":
            return np.array([r[field] for r in rows]), [r["source"] for r in rows], True
        keep = [r for r in rows if r["source"] == part[1]]
        return np.array([r[field] for r in keep]), [part[1]] * len(keep), False
    values = {"em/micro": "em", "format_rate": "format", "searches": "searches", "turns": "turns"}
    if name in values:
        return np.array([r[values[name]] for r in rows]), ["all"] * len(rows), False
    if name == "no_search_rate":
        return np.array([float(r["searches"] == 0) for r in rows]), ["all"] * len(rows), False
    return None


def change_intervals(before: list[dict], after: list[dict], names: list[str]) -> dict[str, tuple]:
    """``name → (low, high)`` of the after − before change, for the rows both evals share."""
    if [r["id"] for r in before] != [r["id"] for r in after] or not before:
        return {}
    rng = np.random.default_rng(SEED)
    out = {}
    for name in names:
        a, b = _column(name, before), _column(name, after)
        if a is None or not len(a[0]):
            continue
        iv = paired(a[0][None, :], b[0][None, :], a[1], macro=a[2], n_resamples=RESAMPLES, rng=rng,
                    level=LEVEL)
        out[name] = (iv.low, iv.high)
    return out


def format_before_after(before: dict[str, float], after: dict[str, float], step: int,
                        intervals: dict[str, tuple] | None = None) -> str:
    """The eval metrics before training and after ``step`` steps, side by side, with the
    change's interval where ``intervals`` has one."""
    keys = [k for k in before if k.startswith(EVAL_PREFIXES) and k in after]
    rows = [(k.removeprefix("eval/"), before[k], after[k]) for k in sorted(keys)]
    width = max((len(r[0]) for r in rows), default=6)
    iv = intervals or {}
    head = f"{'eval (dev)':<{width}}  {'before':>8}  {f'step {step}':>8}  {'change':>8}"
    lines = [head + (f"  {'95% interval':>18}" if iv else "")]
    for name, b, a in rows:
        low, high = iv.get(name, (math.nan, math.nan))
        cell = f"  [{low:+.3f}, {high:+.3f}]" if name in iv else ""
        lines.append(f"{name:<{width}}  {b:8.3f}  {a:8.3f}  {a - b:+8.3f}{cell}")
    return "\n".join(lines)


def _series(values: list[float], fmt: str) -> str:
    if len(values) <= 6:
        return " / ".join(fmt.format(v) for v in values)
    return f"{fmt.format(min(values))}–{fmt.format(max(values))} per step"


def run_note(step_rows: list[dict[str, float]], questions: int, intervals: dict[str, tuple]) -> str:
    """What the run shows under the table: the interval's meaning, the loop's own figures,
    and (when the macro EM's change is within its interval) where learning is shown."""
    lines = []
    if intervals:
        lines.append(f"95% interval: paired bootstrap over the {questions} dev questions (within each "
                     "source); a change whose interval holds 0 is within the noise of this eval.")
    if step_rows:
        figures = [f"{label} {_series([r[key] for r in step_rows if key in r], fmt)}"
                   for key, label, fmt in STEP_FIGURES if any(key in r for r in step_rows)]
        lines.append(f"This run shows that the loop trains: {len(step_rows)} steps; "
                     + "; ".join(figures) + ".")
    low, high = intervals.get("em/macro", (math.nan, math.nan))
    if not (low > 0 or high < 0):
        lines.append("Whether training improves the policy takes more questions and steps than "
                     f"this: {LEARNING}.")
    return "\n".join(lines)


def before_after_report(before: dict[str, float], after: dict[str, float], step: int,
                        before_file: Path, after_file: Path, step_rows: list[dict[str, float]]) -> str:
    """The table and the note, from the two evals' metrics and their trajectory files."""
    b, a = read_questions(before_file), read_questions(after_file)
    names = [k.removeprefix("eval/") for k in before if k.startswith(EVAL_PREFIXES) and k in after]
    intervals = change_intervals(b, a, names) if b is not None and a is not None else {}
    table = format_before_after(before, after, step, intervals)
    return table + "\n" + run_note(step_rows, len(b or []), intervals)
