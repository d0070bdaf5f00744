"""How much of a log compaction would remove: exact counts or a bloom-filter estimate, per partition and in total.

Owns `PartitionDuplication` (one partition's figures and what follows from them) and `estimate_partition`,
which reads a partition once, sequentially, and hashes every data record's key (MurmurHash3 x64 128, as the
offset map does): with method "exact" it counts distinct hash pairs (16 bytes of memory per keyed record),
with "bloom" it adds them to a `KeyBloomFilter` of a fixed size and estimates the distinct count from it, and
"auto" picks exact when the partition's offset span fits the memory budget at 16 bytes a record.

What compaction would remove = records whose key appears again later (keyed records − distinct keys) + records
without a key (a compacted topic drops them). Control records and records below the log start are not counted.
The bytes it would free are estimated as that fraction of the partition's bytes; a total's are the sum of its
partitions' (not the total fraction of the total bytes: partitions differ in record size). The figure is for a full
compaction: a real round leaves the active segment alone, and tombstones that are the latest record of their
key are counted as kept (they go only after `delete.retention.ms`).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from offsetmap import hash_key_spans
from offsetmap.bloom import KeyBloomFilter
from segments.partition.log import PartitionLog

from .cli_support import megabytes

__all__ = ["METHODS", "PartitionDuplication", "estimate_partition", "total"]

METHODS = ("auto", "exact", "bloom")
_EXACT_BYTES_PER_RECORD = 16
_WINDOW_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PartitionDuplication:
    """One partition's (or a total's) counts; `distinct_bound` is ± on `distinct_keys` (0 when exact)."""

    name: str
    records: int
    unkeyed: int
    distinct_keys: float
    distinct_bound: float
    size_bytes: int
    method: str
    filter_bytes: int = 0
    parts_bytes_freed: float | None = None  # a total: the sum of its partitions' bytes_freed; None for a partition

    @property
    def removable(self) -> float:
        return max(self.records - self.unkeyed - self.distinct_keys, 0.0) + self.unkeyed

    @property
    def fraction(self) -> float:
        return self.removable / self.records if self.records else 0.0

    @property
    def fraction_bound(self) -> float:
        return self.distinct_bound / self.records if self.records else 0.0

    @property
    def bytes_freed(self) -> float:
        """A partition's: its fraction of its bytes; a total's: the sum over its partitions."""
        return self.fraction * self.size_bytes if self.parts_bytes_freed is None else self.parts_bytes_freed

    def as_dict(self) -> dict:
        out = asdict(self)
        del out["parts_bytes_freed"]
        out.update(removable=self.removable, fraction=self.fraction, fraction_bound=self.fraction_bound,
                   bytes_freed=self.bytes_freed)
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in out.items()}

    def describe(self) -> str:
        bound = "" if self.method == "exact" else f" ± {100 * self.fraction_bound:.2f} pp"
        return (
            f"{self.name}: {self.records} records, {self.distinct_keys:.0f} distinct keys ({self.method}), "
            f"{self.unkeyed} unkeyed; compaction would remove {100 * self.fraction:.2f}%{bound} "
            f"(~{megabytes(self.bytes_freed)} of {megabytes(self.size_bytes)})"
        )


def total(parts: list[PartitionDuplication]) -> PartitionDuplication:
    """The sum over partitions (keys never span partitions); bounds add up, so the total's is conservative."""
    methods = {p.method for p in parts}
    return PartitionDuplication(
        name="total",
        records=sum(p.records for p in parts),
        unkeyed=sum(p.unkeyed for p in parts),
        distinct_keys=sum(p.distinct_keys for p in parts),
        distinct_bound=sum(p.distinct_bound for p in parts),
        size_bytes=sum(p.size_bytes for p in parts),
        method=methods.pop() if len(methods) == 1 else "mixed",
        filter_bytes=sum(p.filter_bytes for p in parts),
        parts_bytes_freed=sum(p.bytes_freed for p in parts),
    )


def _distinct_pairs(h1: list[np.ndarray], h2: list[np.ndarray]) -> int:
    if not h1:
        return 0
    a, b = np.concatenate(h1), np.concatenate(h2)
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    return int(1 + np.count_nonzero((a[1:] != a[:-1]) | (b[1:] != b[:-1]))) if len(a) else 0


def estimate_partition(
    directory: str | os.PathLike, *, memory_bytes: int = 256 * 1024 * 1024, method: str = "auto", hashes: int = 2,
) -> PartitionDuplication:
    """Read the partition at `directory` once and count (see the module docstring). Nothing is written."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    path = Path(directory)
    with PartitionLog.open(path, mode="reader") as plog:
        start = plog.log_start_offset
        span = max(plog.log_end_offset - start, 0)
        exact = method == "exact" or (method == "auto" and span * _EXACT_BYTES_PER_RECORD <= memory_bytes)
        bloom = None if exact else KeyBloomFilter.for_memory(memory_bytes, hashes)
        h1s: list[np.ndarray] = []
        h2s: list[np.ndarray] = []
        records = unkeyed = 0
        segments = plog.segments
        for i, segment in enumerate(segments):
            for _, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, stop_at_invalid=i == len(segments) - 1):
                if result.n_records == 0:
                    continue
                data = ~result.is_control[result.batch_index] & (result.offset >= start)
                keyed = data & (result.key_len >= 0)
                records += int(np.count_nonzero(data))
                unkeyed += int(np.count_nonzero(data & ~keyed))
                for spans in result.key_spans(keyed):
                    h1, h2 = hash_key_spans(spans.buffer, spans.key_pos, spans.key_len)
                    if bloom is None:
                        h1s.append(h1)
                        h2s.append(h2)
                    else:
                        bloom.add_hashes(h1, h2)
        size = plog.size_bytes
    if bloom is None:
        distinct, bound, filter_bytes, used = float(_distinct_pairs(h1s, h2s)), 0.0, 0, "exact"
    else:
        distinct = min(bloom.estimate_distinct(), float(records - unkeyed))
        bound, filter_bytes, used = bloom.error_bound(), bloom.memory_bytes, "bloom"
    return PartitionDuplication(path.name, records, unkeyed, distinct, bound, size, used, filter_bytes)
