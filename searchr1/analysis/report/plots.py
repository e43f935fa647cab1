"""The report's PNG plots: one line per arm (mean over seeds), a band from the lowest to the
highest seed, partial arms marked ``(partial)`` in the legend.

- ``em_by_source.png``    eval EM vs step: macro, then one panel per source
- ``format_rate.png``     eval format rate vs step (and the training ``reward/format``)
- ``searches_by_hop.png`` eval searches per trajectory vs step, one panel per hop source
                          (``world_1hop``, ``world_2hop``, ``world_3hop``, ``world_compare``;
                          every source when the runs have none of those)
- ``degenerate_groups.png`` training share of groups whose rewards are all equal
- ``response_length.png``   tokens the model generates per training trajectory
- ``claim_gaps.png``        with claims: each claim's B − A vs step with its interval band,
                          zero drawn, the claimed side shaded

Training curves are smoothed with a centred rolling mean of ``SMOOTH`` steps (they are
noisy per step); eval curves are drawn as logged. Figures are built on the Agg canvas
without pyplot, so nothing global changes and no display is needed.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from searchr1.analysis.report import bootstrap as bs
from searchr1.analysis.report.claims import ClaimResult
from searchr1.analysis.report.gaps import Gap
from searchr1.analysis.report.loading import Arm, Run
from searchr1.analysis.report.measures import logged_value, parse_metric

DPI = 100
PANEL = (4.2, 3.4)
HOP_SOURCES = ("world_1hop", "world_2hop", "world_3hop", "world_compare")
SMOOTH = 10
LABEL_WIDTH = 70
MIN_WIDTH = 9.0  # inches: room for the legend under a single panel
GAP_COLUMNS = 3
LENGTH_KEYS = ("rollout/action_tokens", "rollout/trajectory_tokens")


def _figure(panels: int) -> tuple[Figure, list]:
    cols = min(panels, 5)
    rows = -(-panels // cols)
    fig = Figure(figsize=(max(PANEL[0] * cols, MIN_WIDTH), PANEL[1] * rows + 1.2), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for extra in axes[panels:]:
        extra.set_visible(False)
    return fig, axes[:panels]


def eval_curve(run: Run, metric_name: str) -> pd.Series:
    """An eval metric by step: logged history, else computed from the trajectory files."""
    metric = parse_metric(metric_name)
    series = run.series(metric.history_key)
    if len(series):
        return series
    values = {s: logged_value(run, s, metric) for s in sorted(run.questions)}
    return pd.Series(values, dtype=float).dropna()


def train_curve(run: Run, keys: Sequence[str]) -> pd.Series:
    """The first of ``keys`` the run logged, smoothed over ``SMOOTH`` steps."""
    for key in keys:
        series = run.series(key)
        if len(series):
            return series.rolling(SMOOTH, center=True, min_periods=1).mean()
    return pd.Series(dtype=float)


def _band(arm: Arm, curve: Callable[[Run], pd.Series]) -> pd.DataFrame:
    """Mean, min and max over the arm's seeds at each step any seed reached."""
    frame = pd.concat({r.label: curve(r) for r in arm.runs}, axis=1).sort_index()
    return pd.DataFrame({"mean": frame.mean(axis=1), "low": frame.min(axis=1),
                         "high": frame.max(axis=1)}).dropna()


def _short(text: str, width: int = LABEL_WIDTH) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


LINESTYLES = ("-", "--", ":", "-.")


def arm_style(index: int) -> tuple[str, str]:
    """The colour and line style of the arm drawn ``index``-th: matplotlib's ten cycle colours,
    then the same colours dashed, dotted and dash-dotted, so up to 40 arms never share a look."""
    return f"C{index % 10}", LINESTYLES[(index // 10) % len(LINESTYLES)]


def _draw(ax, arms: Sequence[Arm], curve: Callable[[Run], pd.Series], title: str) -> int:
    drawn = 0
    for i, arm in enumerate(arms):
        band = _band(arm, curve)
        if not len(band):
            continue
        color, style = arm_style(i)
        label = f"{arm.ident}: {_short(arm.label)}" + (" (partial)" if arm.partial_runs() else "")
        ax.plot(band.index, band["mean"], color=color, linestyle=style, marker="o" if len(band) < 30 else None,
                markersize=3, label=f"{label} (n={len(arm.runs)})")
        if len(arm.runs) > 1:
            ax.fill_between(band.index, band["low"], band["high"], color=color, alpha=0.2, lw=0)
        drawn += 1
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    return drawn


def _save(fig: Figure, axes: list, path: Path) -> Path | None:
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        more = ax.get_legend_handles_labels()
        for h, lab in zip(*more):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if not handles:
        return None
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 2), fontsize=8)
    fig.subplots_adjust(bottom=min(0.5, 0.2 + 0.05 * ((len(labels) - 1) // 2)), hspace=0.45, wspace=0.3)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def plot_em_by_source(arms: Sequence[Arm], sources: Sequence[str], path: Path) -> Path | None:
    names = ["em/macro", *(f"em/{s}" for s in sources)]
    fig, axes = _figure(len(names))
    for ax, name in zip(axes, names):
        _draw(ax, arms, lambda r, n=name: eval_curve(r, n), f"eval {name}")
        ax.set_ylim(-0.02, 1.02)
    return _save(fig, axes, path)


def plot_format_rate(arms: Sequence[Arm], path: Path) -> Path | None:
    fig, axes = _figure(2)
    _draw(axes[0], arms, lambda r: eval_curve(r, "format_rate"), "eval format rate")
    _draw(axes[1], arms, lambda r: train_curve(r, ["reward/format"]),
          f"training reward/format ({SMOOTH}-step mean)")
    return _save(fig, axes, path)


def plot_searches_by_hop(arms: Sequence[Arm], sources: Sequence[str], path: Path) -> Path | None:
    hops = [s for s in HOP_SOURCES if s in sources] or list(sources)
    if not hops:
        return None
    fig, axes = _figure(len(hops))
    for ax, source in zip(axes, hops):
        _draw(ax, arms, lambda r, s=source: eval_curve(r, f"searches/{s}"), f"searches/traj: {source}")
        ax.set_ylim(bottom=0)
    return _save(fig, axes, path)


def plot_training(arms: Sequence[Arm], keys: Sequence[str], title: str, path: Path) -> Path | None:
    fig, axes = _figure(1)
    if not _draw(axes[0], arms, lambda r: train_curve(r, keys), f"{title} ({SMOOTH}-step mean)"):
        return None
    return _save(fig, axes, path)


def plot_claim_gaps(gaps: Sequence[tuple[ClaimResult, list[Gap]]], path: Path) -> Path | None:
    """One panel a claim: B − A by step (points), its interval (band), 0 and the claimed side
    (shaded green)."""
    drawn = [(res, rows) for res, rows in gaps if rows]
    if not drawn:
        return None
    cols = min(len(drawn), GAP_COLUMNS)
    rows_n = -(-len(drawn) // cols)
    fig = Figure(figsize=(PANEL[0] * cols, (PANEL[1] + 0.4) * rows_n), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows_n, cols, squeeze=False).ravel().tolist()
    for extra in axes[len(drawn):]:
        extra.set_visible(False)
    for ax, (res, rows) in zip(axes, drawn):
        steps = [g.step for g in rows]
        ax.fill_between(steps, [g.diff.interval.low for g in rows], [g.diff.interval.high for g in rows],
                        color="C0", alpha=0.25, lw=0)
        ax.plot(steps, [g.diff.interval.point for g in rows], color="C0", marker="o", markersize=3)
        ax.axhline(0.0, color="black", lw=0.8)
        low, high = ax.get_ylim()
        ax.axhspan(0, high if res.claim.direction > 0 else low, color="C2", alpha=0.12, lw=0)
        ax.set_ylim(low, high)
        title = textwrap.wrap(res.claim.text, 46, max_lines=2, placeholder=" …")
        if res.verdict == bs.FEW_SEEDS:  # its bands exclude 0, yet the claim is not settled
            title.append(f"[{res.verdict}]")
        ax.set_title("\n".join(title), fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(f"B − A ({res.claim.measured()})", fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    return path


def write_plots(arms: Sequence[Arm], sources: Sequence[str], out: Path) -> list[Path]:
    """Every plot the runs have data for; returns the files written."""
    written = [plot_em_by_source(arms, sources, out / "em_by_source.png"),
               plot_format_rate(arms, out / "format_rate.png"),
               plot_searches_by_hop(arms, sources, out / "searches_by_hop.png"),
               plot_training(arms, ["rollout/degenerate_group_rate"], "degenerate-group rate",
                             out / "degenerate_groups.png"),
               plot_training(arms, LENGTH_KEYS, "response tokens per trajectory",
                             out / "response_length.png")]
    return [p for p in written if p is not None]
