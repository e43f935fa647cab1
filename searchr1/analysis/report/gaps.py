"""Each claim's B − A at every eval step both arms reached: how a verdict moves over training.

The claims table judges a claim at one step (its ``step``: final, common or a number). Arms'
curves can cross, so the same pair may be apart at step 60 and level at step 100. These gaps
show the whole course: at each eval step every run of both arms reached, the same paired
bootstrap as the claims table and the verdict its interval alone would give.

Each step's interval is read alone. Looking at ten steps gives ten chances for one to
exclude zero by luck, so the claim's verdict stays the one at the step the claims file names;
the gaps say when a difference appears, holds or fades. ``claim_gaps.csv`` has every value.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from searchr1.analysis.report.claims import ClaimResult, claim_difference, judge
from searchr1.analysis.report.curves import is_curve_metric
from searchr1.analysis.report.measures import Estimate, Settings, eval_steps, parse_metric

CSV_COLUMNS = ("claim", "metric", "step", "b_minus_a", "low", "high", "verdict", "note")


@dataclass(frozen=True)
class Gap:
    step: int
    diff: Estimate
    verdict: str


def shared_steps(result: ClaimResult) -> list[int]:
    """Eval steps every run of both arms has (per-question files when all runs have them)."""
    metric = parse_metric(result.claim.sides()[1][0])
    runs = [*result.arm_a.runs, *result.arm_b.runs]
    per_question = all(r.questions for r in runs)
    return sorted(set.intersection(*(set(eval_steps(r, metric, per_question)) for r in runs)))


def claim_gaps(result: ClaimResult, settings: Settings) -> list[Gap]:
    """B − A with its interval and verdict at each shared eval step, in step order. A claim
    about one arm with a fixed step on one side (step 0 against later steps) is measured at
    every other step; at its own fixed step it would compare a thing with itself."""
    claim, gaps = result.claim, []
    for step in shared_steps(result):
        side_a, side_b = claim.sides(step)
        if claim.within and side_a == side_b:
            continue
        diff = claim_difference(claim, result.arm_a, result.arm_b, settings, step)
        gaps.append(Gap(step, diff, judge(diff, claim, [result.arm_a, result.arm_b], settings)))
    return gaps


def all_gaps(results: Sequence[object], settings: Settings) -> list[tuple[ClaimResult, list[Gap]]]:
    """The gaps of every checked claim on an eval metric (claims whose arms have not run, and
    claims on a whole curve's figure, are skipped)."""
    return [(r, claim_gaps(r, settings)) for r in results
            if isinstance(r, ClaimResult) and not is_curve_metric(r.claim.metric)]


def write_csv(path: Path, gaps: Sequence[tuple[ClaimResult, list[Gap]]]) -> Path:
    """One row per claim and step: the difference, its interval, the verdict alone."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for result, rows in gaps:
            for gap in rows:
                iv = gap.diff.interval
                writer.writerow([result.claim.text, result.claim.measured(), gap.step,
                                 f"{iv.point:.6f}", f"{iv.low:.6f}", f"{iv.high:.6f}",
                                 gap.verdict, gap.diff.note])
    return path
