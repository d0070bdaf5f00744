"""Advisory locks that let one writer process and one cleaner process share a partition directory.

The protocol (every lock is an `flock` on a small file inside `<topic>-<partition>/`; the kernel releases
it when the holder dies, so a crash never leaves a partition locked):

| lock file       | mode      | held by                                   | for                                      |
|-----------------|-----------|-------------------------------------------|------------------------------------------|
| `.writer.lock`  | exclusive | the one writer process                    | its whole life: a second writer fails    |
| `.cleaner.lock` | exclusive | the one process cleaning this partition   | a whole cleaning round, start to finish  |
| `.swap.lock`    | exclusive | the cleaner's swap; the writer's roll;    | the few renames that change which files  |
|                 |           | leftover recovery at open                 | make up the log                          |
|                 | shared    | anyone listing the directory's segments   | a consistent view of the segment set     |

Rules that follow from it:
* The writer alone appends to and rolls the active (last) segment; the cleaner never opens the active
  segment for writing and only replaces segments below it.
* The swap and the roll exclude each other, so the cleaner's notion of "the active segment" is never
  invalidated mid-swap, and a reader never lists a half-renamed directory.
* `.cleaned` files belong to whoever holds `.cleaner.lock`; leftover recovery deletes them only while it
  holds that lock itself (so a writer opening during a cleaning round leaves them alone).
* A reader that has opened a segment file keeps reading it after a swap (the old inode stays valid), so
  reads never need to hold a lock for longer than the listing.
Lock order, to avoid deadlock: `.writer.lock` or `.cleaner.lock` first, then `.swap.lock`.

These locks coordinate processes. Threads inside one process coordinate with the `PartitionLog`'s own
mutex; each `PartitionLock` opens its own file description, so two threads also exclude each other.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from .errors import LockTimeoutError
from .pathcheck import open_no_follow

__all__ = ["PartitionLock", "WRITER_LOCK", "CLEANER_LOCK", "SWAP_LOCK"]

WRITER_LOCK = ".writer.lock"
CLEANER_LOCK = ".cleaner.lock"
SWAP_LOCK = ".swap.lock"

_POLL_INTERVAL_S_MAX = 0.05


class PartitionLock:
    """One advisory lock file in a partition directory; usable as a context manager.

    `acquire(timeout_s=None)` blocks until the lock is held (or raises `LockTimeoutError` after
    `timeout_s`); `timeout_s=0` tries once. The lock is not re-entrant.
    """

    def __init__(self, directory: str | os.PathLike, name: str, *, shared: bool = False) -> None:
        self.path = Path(directory) / name
        self.shared = shared
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout_s: float | None = None) -> "PartitionLock":
        assert self._fd is None, f"{self.path} is already held by this object"
        fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT)  # a lock file that is a link is refused
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        try:
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
