"""The claims spec: a YAML list of comparisons, each checked against the runs.

    - claim: "GRPO beats the lab's algorithm on macro EM"   # the paper's claim, in words
      a: {experiment: lab_world}                            # arm A: overrides it must have
      b: {experiment: paper_grpo_world, rollout.mask_observations: null}
      metric: em/macro        # optional (default em/macro): em/<source>, format_rate, ...,
                              # or a learning-curve figure: curve/steps_to_90, curve/max_drop,
                              # curve/collapses (``curves``: the curve up to ``step``)
      step: final             # optional: final (default) | common | a step number
      direction: b>a          # the claimed sign of B − A: b>a or b<a
      paper: {a: 0.30, b: 0.35}   # optional: the paper's numbers (or a line of text)

An arm is selected by overrides: it must carry every listed key with that value (``null``
means "not overridden"); the selection must match exactly one arm, so a claim never
silently averages two arms. The seed is never a selector — an arm is all its seeds.
A claim is reproduced when the interval of B − A excludes zero on the claimed side and
both arms have at least ``min_seeds`` seeds (2 by default): an arm of one seed says nothing
of how far another seed would land, so its decisive interval is called "too few seeds".

A claim about one arm measures it twice, and each seed is compared with itself:

    - claim: "searches per trajectory rise during training"
      arm: {experiment: paper_grpo_world}    # the one arm (a selector as above)
      a: {step: 0}                           # A and B: this arm's metric and step, each
      b: {step: common}                      # defaulting to the claim's own
      metric: searches
      direction: b>a
    - claim: "3-hop questions get more searches than 1-hop ones"
      arm: {experiment: paper_grpo_world}
      a: {metric: searches/world_1hop}       # two metrics: one measure, two sources
      b: {metric: searches/world_3hop}
      step: common
      direction: b>a
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from searchr1.analysis.compare import MISSING_AXIS, typed_value
from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.curves import check_curve_metric, curve_estimate, is_curve_metric, last_step
from searchr1.analysis.report.loading import SEED_KEY, Arm, ReportInputError
from searchr1.analysis.report.measures import (Estimate, Settings, arm_estimate, common_step,
                                               difference, parse_metric, within_difference)

DIRECTIONS = {"b>a": 1, "a<b": 1, "b<a": -1, "a>b": -1}
FIELDS = {"claim", "a", "b", "arm", "metric", "step", "direction", "paper"}
SIDE_FIELDS = {"metric", "step"}  # what A and B of a claim about one arm may set


@dataclass(frozen=True)
class Claim:
    text: str
    a: dict[str, Any]
    b: dict[str, Any]
    metric: str
    step: str | int
    direction: int  # +1: B > A claimed, −1: B < A
    paper: Any
    within: bool = False  # one arm (``arm``), measured as ``side_a`` and ``side_b``
    side_a: tuple[str, str | int] | None = None  # (metric, step) of A, where it is not the claim's
    side_b: tuple[str, str | int] | None = None

    def sides(self, step: str | int | None = None) -> tuple[tuple[str, str | int], tuple[str, str | int]]:
        """(metric, step) of A and of B. ``step`` (the gaps' eval step) replaces every step that
        is not a fixed number, so "step 0 against each later step" stays anchored at 0."""
        def at(side: tuple[str, str | int] | None) -> tuple[str, str | int]:
            metric, own = side or (self.metric, self.step)
            return metric, own if step is None or isinstance(own, int) else step
        return at(self.side_a), at(self.side_b)

    def measured(self) -> str:
        """The metric B − A is taken of: ``em/macro``, or ``searches/world_3hop − searches/world_1hop``."""
        (metric_a, _), (metric_b, _) = self.sides()
        return metric_b if metric_a == metric_b else f"{metric_b} − {metric_a}"

    def claimed(self) -> str:
        """What is claimed, e.g. ``em/macro: B > A`` or ``searches: step common > step 0``."""
        sign = ">" if self.direction > 0 else "<"
        if not self.within:
            return f"{self.metric}: B {sign} A"
        (metric_a, step_a), (metric_b, step_b) = self.sides()
        if metric_a == metric_b:
            return f"{metric_a}: step {step_b} {sign} step {step_a}"
        return f"{metric_b} {sign} {metric_a}"


class NoArmError(ReportInputError):
    """A selector that matches no arm: a typo, or an arm of a running study not started yet."""


@dataclass(frozen=True)
class PendingClaim:
    """A claim one of whose arms has no run yet (``--pending``): listed as not run."""

    claim: Claim
    missing: str  # the selector that matched nothing, as ``key=value, ...``


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    arm_a: Arm
    arm_b: Arm
    a: Estimate
    b: Estimate
    diff: Estimate
    verdict: str


def _problem(path: Path, index: int, text: str) -> ReportInputError:
    return ReportInputError(f"{path}, claim {index + 1}: {text}. Each claim is a mapping with "
                            "'claim', 'a', 'b' (override selectors), 'direction' (b>a or b<a) and "
                            "optional 'metric', 'step', 'paper'.")


def _step(value: Any) -> str | int:
    if value in ("final", "common"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"step must be final, common or a step number, not {value!r}")


def parse_claim(entry: Any, path: Path, index: int) -> Claim:
    """One validated claim; every mistake names the file, the claim and the field."""
    if not isinstance(entry, dict):
        raise _problem(path, index, f"expected a mapping, got {type(entry).__name__}")
    unknown = set(entry) - FIELDS
    missing = {"claim", "a", "b", "direction"} - set(entry)
    if unknown or missing:
        parts = [f"unknown fields {sorted(unknown)}"] * bool(unknown)
        raise _problem(path, index, "; ".join(parts + [f"missing {sorted(missing)}"] * bool(missing)))
    if "arm" in entry:
        return parse_within(entry, path, index)
    for side in ("a", "b"):
        if not isinstance(entry[side], dict) or not entry[side]:
            raise _problem(path, index, f"'{side}' must be a non-empty mapping of overrides")
        if SEED_KEY in entry[side]:
            raise _problem(path, index, f"'{side}' selects by seed; an arm is all of its seeds")
    metric, step = _metric_step(entry, path, index)
    return Claim(text=str(entry["claim"]), a=entry["a"], b=entry["b"], metric=metric, step=step,
                 direction=_direction(entry, path, index), paper=entry.get("paper"))


def _direction(entry: dict, path: Path, index: int) -> int:
    direction = str(entry["direction"]).replace(" ", "").lower()
    if direction not in DIRECTIONS:
        raise _problem(path, index, f"direction {entry['direction']!r} is not b>a or b<a")
    return DIRECTIONS[direction]


def _metric_step(entry: dict, path: Path, index: int, curves: bool = True) -> tuple[str, str | int]:
    """A mapping's ``metric`` and ``step`` (defaults em/macro and final), checked."""
    try:
        metric = str(entry.get("metric", "em/macro"))
        if is_curve_metric(metric) and not curves:
            raise ValueError(f"a claim about one arm compares eval metrics, not {metric}")
        check_curve_metric(metric) if is_curve_metric(metric) else parse_metric(metric)
        return metric, _step(entry.get("step", "final"))
    except (ReportInputError, ValueError) as exc:
        raise _problem(path, index, str(exc).rstrip(".")) from None


def parse_within(entry: dict, path: Path, index: int) -> Claim:
    """A claim about one arm: ``arm`` selects it; ``a`` and ``b`` set its metric and step."""
    if not isinstance(entry["arm"], dict) or not entry["arm"] or SEED_KEY in entry["arm"]:
        raise _problem(path, index, "'arm' must be a non-empty mapping of overrides (not a seed)")
    metric, step = _metric_step(entry, path, index, curves=False)
    sides = []
    for name in ("a", "b"):
        side = entry[name]
        if not isinstance(side, dict) or set(side) - SIDE_FIELDS:
            raise _problem(path, index, f"'{name}' of a claim about one arm sets only {sorted(SIDE_FIELDS)}")
        sides.append(_metric_step({"metric": metric, "step": step, **side}, path, index, curves=False))
    (metric_a, _), (metric_b, _) = sides
    if sides[0] == sides[1]:
        raise _problem(path, index, "'a' and 'b' measure the arm alike; give them different steps or metrics")
    if metric_a != metric_b:
        ma, mb = parse_metric(metric_a), parse_metric(metric_b)
        if ma.column != mb.column or not ma.source or not mb.source:
            raise _problem(path, index, f"two metrics ({metric_a}, {metric_b}) must be one measure of "
                                        "two sources, e.g. searches/world_1hop and searches/world_3hop")
    return Claim(text=str(entry["claim"]), a=entry["arm"], b=entry["arm"], metric=metric, step=step,
                 direction=_direction(entry, path, index), paper=entry.get("paper"), within=True,
                 side_a=sides[0], side_b=sides[1])


def load_claims(path: Path) -> list[Claim]:
    """A claims YAML file (a list, or a mapping with a ``claims`` list) → claims."""
    if not path.is_file():
        raise ReportInputError(f"claims file {path} does not exist.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ReportInputError(f"claims file {path} is not valid YAML ({exc}).") from None
    if isinstance(data, dict) and "claims" in data:
        data = data["claims"]
    if not isinstance(data, list) or not data:
        raise ReportInputError(f"claims file {path} must hold a non-empty list of claims.")
    return [parse_claim(entry, path, i) for i, entry in enumerate(data)]


def _normal(value: Any) -> str:
    """Overrides and selectors compared as text: ``false``/False, ``4``/4 and ``null`` alike."""
    if value is None:
        return MISSING_AXIS
    if isinstance(value, bool):
        return str(value).lower()
    return str(typed_value(str(value))).lower()


def select_arm(arms: Sequence[Arm], selector: dict[str, Any], what: str) -> Arm:
    """The one arm whose overrides hold every ``key: value`` of ``selector``."""
    def holds(arm: Arm) -> bool:
        return all(_normal(arm.overrides.get(k)) == _normal(v) for k, v in selector.items())

    matched = [arm for arm in arms if holds(arm)]
    wanted = ", ".join(f"{k}={v}" for k, v in selector.items())
    if len(matched) == 1:
        return matched[0]
    listing = "; ".join(f"[{arm.label}]" for arm in (matched or arms))
    if not matched:
        raise NoArmError(f"{what} selects {wanted}, which no arm has. The arms: {listing}.")
    raise ReportInputError(f"{what} selects {wanted}, which {len(matched)} arms match: {listing}. "
                           "Add a key that tells them apart (null means 'not overridden').")


def check_claim(claim: Claim, arms: Sequence[Arm], settings: Settings) -> ClaimResult:
    """Select both arms, estimate A, B and B − A, and give the verdict."""
    if claim.within:
        arm = select_arm(arms, claim.a, f"claim {claim.text!r}, arm")
        est = [arm_estimate(arm, parse_metric(m), s, settings) for m, s in claim.sides()]
        diff = claim_difference(claim, arm, arm, settings)
        return ClaimResult(claim, arm, arm, est[0], est[1], diff, judge(diff, claim, [arm], settings))
    arm_a = select_arm(arms, claim.a, f"claim {claim.text!r}, arm a")
    arm_b = select_arm(arms, claim.b, f"claim {claim.text!r}, arm b")
    if arm_a is arm_b:
        raise ReportInputError(f"claim {claim.text!r} selects the same arm [{arm_a.label}] as a and b.")
    if is_curve_metric(claim.metric):  # each curve cut where every run of both arms has evals
        end = last_step([arm_a, arm_b], claim.step)
        est = [curve_estimate(arms_, claim.metric, claim.step, settings, end=end)
               for arms_ in ([arm_a], [arm_b], [arm_a, arm_b])]
        return ClaimResult(claim, arm_a, arm_b, est[0], est[1], est[2],
                           judge(est[2], claim, [arm_a, arm_b], settings))
    metric = parse_metric(claim.metric)
    step = claim.step
    if step == "common":  # one step for A, B and B − A alike; -1: none shared, so no data
        shared = common_step([*arm_a.runs, *arm_b.runs], metric)
        step = -1 if shared is None else shared
    diff = claim_difference(claim, arm_a, arm_b, settings, step)
    return ClaimResult(claim, arm_a, arm_b, arm_estimate(arm_a, metric, step, settings),
                       arm_estimate(arm_b, metric, step, settings), diff,
                       judge(diff, claim, [arm_a, arm_b], settings))


def judge(diff: Estimate, claim: Claim, arms: Sequence[Arm], settings: Settings) -> str:
    """The verdict on B − A: the interval's (``bootstrap.verdict``), except that a decisive one
    is ``FEW_SEEDS`` while an arm has fewer than ``settings.min_seeds`` seeds."""
    verdict = bs.verdict(diff.interval, claim.direction)
    if verdict != bs.INCONCLUSIVE and min(len(arm.seeds) for arm in arms) < settings.min_seeds:
        return bs.FEW_SEEDS
    return verdict


def claim_difference(claim: Claim, arm_a: Arm, arm_b: Arm, settings: Settings,
                     step: str | int | None = None) -> Estimate:
    """B − A of an eval-metric claim at its step (or at ``step``, for the gaps): paired on the
    same questions between two arms, each seed against itself within one."""
    if claim.within:
        (metric_a, step_a), (metric_b, step_b) = claim.sides(step)
        return within_difference(arm_a, (parse_metric(metric_a), step_a),
                                 (parse_metric(metric_b), step_b), settings)
    return difference(arm_a, arm_b, parse_metric(claim.metric), claim.step if step is None else step,
                      settings)


def check_claims(claims: Sequence[Claim], arms: Sequence[Arm], settings: Settings,
                 pending: bool = False) -> list[ClaimResult | PendingClaim]:
    """Every claim checked; with ``pending`` one whose arm has no run yet is listed, not fatal
    (a selector that several arms match stays an error either way)."""
    out: list[ClaimResult | PendingClaim] = []
    for claim in claims:
        try:
            out.append(check_claim(claim, arms, settings))
        except NoArmError:
            if not pending:
                raise
            missing = next(sel for sel in (claim.a, claim.b) if not any(
                all(_normal(arm.overrides.get(k)) == _normal(v) for k, v in sel.items()) for arm in arms))
            out.append(PendingClaim(claim, ", ".join(f"{k}={v}" for k, v in missing.items())))
    return out


def paper_text(paper: Any) -> str:
    """``{a: 0.30, b: 0.35}`` → ``0.300 → 0.350 (+0.050)``; text as given; nothing → ``-``."""
    if paper is None:
        return "-"
    if isinstance(paper, dict) and {"a", "b"} <= set(paper):
        try:
            a, b = float(paper["a"]), float(paper["b"])
        except (TypeError, ValueError):
            return f"{paper['a']} → {paper['b']}"
        return f"{a:.3f} → {b:.3f} ({b - a:+.3f})" if math.isfinite(b - a) else "-"
    return str(paper)
