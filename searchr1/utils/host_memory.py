"""Host memory: glibc's allocator told to hand freed memory back to the system.

CPU tensors (and Python objects) come from glibc's malloc, and two of its defaults let a
run's resident memory grow far past what it holds live. A freed block below the mmap
threshold stays in the heap for reuse, and that threshold rises to the size of the largest
block ever freed (up to 32 MiB), so after the first big activation every mid-size tensor is
heap-allocated and its pages are kept; and each thread gets its own arena (up to eight per
core), each keeping its own free blocks. On this project's default CPU run that retention
was over half of the peak.

``configure`` fixes the threshold (blocks of ``MMAP_THRESHOLD`` and more are mapped and
unmapped, so their pages return at ``free``) and caps the arenas; ``release`` (called at
every rollout/training switch, ``engines/local/phases.py``) runs ``gc`` and
``malloc_trim(0)``, which returns the free pages of every arena. Both do nothing where the C
library is not glibc. The environment's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_ARENA_MAX``
win over these defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

MMAP_THRESHOLD = 4 << 20  # bytes: larger blocks are mapped per allocation and unmapped at free
ARENA_MAX = 2
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # mallopt parameter numbers in glibc's malloc.h

_libc = None


def _glibc():
    """glibc's handle, or None (macOS, musl, Windows)."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else False
        except OSError:
            _libc = False
    return _libc or None


def configure() -> bool:
    """Fixed mmap threshold and at most ``ARENA_MAX`` arenas; returns whether it applied."""
    libc = _glibc()
    if libc is None:
        return False
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_ARENA_MAX" not in os.environ:
        libc.mallopt(_M_ARENA_MAX, ARENA_MAX)
    return True


def release() -> bool:
    """Collect garbage and return free heap pages to the system; returns whether it ran."""
    gc.collect()
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def resident_bytes() -> int:
    """This process's resident set size now (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
