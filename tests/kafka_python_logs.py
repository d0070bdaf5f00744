"""Partitions written and read back with kafka-python, an implementation of the record format independent of ours.

`write_partition` writes segments of v2 batches built by kafka-python's `DefaultRecordBatchBuilder` as
`<base offset>.log` files (offsets assigned in order across segments; opening the log builds the indexes).
Transaction markers are built the same way with the control bit set, which kafka-python's builder leaves to
brokers: the builder computes the CRC over the attributes with the bit in. The base offset is patched in
afterwards; it lies outside the CRC. The last segment is the active one (empty unless given records).

`read_partition` reads every `.log` file back with `kafka.record.MemoryRecords`, record by record, with the
flags of each record's batch (kafka-python does not know the delete-horizon bit: it is read from the
attributes). `committed_latest` is what a read-committed consumer from offset 0 ends up with per key.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

COMMIT, ABORT = 1, 0  # control record types (Kafka's ControlRecordType)
DELETE_HORIZON_BIT = 0x40  # attribute bit 6 (KIP-534)
BATCH_BYTES_MAX = 1 << 24  # far above anything written: the builder never refuses an append


@dataclass(frozen=True)
class Batch:
    """A batch to write: records (key, value, timestamp) — value None is a tombstone — or a marker."""

    records: tuple[tuple[bytes | None, bytes | None, int], ...] = ()
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    marker: int | None = None  # COMMIT or ABORT: a control batch ending the producer's transaction
    marker_timestamp: int = 0
    codec: int = 0  # kafka-python's codec ids: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd


def data(records, **kwargs) -> Batch:
    return Batch(records=tuple(records), **kwargs)


def txn(records, *, pid: int, seq: int = 0, **kwargs) -> Batch:
    return Batch(records=tuple(records), producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True,
                 **kwargs)


def marker(pid: int, control_type: int, *, timestamp: int = 0) -> Batch:
    return Batch(producer_id=pid, producer_epoch=0, transactional=True, marker=control_type,
                 marker_timestamp=timestamp)


class _MarkerBuilder(DefaultRecordBatchBuilder):
    """kafka-python's builder with the control bit set (only brokers write control batches)."""

    def _get_attributes(self, include_compression_type=True):
        return super()._get_attributes(include_compression_type) | self.CONTROL_MASK


def encode(batch: Batch, base_offset: int) -> tuple[bytes, int]:
    """The batch's bytes at `base_offset`, and how many offsets it takes."""
    if batch.marker is not None:
        builder = _MarkerBuilder(2, 0, True, batch.producer_id, batch.producer_epoch, -1, BATCH_BYTES_MAX)
        # key: version, type; value: version, coordinator epoch (Kafka's EndTransactionMarker)
        builder.append(0, batch.marker_timestamp, struct.pack(">hh", 0, batch.marker), struct.pack(">hi", 0, 0), [])
        count = 1
    else:
        builder = DefaultRecordBatchBuilder(2, batch.codec, batch.transactional, batch.producer_id,
                                            batch.producer_epoch, batch.base_sequence, BATCH_BYTES_MAX)
        for delta, (key, value, timestamp) in enumerate(batch.records):
            builder.append(delta, timestamp, key, value, [])
        count = len(batch.records)
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)  # outside the CRC, which covers attributes onward
    return bytes(out), count


def write_partition(directory: Path, segments: list[list[Batch]]) -> int:
    """Write `segments` (the last one active) as `<base>.log` files in `directory`; returns the log end offset."""
    directory.mkdir(parents=True, exist_ok=True)
    offset = 0
    for batches in segments:
        base = offset
        chunks = []
        for batch in batches:
            raw, count = encode(batch, offset)
            chunks.append(raw)
            offset += count
        (directory / f"{base:020d}.log").write_bytes(b"".join(chunks))
    return offset


@dataclass(frozen=True)
class ReadRecord:
    segment: int  # base offset of the segment file it was read from
    offset: int
    key: bytes | None
    value: bytes | None
    producer_id: int
    transactional: bool
    control_type: int | None  # COMMIT/ABORT for a marker's record, None for data
    batch_has_horizon: bool
    batch_base_offset: int


def read_partition(directory: Path) -> list[ReadRecord]:
    """Every record of every segment, in order, read by kafka-python (CRCs checked)."""
    out = []
    for path in sorted(directory.glob("*.log")):
        records = MemoryRecords(path.read_bytes())
        while records.has_next():
            batch = records.next_batch()
            assert batch.validate_crc(), f"{path}: bad CRC at offset {batch.base_offset}"
            flags = (batch.producer_id, batch.is_transactional, batch.is_control_batch,
                     bool(batch.attributes & DELETE_HORIZON_BIT), batch.base_offset)
            for r in batch:
                out.append(ReadRecord(int(path.stem), r.offset, r.key, r.value, flags[0], flags[1],
                                      r.type if flags[2] else None, flags[3], flags[4]))
    return out


def committed_latest(records: list[ReadRecord]) -> dict[bytes, bytes | None]:
    """key -> latest value (None: a tombstone) a read-committed consumer from offset 0 ends with."""
    pending: dict[int, list[ReadRecord]] = {}
    latest: dict[bytes, tuple[int, bytes | None]] = {}

    def apply(r: ReadRecord) -> None:
        if r.key is not None and (r.key not in latest or latest[r.key][0] < r.offset):
            latest[r.key] = (r.offset, r.value)

    for r in records:
        if r.control_type is not None:
            done = pending.pop(r.producer_id, [])
            if r.control_type == COMMIT:
                for d in done:
                    apply(d)
        elif r.transactional:
            pending.setdefault(r.producer_id, []).append(r)
        else:
            apply(r)
    return {k: v for k, (_, v) in latest.items()}


def inactive(records: list[ReadRecord], directory: Path) -> list[ReadRecord]:
    """The records outside the active (last) segment."""
    active = max(int(p.stem) for p in directory.glob("*.log"))
    return [r for r in records if r.segment != active]


def file_states(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """(inode, mtime ns, bytes) of every file under `root`, lock files left out (opening a log may create them)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.endswith(".lock"):
                continue
            path = Path(dirpath) / name
            st = os.stat(path)
            out[str(path.relative_to(root))] = (st.st_ino, st.st_mtime_ns, path.read_bytes())
    return out
