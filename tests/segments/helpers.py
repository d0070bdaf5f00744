"""Shared test helpers: building batches, reading a log's records back, byte mutation."""

from __future__ import annotations

from pathlib import Path

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
