"""Experiment tracking: build the configured trackers for one Hydra job, always finish them.

Usage in the entry point (inside ``@hydra.main``)::

    with open_trackers(cfg, run_dir) as tracker:
        tracker.log({"reward/mean": 0.4}, step=0)
        tracker.summary({"eval/em/macro": 0.31})

Leaving the ``with`` block finishes every tracker, with ``exit_code=1`` when an exception
escapes, so a failed job in a sweep still closes its wandb/swanlab run (marked failed)
instead of leaving it "running" for ever. ``jsonl`` always runs: ``metrics.jsonl`` and
``summary.json`` are the run-folder contract. The backends live in ``searchr1.trackers``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from searchr1.trackers import TRACKERS, MultiTracker, RunInfo, Tracker
from searchr1.trackers.swanlab import SwanlabConfig
from searchr1.trackers.wandb import WandbConfig

__all__ = [
    "TRACKERS", "MultiTracker", "RunInfo", "SwanlabConfig", "Tracker", "WandbConfig",
    "build_trackers", "open_trackers", "run_info_from_hydra", "tracker_names",
]

OPTIONAL_TRACKERS = ("console", "wandb", "swanlab")


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


def _get(node: Any, key: str) -> Any:
    """``node[key]`` for mappings and DictConfigs, ``node.key`` for dataclasses, else None."""
    if node is None:
        return None
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


def _is_options(value: Any) -> bool:
    return value is not None and not isinstance(value, (bool, str, int, float, list))


def _options_for(tracker_cfgs: Any, name: str) -> Any:
    """This tracker's options from a mapping, dataclass or DictConfig (``None`` if absent)."""
    value = _get(tracker_cfgs, name)
    return value if _is_options(value) else None


def _plain_config(cfg_dict: Any) -> dict:
    """A plain dict of the config; a DictConfig is resolved, a dataclass converted."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg_dict):
        plain = OmegaConf.to_container(cfg_dict, resolve=True, enum_to_str=True)
        return plain  # type: ignore[return-value]
    if dataclasses.is_dataclass(cfg_dict):
        return dataclasses.asdict(cfg_dict)  # type: ignore[arg-type]
    return dict(cfg_dict or {})


def build_trackers(names: Iterable[str], run_info: RunInfo, cfg_dict: Any,
                   tracker_cfgs: Any = None) -> MultiTracker:
    """Create the named trackers (duplicates ignored) behind one ``MultiTracker``.

    ``tracker_cfgs`` maps a tracker name to its options (``{"wandb": WandbConfig(...)}``,
    or a config node with ``wandb:``/``swanlab:`` children). If one tracker fails to start,
    those already started are finished (as failed) before the error propagates. The
    returned ``MultiTracker`` is a context manager that finishes them all.
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


def tracker_names(logger_cfg: Any) -> list[str]:
    """``jsonl`` first, then the ``logger`` node's choice: a ``trackers`` list, or the
    boolean flags ``console`` / ``wandb`` / ``swanlab`` (``logger=[wandb,swanlab]``)."""
    listed = _get(logger_cfg, "trackers")
    if listed is not None:
        return list(dict.fromkeys(["jsonl", *map(str, listed)]))
    return ["jsonl", *(n for n in OPTIONAL_TRACKERS if _get(logger_cfg, n) is True)]


def _tracker_options(cfg: Any) -> dict[str, Any]:
    """Options per tracker: a mapping under ``logger.<name>``, else the top-level ``<name>``."""
    logger_cfg = _get(cfg, "logger")
    return {name: _options_for(logger_cfg, name) or _options_for(cfg, name)
            for name in OPTIONAL_TRACKERS}


def _current_run_info(run_dir: str | Path | None) -> RunInfo:
    """Hydra's view of this job when Hydra is running, else a bare run at ``run_dir``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        info = run_info_from_hydra()
        return dataclasses.replace(info, run_dir=str(run_dir)) if run_dir else info
    if run_dir is None:
        raise ValueError("open_trackers needs run_dir outside a Hydra job")
    return RunInfo(run_dir=str(run_dir))


@contextmanager
def open_trackers(cfg: Any, run_dir: str | Path | None = None,
                  run_info: RunInfo | None = None) -> Iterator[MultiTracker]:
    """The config-driven entry: trackers chosen by ``cfg.logger``, finished in a ``finally``
    (``exit_code=1`` when the block raised). ``cfg`` is the job's (unresolved) config."""
    info = run_info or _current_run_info(run_dir)
    names = tracker_names(_get(cfg, "logger"))
    with build_trackers(names, info, cfg, _tracker_options(cfg)) as tracker:
        yield tracker
