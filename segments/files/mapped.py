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

A window is a read-only `memoryview` of its mapping, unmapped when the last view of it is released: a round maps
only the windows in flight (two or three, as its `preadv` buffers), so the pages it maps, which count in its
RSS, stay as few as the buffers they replace; a mapping of the whole segment counted all of it (W2's peak RSS
went 285 → 412 MiB). The mapping, its population and its unmapping are libc calls through ctypes, which
releases the GIL for each: Python 3.11's `mmap` holds it through `madvise` and through the `munmap` of a
window's release (~0.12 ms an 8 MiB window, ~30 ms a GB read twice, on the round's thread: `perf`, W4).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys

import numpy as np

__all__ = ["mapped_window"]

# Python 3.11 does not name it; the value is Linux's (include/uapi/asm-generic/mman-common.h)
_MADV_POPULATE_READ: int | None = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform.startswith("linux") else None)
_populate_refused: list[bool] = []  # set once the kernel says it does not know MADV_POPULATE_READ
_libc: list = []  # libc, its madvise, mmap and munmap bound with their C types, once
_MAP_FAILED = ctypes.c_void_p(-1).value


def _bound():
    if not _libc:
        libc = ctypes.CDLL(None, use_errno=True)
        for name, argtypes, restype in (
            ("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int),
            ("mmap", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64],
             ctypes.c_void_p),
            ("munmap", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int),
        ):
            function = getattr(libc, name)
            function.argtypes, function.restype = argtypes, restype
        _libc.append(libc)
    return _libc[0]


def _map(fd: int, length: int, offset: int) -> int | None:
    """The address of a shared read-only mapping of `length` bytes of `fd` from `offset`, or None."""
    address = _bound().mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
    return None if address in (None, _MAP_FAILED) else address


def _unmap(address: int, length: int) -> None:
    _bound().munmap(address, length)


def _populate(address: int, length: int) -> int:
    """Read in every page of the mapping at `address`; 0, or the errno of the failure."""
    if _bound().madvise(address, length, _MADV_POPULATE_READ) == 0:
        return 0
    return ctypes.get_errno() or errno.EIO


class _Mapping:
    """Pages mapped by `_map`, unmapped when this object goes: when the last view of them is released. It
    exports them read-only through `__array_interface__`, so an array of them takes no per-length ctypes type
    (making one costs ~17 µs of held GIL: window lengths differ)."""

    __slots__ = ("address", "length", "__array_interface__")

    def __init__(self, address: int, length: int) -> None:
        self.address, self.length = address, length
        self.__array_interface__ = {"data": (address, True), "shape": (length,), "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        _unmap(self.address, self.length)


def mapped_window(fd: int, position: int, size: int) -> memoryview | None:
    """`size` bytes of `fd` at `position`, as a read-only view of a mapping of just those pages, read in; None
    if mapped reads are not used here (no `MADV_POPULATE_READ`) or the pages could not be read in (the file no
    longer covers them, an I/O error): the caller then reads the window with `preadv`, which reports it."""
    if _MADV_POPULATE_READ is None or _populate_refused or size <= 0 or position < 0:
        return None
    start = position - position % mmap.ALLOCATIONGRANULARITY
    length = position + size - start
    try:
        if position + size > os.fstat(fd).st_size:
            return None  # past the end of the file
    except OSError:
        return None
    address = _map(fd, length, start)
    if address is None:  # a file system that cannot map
        return None
    mapping = _Mapping(address, length)
    failed = _populate(address, length)
    if failed:
        if failed == errno.EINVAL:
            _populate_refused.append(True)
        return None  # unmapped as `mapping` goes
    window = np.asarray(mapping)[position - start:]  # read-only; its base is `mapping`: mapped while a view lives
    return window.data
