"""Weights & Biases tracking: one wandb run per Hydra job, grouped by sweep.

A multirun's jobs share ``group`` (the sweep folder), carry ``job_type`` (the experiment
preset) and one tag per selected config option, and are named by their overrides, so the
wandb UI can group, filter and label an ablation without extra bookkeeping. The logged
config is the resolved config with secrets removed, plus a ``hydra`` block with the
overrides (``searchr1.analysis.compare --wandb`` reads the sweep axes from it).

``wandb`` is imported when a run starts, not at module import: most code paths never
touch it, and it takes a second to import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from searchr1.trackers.base import (
    TRACKERS,
    RunInfo,
    Tracker,
    coerce_options,
    resolve_mode,
    scrubbed_argv,
)

WANDB_MODES = ("online", "offline", "disabled")
WANDB_ALIASES = {"dryrun": "offline", "run": "online"}


@dataclass
class WandbConfig:
    """Options of the ``wandb`` tracker (a ``logger`` config item)."""

    project: str = "searchr1"
    entity: str | None = None
    mode: str = "offline"  # online | offline | disabled; the WANDB_MODE variable wins


def wandb_init_kwargs(run_info: RunInfo, cfg_dict: Mapping, options: WandbConfig,
                      environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything ``wandb.init`` receives except ``settings`` (a pure function, for tests)."""
    env = os.environ if environ is None else environ
    return {
        "project": options.project,
        "entity": options.entity,
        "group": run_info.group,
        "job_type": run_info.job_type,
        "tags": run_info.tags,
        "name": run_info.name,
        "dir": str(run_info.run_dir),
        "mode": resolve_mode("wandb", options.mode, env.get("WANDB_MODE"), WANDB_MODES,
                             WANDB_ALIASES),
        "config": run_info.tracked_config(cfg_dict),
    }


def _settings(wandb: Any) -> Any:
    """``Settings(start_method="thread")`` where this wandb still has that field.

    wandb ≥ 0.19 runs a separate core service and dropped ``start_method``; older versions
    need ``thread`` to start cleanly inside Hydra's launcher processes.
    """
    fields = getattr(wandb.Settings, "model_fields", None) or {}
    if "start_method" in fields:
        return wandb.Settings(start_method="thread")
    return wandb.Settings()


@TRACKERS.register("wandb")
class WandbTracker(Tracker):
    """Forwards metrics to a wandb run; ``summary`` updates the run summary."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self._finished = False

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> WandbTracker:
        import wandb

        kwargs = wandb_init_kwargs(run_info, cfg_dict, coerce_options(options, WandbConfig))
        os.makedirs(kwargs["dir"], exist_ok=True)
        with scrubbed_argv():
            run = wandb.init(settings=_settings(wandb), **kwargs)
        return cls(run)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=int(step))

    def summary(self, metrics: Mapping[str, float]) -> None:
        self.run.summary.update(dict(metrics))

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        if not self._finished:
            self._finished = True
            self.run.finish(exit_code=exit_code)
