"""Experiment tracking: build the configured trackers for one Hydra job, always finish them.

Usage in an entry point::

    info = run_info_from_hydra()
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    with open_trackers(cfg.logger.trackers, info, cfg_dict, cfg.logger) as tracker:
        tracker.log({"reward/mean": 0.4}, step=0)
        tracker.summary({"eval/em/macro": 0.31})

Leaving the ``with`` block finishes every tracker, with ``exit_code=1`` when an exception
escapes, so a failed job in a sweep still closes its wandb/swanlab run (marked failed)
instead of leaving it "running" for ever. The backends live in ``searchr1.trackers``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from searchr1.trackers import TRACKERS, MultiTracker, RunInfo, Tracker
from searchr1.trackers.console import ConsoleConfig
from searchr1.trackers.swanlab import SwanlabConfig
from searchr1.trackers.wandb import WandbConfig

__all__ = [
    "TRACKERS", "ConsoleConfig", "LoggerConfig", "MultiTracker", "RunInfo", "SwanlabConfig",
    "Tracker", "WandbConfig", "build_trackers", "open_trackers", "run_info_from_hydra",
]


@dataclass
class LoggerConfig:
    """Schema of a ``logger`` config item: which trackers run, and each one's options."""

    trackers: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    swanlab: SwanlabConfig = field(default_factory=SwanlabConfig)


def run_info_from_hydra() -> RunInfo:
    """The current Hydra job's ``RunInfo`` (call inside a ``@hydra.main`` function).

    ``sweep_dir`` is set only in multirun mode: Hydra fills ``hydra.sweep.dir`` in single
    runs too, but there it names no folder that exists.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    choices = {str(k): str(v) for k, v in hc.runtime.choices.items() if v is not None}
    multirun = hc.mode == RunMode.MULTIRUN
    return RunInfo(
        run_dir=str(hc.runtime.output_dir),
        sweep_dir=str(hc.sweep.dir) if multirun else None,
        experiment=choices.get("experiment"),
        group_choices=choices,
        overrides=[str(o) for o in hc.overrides.task],
    )


def _options_for(tracker_cfgs: Any, name: str) -> Any:
    """This tracker's options from a mapping, a dataclass or a DictConfig (``None`` if absent)."""
    if tracker_cfgs is None:
        return None
    if isinstance(tracker_cfgs, Mapping):
        return tracker_cfgs.get(name)
    return getattr(tracker_cfgs, name, None)


def _plain_config(cfg_dict: Any) -> dict:
    """A plain dict of the config; a DictConfig is resolved first."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg_dict):
        return OmegaConf.to_container(cfg_dict, resolve=True)  # type: ignore[return-value]
    return dict(cfg_dict or {})


def build_trackers(names: Iterable[str], run_info: RunInfo, cfg_dict: Any,
                   tracker_cfgs: Any = None) -> MultiTracker:
    """Create the named trackers (duplicates ignored) behind one ``MultiTracker``.

    If one fails to start, those already started are finished (as failed) before the
    error propagates, so no backend run is left open.
    """
    config = _plain_config(cfg_dict)
    started: list[Tracker] = []
    try:
        for name in dict.fromkeys(names):
            factory = TRACKERS.get(name)
            started.append(factory.create(run_info, config, _options_for(tracker_cfgs, name)))
    except BaseException:
        MultiTracker(started).finish(exit_code=1)
        raise
    return MultiTracker(started)


@contextmanager
def open_trackers(names: Iterable[str], run_info: RunInfo, cfg_dict: Any,
                  tracker_cfgs: Any = None) -> Iterator[MultiTracker]:
    """``build_trackers`` as a context manager that finishes them in a ``finally``."""
    tracker = build_trackers(names, run_info, cfg_dict, tracker_cfgs)
    exit_code = 1
    try:
        yield tracker
        exit_code = 0
    finally:
        tracker.finish(exit_code=exit_code)
