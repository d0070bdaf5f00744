"""The native libraries' settings of a cleaning process (the CLI and the daemon call both functions at start).

Owns two decisions. `limit_blas_threads`: numpy's OpenBLAS starts a thread per core when numpy is imported,
and they spin for a while; no round calls BLAS, and on a 2-core machine the spinning took a core from the round
(W1 0.1 s of 1.2 s, bench/RESULTS.md), so a cleaning process asks OpenBLAS for one thread, unless the
environment already says how many.

`tune_allocator`: keep the per-window numpy temporaries of a round (masks, indices, hashes: a few MB each, a
dozen per 16 MiB window) in glibc's heap instead of a fresh `mmap` for each. By default glibc serves blocks
above its (dynamic, at most 32 MiB) mmap threshold with `mmap` and trims the heap as soon as 128 KiB at its top
are free, so every window paid page faults on brand-new memory and `munmap`s: measured 0.2-0.5 s of system
time per GB cleaned (bench/RESULTS.md). With a 32 MiB mmap threshold, a 64 MiB trim threshold and a 16 MiB
top pad, the same pages are reused window after window. What this keeps from the kernel is bounded: up to
64 MiB of freed heap at the top, reused by the next round. The offset map and the window buffers are not
affected (the map is its own mapping; the buffers live for the thread).

Only glibc has `mallopt`; elsewhere (musl, macOS) it does nothing. Neither is called on import: a library
user's process keeps its own settings.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["limit_blas_threads", "tune_allocator"]

# OpenBLAS (numpy's wheels) reads it when numpy is first imported; later settings do nothing
BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_SETTINGS = ((_M_MMAP_THRESHOLD, 32 * 2**20), (_M_TRIM_THRESHOLD, 64 * 2**20), (_M_TOP_PAD, 16 * 2**20))


def tune_allocator() -> bool:
    """Apply the settings above; True if glibc took all of them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: the C library it runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in _SETTINGS)


def limit_blas_threads() -> bool:
    """Ask OpenBLAS for one thread if numpy is not imported yet and the environment sets no count; True if set.

    The variable is inherited by the process's children (the kernels' build, a local Spark's workers): none of
    them calls BLAS either."""
    if "numpy" in sys.modules or BLAS_THREADS_VARIABLE in os.environ:
        return False
    os.environ[BLAS_THREADS_VARIABLE] = "1"
    return True
