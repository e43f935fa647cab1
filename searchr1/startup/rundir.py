"""Run-directory safety: one live job per run dir, no silent reuse of a finished run, disk space.

- ``RunDirLock``: an exclusive ``fcntl.flock`` on ``<run_dir>/.searchr1.lock``, held for the
  whole job. The kernel drops it when the process dies (SIGKILL included), so a lock left by
  a dead PID is simply taken over; the file's JSON (pid, host, start time) only feeds the
  message a second job gets. The file is never deleted (deleting a flock file races).
- ``run_dir_problems``: a run dir holding ``summary.json`` is a finished run; a new job there
  refuses unless ``trainer.resume=auto``; a ``trainer.resume`` path must exist.
- ``refuse_live_run_dir(argv)``: Hydra writes ``.hydra/*.yaml`` before our task starts, so a
  second job into a live ``hydra.run.dir=…`` is refused from the command line, before Hydra.
- ``ensure_free_space``: raise ``DiskSpaceError`` before writing a checkpoint that cannot fit.

Locks are advisory and per host on local disks; on NFS, ``flock`` is emulated with POSIX
locks by Linux (NFSv4), which is what SLURM sweeps usually share.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import time
from pathlib import Path

from searchr1.startup.checks import StartupError, exit_with

LOCK_FILE = ".searchr1.lock"
SUMMARY_FILE = "summary.json"
STATE_FILE = "trainer_state.json"


class RunDirBusy(StartupError):
    """Another live job holds the run directory."""


class DiskSpaceError(OSError):
    """Not enough free disk space for a write we are about to make."""


def _holder(lock_path: Path) -> str:
    """Who holds ``lock_path``, from the JSON the holder wrote (best effort)."""
    try:
        info = json.loads(lock_path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on {info['host']} (since {info['started']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class RunDirLock:
    """Exclusive hold on a run dir for the life of one job (a context manager)."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        """Take the lock, or exit (code 2) with one paragraph naming the holder."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            exit_with(f"searchr1: run directory {self.run_dir} is in use by "
                      f"{_holder(self.path)}. Wait for that job to finish, or pick another "
                      f"hydra.run.dir.", RunDirBusy)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_locked(run_dir: str | os.PathLike) -> bool:
    """Whether a live process holds ``run_dir``'s lock (never blocks, takes nothing)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock if we got it
    return False


def refuse_live_run_dir(argv: list[str]) -> None:
    """Exit (code 2) if ``argv`` names a ``hydra.run.dir`` a live job holds (run mode only)."""
    if any(a in ("-m", "--multirun") for a in argv):
        return
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") == "hydra.run.dir" and value and is_locked(value):
            exit_with(f"searchr1: run directory {value} is in use by "
                      f"{_holder(Path(value) / LOCK_FILE)}. Wait for that job to finish, or "
                      f"pick another hydra.run.dir.", RunDirBusy)


def run_dir_problems(run_dir: str | os.PathLike | None, resume: str) -> list[str]:
    """Why this run dir / resume setting cannot start a job (empty when it can)."""
    out: list[str] = []
    if resume not in ("never", "auto"):
        path = Path(resume).expanduser()
        if not path.exists():
            out.append(f"trainer.resume={resume}: no such checkpoint (use never, auto, or the "
                       f"path of a checkpoints/step_N folder)")
        elif path.is_dir() and not (path / STATE_FILE).is_file():
            out.append(f"trainer.resume={resume}: the folder holds no {STATE_FILE} (an "
                       f"incomplete or foreign checkpoint)")
    if run_dir is not None and (Path(run_dir) / SUMMARY_FILE).is_file() and resume != "auto":
        out.append(f"run directory {run_dir} holds a finished run ({SUMMARY_FILE}); pick a new "
                   f"hydra.run.dir, or continue this one with trainer.resume=auto")
    return out


def ensure_free_space(path: str | os.PathLike, needed_bytes: int, margin: float = 1.1) -> None:
    """Raise ``DiskSpaceError`` unless ``needed_bytes × margin`` are free where ``path`` goes."""
    probe = Path(path).expanduser().resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed_bytes * margin:
        raise DiskSpaceError(
            f"not enough disk space for {path}: needs about {_gb(needed_bytes * margin)} "
            f"(with a {margin:.0%} margin), {_gb(free)} free on {probe}")


def dir_size(path: str | os.PathLike) -> int:
    """Bytes in the files under ``path`` (0 when it does not exist): a checkpoint's size."""
    root = Path(path)
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"

