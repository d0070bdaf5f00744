"""Builders of KRaft metadata logs for tests: `__cluster_metadata-0/` with segments and snapshots.

Batches are built with kafka-python's record builder (an implementation independent of ours); the record
values with `segments.codec.metadata_records`' encoders, whose bytes `tests/segments/test_kraft.py` pins against
the published schemas by hand-written golden bytes. Snapshot files get SnapshotHeader/SnapshotFooter
control batches around their records, as Kafka writes them.
"""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder

from segments.codec.metadata_records import (
    ConfigResourceType,
    encode_config_record,
    encode_remove_topic_record,
    encode_topic_record,
)
from segments.codec.records import Record, encode_batch

TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER
SNAPSHOT_HEADER, SNAPSHOT_FOOTER = 3, 4  # control record types (Kafka's ControlRecordType ids)


def topic_id(name: str) -> bytes:
    """A stable 16-byte topic id per name (what the controller would draw at random)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, name).bytes


def topic(name: str) -> bytes:
    return encode_topic_record(name, topic_id(name))


def topic_config(name: str, key: str, value: str | None) -> bytes:
    return encode_config_record(TOPIC, name, key, value)


def broker_config(node: str, key: str, value: str | None) -> bytes:
    """A dynamic broker config; node "" is the cluster-wide default."""
    return encode_config_record(BROKER, node, key, value)


def remove_topic(name: str) -> bytes:
    return encode_remove_topic_record(topic_id(name))


def batch(values: list[bytes], base_offset: int, timestamp_ms: int = 1_700_000_000_000) -> bytes:
    """One v2 batch of records with null keys and `values`, at `base_offset` (kafka-python's builder)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
    for i, value in enumerate(values):
        builder.append(i, timestamp=timestamp_ms, key=None, value=value, headers=[])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base_offset)  # outside the CRC, which covers attributes onward
    return bytes(out)


def _control(offset: int, control_type: int) -> bytes:
    key = struct.pack(">hh", 0, control_type)
    return encode_batch([Record(offset=offset, timestamp=0, key=key, value=b"\x00\x00")], base_offset=offset,
                        is_control=True)


def write_segment(directory: Path, base_offset: int, batches_values: list[list[bytes]]) -> int:
    """`<base>.log` holding one batch per list of values, offsets consecutive; returns the next offset."""
    directory.mkdir(parents=True, exist_ok=True)
    offset = base_offset
    data = bytearray()
    for values in batches_values:
        data += batch(values, offset)
        offset += len(values)
    (directory / f"{base_offset:020d}.log").write_bytes(bytes(data))
    return offset


def write_snapshot(directory: Path, end_offset: int, values: list[bytes], epoch: int = 1) -> Path:
    """`<end offset>-<epoch>.checkpoint`: SnapshotHeader, the records, SnapshotFooter."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{end_offset:020d}-{epoch:010d}.checkpoint"
    path.write_bytes(_control(0, SNAPSHOT_HEADER) + batch(values, 1) + _control(1 + len(values), SNAPSHOT_FOOTER))
    return path


def write_kraft_log_dir(log_dir: Path, values: list[bytes], *, node_id: int = 1) -> Path:
    """A KRaft broker's log dir: `meta.properties` (version 1) and a metadata log holding `values`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "meta.properties").write_text(
        f"#\nnode.id={node_id}\nversion=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\n")
    write_segment(log_dir / "__cluster_metadata-0", 0, [values] if values else [])
    return log_dir
