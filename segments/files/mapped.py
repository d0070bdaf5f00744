"""Reading a segment's windows through a memory mapping of its `.log` instead of copying them into a buffer.

Owns one decision and its safety argument. A round reads every inactive segment it cleans two or three times
(survey, index, recopy); `os.preadv` copies each window out of the page cache (~0.13 s per GB on the read-ahead
thread, which is the round's critical path), where a mapping hands the kernels the cached pages themselves.
Each window is a mapping of its own pages, populated before use (`MADV_POPULATE_READ`, Linux 5.14+) on the
thread that reads, so disk reads happen where `preadv`'s did, and a window the file no longer covers, or an
I/O error, is reported by that call (the window is then read with `preadv`, which gives its usual error).

A mapping is only safe on a file that cannot shrink while its pages are in use: a page cut off by a truncate
would end the process with SIGBUS instead of an error. So only a caller holding the partition's cleaner lock
maps, and only inactive segments: under that lock no writer of this project truncates them (a writer only cuts
the torn tail of the last segment, at open) and a Kafka broker is excluded by its `.lock`. Reader-mode walks
(`verify`, `dump`, `audit`, a dry run next to a live broker) and the active segment are read with `preadv`.
Where the kernel refuses `MADV_POPULATE_READ` (older than 5.14), nothing is mapped from then on.

A window is a `memoryview` of its mapping, unmapped when the last view of it is released: a round maps only the
windows in flight (two or three, as its `preadv` buffers), so the pages it maps, which count in its RSS,
stay as few as the buffers they replace; a mapping of the whole segment counted all of it (W2's peak RSS
went 285 → 412 MiB).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import sys

import numpy as np

__all__ = ["mapped_window"]

# Python 3.11 does not name it; the value is Linux's (include/uapi/asm-generic/mman-common.h)
_MADV_POPULATE_READ: int | None = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform.startswith("linux") else None)
_populate_refused: list[bool] = []  # set once the kernel says it does not know MADV_POPULATE_READ
_madvise: list = []  # libc's madvise, once bound


def _populate(mapping: mmap.mmap) -> int:
    """Read in every page of `mapping`; 0, or the errno of the failure. Through ctypes, which releases the GIL
    for the call (`mmap.madvise` holds it: 8-14% of a round's wall time with it, and a cold read's disk time)."""
    if not _madvise:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
        _madvise.append(libc.madvise)
    address = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    if _madvise[0](address, len(mapping), _MADV_POPULATE_READ) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


def mapped_window(fd: int, position: int, size: int) -> memoryview | None:
    """`size` bytes of `fd` at `position`, as a view of a read-only mapping of just those pages, read in; None
    if mapped reads are not used here (no `MADV_POPULATE_READ`) or the pages could not be read in (the file no
    longer covers them, an I/O error): the caller then reads the window with `preadv`, which reports it."""
    if _MADV_POPULATE_READ is None or _populate_refused or size <= 0 or position < 0:
        return None
    start = position - position % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, position + size - start, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=start)
    except (OSError, ValueError):  # past the end of the file, or a file system that cannot map
        return None
    failed = _populate(mapping)
    if failed:
        if failed == errno.EINVAL:
            _populate_refused.append(True)
        mapping.close()
        return None
    with memoryview(mapping) as whole:
        return whole[position - start:]
