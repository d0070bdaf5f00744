"""A power-loss model of the filesystem: what survives a crash is only what was fsynced.

`PowerLossFileOps` performs every operation for real and remembers, per inode, the content at its last
fsync, and per directory, the entries at its last directory fsync. `materialize(dest)` writes out the
tree a machine would find after losing power at that instant: each durably listed name, with its inode's
durably written content (empty if its data was never fsynced). Directory entries created, renamed or
removed since the directory's last fsync are rolled back; file data written since the file's last fsync
is dropped. Removed files are moved to a graveyard instead of unlinked, so an inode number is never
reused while the model is keeping its content.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

from segments.files import faults
from segments.files.fileio import FileOps

__all__ = ["PowerLossFileOps", "SimulatedPowerLoss"]


class SimulatedPowerLoss(BaseException):
    """Raised at the crash point, after the durable state was written out (BaseException: no handler eats it)."""


def _read_fd(fd: int) -> bytes:
    with open(f"/proc/self/fd/{fd}", "rb") as f:  # the fd may be write-only
        return f.read()


class PowerLossFileOps(FileOps):
    def __init__(self, directories: list[Path], graveyard: Path) -> None:
        self.base = Path(os.path.commonpath([str(d) for d in directories]))
        self.directories = [Path(d) for d in directories]
        self.graveyard = graveyard
        graveyard.mkdir(parents=True, exist_ok=True)
        self._graves = itertools.count()
        self.entries: dict[Path, dict[str, int]] = {}
        self.content: dict[int, bytes] = {}
        for d in self.directories:
            self._sync_listing(d)
            for name, ino in self.entries[d].items():
                self.content[ino] = (d / name).read_bytes()

    def _sync_listing(self, directory: Path) -> None:
        self.entries[directory] = {
            e.name: e.inode() for e in os.scandir(directory) if e.is_file() and not e.name.endswith(".lock")
        }

    def fsync_file(self, path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            self.content[os.fstat(fd).st_ino] = _read_fd(fd)
        finally:
            os.close(fd)
        faults.hit("fileops.fsync")

    def fsync_fd(self, fd: int) -> None:
        os.fsync(fd)
        self.content[os.fstat(fd).st_ino] = _read_fd(fd)
        faults.hit("fileops.fsync")

    def fsync_dir(self, path) -> None:
        directory = Path(path)
        if directory not in self.entries:
            super().fsync_dir(directory)
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sync_listing(directory)
        faults.hit("fileops.fsync_dir")

    def remove(self, path) -> None:
        try:
            os.rename(path, self.graveyard / str(next(self._graves)))
        except FileNotFoundError:
            return
        faults.hit("fileops.remove")

    def materialize(self, dest: Path) -> None:
        """Write the tree as it would be after a power loss now, under `dest` (same relative layout)."""
        for d in self.directories:
            target = dest / d.relative_to(self.base)
            target.mkdir(parents=True, exist_ok=True)
            for name, ino in self.entries[d].items():
                (target / name).write_bytes(self.content.get(ino, b""))
