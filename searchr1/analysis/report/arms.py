"""Arms of the study report: runs grouped by their overrides minus the seed and placement keys,
each with a label a reader can tell apart (``arm_labels``), and the arm ``--baseline`` names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchr1.analysis.report.loading import Arm, ReportInputError, Run


def _key(overrides: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in overrides.items()))


def _seed_order(run: Run) -> tuple:
    seed = run.seed
    return (0, float(seed), "") if isinstance(seed, (int, float)) else (1, 0.0, str(seed))


def label_keys(groups: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Per arm, the override keys that tell it apart.

    A key counts for an arm when the arms holding it disagree on its value, or when at most
    half of the arms hold it (``mode=eval`` on the one eval-only arm) — not when most arms
    share it and a few merely lack it (the training keys an eval-only arm does not set).
    """
    keys = list(dict.fromkeys(k for g in groups for k in g))
    if len(groups) <= 1:
        return [list(g) for g in groups]
    telling = []
    for k in keys:
        held = [repr(g[k]) for g in groups if k in g]
        if len(set(held)) > 1 or len(held) <= len(groups) / 2:
            telling.append(k)
    return [[k for k in telling if k in g] for g in groups]


def shared_overrides(arms: Sequence[Arm]) -> dict[str, Any]:
    """The overrides every arm has with the same value."""
    first = arms[0].overrides if arms else {}
    return {k: v for k, v in first.items()
            if all(k in a.overrides and repr(a.overrides[k]) == repr(v) for a in arms)}


def usual_values(groups: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Of ``keys``, those for which more than half of the arms have one value: key → that value.

    A study of one baseline and variants that each change a key or two (grpo; grpo with a
    budget of 1; grpo with groups of 2) has a usual value for every key it varies; a full
    factorial sweep (each value held by half the arms or fewer) has none.
    """
    usual = {}
    for k in keys:
        counts: dict[str, int] = {}
        for g in groups:
            if k in g:
                counts[repr(g[k])] = counts.get(repr(g[k]), 0) + 1
        if counts and max(counts.values()) > len(groups) / 2:
            top = max(counts, key=counts.__getitem__)
            usual[k] = next(g[k] for g in groups if k in g and repr(g[k]) == top)
    return usual


def arm_labels(overrides: Sequence[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Each arm's label, and the usual values its label leaves out.

    A label is the arm's values on the keys that tell it apart (``label_keys``), less those
    where it has the usual value (``usual_values``), so a sweep's arms read as its axes and a
    baseline's variants as what they change. An arm with the usual value everywhere (the
    baseline) keeps them all; when two labels come out the same, every arm gets every key it
    holds that differs anywhere (and nothing is left out).
    """
    telling = label_keys(overrides)
    usual = usual_values(overrides, list(dict.fromkeys(k for ks in telling for k in ks)))
    shown = [[k for k in ks if not (k in usual and repr(o[k]) == repr(usual[k]))] or ks
             for o, ks in zip(overrides, telling)]
    labels = [", ".join(f"{k}={o[k]}" for k in ks) or "(no overrides)" for o, ks in zip(overrides, shown)]
    if len(set(labels)) < len(labels):
        common = {k for k in overrides[0] if all(repr(o.get(k)) == repr(overrides[0][k]) for o in overrides)}
        return [", ".join(f"{k}={v}" for k, v in o.items() if k not in common) or "(no overrides)"
                for o in overrides], [{} for _ in overrides]
    return labels, [{k: usual[k] for k in ks if k not in kept} for ks, kept in zip(telling, shown)]


def left_out_values(arms: Sequence[Arm]) -> dict[str, Any]:
    """The usual values that some arm's label leaves out, keys in order of first appearance."""
    order = list(dict.fromkeys(k for a in arms for k in a.overrides))
    out = {k: v for a in arms for k, v in a.left_out.items()}
    return {k: out[k] for k in order if k in out}


def group_arms(runs: Sequence[Run]) -> list[Arm]:
    """Runs grouped by their overrides minus the seed, in order of first appearance, each
    labelled by ``arm_labels``."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(_key(run.arm_overrides), []).append(run)
    overrides = [members[0].arm_overrides for members in groups.values()]
    labels, left_out = arm_labels(overrides)
    return [Arm(label, over, sorted(members, key=_seed_order), f"A{i}", out)
            for i, (label, over, members, out) in enumerate(zip(labels, overrides, groups.values(), left_out), 1)]


def baseline_arm(arms: Sequence[Arm], run_label: str) -> Arm:
    """The arm holding the run labelled ``run_label`` (the report's ``--baseline``)."""
    for arm in arms:
        if any(r.label == run_label for r in arm.runs):
            return arm
    known = ", ".join(r.label for arm in arms for r in arm.runs)
    raise ReportInputError(f"--baseline {run_label}: no run with an eval has that label. The runs: {known}.")


