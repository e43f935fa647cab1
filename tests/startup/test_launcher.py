"""``hydra/launcher=slurm_gpu`` where there is no SLURM: one paragraph, exit 2, no sweep folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from searchr1.startup.launcher import launcher_problem, uses_slurm

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["-m", "sweep=seeds", "hydra/launcher=slurm_gpu", "hydra.launcher.partition=gpu"]


def test_slurm_launchers_are_recognised():
    assert uses_slurm("slurm_gpu") and uses_slurm("submitit_slurm")
    assert not uses_slurm("local_cpu") and not uses_slurm("joblib")


def test_refused_without_srun_and_allowed_with_it():
    problem = launcher_problem(SWEEP, which=lambda name: None)
    assert "hydra/launcher=slurm_gpu" in problem and "no SLURM" in problem and "local_cpu" in problem
    assert launcher_problem(SWEEP, which=lambda name: f"/usr/bin/{name}") is None
    assert launcher_problem(SWEEP[1:], which=lambda name: None) is None  # no sweep, no launcher
    assert launcher_problem(["-m", "hydra/launcher=local_cpu"], which=lambda name: None) is None


def test_the_entry_point_stops_before_hydra_writes_the_sweep_folder(tmp_path):
    sweep_dir = tmp_path / "sw"
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "searchr1.main", *SWEEP, f"hydra.sweep.dir={sweep_dir}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "no SLURM" in out.stderr
    assert not sweep_dir.exists()
