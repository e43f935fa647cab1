"""``engine.threads`` / ``engine.interop_threads``: the count picked for the machine and its load."""

from __future__ import annotations

import pytest
import torch

from searchr1.utils import cpu_threads
from searchr1.utils.cpu_threads import auto_threads, parse_setting, pick


@pytest.mark.parametrize("cores, load, ceiling, expected", [
    (2, 0.0, 2, 1),   # a quiet 2-core machine: one thread, a core for the run's other threads
    (2, 8.0, 2, 1),   # never below one
    (1, 0.0, 1, 1),
    (4, 0.0, 4, 3),
    (4, 1.6, 4, 1),   # two cores taken by other work
    (16, 4.2, 16, 11),
    (16, 0.0, 8, 8),  # never above torch's own count (physical cores)
])
def test_auto_takes_the_cores_other_work_leaves(cores, load, ceiling, expected):
    assert auto_threads(cores, load, ceiling) == expected


def test_the_environment_and_explicit_settings_win_over_auto():
    assert pick("auto", "auto", env={}, cores=4, load=0.2, torch_default=4)[:2] == (3, 1)
    assert pick("auto", "auto", env={"OMP_NUM_THREADS": "2"}, cores=2, load=5.0)[:2] == (None, 1)
    assert pick(3, "torch", env={"OMP_NUM_THREADS": "1"}, cores=2, load=0.0)[:2] == (3, None)
    assert pick("torch", 2, env={}, cores=2, load=9.0)[:2] == (None, 2)
    assert "load 1.70" in pick("auto", "auto", env={}, cores=2, load=1.7)[2]


@pytest.mark.parametrize("value", ["0", "-1", "many", "1.5"])
def test_a_bad_setting_is_refused(value):
    with pytest.raises(ValueError, match="auto, torch or a positive integer"):
        parse_setting(value, "engine.threads")


def test_apply_sets_torchs_count_and_the_engine_schema_defaults_to_auto():
    from searchr1.engines.local.config import LocalEngineConfig

    assert (LocalEngineConfig().threads, LocalEngineConfig().interop_threads) == ("auto", "auto")
    before = torch.get_num_threads()
    try:
        assert cpu_threads.apply(1, "torch") == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_importing_the_package_asks_openmp_for_passive_waiting():
    import subprocess
    import sys

    code = "import os, searchr1; print(os.environ['OMP_WAIT_POLICY'])"
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=cpu_threads.__file__.rsplit("/searchr1/", 1)[0])
    assert out.stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         cwd=cpu_threads.__file__.rsplit("/searchr1/", 1)[0])
    assert out.stdout.strip() == "ACTIVE"  # the environment's choice stays
