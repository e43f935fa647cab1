"""A sweep launcher this machine cannot run, refused before Hydra creates the sweep folder.

``hydra/launcher=slurm_gpu`` submits each job through submitit, which needs SLURM's ``srun``
and ``sbatch``. On a machine without them Hydra used to create ``outputs/multirun/<date>/<time>/``
and then end in submitit's traceback; ``launcher_problem`` says so in one paragraph (exit 2)
before anything is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

LAUNCHERS = Path(__file__).resolve().parents[2] / "conf" / "hydra" / "launcher"
SLURM = "submitit_slurm"


def _launcher(argv: list[str]) -> str | None:
    """The ``hydra/launcher=`` choice on the command line, if any."""
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "hydra/launcher":
            return value
    return None


def uses_slurm(name: str) -> bool:
    """Whether launcher option ``name`` is submitit's SLURM launcher (or builds on it)."""
    if name == SLURM:
        return True
    path = LAUNCHERS / f"{name}.yaml"
    if not path.is_file():
        return False
    defaults = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    return SLURM in [d if isinstance(d, str) else next(iter(d.values()), None) for d in defaults]


def launcher_problem(argv: list[str], which=shutil.which) -> str | None:
    """One paragraph when the sweep asks for SLURM on a machine without it; else None."""
    name = _launcher(argv)
    if name is None or not any(a in ("-m", "--multirun") for a in argv) or not uses_slurm(name):
        return None
    if which("srun") and which("sbatch"):
        return None
    return (f"searchr1: hydra/launcher={name} submits every job to SLURM, but this machine has no "
            "SLURM (`srun` / `sbatch` are not on PATH). Start the sweep from a SLURM login node, or "
            "run it here: without a launcher override (one job after another) or with "
            "hydra/launcher=local_cpu (parallel local jobs). Nothing was written.")
