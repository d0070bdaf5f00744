"""Deterministic synthetic partitions for the demo, tests and benchmarks, written through the log writer.

Owns the description of a synthetic workload (`WorkloadSpec`) and writing it as real segment files via
`PartitionLog` in writer mode, so generated logs have the same segments, indexes and checkpoints as any
other. Same spec and seed, same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..codec import format as fmt
from ..codec.records import Record, encode_batch
from ..partition.log import LogConfig, PartitionLog

__all__ = ["WorkloadSpec", "generate_partition"]


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A keyed workload: `records` records over `keys` distinct keys, in batches of `records_per_batch`."""

    records: int = 20_000
    keys: int = 1_000
    value_bytes: int = 100
    records_per_batch: int = 20
    tombstone_fraction: float = 0.0
    compression: int = fmt.COMPRESSION_NONE
    segment_bytes: int = 64 * 1024
    start_timestamp_ms: int = 1_700_000_000_000
    timestamp_step_ms: int = 1
    seed: int = 42


def generate_partition(directory: str | os.PathLike, spec: WorkloadSpec) -> dict:
    """Write `spec` into a new partition directory; returns counts (records, batches, keys, tombstones)."""
    rng = np.random.default_rng(spec.seed)
    key_ids = rng.integers(0, spec.keys, size=spec.records)
    tombstones = rng.random(spec.records) < spec.tombstone_fraction
    values = rng.integers(0, 256, size=(spec.records_per_batch, spec.value_bytes), dtype=np.uint8)
    config = LogConfig(segment_bytes=spec.segment_bytes)
    written_batches = 0
    with PartitionLog.open(Path(directory), mode="writer", create=True, config=config) as log:
        offset = log.log_end_offset
        for start in range(0, spec.records, spec.records_per_batch):
            stop = min(start + spec.records_per_batch, spec.records)
            records = []
            for i in range(start, stop):
                key = b"key-%08d" % key_ids[i]
                value = None if tombstones[i] else bytes(values[i - start]) + b"%012d" % i
                ts = spec.start_timestamp_ms + i * spec.timestamp_step_ms
                records.append(Record(offset=i - start, timestamp=ts, key=key, value=value))
            log.append_batches(encode_batch(records, base_offset=0, compression=spec.compression))
            written_batches += 1
        end = log.log_end_offset
        log.roll()  # leave a small empty active segment, so everything written is cleanable
    return {
        "records": end - offset,
        "batches": written_batches,
        "keys": int(len(np.unique(key_ids))),
        "tombstones": int(tombstones.sum()),
    }
