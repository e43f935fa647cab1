"""Fault-injection hooks for tests: named points where a test can kill the process or fail a write.

``crash_point(name, step)`` does nothing unless ``$SEARCHR1_KILL_AT`` or ``$SEARCHR1_FAIL_AT``
names that point, so production runs pay two environment lookups. Tests use it to prove that a
kill, a stop signal or a full disk at any point of a step resumes to the result of an
uninterrupted run.

- ``SEARCHR1_KILL_AT=<point>[@<step>]`` sends ``$SEARCHR1_KILL_SIGNAL`` (``KILL`` unless set,
  e.g. ``TERM`` or ``INT``) to this process there: SIGKILL dies at once, SIGTERM / SIGINT go
  through the trainer's stop handler (``loop/stop.py``). A line on stderr first says which
  signal was sent where and when (``SENT_LINE``), so a test can time the process's exit.
- ``SEARCHR1_FAIL_AT=<point>[@<step>]`` raises ``OSError(ENOSPC)`` there, as a full disk
  would inside the write that follows.

These are the package's only test hooks; ``POINTS`` names every one, in the order a step
reaches them, and ``crash_point`` refuses a name it does not list.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time

KILL_ENV = "SEARCHR1_KILL_AT"  # a signal at <point>[@<step>]
KILL_SIGNAL_ENV = "SEARCHR1_KILL_SIGNAL"  # which signal (a name without SIG; KILL by default)
FAIL_ENV = "SEARCHR1_FAIL_AT"  # OSError(ENOSPC) at <point>[@<step>]
SENT_LINE = "searchr1 test hook:"  # starts the stderr line telling which signal was sent when
POINTS = {  # every crash point in the package: where it is, and what a kill there leaves
    "in_rollout": "loop/train_step.py: the step's first turns in flight",
    "mid_rollout": "loop/train_step.py: the step's rollout sampled, nothing trained",
    "in_update": "loop/train_step.py: the update about to start",
    "after_update": "loop/trainer.py: updated and its metrics row logged, nothing saved",
    "engine_mid_write": "engines/local/training/checkpoint.py (inside save_checkpoint's engine "
                        "saves): files in the engine's temp folder, not renamed",
    "shard_mid_write": "distributed/dcp.py: a rank's shards written, not renamed",
    "after_engine_state": "loop/checkpoint.py: the engine state saved",
    "after_sampler": "loop/checkpoint.py: the sampler weights saved",
    "loop_mid_write": "loop/checkpoint.py: the loop's temp folder made, trainer_state.json not "
                      "yet in it",
    "before_loop_state": "loop/checkpoint.py: the temp folder complete, not renamed",
    "in_eval": "loop/trainer.py: the questions of the eval after step N in flight (@0: the eval "
               "before training)",
}
_fired: set[tuple[str, str]] = set()  # (env, spec) already acted on in this process


def _fires(env: str, name: str, step: int | None) -> bool:
    """Whether ``$env`` (``<point>[@<step>]``) names this point and step, for the first time."""
    spec = os.environ.get(env)
    if not spec or (env, spec) in _fired:
        return False
    point, _, at = spec.partition("@")
    if point == name and (not at or (step is not None and step == int(at))):
        _fired.add((env, spec))  # once: a point reached twice (engine state, then sampler) acts once
        return True
    return False


def crash_point(name: str, step: int | None = None) -> None:
    """Signal this process or raise ENOSPC when the environment names this point (tests only).

    ``<point>`` acts the first time the point is reached; ``<point>@<N>`` the first time it is
    reached on step ``N`` (1-based: the step whose metrics row and checkpoint are numbered
    ``N``), so a test can let step 1 complete and break step 2. A point whose caller does not
    know the step (``step=None``) matches the plain form only.
    """
    if name not in POINTS:
        raise ValueError(f"crash point {name!r} is not in utils/faults.py's POINTS")
    if _fires(FAIL_ENV, name, step):
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {name})")
    if _fires(KILL_ENV, name, step):
        sig = getattr(signal, "SIG" + os.environ.get(KILL_SIGNAL_ENV, "KILL").upper())
        print(f"{SENT_LINE} {sig.name} at {name}@{step} t={time.time():.3f}", file=sys.stderr,
              flush=True)  # when: a test measures the time from here to the process's exit
        os.kill(os.getpid(), sig)


def reset() -> None:
    """Forget which hooks acted, so the same spec acts again (tests running in one process)."""
    _fired.clear()
