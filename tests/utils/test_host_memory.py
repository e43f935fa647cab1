"""glibc told to hand freed memory back: a worker thread's freed mid-size tensors leave the RSS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from searchr1.utils import host_memory

PROBE = textwrap.dedent("""
    import os, sys, threading, torch
    from searchr1.utils import host_memory as hm
    def resident_bytes():  # this process's resident set size now
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    configured = sys.argv[1] == "configured"
    if configured:
        hm.configure()
    keep = []
    def work():
        big = torch.ones(16 << 18)  # 16 MiB freed: glibc's dynamic mmap threshold rises to it
        del big
        held = []
        for _ in range(120):
            held.append(torch.ones(6 << 18))  # 6 MiB each, all freed below
            keep.append(torch.ones(1 << 14))  # 64 KiB each, kept: they pin the heap around the holes
        del held[:]
    before = resident_bytes()
    t = threading.Thread(target=work)  # its own arena, as the sampler's and the retriever's threads
    t.start(); t.join()
    if configured:
        assert hm.release()
    print((resident_bytes() - before) >> 20)
""")


def retained_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_tensors_return_to_the_system_once_configured():
    default = retained_mib("default")
    if default < 300:
        pytest.skip(f"this C library keeps only {default} MiB of 720 MiB freed: nothing to fix here")
    assert retained_mib("configured") < 64, "configure + release left the freed 720 MiB resident"


def test_environment_settings_win(monkeypatch):
    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append(param)

    monkeypatch.setattr(host_memory, "_libc", FakeLibc())
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert host_memory.configure()
    assert calls == [host_memory._M_MMAP_THRESHOLD]


def test_reexec_runs_the_same_command_once_with_the_tunable(monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory.os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(host_memory.sys, "orig_argv", ["python3", "-m", "searchr1.main", "seed=3"])
    monkeypatch.delenv(host_memory.NO_REEXEC_ENV, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4")
    host_memory.reexec_with_huge_pages()
    ((exe, argv, env),) = calls
    assert exe == host_memory.sys.executable and argv == [exe, "-m", "searchr1.main", "seed=3"]
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=4:glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])  # the re-run: no second exec
    host_memory.reexec_with_huge_pages()
    monkeypatch.setenv("GLIBC_TUNABLES", "")
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 31))  # tunable unknown there
    host_memory.reexec_with_huge_pages()
    monkeypatch.setenv(host_memory.NO_REEXEC_ENV, "1")
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 36))
    host_memory.reexec_with_huge_pages()
    assert len(calls) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_the_entry_point_runs_under_the_tunable(tmp_path):
    """``python -m searchr1.main`` re-runs itself with the tunable before any work."""
    if (host_memory.glibc_version() or (0, 0)) < (2, 35):
        pytest.skip("glibc < 2.35 has no hugetlb tunable")
    probe = tmp_path / "sitecustomize.py"  # runs in every interpreter start: records the tunables
    probe.write_text("import os\nopen(os.environ['PROBE_OUT'], 'a').write(os.environ.get('GLIBC_TUNABLES', '-') + '\\n')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               PROBE_OUT=str(tmp_path / "seen"))
    env.pop("GLIBC_TUNABLES", None)
    env.pop(host_memory.NO_REEXEC_ENV, None)
    subprocess.run([sys.executable, "-m", "searchr1.main", "--help"], env=env, capture_output=True,
                   timeout=300, check=True)
    assert (tmp_path / "seen").read_text().split() == ["-", "glibc.malloc.hugetlb=1"]


def test_phase_switches_release_host_memory_only_when_asked(monkeypatch):
    from searchr1.engines.local.phases import Phases

    calls = []
    monkeypatch.setattr(host_memory, "release", lambda: calls.append(1) or True)
    cpu, gpu = Phases(), Phases(release_host_memory=False)
    for phases in (cpu, gpu):
        phases.rollout()
        phases.training()
        phases.training()  # no switch: nothing to release
    assert len(calls) == 2 and cpu.switches == gpu.switches == 2
