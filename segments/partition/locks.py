"""Advisory locks that let one writer process and one cleaner process share a partition directory.

Owns `PartitionLock`, an `flock` on a small file inside `<topic>-<partition>/` (released by the kernel when
the holder dies, so a crash never leaves a partition locked), and `LogDirLock`, the shared lock on the log
dir's `.lock` that keeps logcleaner and a running Kafka broker apart. The protocol:
* `.writer.lock` (exclusive): the one writer, for its whole life; it alone appends to and rolls the active
  segment. `.cleaner.lock` (exclusive): the one cleaner of the partition, for a whole round; `.cleaned`
  files are its own, and it never writes the active segment.
* `.swap.lock`: exclusive for the few renames of a swap, a roll or leftover recovery; shared while listing
  segments. A reader takes it only if the file exists (`create=False`) and creates nothing.
* Lock order, to avoid deadlock: `.writer.lock` or `.cleaner.lock` first, then `.swap.lock`.
* These locks coordinate processes; threads of one process use the `PartitionLog`'s own mutex.
* Whatever changes files in a log dir holds `LogDirLock` first, which fails while a broker owns the log dir;
  read-only commands take no lock and ask `log_dir_owner()`.
The full protocol, and why it is safe: see docs/design.md, "Locks".
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path

from ..codec.errors import LockTimeoutError, LogDirOwnedError, LogStateError
from ..files.pathcheck import check_regular_fd, open_no_follow

__all__ = ["PartitionLock", "LogDirLock", "log_dir_owner", "WRITER_LOCK", "CLEANER_LOCK", "SWAP_LOCK", "KAFKA_LOCK"]

WRITER_LOCK = ".writer.lock"
CLEANER_LOCK = ".cleaner.lock"
SWAP_LOCK = ".swap.lock"
KAFKA_LOCK = ".lock"  # in the log dir itself: Kafka's lock file, held by a running broker

# struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid, padding): whole file from byte 0.
_FLOCK = struct.Struct("@hhqqi4x")
_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)

_POLL_INTERVAL_S_MAX = 0.05


class PartitionLock:
    """One advisory lock file in a partition directory; usable as a context manager.

    `acquire(timeout_s=None)` blocks until the lock is held (or raises `LockTimeoutError` after
    `timeout_s`); `timeout_s=0` tries once. The lock is not re-entrant. With `create=False` (shared locks
    only: a reader's) a missing lock file is not created: `acquire` raises `FileNotFoundError` instead, and
    a lock file that is not a regular file raises `NotRegularFileError` without waiting on it.
    """

    def __init__(self, directory: str | os.PathLike, name: str, *, shared: bool = False, create: bool = True) -> None:
        assert create or shared, "only a shared lock may be taken without creating its file"
        self.path = Path(directory) / name
        self.shared = shared
        self.create = create
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout_s: float | None = None, check_abort: Callable[[], None] | None = None) -> "PartitionLock":
        """Take the lock, waiting up to `timeout_s` (None: for ever; 0: not at all). While it waits, `check_abort()`
        is called between tries: what it raises ends the wait (a cleaner stopping does not wait out the timeout)."""
        assert self._fd is None, f"{self.path} is already held by this object"
        if self.create:
            fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)  # a lock file that is a link is refused
        else:
            # Read-only is enough for flock (and for a shared lock over NFS's fcntl emulation); O_NONBLOCK so
            # that a FIFO in its place is refused by the check below, not waited on by the open.
            fd = open_no_follow(self.path, os.O_RDONLY | os.O_NONBLOCK)
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        try:
            if not self.create:
                check_regular_fd(fd, self.path)
            if timeout_s is None:
                fcntl.flock(fd, mode)
            else:
                deadline = time.monotonic() + timeout_s
                delay = 0.001
                while True:
                    try:
                        fcntl.flock(fd, mode | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise LockTimeoutError(
                                f"{self.path}: lock is held by another process or thread "
                                f"(waited {timeout_s:.3f} s)"
                            ) from None
                        if check_abort is not None:
                            check_abort()
                        time.sleep(min(delay, remaining))
                        delay = min(delay * 2, _POLL_INTERVAL_S_MAX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> "PartitionLock":
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def is_held_elsewhere(self) -> bool:
        """Whether another process or file description holds this lock now (a snapshot, racy by nature)."""
        if self._fd is not None:
            return False
        probe = PartitionLock(self.path.parent, self.path.name, shared=self.shared)
        try:
            probe.acquire(timeout_s=0)
        except LockTimeoutError:
            return True
        probe.release()
        return False


KAFKA_MAIN_CLASS = "kafka.Kafka"  # a broker's JVM runs this class (bin/kafka-server-start.sh)


def _describe_pid(pid: int | None) -> str:
    """Who holds a lock, in words: "a running Kafka broker (pid N)" when it runs Kafka's main class."""
    if pid is None or pid <= 0:
        return "another process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        args = []
    if KAFKA_MAIN_CLASS in args:
        return f"a running Kafka broker (pid {pid})"
    name = args[0].rsplit("/", 1)[-1] if args and args[0] else "unknown command"
    return f"process {pid} ({name})"


def log_dir_owner(log_dir: str | os.PathLike) -> LogDirOwnedError | None:
    """The error naming who holds `<log_dir>/.lock` for writing (a running broker), or None if nobody does.

    Creates nothing and takes no lock (for read-only commands, and the daemon's periodic check); a
    missing or unreadable `.lock` means no broker can be holding it readably: None. Racy by nature.
    """
    path = Path(log_dir) / KAFKA_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        found = fcntl.fcntl(fd, _OFD_GETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
    except OSError:
        return None
    finally:
        os.close(fd)
    l_type, _, _, _, pid = _FLOCK.unpack(found)
    if l_type == fcntl.F_UNLCK:
        return None
    return LogDirOwnedError(log_dir, _describe_pid(pid if pid > 0 else None), pid if pid > 0 else None)


class LogDirLock:
    """A shared lock on `<log dir>/.lock` for as long as logcleaner changes files in the log dir.

    `acquire()` raises `LogDirOwnedError` (naming the holder) if a broker holds its exclusive lock, and
    `OSError` if the file can neither be opened nor created. Not re-entrant; release() is idempotent.
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.log_dir = Path(log_dir)
        self._fd: int | None = None

    def acquire(self) -> "LogDirLock":
        assert self._fd is None, f"{self.log_dir}/{KAFKA_LOCK} is already held by this object"
        fd = open_no_follow(self.log_dir / KAFKA_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LogStateError(f"{self.log_dir / KAFKA_LOCK}: is not a regular file (Kafka's lock file is)")
            fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
        except LogStateError:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            owner = log_dir_owner(self.log_dir)
            raise owner or LogDirOwnedError(self.log_dir, "another process", None) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the description releases its lock

    def __enter__(self) -> "LogDirLock":
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
