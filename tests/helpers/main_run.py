"""``python -m searchr1.main`` as a real process that starts in seconds, for the stop tests.

A fresh interpreter spends 15-35 s importing torch, transformers and the project on 2 cores. A
``forkserver`` that imported them once forks each run instead; the child runs ``searchr1.main``
as ``__main__`` (Hydra, the start-up checks, the trainer, main.py's reports and exit codes)
with its own command line, environment and stdout/stderr files, and runs the interpreter's
exit handlers before it ends, as ``python -m`` would. It is a process of its own: signals,
exit codes and the run-dir lock are real.

``tiny_overrides`` is the smoke preset on a tiny random model (``warmstart=none``): 2 steps of
2 questions × 2 trajectories over the generated world with BM25, a 2-question eval.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from searchr1.utils.faults import FAIL_ENV, KILL_ENV, KILL_SIGNAL_ENV, SENT_LINE
from searchr1.utils.host_memory import NO_REEXEC_ENV

ROOT = Path(__file__).resolve().parents[2]
PRELOAD = ["searchr1.loop.trainer", "searchr1.build", "searchr1.engines.local.service",
           "searchr1.retrievers.bm25", "searchr1.trackers.session", "searchr1.startup.preflight"]


def tiny_overrides(model_dir: Path) -> list[str]:
    """``experiment=smoke`` on the tiny random model of ``tests/conftest.py``."""
    return ["experiment=smoke", "model.name=tiny", f"model.hf_id={model_dir}",
            "model.gguf_file=null", "model.lora_rank=4", "model.lora_alpha=8", "warmstart=none",
            "engine.device=cpu", "rollout.max_turn_tokens=8"]


def _child(argv: list[str], env: dict, out: str, err: str) -> None:
    """The forked process: ``python -m searchr1.main *argv`` with ``env`` added."""
    import atexit
    import runpy

    for name in (KILL_ENV, KILL_SIGNAL_ENV, FAIL_ENV):
        os.environ.pop(name, None)
    os.environ.update({**env, NO_REEXEC_ENV: "1"})  # no re-exec: it would re-import everything
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.chdir(ROOT)
    sys.argv = [str(ROOT / "searchr1" / "main.py"), *argv]
    try:
        runpy.run_module("searchr1.main", run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


@dataclass
class Ended:
    """How a run ended: its exit code (−N: killed by signal N), output, and timing."""

    code: int | None
    stdout: str
    stderr: str
    ended_at: float  # time.time() when the parent saw it exit

    def seconds_after_signal(self) -> float:
        """From the fault hook's signal (its stderr line) to the process's exit."""
        found = re.search(rf"{re.escape(SENT_LINE)} \S+ at \S+ t=([0-9.]+)", self.stderr)
        assert found, f"no signal was sent: {self.stderr[-2000:]}"
        return self.ended_at - float(found.group(1))


class MainRun:
    """A started run; ``wait`` for its end."""

    def __init__(self, argv: list[str], log_dir: Path, env: dict | None = None) -> None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        log_dir.mkdir(parents=True, exist_ok=True)
        n = len(list(log_dir.glob("main_*.out")))
        self.out, self.err = log_dir / f"main_{n}.out", log_dir / f"main_{n}.err"
        self.proc = ctx.Process(target=_child, args=(list(argv), dict(env or {}), str(self.out),
                                                     str(self.err)))
        self.proc.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = 300) -> Ended:
        """Its ending (killed with SIGKILL after ``timeout`` seconds: code −9)."""
        end = time.monotonic() + timeout
        while self.proc.exitcode is None and time.monotonic() < end:
            self.proc.join(0.02)
        ended_at = time.time()
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()
        return Ended(self.proc.exitcode, self.out.read_text(errors="replace"),
                     self.err.read_text(errors="replace"), ended_at)


def run_main(argv: list[str], log_dir: Path, env: dict | None = None, timeout: float = 300) -> Ended:
    """Start a run and wait for it."""
    return MainRun(argv, log_dir, env).wait(timeout)


def signal_at(point: str, sig: str = "TERM") -> dict:
    """The environment that has the fault hook send ``sig`` at ``point`` (``<name>@<step>``)."""
    return {KILL_ENV: point, KILL_SIGNAL_ENV: sig}
