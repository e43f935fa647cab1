"""A resume re-composes the run's own config: its saved overrides, not the defaults.

``python -m searchr1.main trainer.resume=auto hydra.run.dir=<run>`` would compose the default
config and have Hydra overwrite ``<run>/.hydra/overrides.yaml`` with the resume's own. Before
Hydra runs, ``resume_argv`` reads the run's saved overrides and returns the command line
that resumes with them: the saved overrides, the resume's ``trainer.resume`` / ``hydra.*`` /
flag arguments, and ``hydra.output_subdir=null`` so Hydra writes nothing into ``.hydra/``
(the original files stay). An override that differs from the run's (a new key, or the same
key with another value) is refused (exit 2) naming the keys: a different config is a new
run, and training on under it would mix two configs in one run dir. A saved file that cannot
be read (a byte that is not UTF-8, broken YAML) exits 2 naming its line.
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


def _unreadable(path: Path, where: str, why: str):
    """Exit 2: the saved overrides cannot be read (the run's config is unknown)."""
    exit_with(f"searchr1: cannot resume from {path.parent.parent}: {where} {why}. That file "
              f"holds the run's overrides (a YAML list, one `- key=value` line each): repair "
              f"it or restore it from a copy, then resume again.")


def _load(path: Path) -> list:
    """``path``'s YAML list, or exit 2 naming the line that is not UTF-8 or not YAML."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        _unreadable(path, f"{path}:{line}", f"has a byte that is not UTF-8 (byte {err.start})")
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        why = getattr(err, "problem", None) or type(err).__name__
        _unreadable(path, where, f"is not valid YAML ({why})")
    if loaded is None:
        return []
    if not isinstance(loaded, list) or not all(isinstance(o, (str, int, float)) for o in loaded):
        _unreadable(path, str(path), "is not a list of overrides")
    return loaded


def saved_overrides(run_dir: Path) -> list[str] | None:
    """The run's task overrides from ``.hydra/overrides.yaml`` (None when there is none); a
    file that cannot be read exits 2 naming its line."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    return [str(o) for o in _load(path) if _key(str(o)) not in RESUME_KEYS]


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
