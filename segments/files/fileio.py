"""The filesystem operations whose ordering and durability matter, behind one injectable object.

Owns fsync of files and directories, atomic rename, removal (also on a thread of its own:
`BackgroundRemover`) and the write-tmp-fsync-rename discipline of checkpoint files. Everything that must survive a crash in a known state (checkpoints, the swap of
cleaned segments, segment rolls) goes through a `FileOps` instance, so a test can pass a subclass that
fails or kills the process at a chosen step and a power-loss model can drop what was not fsynced.
It holds no state of its own.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from pathlib import Path

from . import faults

__all__ = ["BackgroundRemover", "FileOps", "DEFAULT_FILE_OPS"]

log = logging.getLogger(__name__)


class FileOps:
    """Durable file operations on the real filesystem. Subclass to inject faults."""

    def fsync_file(self, path: str | os.PathLike) -> None:
        """Flush a file's data and metadata to stable storage."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        faults.hit("fileops.fsync")

    def fsync_fd(self, fd: int) -> None:
        os.fsync(fd)
        faults.hit("fileops.fsync")

    def fsync_dir(self, path: str | os.PathLike) -> None:
        """Make renames, creations and removals in directory `path` durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        faults.hit("fileops.fsync_dir")

    def rename(self, src: str | os.PathLike, dst: str | os.PathLike) -> None:
        """Atomically rename `src` to `dst`, replacing `dst` if it exists (same filesystem)."""
        os.replace(src, dst)
        faults.hit("fileops.rename")

    def remove(self, path: str | os.PathLike) -> None:
        """Remove a file; a file that is already gone is not an error."""
        try:
            os.remove(path)
        except FileNotFoundError:
            return
        faults.hit("fileops.remove")

    def pwrite_all(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
        """Write all of `data` at `position` (pwrite may write less than asked); ENOSPC/EIO propagate."""
        try:
            faults.hit("fileops.pwrite")
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, position)
                view = view[written:]
                position += written
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, _fd_path(fd)) from None

    def write_atomic(self, path: str | os.PathLike, data: bytes, *, durable: bool = True) -> None:
        """Replace `path` with `data` so that a crash leaves either the old or the new content.

        Writes `<path>.tmp`, fsyncs it, renames it over `path` and fsyncs the directory. With `durable` False
        (a hint that may be lost, such as the survivorship checkpoint) nothing is fsynced: a process crash still
        leaves the old or the new content, a power failure may leave the old content or an unreadable file.
        """
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        # O_NOFOLLOW: a `.tmp` that is a symbolic link fails here instead of being truncated through.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            self.pwrite_all(fd, data, 0)
            if durable:
                self.fsync_fd(fd)
        except BaseException:
            os.close(fd)
            self.remove(tmp)
            raise
        os.close(fd)
        self.rename(tmp, path)
        if durable:
            self.fsync_dir(path.parent)


def _fd_path(fd: int) -> str:
    """The path an open file descriptor refers to, for error messages (best effort)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<fd {fd}>"


DEFAULT_FILE_OPS = FileOps()


class BackgroundRemover:
    """Removes files on threads of its own, taken in the order handed over, so that a swap's `.deleted` files do not
    hold up the round that made them (Kafka also deletes them later, after `file.delete.delay.ms`).

    Unlinking a file of a GB frees its page-cache pages and its blocks in the kernel: ~0.15-0.2 s per GB (of
    which ~0.06 s the pages; more with a filesystem mounted with `discard`), on the round's thread until then.
    `threads` files are unlinked at once (default 4): eight 128 MiB files took 0.21 s one at a time and 0.16-0.17 s
    four or eight at a time on the bench machine's `discard` ext4 (bench/RESULTS.md, fourteenth round), time a
    one-shot `clean` waits before it exits. A file left when the process ends (a crash) is removed by recovery
    at the next open of its log (`segments.partition.recovery`: `.deleted` files are never part of a log, so the
    order in which they go does not matter). A removal that fails is logged and left to that recovery.
    `drain()` waits until every file handed over so far is gone; the owner calls it before it reports disk usage
    or exits.
    """

    def __init__(self, file_ops: FileOps | None = None, threads: int = 4) -> None:
        self._file_ops = file_ops or DEFAULT_FILE_OPS
        self._queue: queue.Queue[Path] = queue.Queue()
        for _ in range(max(1, threads)):
            threading.Thread(target=self._run, name="logcleaner-remover", daemon=True).start()

    def remove(self, paths: list[Path]) -> None:
        """Remove `paths` soon, taken in this order (files already gone are no error)."""
        for path in paths:
            self._queue.put(path)

    def drain(self) -> None:
        """Wait until every file handed over so far has been removed (or its removal failed)."""
        self._queue.join()

    def _run(self) -> None:
        while True:
            path = self._queue.get()
            try:
                self._file_ops.remove(path)
            except Exception as exc:  # noqa: BLE001 - any failure: the file stays for recovery, the others go on
                log.warning("could not remove %s (%s); the next open of its log removes it", path, exc)
            finally:
                self._queue.task_done()
