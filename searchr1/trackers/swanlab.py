"""SwanLab tracking: the same run identity as wandb, mapped onto ``swanlab.init``.

Field mapping: project → ``project``, run name → ``name`` (``experiment_name`` in older
SDKs), sweep → ``group``, preset → ``job_type``, options → ``tags``, run folder →
``log_dir`` (``logdir`` in older SDKs) under ``<run_dir>/swanlog``. Modes: ``cloud``
(alias of ``online``), ``local``, ``offline``, ``disabled``; ``SWANLAB_MODE`` wins over
the config. SwanLab ≥ 0.10 needs the ``swanboard`` package for ``local`` (its dashboard);
without it we fall back to ``offline``, which writes the same run files, syncable later.

SwanLab has no separate run summary: final metrics are logged as ``summary/<name>`` at
the last step, where its dashboard shows them beside the curves.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.trackers.base import (
    TRACKERS,
    RunInfo,
    Tracker,
    coerce_options,
    resolve_mode,
    scrubbed_argv,
)

SWANLAB_MODES = ("online", "local", "offline", "disabled")
SWANLAB_ALIASES = {"cloud": "online"}
LOG_SUBDIR = "swanlog"
_OLD_NAMES = {"name": "experiment_name", "log_dir": "logdir"}  # swanlab < 0.7 spellings

logger = logging.getLogger(__name__)


@dataclass
class SwanlabConfig:
    """Options of the ``swanlab`` tracker (a ``logger`` config item)."""

    project: str = "searchr1"
    mode: str = "local"  # cloud | local | offline | disabled; the SWANLAB_MODE variable wins
    workspace: str | None = None  # organisation to log to in cloud mode; None: your own


def swanlab_mode(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """The mode to run in, after env precedence, aliases and the ``swanboard`` fallback."""
    env = os.environ if environ is None else environ
    mode = resolve_mode("swanlab", configured, env.get("SWANLAB_MODE"), SWANLAB_MODES,
                        SWANLAB_ALIASES)
    if mode == "local" and importlib.util.find_spec("swanboard") is None:
        logger.warning("swanlab local mode needs 'swanboard'; logging in offline mode instead")
        return "offline"
    return mode


def swanlab_init_kwargs(run_info: RunInfo, cfg_dict: Mapping, options: SwanlabConfig,
                        environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything ``swanlab.init`` receives, in current SDK spelling (pure, for tests)."""
    kwargs = {
        "project": options.project,
        "workspace": options.workspace,
        "name": run_info.name,
        "group": run_info.group,
        "job_type": run_info.job_type,
        "tags": run_info.tags,
        "config": run_info.tracked_config(cfg_dict),
        "mode": swanlab_mode(options.mode, environ),
        "log_dir": str(Path(run_info.run_dir) / LOG_SUBDIR),
    }
    return {k: v for k, v in kwargs.items() if v is not None}


def adapt_to_signature(init: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Rename to older spellings, and drop fields an older ``swanlab.init`` lacks."""
    params = inspect.signature(init).parameters
    adapted = {}
    for key, value in kwargs.items():
        if key in params:
            adapted[key] = value
        elif _OLD_NAMES.get(key) in params:
            adapted[_OLD_NAMES[key]] = value
    return adapted


@TRACKERS.register("swanlab")
class SwanlabTracker(Tracker):
    """Forwards metrics to a SwanLab run."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self._last_step = 0
        self._finished = False

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> SwanlabTracker:
        import swanlab

        kwargs = swanlab_init_kwargs(run_info, cfg_dict, coerce_options(options, SwanlabConfig))
        os.makedirs(kwargs["log_dir"], exist_ok=True)
        with scrubbed_argv() as argv_had_secret:
            if argv_had_secret and hasattr(swanlab, "Settings"):
                # SwanLab reads the command from /proc, past our argv scrub: skip recording it.
                kwargs["settings"] = swanlab.Settings(probe={"runtime": False})
            kwargs["reinit"] = True
            run = swanlab.init(**adapt_to_signature(swanlab.init, kwargs))
        return cls(run)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._last_step = max(self._last_step, int(step))
        self.run.log(dict(metrics), step=int(step))

    def summary(self, metrics: Mapping[str, float]) -> None:
        self.run.log({f"summary/{k}": v for k, v in metrics.items()}, step=self._last_step)

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        if exit_code == 0:
            self.run.finish()
        else:
            why = f": {reason}" if reason else ""
            self.run.finish(state="crashed", error=f"exit code {exit_code}{why}")
