"""``results.md`` and ``claims.md``: the report's tables as markdown.

Every estimate is printed as ``mean [low, high]`` (the bootstrap interval); differences
carry a sign. Each table says how its intervals were made, and any estimate that fell back
to seeds only is listed under the table with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

import numpy as np

from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.claims import ClaimResult, PendingClaim, paper_text
from searchr1.analysis.report.curves import DIGITS
from searchr1.analysis.report.gaps import Gap
from searchr1.analysis.report.arms import left_out_values, shared_overrides
from searchr1.analysis.report.loading import Arm, Run
from searchr1.analysis.report.measures import (Estimate, Settings, arm_estimate, common_step,
                                               curve_figures, difference, macro_series,
                                               parse_metric)
from searchr1.analysis.report.timing import ArmTime, arm_time

SUMMARY_METRICS = (("em/macro", "macro EM"), ("em/micro", "micro EM"),
                   ("format_rate", "format rate"), ("searches", "searches/traj"))
MAX_PAIRS = 28  # all pairs of up to 8 arms; beyond that, each arm against the first


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def number(value: float, signed: bool = False, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def estimate_text(est: Estimate, signed: bool = False, digits: int = 3) -> str:
    """``0.346 [0.310, 0.382]``; a single seed's seeds-only interval is just its value."""
    iv = est.interval
    if not math.isfinite(iv.point):
        return "-"
    if not math.isfinite(iv.low) or iv.low == iv.high == iv.point:
        return number(iv.point, signed, digits)
    return (f"{number(iv.point, signed, digits)} [{number(iv.low, signed, digits)}, "
            f"{number(iv.high, signed, digits)}]")


def _steps_text(steps: Sequence[int | None]) -> str:
    found = sorted({s for s in steps if s is not None})
    return ", ".join(map(str, found)) or "-"


Notes = dict[tuple[str, str], list[str]]  # (arm or pair, reason) → the columns it applies to


def _note(notes: Notes, who: str, what: str, est: Estimate) -> str:
    """Record a seeds-only fallback and return the mark that flags the cell."""
    if est.note:
        notes.setdefault((who, est.note.removeprefix("seeds only: ")), []).append(what)
        return " †"
    return ""


def _notes_block(notes: Notes) -> list[str]:
    if not notes:
        return []
    lines = [f"- {who} ({', '.join(whats)}): {why}." for (who, why), whats in notes.items()]
    return ["", "† intervals over seeds only, without per-question data:", *lines]


def header_section(inputs: Sequence[str], settings: Settings, n_runs: int) -> list[str]:
    pct = f"{settings.level:.0%}"
    return [
        "# Study report", "",
        f"Inputs: {', '.join(f'`{p}`' for p in inputs)} ({n_runs} runs).", "",
        f"Intervals: {pct} percentile bootstrap, {settings.n_resamples} resamples, generator seed "
        f"{settings.seed} (each interval starts from that seed, so each is reproducible alone). "
        "An arm is the runs sharing every override except `seed` and where it was placed "
        "(`engine.memory_fraction`, `trainer.resume`, `engine.device`, the engine's micro-batch "
        "limits and the like: `PLACEMENT_KEYS`). An arm's value is the mean over "
        "its seeds; its interval comes from a hierarchical bootstrap that resamples seeds, then "
        "questions within each seed and source, from the per-question eval results "
        "(`eval/step_<N>/trajectories.jsonl`). A difference B − A is paired on the same questions: "
        "each resample draws one question set for both arms and resamples each arm's seeds "
        "independently. Resampling both levels counts each answer's own noise twice, so these "
        "intervals are conservative: with no true difference (3 seeds × 120 questions, simulated) "
        "a 95 % paired interval excludes zero in about 1 % of replications, not 5 %. "
        "Without per-question data an interval is over seeds only (marked †): "
        "with few seeds it is narrow and optimistic (with two it spans at most the two seeds' "
        "values), and with one seed there is none — read it as a range, not a confidence "
        "interval.", "",
        "Macro EM is the mean over data sources of each source's EM; micro EM the mean over "
        "questions. \"final\" is each run's last eval.", ""]


def arms_section(arms: Sequence[Arm], skipped: Sequence[Run]) -> list[str]:
    """The arms: their distinguishing overrides, seeds, progress and partial marks."""
    rows = []
    for arm in arms:
        partial = arm.partial_runs()
        status = "partial: " + "; ".join(f"{r} ({', '.join(w)})" for r, w in partial.items()) \
            if partial else "complete"
        last = [r.last_step for r in arm.runs]
        rows.append([arm.ident, arm.label, ", ".join(r.label for r in arm.runs), ", ".join(map(str, arm.seeds)),
                     "/".join("-" if s is None else str(s) for s in last), status])
    shared = ", ".join(f"`{k}={v}`" for k, v in shared_overrides(arms).items()) or "none"
    usual = ", ".join(f"`{k}={v}`" for k, v in left_out_values(arms).items())
    lines = ["## Arms", "", table(["id", "arm", "runs", "seeds", "last step per seed", "status"], rows), "",
             f"Overrides shared by every arm: {shared}.", ""]
    if usual:
        lines += [f"Labels leave out a key where the arm has the value most arms have: {usual}.", ""]
    lines += ["A run is partial when it has no `summary.json` (still running or stopped) or logged "
              "fewer steps than `trainer.steps`; its figures are from the evals it reached.", ""]
    if skipped:
        lines += ["Runs without any eval, left out: " + ", ".join(f"`{r.label}`" for r in skipped), ""]
    return lines


NO_TIME = "—"


def _seconds(value: float) -> str:
    """``3.75``, ``414``: three significant digits below 100 s, whole seconds above."""
    if not math.isfinite(value):
        return NO_TIME
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _time_row(arm: Arm, t: ArmTime) -> list[str]:
    step = _seconds(t.step)
    if math.isfinite(t.step) and t.step_low < t.step_high:
        step += f" ({_seconds(t.step_low)}–{_seconds(t.step_high)})"
    wall = NO_TIME if not t.wall_runs else f"{t.wall_minutes:.1f}"
    if 0 < t.wall_runs < t.runs:
        wall += f" ({t.wall_runs} of {t.runs} runs)"
    return [arm.ident, arm.label, str(t.runs), step, _seconds(t.rollout), _seconds(t.train),
            _seconds(t.eval), wall]


def time_section(arms: Sequence[Arm]) -> list[str]:
    """Each arm's step, rollout, train and eval seconds and wall minutes (``timing``); nothing
    when no run logged any time."""
    times = [arm_time(arm) for arm in arms]
    if not any(t.logged() for t in times):
        return []
    rows = [_time_row(arm, t) for arm, t in zip(arms, times)]
    head = ["id", "arm", "runs", "step s (min–max of runs)", "rollout s", "train s",
            "eval s per eval", "wall min"]
    return ["## Time per arm", "", table(head, rows), "",
            "Step, rollout and train: the median over runs of each run's median; eval: the median "
            "over every eval of the arm's runs; wall: the median of `summary.json`'s "
            f"`wall_seconds` over the runs that wrote one (a resumed run's counts only its last "
            f"launch); {NO_TIME}: not logged.", "",
            "Times come from the runs' own logs and depend on how many arms shared the GPU, "
            "which the report does not know.", ""]


def final_section(arms: Sequence[Arm], settings: Settings) -> list[str]:
    notes: Notes = {}
    rows = []
    for arm in arms:
        row, steps = [arm.ident], []
        for name, title in SUMMARY_METRICS:
            est = arm_estimate(arm, parse_metric(name), "final", settings)
            row.append(estimate_text(est) + _note(notes, arm.ident, title, est))
            steps += est.steps
        rows.append(row + [_steps_text(steps)])
    head = ["arm", *(title for _, title in SUMMARY_METRICS), "eval step(s)"]
    return ["## Final eval", "", table(head, rows), *_notes_block(notes), ""]


def source_section(arms: Sequence[Arm], sources: Sequence[str], settings: Settings) -> list[str]:
    if not sources:
        return []
    notes: Notes = {}
    rows = []
    for arm in arms:
        row = [arm.ident]
        for source in sources:
            est = arm_estimate(arm, parse_metric(f"em/{source}"), "final", settings)
            row.append(estimate_text(est) + _note(notes, arm.ident, source, est))
        rows.append(row)
    return ["## Final EM per source", "", table(["arm", *sources], rows), *_notes_block(notes), ""]


def _pairs(n: int, baseline: int | None = None) -> list[tuple[int, int]]:
    """Every pair of arms while they are few (``MAX_PAIRS``), else the first arm against each
    other; ``baseline`` given: that arm (as A) against each other."""
    if baseline is not None:
        return [(baseline, j) for j in range(n) if j != baseline]
    pairs = list(combinations(range(n), 2))
    return pairs if len(pairs) <= MAX_PAIRS else [(0, j) for j in range(1, n)]


def pairs_section(arms: Sequence[Arm], settings: Settings, baseline: Arm | None = None) -> list[str]:
    if len(arms) < 2:
        return []
    notes: Notes = {}
    rows = []
    metric = parse_metric("em/macro")
    base = None if baseline is None else next(i for i, arm in enumerate(arms) if arm is baseline)
    for i, j in _pairs(len(arms), base):
        step: str | int = "final"
        if arms[i].partial_runs() or arms[j].partial_runs():  # finals of unequal length: compare
            shared = common_step([*arms[i].runs, *arms[j].runs], metric)  # at the last shared eval
            step = -1 if shared is None else shared
        est = difference(arms[i], arms[j], metric, step, settings)
        iv = est.interval
        call = "-" if math.isnan(iv.point) else ("B > A" if iv.low > 0 else "B < A" if iv.high < 0
                                                 else "no clear difference")
        n_q = "-" if iv.n_questions is None else str(iv.n_questions)
        rows.append([arms[i].ident, arms[j].ident, "final" if step == "final" else
                     ("-" if step == -1 else str(step)), estimate_text(est, signed=True)
                     + _note(notes, f"{arms[j].ident} − {arms[i].ident}", "macro EM", est), n_q, call])
    against = "" if base is None else f" Arm A is {arms[base].ident}, the baseline (`--baseline`)."
    return ["## Paired differences (macro EM)", "",
            "At each run's final eval when both arms are complete, else at the last eval step "
            "every run of the two arms reached (a partial arm's last eval is not its final one)."
            + against, "",
            table(["A", "B", "step", "B − A", "questions", "call"], rows), *_notes_block(notes), ""]


def _spread(values: Sequence[float], integer: bool = False) -> str:
    """``0.312 (0.296/0.328)``: the mean over seeds, then each seed's value (``-``: undefined)."""
    arr = np.asarray(values, dtype=float)
    fin = arr[np.isfinite(arr)]
    if not len(fin):
        return "-"

    def show(v: float) -> str:
        return "-" if not math.isfinite(v) else f"{v:.0f}" if integer else number(v)

    mean = f"{fin.mean():.1f}" if integer and len(arr) > 1 else show(fin.mean())
    return mean if len(arr) == 1 else f"{mean} ({'/'.join(show(v) for v in arr)})"


def curves_section(arms: Sequence[Arm], settings: Settings) -> list[str]:
    rows = []
    for arm in arms:
        curves = [curve_figures(macro_series(r), settings.collapse_fraction) for r in arm.runs]
        rows.append([arm.ident, _spread([c.final for c in curves]),
                     _spread([c.final_step for c in curves], integer=True),
                     _spread([c.steps_to_90 for c in curves], integer=True),
                     _spread([c.max_drop for c in curves]),
                     str(sum(c.collapses for c in curves)), str(sum(c.evals for c in curves))])
    frac = f"{settings.collapse_fraction:g}"
    return ["## Learning curves (macro EM)", "",
            table(["arm", "final EM", "final step", "steps to 90% of final", "largest drop",
                   "collapses", "evals"], rows), "",
            "Mean over seeds, then each seed's value. Steps to 90 %: the first eval step whose macro "
            "EM is at least 0.9 × that seed's final macro EM (undefined when the final is 0). "
            "Largest drop: the biggest fall of macro EM between two consecutive evals. Collapses: "
            f"evals whose macro EM is below {frac} × the best earlier eval of the same seed "
            "(counted once that best is above 0), summed over seeds.", ""]


NOT_RUN = "not run yet"


def claims_table(results: Sequence[ClaimResult | PendingClaim], settings: Settings) -> str:
    """The study README's table: paper claim → world result (interval) → verdict."""
    pct = f"{settings.level:.0%}"
    rows = []
    for res in results:
        c = res.claim
        if isinstance(res, PendingClaim):
            rows.append([c.text, c.claimed(), paper_text(c.paper),
                         f"no run of {res.missing} yet", "-", f"**{NOT_RUN}**"])
            continue
        note = " (seeds only)" if res.diff.note else ""
        partial = " (partial arm)" if res.arm_a.partial_runs() or res.arm_b.partial_runs() else ""
        digits = DIGITS.get(c.sides()[1][0], 3)
        rows.append([c.text, c.claimed(), paper_text(c.paper),
                     f"{estimate_text(res.a, digits=digits)} → {estimate_text(res.b, digits=digits)}",
                     estimate_text(res.diff, signed=True, digits=digits) + note + partial,
                     f"**{res.verdict}**"])
    return table(["paper claim", "claimed", "paper (A → B)", "world A → B", f"B − A ({pct} CI)",
                  "verdict"], rows)


def _claim_line(result: ClaimResult) -> str:
    """Which arms (or which measurements of one arm) a claim compared, at which steps."""
    c, a, b = result.claim, result.arm_a, result.arm_b
    if not c.within:
        return (f"- \"{c.text}\": A = {a.ident} [{a.label}], B = {b.ident} [{b.label}], step "
                f"{c.step} ({_steps_text(result.diff.steps)})")
    (metric_a, step_a), (metric_b, step_b) = c.sides()
    return (f"- \"{c.text}\": one arm, {a.ident} [{a.label}], each seed against itself: "
            f"A = {metric_a} at step {step_a} ({_steps_text(result.a.steps)}), "
            f"B = {metric_b} at step {step_b} ({_steps_text(result.b.steps)})")


def claims_section(results: Sequence[ClaimResult | PendingClaim], settings: Settings) -> list[str]:
    if not results:
        return []
    arms = [_claim_line(r) if isinstance(r, ClaimResult)
            else f"- \"{r.claim.text}\": {NOT_RUN}, no run of {r.missing}" for r in results]
    return ["## Claims", "", claims_table(results, settings), "",
            f"{bs.REPRODUCED}: the interval of B − A excludes 0 on the claimed side; "
            f"{bs.OPPOSITE}: it excludes 0 on the other side; {bs.INCONCLUSIVE}: it contains 0; "
            f"{bs.FEW_SEEDS}: it excludes 0, but an arm has fewer than {settings.min_seeds} seeds, "
            "so how far another seed would land is not in the interval; "
            f"{NOT_RUN}: an arm it compares has no run yet.", "",
            *arms, ""]


GAP_MARKS = {bs.REPRODUCED: " ✓", bs.OPPOSITE: " ✗", bs.FEW_SEEDS: " ?"}


def gaps_section(gaps: Sequence[tuple[ClaimResult, list[Gap]]], settings: Settings) -> list[str]:
    """Each claim's B − A at every eval step both arms reached (``gaps``), one row a claim."""
    if not gaps:
        return []
    steps = sorted({g.step for _, rows in gaps for g in rows})
    body = []
    for result, rows in gaps:
        by_step = {g.step: g for g in rows}
        cells = [number(by_step[s].diff.interval.point, signed=True) + GAP_MARKS.get(by_step[s].verdict, "")
                 if s in by_step else "" for s in steps]
        body.append([result.claim.text, *cells])
    pct = f"{settings.level:.0%}"
    return ["## Claims over training", "",
            f"B − A of each claim at every eval step all runs of both arms reached, paired on the "
            f"same questions as in the claims table (a claim about one arm: each seed against itself, "
            f"its fixed step, e.g. 0, against each later step). ✓: that step's {pct} interval excludes 0 on "
            "the claimed side; ✗: on the other side; ?: it excludes 0 but an arm has fewer than "
            f"{settings.min_seeds} seeds; no mark: it contains 0. Each step's interval "
            "is read alone (with ten steps, one may exclude 0 by chance), so a claim's verdict is "
            "the one at the step the claims file names. `claim_gaps.csv` has every interval, "
            "`claim_gaps.png` draws them.", "",
            table(["claim", *map(str, steps)], body), ""]


def write_markdown(path: Path, sections: Sequence[list[str]]) -> Path:
    path.write_text("\n".join(line for sec in sections for line in sec).rstrip() + "\n",
                    encoding="utf-8")
    return path
