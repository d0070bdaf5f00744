"""The process's C allocator settings for a cleaning process (the CLI and the daemon call `tune_allocator`).

Owns one decision: keep the per-window numpy temporaries of a round (masks, indices, hashes: a few MB each, a
dozen per 16 MiB window) in glibc's heap instead of a fresh `mmap` for each. By default glibc serves blocks
above its (dynamic, at most 32 MiB) mmap threshold with `mmap` and trims the heap as soon as 128 KiB at its top
are free, so every window paid page faults on brand-new memory and `munmap`s: measured 0.2-0.5 s of system
time per GB cleaned (bench/RESULTS.md). With a 32 MiB mmap threshold, a 64 MiB trim threshold and a 16 MiB
top pad, the same pages are reused window after window. What this keeps from the kernel is bounded: up to
64 MiB of freed heap at the top, reused by the next round. The offset map and the window buffers are not
affected (the map is its own mapping; the buffers live for the thread).

Only glibc has `mallopt`; elsewhere (musl, macOS) this does nothing. Never called on import: a library user's
process keeps its own allocator settings.
"""

from __future__ import annotations

import ctypes

__all__ = ["tune_allocator"]

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
