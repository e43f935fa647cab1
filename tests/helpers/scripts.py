"""Import a script of ``experiments/`` (not a package) as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> ModuleType:
    """The module at ``ROOT / relative`` (e.g. ``experiments/benchmarks/paper_scale.py``)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)  # never a real module's name
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass in it looks its module up there
    spec.loader.exec_module(module)
    return module
