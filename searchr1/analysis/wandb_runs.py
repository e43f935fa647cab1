"""A wandb group's runs as ``RunData`` (``compare --wandb ENTITY/PROJECT --group SWEEP``).

Overrides come from the ``hydra.overrides`` block our tracker logs in the run's config (or
from the run name, ``a=1,b=2``); the history from ``run.history``; the summary from
``run.summary`` (wandb's ``_runtime`` standing in for ``wall_seconds``). A run is ``done``
when wandb says it finished and its summary holds the final metrics our tracker writes at the
end (``steps``); otherwise it is unfinished (see ``run_data``).

``open_api`` turns wandb's failures to start (no login, no network, no such project) into
``WandbUnavailable``, whose message says what to do; ``compare`` prints it and exits 2.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from searchr1.analysis.run_data import DONE, RunData, parse_overrides, planned_steps, status_of

HISTORY_SAMPLES = 100_000


class WandbUnavailable(Exception):
    """wandb cannot be read from here; the message is one paragraph for the user."""


def open_api(path: str) -> Any:
    """``wandb.Api()``, or ``WandbUnavailable`` saying why not and what to do."""
    try:
        import wandb

        return wandb.Api()
    except Exception as err:  # noqa: BLE001 - wandb raises UsageError, CommError, ValueError …
        raise WandbUnavailable(_advice(path, err)) from err


def _advice(path: str, err: Exception) -> str:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return (f"searchr1: cannot read wandb project {path} ({type(err).__name__}: {first}). "
            "Log in first (`uv run wandb login`, or set WANDB_API_KEY) on a machine that can "
            "reach wandb; or compare the sweep from its run folders, which need no tracker: "
            "`uv run python -m searchr1.analysis.compare outputs/multirun/<date>/<time>`.")


def _overrides_from_name(name: str) -> list[str]:
    """Our tracker names runs ``a=1,b=2``; use that when a run lacks the ``hydra`` block."""
    parts = (name or "").split(",")
    return parts if all("=" in p for p in parts) else []


def _wandb_history(run: Any) -> pd.DataFrame:
    history = run.history(samples=HISTORY_SAMPLES, pandas=True)
    frame = history if isinstance(history, pd.DataFrame) else pd.DataFrame(list(history))
    if frame.empty or "_step" not in frame:
        return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
    frame = frame.rename(columns={"_step": "step"}).groupby("step", sort=True).last()
    frame = frame[[c for c in frame.columns if not str(c).startswith("_")]]
    return frame.apply(pd.to_numeric, errors="coerce")


def _wandb_summary(summary: Any) -> dict[str, Any]:
    """A plain dict of a run's summary; wandb's ``_runtime`` stands in for ``wall_seconds``."""
    plain = {k: summary[k] for k in summary.keys()}  # noqa: SIM118 - HTTPSummary has no __iter__
    if "wall_seconds" not in plain and "_runtime" in plain:
        plain["wall_seconds"] = plain["_runtime"]
    return {k: v for k, v in plain.items() if not k.startswith("_")}


def _status(run: Any, summary: dict[str, Any], history: pd.DataFrame, config: dict) -> str:
    final = summary if "steps" in summary or "stopped_reason" in summary else None
    status = status_of(final, history, planned_steps(config))
    state = getattr(run, "state", "finished")
    if status == DONE and state != "finished":
        return f"{state} (wandb)"
    return status


def load_wandb_runs(api: Any, path: str, group: str) -> list[RunData]:
    """Runs of one wandb group, via ``wandb.Api().runs(path, filters={"group": group})``."""
    try:
        runs = list(api.runs(path, filters={"group": group}))
    except Exception as err:  # noqa: BLE001 - an unknown project, no access, no network
        raise WandbUnavailable(_advice(path, err)) from err
    names = [r.name for r in runs]
    out = []
    for run in runs:
        config = dict(run.config or {})
        overrides = (config.get("hydra") or {}).get("overrides") or _overrides_from_name(run.name)
        label = run.name if names.count(run.name) == 1 else f"{run.name} ({run.id})"
        history, summary = _wandb_history(run), _wandb_summary(run.summary)
        out.append(RunData(label=label, source=f"wandb:{path}/{run.id}",
                           overrides=parse_overrides(overrides), history=history,
                           summary=summary, status=_status(run, summary, history, config)))
    return out
