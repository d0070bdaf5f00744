"""Shared test helpers: building batches, reading a log's records back, byte mutation, page-cache residency."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
from pathlib import Path

import numpy as np

from segments.codec import format as fmt
from segments.codec.records import Record, batch_crc, encode_batch
from segments.files.fileio import FileOps
from segments.partition.log import LogConfig, PartitionLog

from ..kafka_fixtures import copy_kafka_fixture


def keyed_batch(keys_values, *, timestamp_ms=1_700_000_000_000, compression=0, **kwargs) -> bytes:
    """One batch of (key, value) records with offsets 0..n-1 (the log assigns the real ones)."""
    records = [
        Record(offset=i, timestamp=timestamp_ms + i, key=k, value=v) for i, (k, v) in enumerate(keys_values)
    ]
    return encode_batch(records, base_offset=0, compression=compression, **kwargs)


def write_log(directory: Path, batches: int, *, records_per_batch: int = 5, segment_bytes: int = 2048, value_bytes: int = 40):
    """A writer-made log with keys k0..k9 cycling and values naming their sequence number."""
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=256)
    seq = 0
    with PartitionLog.open(directory, mode="writer", create=True, config=config) as log:
        for _ in range(batches):
            pairs = []
            for _ in range(records_per_batch):
                pairs.append((b"k%d" % (seq % 10), b"v%06d-" % seq + b"x" * value_bytes))
                seq += 1
            log.append_batches(keyed_batch(pairs, timestamp_ms=1_700_000_000_000 + seq))
    return seq


def read_all(directory: Path, start=None) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """(offset, key, value, timestamp) of every record, as a consumer from `start` sees them."""
    with PartitionLog.open(directory, mode="reader") as log:
        return [(r.offset, r.key, r.value, r.timestamp) for _, r in log.iter_records(start)]


def copy_fixture(name: str, tmp_path: Path) -> Path:
    """A writable copy of Kafka fixture `name` (see `tests.kafka_fixtures`) at `tmp_path/logs/<last part>`."""
    return copy_kafka_fixture(name, tmp_path / "logs" / Path(name).name)


def fix_crc(data: bytearray, pos: int = 0) -> None:
    """Recompute the CRC of the v2 batch at `pos` in place, so the next check down is reached."""
    size = int.from_bytes(data[pos + 8 : pos + 12], "big") + fmt.LOG_OVERHEAD
    crc = batch_crc(bytes(data), pos, size)
    data[pos + fmt.CRC_OFFSET : pos + fmt.CRC_OFFSET + 4] = crc.to_bytes(4, "big")


class Crash(Exception):
    """Stands for the process dying at a chosen step."""


class CrashingFileOps(FileOps):
    """A `FileOps` that raises `Crash` instead of performing its `crash_at`-th rename (0-based)."""

    def __init__(self, crash_at: int) -> None:
        self.crash_at = crash_at
        self.renames = 0

    def rename(self, src, dst) -> None:
        if self.renames == self.crash_at:
            raise Crash(f"crash before rename #{self.renames}: {src} -> {dst}")
        self.renames += 1
        super().rename(src, dst)


def resident_pages(path: Path) -> tuple[int, int]:
    """(pages of `path` in the page cache, pages of the file), by mincore(2)."""
    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mapped:
        address = np.frombuffer(mapped, dtype=np.uint8).ctypes.data  # the mapping's address, nothing read
        vector = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0, ctypes.get_errno()
        return sum(v & 1 for v in vector), pages


def in_memory_file_system(directory: Path) -> str | None:
    """The type of `directory`'s file system if it keeps its files in memory (tmpfs, ramfs: a `/tmp` in memory,
    where every page of a file is in the page cache however it was written), else None."""
    path, best, kind = str(directory.resolve()), "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        mount_point = fields[1].replace("\\040", " ")
        if (path == mount_point or path.startswith(mount_point.rstrip("/") + "/")) and len(mount_point) >= len(best):
            best, kind = mount_point, fields[2]
    return kind if kind in ("tmpfs", "ramfs") else None


def _is_direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


class RecordingOps(FileOps):
    """Records (direct?, position, length) of every write; refuses direct ones with `refuse` (an errno)."""

    def __init__(self, refuse: int | None = None) -> None:
        self.writes: list[tuple[bool, int, int]] = []
        self.refuse = refuse

    def pwrite_all(self, fd, data, position) -> None:
        direct = _is_direct(fd)
        self.writes.append((direct, position, len(memoryview(data))))
        if direct and self.refuse is not None:
            raise OSError(self.refuse, os.strerror(self.refuse))
        super().pwrite_all(fd, data, position)
