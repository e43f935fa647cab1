"""CPU threads of torch: how many this process uses, picked for the machine and its load.

torch starts one OpenMP thread per core, and by default those threads spin at the end of
every parallel region waiting for the slowest of them. On a machine where other work holds a
core, the team waits for a member the kernel has taken off the CPU: on the 2-core dev VM, with
other work beside it, a decode step of the embedded model took ~10× longer at torch's default
than with one thread (experiments/benchmarks/README.md, ``cpu_threads``). Hence:

- ``engine.threads=auto`` (the default): the cores this process may run on
  (``os.sched_getaffinity``) less the load other work puts on them (the 1-minute load
  average at start-up), rounded, less one more for the run's own other threads (the event
  loop, searches, tokenising), at least 1 and at most torch's own default. On the 2-core VM
  one thread decoded and trained as fast as torch's two even with the machine nearly quiet
  (decode 57 vs 66 ms, train 580 vs 549 ms at load 0.9), and far faster under load. An
  ``OMP_NUM_THREADS`` in the environment wins (torchrun sets 1 per rank; joblib's workers
  their share). ``engine.threads=N`` fixes the count; ``engine.threads=torch`` keeps torch's.
- ``engine.interop_threads=auto``: 1. The run schedules its own concurrency (the sampler's
  worker thread, the event loop); torch's inter-op pool serves ``torch.jit.fork``, which
  nothing here calls. An integer sets it, ``torch`` keeps torch's default.
- importing ``searchr1`` asks OpenMP to let waiting threads sleep instead of spinning
  (``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets it; read when torch loads), so
  load that appears after start-up slows a run by the share it takes rather than by a team
  spinning for a descheduled member.

The count is picked once, at start-up, and kept for the run: a count that changed between
steps would change the order of float reductions from one step to the next.
"""

from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger(__name__)

AUTO, TORCH = "auto", "torch"
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def usable_cores() -> int:
    """Cores this process may be scheduled on (the affinity mask, else ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


def other_load() -> float:
    """The machine's 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def auto_threads(cores: int, load: float, ceiling: int) -> int:
    """The cores left by ``load`` (rounded half up) less one for the run's own other threads,
    within [1, min(cores, ceiling)]."""
    free = int(cores - load + 0.5) - 1
    return max(1, min(free, cores, ceiling))


def parse_setting(value, name: str) -> str | int:
    """``auto``, ``torch`` or a positive integer (an int or its text); ValueError otherwise."""
    text = str(value).strip().lower()
    if text in (AUTO, TORCH):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"{name}={value!r}: give auto, torch or a positive integer")


def pick(threads, interop, env=os.environ, cores: int | None = None, load: float | None = None,
         torch_default: int | None = None) -> tuple[int | None, int | None, str]:
    """(intra-op threads or None to keep, inter-op threads or None to keep, why): the decision,
    without touching torch (``apply`` does)."""
    threads = parse_setting(threads, "engine.threads")
    interop = parse_setting(interop, "engine.interop_threads")
    n_interop = 1 if interop == AUTO else (None if interop == TORCH else interop)
    if threads == TORCH:
        return None, n_interop, "torch's default"
    if isinstance(threads, int):
        return threads, n_interop, "engine.threads"
    if env.get("OMP_NUM_THREADS", "").strip().isdigit():
        return None, n_interop, f"OMP_NUM_THREADS={env['OMP_NUM_THREADS'].strip()}"
    cores = usable_cores() if cores is None else cores
    load = other_load() if load is None else load
    ceiling = cores if torch_default is None else torch_default
    n = auto_threads(cores, load, ceiling)
    return n, n_interop, f"auto: {cores} cores, load {load:.2f}"


@functools.lru_cache(maxsize=1)
def _torch_default() -> int:
    """torch's intra-op count before this module changed it (physical cores, or the env's)."""
    import torch

    return torch.get_num_threads()


def apply(threads=AUTO, interop=AUTO) -> int:
    """Set torch's thread counts per ``engine.threads`` / ``engine.interop_threads``; returns
    the intra-op count in force. An inter-op count torch no longer accepts (parallel work has
    started, or it was set before in this process) is left as it is."""
    import torch

    n, n_interop, why = pick(threads, interop, torch_default=_torch_default())
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)
    if n_interop is not None and n_interop != torch.get_num_interop_threads():
        try:
            torch.set_num_interop_threads(n_interop)
        except RuntimeError:  # only once per process, before any inter-op work
            pass
    log.info("CPU threads: %d (%s), inter-op %d, OMP_WAIT_POLICY=%s", torch.get_num_threads(),
             why, torch.get_num_interop_threads(), os.environ.get(WAIT_POLICY_ENV, "(OpenMP's)"))
    return torch.get_num_threads()
