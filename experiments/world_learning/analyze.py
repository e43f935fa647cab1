"""Table and plots of the world-learning study from its run folders.

    python experiments/world_learning/analyze.py RESULTS_DIR [--out experiments/world_learning]

RESULTS_DIR holds one folder per run (any depth) with ``metrics.jsonl`` and its Hydra
``overrides.yaml`` (in ``.hydra/`` or beside it, as ``runs/`` here keeps them); a run's
arm is read from its overrides: ``mode=eval`` → base, ``experiment=paper_grpo_world`` → paper
GRPO (``rollout.mask_observations=false`` → its unmasked ablation), ``experiment=lab_world`` →
lab. The step-0 eval of every RL arm is the warm start alone (they all start from the same
cached warm-start adapter). Writes ``results.md`` (the table, then macro EM at every eval step),
``results.csv`` and four PNG plots.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

SOURCES = ("world_1hop", "world_2hop", "world_3hop", "world_compare")


def arm_of(overrides: list[str]) -> tuple[str, int]:
    ov = dict(o.split("=", 1) for o in overrides if "=" in o)
    seed = int(ov.get("seed", 0))
    if ov.get("mode") == "eval":
        return "base", seed
    if ov.get("mode") == "sft":
        return "sft", seed
    exp = ov.get("experiment", "default")
    if exp == "paper_grpo_world":
        unmasked = ov.get("rollout.mask_observations", "true").lower() == "false"
        return ("paper_grpo_unmasked" if unmasked else "paper_grpo"), seed
    return {"lab_world": "lab"}.get(exp, exp), seed


def load_runs(root: Path) -> list[dict]:
    runs = []
    for metrics in sorted(root.rglob("metrics.jsonl")):
        run = metrics.parent
        found = [p for p in (run / ".hydra" / "overrides.yaml", run / "overrides.yaml") if p.is_file()]
        overrides = yaml.safe_load(found[0].read_text()) or [] if found else []
        arm, seed = arm_of(overrides)
        if arm == "sft":
            continue
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        runs.append({"dir": run, "arm": arm, "seed": seed, "rows": rows})
    return runs


def evals(rows: list[dict]) -> pd.DataFrame:
    """One row per eval: step, EM per source, macro EM, format rate, searches per source."""
    out = [r for r in rows if "eval/em/macro" in r]
    return pd.DataFrame(out).set_index("step") if out else pd.DataFrame()


def train(rows: list[dict]) -> pd.DataFrame:
    out = [r for r in rows if "rollout/degenerate_group_rate" in r]
    return pd.DataFrame(out).set_index("step") if out else pd.DataFrame()


def table(runs: list[dict]) -> pd.DataFrame:
    records = []
    for run in runs:
        ev, tr = evals(run["rows"]), train(run["rows"])
        if ev.empty:
            continue
        first, last = ev.iloc[0], ev.iloc[-1]
        rec = {"arm": run["arm"], "seed": run["seed"], "steps": int(ev.index.max())}
        for tag, row in (("start", first), ("end", last)):
            rec[f"macro_{tag}"] = row.get("eval/em/macro")
            rec[f"format_{tag}"] = row.get("eval/format_rate")
            rec[f"searches_{tag}"] = row.get("eval/searches")
            for s in SOURCES:
                rec[f"{s.split('_')[1]}_{tag}"] = row.get(f"eval/em/{s}")
                rec[f"srch_{s.split('_')[1]}_{tag}"] = row.get(f"eval/searches/{s}")
        rec["macro_peak"] = ev["eval/em/macro"].max()
        if not tr.empty:
            rec["degenerate"] = tr["rollout/degenerate_group_rate"].mean()
            rec["step_s"] = tr["time/step_seconds"].median() if "time/step_seconds" in tr else None
        records.append(rec)
    df = pd.DataFrame(records).sort_values(["arm", "seed"])
    return df.dropna(axis=1, how="all")  # e.g. per-source searches, logged only by newer runs


def by_step(runs: list[dict], key: str = "eval/em/macro") -> pd.DataFrame:
    """``key`` at every eval step (columns) for each RL arm and seed (rows): the arms compared
    at equal steps, also when some stopped earlier than others."""
    cols = {}
    for run in runs:
        ev = evals(run["rows"])
        if run["arm"] != "base" and not ev.empty and key in ev:
            cols[(run["arm"], run["seed"])] = ev[key]
    if not cols:
        return pd.DataFrame()
    df = pd.DataFrame(cols).T.sort_index()
    df.index.names = ["arm", "seed"]
    df.columns = [f"step {int(c)}" for c in df.columns]
    return df.reset_index()


def markdown(df: pd.DataFrame) -> str:
    """A GitHub table of ``df`` (floats to 3 decimals)."""
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], out: Path) -> None:
    colors = {"paper_grpo": "tab:blue", "lab": "tab:orange", "paper_grpo_unmasked": "tab:red", "base": "gray"}
    panels = {
        "em_by_source.png": [f"eval/em/{s}" for s in SOURCES] + ["eval/em/macro"],
        "format_rate.png": ["eval/format_rate"],
        "searches.png": [f"eval/searches/{s}" for s in SOURCES],
    }
    for name, keys in panels.items():
        fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3), squeeze=False)
        for ax, key in zip(axes[0], keys):
            for run in runs:
                ev = evals(run["rows"])
                if run["arm"] == "base" or ev.empty or key not in ev:
                    continue
                ax.plot(ev.index, ev[key], color=colors.get(run["arm"]), alpha=0.8,
                        label=f"{run['arm']} s{run['seed']}")
            ax.set_title(key.replace("eval/", ""), fontsize=9)
            ax.set_xlabel("step")
        axes[0][0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.5, 3))
    for run in runs:
        tr = train(run["rows"])
        if not tr.empty:
            ax.plot(tr.index, tr["rollout/degenerate_group_rate"].rolling(5, min_periods=1).mean(),
                    color=colors.get(run["arm"]), label=f"{run['arm']} s{run['seed']}")
    ax.set_title("degenerate-group rate (5-step mean)", fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "degenerate_groups.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    args = ap.parse_args()
    runs = load_runs(args.results)
    df = table(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "results.csv", index=False)
    steps = by_step(runs)
    (args.out / "results.md").write_text(markdown(df) + "\nHeld-out macro EM at each eval step:\n\n"
                                         + markdown(steps))
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    plot(runs, args.out)


if __name__ == "__main__":
    main()
