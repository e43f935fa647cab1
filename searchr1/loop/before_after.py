"""The dev eval before and after training, side by side, with what a change of that size means.

The default run evaluates 8 dev questions (2 per source) before and after 3 steps. One answer
there moves a source's EM by 0.5 and the macro EM by 0.125, so "em/macro 0.500 → 0.250" was
read by a newcomer as damage when it is noise. Beside every change of a yes/no metric (EM,
format, no-search) the table prints a 95% interval for the paired difference: each question
falls in one of four cells (yes before and after, before only, after only, neither); the cells'
shares get the Jeffreys posterior, Dirichlet(counts + ½), and the interval is the central 95%
of share(after only) − share(before only) over ``DRAWS`` seeded draws. It keeps its width at a
handful of questions, where a bootstrap collapses (two questions of a source that both changed
resample to the same change every time: an interval of width 0, which the default run showed):
8 questions with 2 answers lost give about [−0.53, +0.10], 8 unchanged ones [−0.21, +0.21]. The
macro EM weighs each question by 1 / (sources × its source's size), fractional counts when the
sources differ in size. Under the table: what the run does show (the loop trains: trained
tokens, degenerate groups, the format rate of the sampled trajectories, per step), and, when the
macro EM's interval holds 0, where learning is shown instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
import numpy as np

LEVEL, DRAWS, SEED = 0.95, 20_000, 0
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


def paired_difference(before: list[float], after: list[float], weights: list[float],
                      level: float = LEVEL, draws: int = DRAWS, seed: int = SEED) -> tuple[float, float]:
    """The central ``level`` interval of after − before, 0/1 outcomes paired by question
    (Jeffreys posterior of the four cells; see the module docstring)."""
    cells = np.zeros(4)  # (yes, yes), (yes, no), (no, yes), (no, no)
    for x, y, w in zip(before, after, weights):
        cells[2 * (1 - int(x)) + (1 - int(y))] += w
    shares = np.random.default_rng(seed).dirichlet(cells + 0.5, draws)
    low, high = np.quantile(shares[:, 2] - shares[:, 1], [(1 - level) / 2, (1 + level) / 2])
    seen = (cells[2] - cells[1]) / cells.sum()  # at the extremes the prior pulls the interval off
    return float(min(low, seen)), float(max(high, seen))  # the change seen; it stays inside (as
    # Jeffreys' interval for one proportion takes 0 or 1 as its limit when all or none succeed)


def _binary_column(name: str, rows: list[dict]) -> tuple[list[float], list[float]] | None:
    """(per-question 0/1 values, weights) behind the yes/no metric ``name``; None otherwise."""
    part = name.split("/")
    if part[0] == "em" and len(part) == 2:
        if part[1] == "macro":  # mean over sources of per-source means
            sizes = {s: sum(r["source"] == s for r in rows) for s in {r["source"] for r in rows}}
            scale = len(rows) / len(sizes)
            return [r["em"] for r in rows], [scale / sizes[r["source"]] for r in rows]
        keep = rows if part[1] == "micro" else [r for r in rows if r["source"] == part[1]]
        return [r["em"] for r in keep], [1.0] * len(keep)
    if name == "format_rate":
        return [r["format"] for r in rows], [1.0] * len(rows)
    if name == "no_search_rate":
        return [float(r["searches"] == 0) for r in rows], [1.0] * len(rows)
    return None


def change_intervals(before: list[dict], after: list[dict], names: list[str]) -> dict[str, tuple]:
    """``name → (low, high)`` of the after − before change, for the yes/no rows both evals share."""
    if [r["id"] for r in before] != [r["id"] for r in after] or not before:
        return {}
    out = {}
    for name in names:
        b, a = _binary_column(name, before), _binary_column(name, after)
        if b is None or not b[0] or any(v not in (0.0, 1.0) for v in b[0] + a[0]):
            continue
        out[name] = paired_difference(b[0], a[0], b[1])
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
        lines.append(f"95% interval of a yes/no metric's change over the {questions} dev questions, "
                     "paired by question (Jeffreys posterior); a change whose interval holds 0 is "
                     "within the noise of this eval.")
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
