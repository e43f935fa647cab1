"""Host memory: glibc's allocator told to hand freed memory back to the system.

CPU tensors (and Python objects) come from glibc's malloc, and two of its defaults let a
run's resident memory grow far past what it holds live. A freed block below the mmap
threshold stays in the heap for reuse, and that threshold rises to the size of the largest
block ever freed (up to 32 MiB), so after the first big activation every mid-size tensor is
heap-allocated and its pages are kept; and each thread gets its own arena (up to eight per
core), each keeping its own free blocks. On this project's default CPU run that retention
was over half of the peak.

Mapping every large block costs a page fault per 4 KiB page each time it is touched anew (a
KV cache grown by one token re-maps its blocks every step): glibc's ``glibc.malloc.hugetlb=1``
tunable makes those mappings transparent huge pages, 512 times fewer faults (a 12 MB
cache-growth loop ran 3.0× faster than without it, and faster than glibc's default). A
tunable is read only when a process starts, so ``reexec_with_huge_pages`` (the entry point's
first call) runs the same command again with it set, once; ``SEARCHR1_NO_REEXEC=1`` skips it.

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

TUNABLE = "glibc.malloc.hugetlb=1"
NO_REEXEC_ENV = "SEARCHR1_NO_REEXEC"
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


def glibc_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the running glibc, or None."""
    libc = _glibc()
    if libc is None:
        return None
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    major, minor = libc.gnu_get_libc_version().decode().split(".")[:2]
    return int(major), int(minor)


def reexec_with_huge_pages() -> None:
    """Run this command again with glibc's huge-page tunable set (glibc ≥ 2.35), else return.

    Same process id, same arguments (``sys.orig_argv``), same environment plus the tunable; a
    process that already has it (the re-run itself) returns at once.
    """
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if os.environ.get(NO_REEXEC_ENV) or "glibc.malloc.hugetlb" in tunables:
        return
    version = glibc_version()
    if version is None or version < (2, 35):
        return
    env = dict(os.environ, GLIBC_TUNABLES=":".join(t for t in (tunables, TUNABLE) if t))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


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

