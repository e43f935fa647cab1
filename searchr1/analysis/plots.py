"""Comparison plots: learning curves, final macro EM by sweep axis, a 2-axis heat map.

Figures are built with ``matplotlib.figure.Figure`` and saved through the Agg canvas, not
``pyplot``: no global backend switch, no figure registry to leak between calls, and it
works on a machine without a display. Sizes are fixed (inches × 100 dpi, no tight
bounding box), so a plot's pixel size is part of its contract:

- ``curves.png``    1500 × 450: reward/mean, dev macro EM and format rate vs step; a run whose
  curve equals an earlier run's is drawn dashed with crosses over it, and the panel says how
  many curves coincide (identical runs would otherwise hide one another)
- ``macro_em.png``  900 × 500: final macro EM, bars grouped by the sweep axes
- ``heatmap.png``   800 × 600: final macro EM over two swept axes (only when exactly two)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

DPI = 100
CURVES_SIZE = (15.0, 4.5)
BARS_SIZE = (9.0, 5.0)
HEATMAP_SIZE = (8.0, 6.0)
CURVE_METRICS = (("reward/mean", "mean reward"), ("eval/em/macro", "dev macro EM"),
                 ("eval/format_rate", "dev format rate"))
MACRO = "em/macro/final"


def _new_figure(size: tuple[float, float]) -> Figure:
    fig = Figure(figsize=size, dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, format="png")
    return path


def run_label(overrides: dict[str, Any], axes: Sequence[str], fallback: str) -> str:
    """``"advantage=grpo_std, rollout.group_size=4"``: the run's values on the sweep axes."""
    parts = [f"{axis}={overrides[axis]}" for axis in axes if axis in overrides]
    return ", ".join(parts) or fallback


def plot_learning_curves(runs: Sequence[Any], axes: Sequence[str], path: Path) -> Path:
    """One panel per curve metric, one line per run, one shared legend below."""
    fig = _new_figure(CURVES_SIZE)
    panels = fig.subplots(1, len(CURVE_METRICS))
    for panel, (metric, title) in zip(panels, CURVE_METRICS):
        drawn: list[pd.Series] = []
        repeats = 0
        for index, run in enumerate(runs):
            series = run.history[metric].dropna() if metric in run.history else pd.Series()
            if len(series):
                repeat = any(series.equals(other) for other in drawn)  # would hide behind it
                repeats += repeat
                panel.plot(series.index, series.values, color=f"C{index % 10}",
                           marker=("x" if repeat else "o") if len(series) <= 30 else None,
                           markersize=5 if repeat else 3, linestyle=(0, (4, 3)) if repeat else "-",
                           label=run_label(run.overrides, axes, run.label))
                drawn.append(series)
        if not drawn:
            panel.text(0.5, 0.5, f"{metric} not logged", ha="center", va="center",
                       transform=panel.transAxes, color="gray")
        elif repeats:
            panel.text(0.01, 0.01, f"{repeats} of {len(drawn)} curves identical to an earlier one "
                       "(dashed, x)", transform=panel.transAxes, fontsize="x-small", color="dimgray")
        panel.set_title(title)
        panel.set_xlabel("step")
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        panel.set_ylabel(metric)
        panel.grid(alpha=0.3)
    handles, labels = _unique_legend(panels)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)),
                   fontsize="small", frameon=False)
    fig.suptitle("Learning curves")
    fig.subplots_adjust(left=0.05, right=0.98, top=0.85, bottom=0.32, wspace=0.25)
    return _save(fig, path)


def _unique_legend(panels: Sequence[Any]) -> tuple[list, list]:
    seen: dict[str, Any] = {}
    for panel in panels:
        for handle, label in zip(*panel.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return list(seen.values()), list(seen.keys())


def _sorted_values(values: Sequence[Any]) -> list[Any]:
    unique = list(dict.fromkeys(values))
    try:
        return sorted(unique)
    except TypeError:
        return sorted(unique, key=str)


def plot_macro_bars(frame: pd.DataFrame, axes: Sequence[str], path: Path) -> Path:
    """Final macro EM: x = first axis, one bar colour per combination of the other axes."""
    fig = _new_figure(BARS_SIZE)
    ax = fig.subplots()
    data = frame.copy()
    x_name = axes[0] if axes else "run"
    hue_names = list(axes[1:])  # the other axes, combined into one colour per combination
    data["_hue"] = [", ".join(f"{n}={row[n]}" for n in hue_names) or MACRO
                    for _, row in data.iterrows()]
    means = data.groupby([x_name, "_hue"], sort=False)[MACRO].mean()
    xs, hues = _sorted_values(data[x_name]), _sorted_values(data["_hue"])
    width = 0.8 / len(hues)
    for h, hue in enumerate(hues):
        heights = [means.get((x, hue), math.nan) for x in xs]
        positions = [i - 0.4 + width * (h + 0.5) for i in range(len(xs))]
        bars = ax.bar(positions, [0 if math.isnan(v) else v for v in heights], width,
                      color=f"C{h % 10}", label=hue if hue_names else None)
        ax.bar_label(bars, labels=["n/a" if math.isnan(v) else f"{v:.3f}" for v in heights],
                     fontsize="small", padding=2)
    ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=0 if len(xs) <= 6 else 30)
    ax.set_xlabel(x_name)
    ax.set_ylabel("final dev macro EM")
    top = data[MACRO].max()
    ax.set_ylim(0, max(1.0, 1.1 * top) if not math.isnan(top) else 1.0)
    ax.set_title("Final macro EM" + (f" by {' × '.join(axes)}" if axes else " per run"))
    if hue_names:
        ax.legend(title=" × ".join(hue_names), fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.9, bottom=0.15)
    return _save(fig, path)


def plot_macro_heatmap(frame: pd.DataFrame, axes: Sequence[str], path: Path) -> Path:
    """Final macro EM over exactly two axes, one annotated cell per combination."""
    if len(axes) != 2:
        raise ValueError(f"a heat map needs exactly two swept axes, got {list(axes)}")
    rows, cols = axes
    grid = frame.pivot_table(index=rows, columns=cols, values=MACRO, aggfunc="mean",
                             dropna=False)
    fig = _new_figure(HEATMAP_SIZE)
    ax = fig.subplots()
    values = grid.to_numpy(dtype=float)
    finite = values[~np.isnan(values)]
    top = float(finite.max()) if finite.size else 1.0
    image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=max(top, 1e-6), aspect="auto")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            value = values[i, j]
            dark = math.isnan(value) or value < 0.6 * image.norm.vmax  # viridis: dark below
            ax.text(j, i, "n/a" if math.isnan(value) else f"{value:.3f}", ha="center",
                    va="center", color="white" if dark else "black")
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [str(r) for r in grid.index])
    ax.set_xlabel(cols)
    ax.set_ylabel(rows)
    ax.set_title(f"Final macro EM: {rows} × {cols}")
    fig.colorbar(image, ax=ax, label="final dev macro EM")
    fig.subplots_adjust(left=0.18, right=0.95, top=0.9, bottom=0.12)
    return _save(fig, path)


def write_plots(frame: pd.DataFrame, runs: Sequence[Any], axes: Sequence[str],
                out_dir: Path) -> list[Path]:
    """Every plot that applies to this comparison, written into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [plot_learning_curves(runs, axes, out_dir / "curves.png"),
             plot_macro_bars(frame, axes, out_dir / "macro_em.png")]
    if len(axes) == 2:
        paths.append(plot_macro_heatmap(frame, axes, out_dir / "heatmap.png"))
    return paths
