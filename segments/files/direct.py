"""Appending to a new file around the page cache (`O_DIRECT`): how the cleaner writes its `.cleaned` segments.

Owns the alignment rule of direct I/O here (the memory, the file position and the length of every direct write a
multiple of `ALIGN`), the aligned staging buffer appended bytes pass through, and the fall-back to ordinary writes
where a filesystem refuses direct I/O (said once per process and filesystem, as a warning). Why (docs/design.md, "Writing around the page cache"): the cleaner writes
its output once and fsyncs it; through the page cache each output byte is first copied into newly allocated
cache pages, which on this project's VMs costs ~2.4 ms a MB of CPU (their host backs guest memory again on first
touch), and the output evicts pages the broker serves reads from. `LogSegment.write_directly` gives a new segment
one; the bytes it holds back (the last, partial block) reach the file at `drain()`, which the segment calls before
anything else uses the file.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os

import numpy as np

from .fileio import FileOps

__all__ = ["ALIGN", "STAGE_BYTES", "DirectAppender"]

log = logging.getLogger(__name__)

ALIGN = 4096  # a direct write's memory address, file position and length: whole 4 KiB blocks (any device's sector)
STAGE_BYTES = 1024 * 1024  # the staging buffer, so one direct write at most: 1, 4 and 16 MiB measured alike (bench/RESULTS.md)


class DirectAppender:
    """Appends to a file from position 0 with direct writes of whole blocks, through a page-aligned staging buffer.

    `fd` is the file's ordinary descriptor (kept by its owner, who also fsyncs it): the partial last block is
    written through it at `drain()`, and every write is, from the first one the filesystem refuses (`EINVAL`).
    Writes go through `file_ops.pwrite_all` (fault injection, the power-loss model, errors naming the file).
    """

    __slots__ = ("_path", "_direct_fd", "_fd", "_file_ops", "_stage", "_array", "_block", "_fill", "_pending")

    def __init__(self, path: str | os.PathLike, fd: int, file_ops: FileOps) -> None:
        if os.fstat(fd).st_size != 0:
            raise ValueError(f"{path}: direct appends start at an empty file")
        self._path = path
        self._fd = fd
        self._file_ops = file_ops
        self._direct_fd = _open_direct(path, fd)
        self._stage = mmap.mmap(-1, STAGE_BYTES)  # anonymous mappings are page-aligned
        self._array = np.frombuffer(self._stage, dtype=np.uint8)
        self._block = 0  # file position of the stage's first byte (a multiple of ALIGN)
        self._fill = 0  # bytes in the stage
        self._pending = False  # the stage holds bytes the file does not have yet

    @property
    def direct(self) -> bool:
        """Whether whole blocks still go around the page cache (False after a refusal, or if the open was refused)."""
        return self._direct_fd >= 0

    def append(self, data: bytes | bytearray | memoryview) -> None:
        """Append `data` after everything appended so far (whole stages are written at once)."""
        source = np.frombuffer(data, dtype=np.uint8)  # a view, not a copy
        done, n = 0, source.size
        while done < n:
            take = min(n - done, STAGE_BYTES - self._fill)
            _copy(self._array[self._fill:self._fill + take], source[done:done + take])
            self._fill += take
            done += take
            self._pending = True
            if self._fill == STAGE_BYTES:
                self._write_blocks()

    def drain(self) -> None:
        """Make the file hold every appended byte: the whole blocks directly, the partial last one through `fd`.
        That block stays staged too, so a later append writes it again, whole, with what follows it."""
        if not self._pending:
            return
        self._write_blocks()
        if self._fill:
            self._file_ops.pwrite_all(self._fd, self._array[:self._fill].data, self._block)
        self._pending = False

    def close(self) -> None:
        """Close the direct descriptor; bytes not drained are dropped (the owner drains first). The stage goes with
        the last reference to it (an error's traceback may still hold a view of it)."""
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1

    def _write_blocks(self) -> None:
        whole = self._fill - self._fill % ALIGN
        if whole == 0:
            return
        self._write(self._array[:whole].data)
        tail = self._fill - whole
        if tail:  # [whole, fill) to the front: whole >= ALIGN > tail, so the two ranges do not overlap
            self._array[:tail] = self._array[whole:self._fill]
        self._block += whole
        self._fill = tail

    def _write(self, blocks: memoryview) -> None:
        if self._direct_fd >= 0:
            try:
                self._file_ops.pwrite_all(self._direct_fd, blocks, self._block)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                os.close(self._direct_fd)  # the filesystem takes no direct writes: ordinary ones from here on
                self._direct_fd = -1
                _refused(self._path, self._fd, exc)
        self._file_ops.pwrite_all(self._fd, blocks, self._block)


def _copy(destination: np.ndarray, source: np.ndarray) -> None:
    """Copy `source` into `destination` (byte arrays of one length). numpy releases the GIL around a plain copy
    of this size; a memoryview slice assignment would hold it (~10 ms a GB of output)."""
    destination[:] = source


def _open_direct(path: str | os.PathLike, fd: int) -> int:
    """A write-only direct descriptor of the file `fd` is open on, or -1 where the filesystem (or platform) has no
    direct I/O or `path` no longer names that file."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        direct = os.open(path, os.O_WRONLY | flag | os.O_NOFOLLOW)
    except OSError as exc:
        _refused(path, fd, exc)
        return -1
    mine, theirs = os.fstat(direct), os.fstat(fd)
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        os.close(direct)
        return -1
    return direct


_refused_on: set[int] = set()  # the filesystems (st_dev) whose refusal this process has reported


def _refused(path: str | os.PathLike, fd: int, exc: OSError) -> None:
    """Say once per process and filesystem that it refuses direct I/O, and that its cleaned segments go through
    the page cache (an operator sees which way they are written; `log.cleaner.io.direct=false` asks for that)."""
    device = os.fstat(fd).st_dev
    if device in _refused_on:
        return
    _refused_on.add(device)
    log.warning("%s: the filesystem refuses direct I/O (%s): cleaned segments on it are written through the page "
                "cache (set log.cleaner.io.direct=false to write them so without trying)", path, exc.strerror or exc)
