"""The tracker contract, the run identity every tracker shares, and the fan-out.

A tracker receives flat metric dicts (``{"reward/mean": 0.4, "eval/em/macro": 0.3}``) with
an integer step, one final ``summary`` and one ``finish``. ``RunInfo`` says which run this
is in Hydra's terms; from it come the names every backend shows (a wandb group per sweep,
a tag per selected config option, a run name from the overrides), so a sweep reads the
same in wandb, swanlab and ``searchr1.analysis.compare``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from searchr1.utils.registry import Registry
from searchr1.utils.secrets import argv_has_secret, redact_config, redact_overrides, scrub_value

TRACKERS: Registry = Registry("tracker")
logger = logging.getLogger(__name__)

MAX_TAG_LEN = 64  # wandb rejects longer tags
_TIME_NAME = re.compile(r"^\d{2}-\d{2}-\d{2}$")  # Hydra's default ``${now:%H-%M-%S}`` leaf


@dataclass(frozen=True)
class RunInfo:
    """Which run this is: where it writes, which sweep it belongs to, what was chosen."""

    run_dir: str
    sweep_dir: str | None = None  # the multirun folder shared by all jobs; None for one run
    experiment: str | None = None  # the ``experiment`` preset, if one was selected
    group_choices: dict[str, str] = field(default_factory=dict)  # config group → option
    overrides: list[str] = field(default_factory=list)  # task overrides, e.g. ``advantage=grpo_std``

    @property
    def group(self) -> str | None:
        """The sweep's name, shared by its jobs; ``None`` for a single run.

        Hydra's default sweep folder ends in a bare time (``2026-11-29/20-05-17``); the date
        is kept then, so sweeps of different days do not share a group.
        """
        if not self.sweep_dir:
            return None
        path = Path(self.sweep_dir)
        if _TIME_NAME.match(path.name) and path.parent.name:
            return f"{path.parent.name}_{path.name}"
        return path.name

    @property
    def job_type(self) -> str:
        return self.experiment or "custom"

    @property
    def tags(self) -> list[str]:
        """One ``group=option`` tag per selected config group (Hydra's own groups left out)."""
        tags = [
            f"{group}={scrub_value(option)}"[:MAX_TAG_LEN]
            for group, option in sorted(self.group_choices.items())
            if option is not None and not group.startswith("hydra/")
        ]
        return tags

    @property
    def name(self) -> str:
        """The overrides that make this run different, or the run folder's name."""
        if self.overrides:
            return ",".join(redact_overrides(self.overrides))
        return Path(self.run_dir).name

    def tracked_config(self, cfg_dict: Mapping) -> dict:
        """The config a backend stores: secrets removed, plus a ``hydra`` block that lets
        ``searchr1.analysis.compare`` recover the sweep axes from a remote run."""
        config = redact_config(cfg_dict)
        config["hydra"] = {
            "overrides": redact_overrides(self.overrides),
            "choices": {k: v for k, v in self.group_choices.items() if not k.startswith("hydra/")},
            "experiment": self.experiment,
            "sweep_dir": self.sweep_dir,
            "run_dir": self.run_dir,
        }
        return config


class Tracker(ABC):
    """One metrics sink. Subclasses register with ``@TRACKERS.register("name")``."""

    @classmethod
    def create(cls, run_info: RunInfo, cfg_dict: Mapping, options: Any) -> Tracker:
        """Build from the run, its resolved config and this tracker's options."""
        return cls()

    @abstractmethod
    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record one step's metrics."""

    def summary(self, metrics: Mapping[str, float]) -> None:
        """Record the run's final metrics (may be called more than once; later wins)."""

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        """Close the run; ``exit_code != 0`` marks it failed (``reason``: why it ended, for a
        clean stop such as a stop signal, a search outage or a refused start)."""


def exit_status(exc: BaseException | None) -> tuple[int, str | None]:
    """The exit code a run ending with ``exc`` gets, and why when it is a clean stop.

    ``SystemExit`` carries its code (a refused start: 2, with its paragraph's first line); an
    exception with an ``exit_code`` (a stop signal, a search outage, a failed checkpoint
    write: ``searchr1/loop/``) ends the process with that code, its ``reason`` saying why;
    anything else is a crash, exit code 1.
    """
    if exc is None:
        return 0, None
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        message = getattr(exc, "message", None)
        first = message.strip().splitlines()[0].removeprefix("searchr1: ") if message else None
        return code, first
    code = getattr(exc, "exit_code", None)
    if isinstance(code, int):
        return code, getattr(exc, "reason", None) or str(exc) or None
    return 1, None


class MultiTracker(Tracker):
    """Fans every call out to several trackers; a context manager that always finishes.

    ``finish`` reaches every tracker even when one raises (the first error is re-raised
    after), and runs once: a second call is a no-op.
    """

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = list(trackers)
        self._finished = False

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def summary(self, metrics: Mapping[str, float]) -> None:
        for tracker in self.trackers:
            tracker.summary(metrics)

    def finish(self, exit_code: int = 0, reason: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        errors = []
        for tracker in self.trackers:
            try:
                tracker.finish(exit_code, reason)
            except Exception as exc:  # noqa: BLE001 - every tracker must get its finish
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Finish with the exit code the block's exception ends the process with (``exit_status``);
        its error stays the one raised."""
        try:
            self.finish(*exit_status(exc))
        except Exception:
            if exc_type is None:
                raise
            logger.exception("a tracker failed to finish after the run failed")


def coerce_options(options: Any, schema: type) -> Any:
    """Turn ``None``, a mapping, a DictConfig or a dataclass into an instance of ``schema``.

    Unknown keys raise, so a typo in a ``logger`` config fails loudly.
    """
    if options is None:
        return schema()
    if isinstance(options, schema):
        return options
    from omegaconf import OmegaConf

    if OmegaConf.is_config(options):
        options = OmegaConf.to_container(options, resolve=True)
    elif dataclasses.is_dataclass(options):
        options = dataclasses.asdict(options)
    names = {f.name for f in dataclasses.fields(schema)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown {schema.__name__} option(s) {unknown}; valid: {sorted(names)}")
    return schema(**dict(options))


def resolve_mode(kind: str, configured: str, env_value: str | None,
                 valid: tuple[str, ...], aliases: Mapping[str, str]) -> str:
    """The backend mode to use: the environment variable beats the config (so
    ``WANDB_MODE=disabled pytest`` silences every run); aliases map old names."""
    raw = (env_value or configured or "").strip().lower()
    mode = aliases.get(raw, raw)
    if mode not in valid:
        raise ValueError(f"unknown {kind} mode {raw!r}; valid: {', '.join(valid)}")
    return mode


@contextmanager
def scrubbed_argv() -> Iterator[bool]:
    """Hide credentials in ``sys.argv`` while a backend records the command line.

    Backends store the launching command in their run metadata; a secret passed as an
    override (``+retriever.api_key=...``) would land there. Yields whether argv had one.
    """
    original = sys.argv
    has_secret = argv_has_secret(original)
    if has_secret:
        sys.argv = redact_overrides(original)
    try:
        yield has_secret
    finally:
        sys.argv = original
