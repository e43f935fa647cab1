"""A resume re-composes the run's own config: its saved overrides, not the defaults.

``python -m searchr1.main trainer.resume=auto hydra.run.dir=<run>`` would compose the default
config and have Hydra overwrite ``<run>/.hydra/overrides.yaml`` with the resume's own. Before
Hydra runs, ``resume_argv`` reads the run's saved overrides and returns the command line
that resumes with them: the saved overrides, the resume's ``trainer.resume`` / ``hydra.*`` /
flag arguments, and ``hydra.output_subdir=null`` so Hydra writes nothing into ``.hydra/``
(the original files stay). An override that differs from the run's (a new key, or the same
key with another value) is refused (exit 2) naming the keys: a different config is a new
run, and training on under it would mix two configs in one run dir.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from searchr1.startup.errors import exit_with

RESUME_KEYS = ("trainer.resume", "hydra.run.dir")


def _key(arg: str) -> str:
    return arg.partition("=")[0].lstrip("+~")


def _value(argv: list[str], key: str) -> str | None:
    found = [a.partition("=")[2] for a in argv if "=" in a and _key(a) == key]
    return found[-1] if found else None


def saved_overrides(run_dir: Path) -> list[str] | None:
    """The run's task overrides from ``.hydra/overrides.yaml`` (None when there is none)."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return [str(o) for o in loaded if _key(str(o)) not in RESUME_KEYS]


def resume_argv(argv: list[str]) -> list[str]:
    """``argv`` for a resume into a run dir with saved overrides; otherwise ``argv`` itself."""
    if any(a in ("-m", "--multirun") for a in argv):
        return argv
    resume, run_dir = _value(argv, "trainer.resume"), _value(argv, "hydra.run.dir")
    saved = saved_overrides(Path(run_dir)) if resume not in (None, "never") and run_dir else None
    if saved is None:
        return argv
    given = [a for a in argv if "=" in a and not a.startswith("-")
             and _key(a) not in RESUME_KEYS and not _key(a).startswith("hydra.")]
    by_key = {_key(o): o for o in saved}
    differ = [a for a in given if by_key.get(_key(a)) != a]
    if differ:
        lines = "; ".join(f"{_key(a)}: the run has {by_key.get(_key(a), '(not set)')!s}, this "
                          f"command gives {a}" for a in differ)
        exit_with(f"searchr1: cannot resume {run_dir} with a different config ({lines}). A resume "
                  f"takes the run's own overrides from {run_dir}/.hydra/overrides.yaml: drop "
                  f"those arguments, or start a new run in another hydra.run.dir.")
    rest = [a for a in argv if a not in given]
    return [*saved, "hydra.output_subdir=null", *rest]  # before flags such as --cfg job
