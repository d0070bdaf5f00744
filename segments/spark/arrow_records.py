"""Kafka records as Arrow columns: the record table's schema, a partition log read as Arrow record batches,
and Arrow columns encoded as v2 batches.

Owns the column layout every tabular view of a log shares (the Spark data source, ingestion, tools):
`topic`, `partition`, `offset`, `timestamp`, `timestamp_type`, `key`, `value`, `headers`, `producer_id`,
`is_transactional` — the same names and types as Spark's own Kafka source where they overlap. Reading goes
through the segment scan (CRCs checked) and a compiled gather, never a Python object per record; writing
goes through a compiled encoder and `encode_batch_from_region` per batch. No pyspark here.

Decisions: control records (transaction markers) are not rows — no consumer ever sees them; records below
the log start offset are not rows; a record without a timestamp (magic 0) has a null `timestamp`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..codec import format as fmt
from ..codec._crc_kernels import stamp_v2_crcs
from ..codec.records import encode_batch_from_region, make_attributes
from ..partition.log import PartitionLog
from ._arrow_kernels import encode_batches, encode_runs, gather_records, group_rows, header_sizes

if TYPE_CHECKING:  # the scan's kernels are not loaded by a process that only encodes (a Spark write task)
    from ..codec.scan import ScanResult

__all__ = [
    "HEADER_TYPE",
    "RECORD_COLUMNS",
    "RECORD_SCHEMA",
    "SPARK_SCHEMA_DDL",
    "BatchEncoder",
    "EncodedBatches",
    "binary_column",
    "binary_parts",
    "encode_table",
    "read_arrow_batches",
    "scan_to_arrow",
    "timestamps_ms",
]

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
RECORD_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestamp_type", pa.int32()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
        pa.field("producer_id", pa.int64()),
        pa.field("is_transactional", pa.bool_()),
    ]
)
RECORD_COLUMNS = tuple(RECORD_SCHEMA.names)
SPARK_SCHEMA_DDL = (
    "topic string, partition int, offset long, timestamp timestamp, timestamp_type int, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>, producer_id long, is_transactional boolean"
)
_WINDOW_BYTES = 8 * 1024 * 1024
_EMPTY_BYTES = np.zeros(0, dtype=np.uint8)
_EMPTY_BYTES_READONLY = np.zeros(0, dtype=np.uint8)
_EMPTY_BYTES_READONLY.flags.writeable = False
_BATCH_BYTES_DEFAULT = 1024 * 1024 - fmt.RECORD_BATCH_OVERHEAD
# the encode kernels' column arguments: key valid/offsets/data, value valid/offsets/data, timestamps, header
# list offsets, header key offsets/data, header value valid/offsets/data
_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                 np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _binary(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray, kind: pa.DataType = pa.binary()) -> pa.Array:
    return pa.Array.from_buffers(
        kind, len(valid), [_validity(valid), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        null_count=int(len(valid) - np.count_nonzero(valid)),
    )


def scan_to_arrow(
    result: ScanResult, topic: str, partition: int, *, columns: Sequence[str] = RECORD_COLUMNS,
    min_offset: int = 0, max_offset: int | None = None,
) -> pa.RecordBatch | None:
    """The data records of one scan with offset in [min_offset, max_offset) as a record batch of `columns`."""
    if result.n_records == 0:
        return None
    batch_index = result.batch_index
    keep = ~result.is_control[batch_index] & (result.offset >= min_offset)
    if max_offset is not None:
        keep &= result.offset < max_offset
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        return None
    n = len(rows)
    b = batch_index[rows]
    arrays: dict[str, pa.Array] = {}
    wanted = set(columns)
    if wanted & {"key", "value", "headers"}:
        arrays.update(_gather(result, rows, b))
    if "topic" in wanted:
        arrays["topic"] = pa.DictionaryArray.from_arrays(np.zeros(n, dtype=np.int32), [topic]).cast(pa.string())
    if "partition" in wanted:
        arrays["partition"] = pa.array(np.full(n, partition, dtype=np.int32))
    if "offset" in wanted:
        arrays["offset"] = pa.array(result.offset[rows])
    if "timestamp" in wanted:
        ts = result.timestamp[rows]
        missing = ts == fmt.NO_TIMESTAMP
        arrays["timestamp"] = pa.array(ts * 1000, type=pa.timestamp("us", tz="UTC"), mask=missing if missing.any() else None)
    if "timestamp_type" in wanted:
        arrays["timestamp_type"] = pa.array(result.timestamp_type[b].astype(np.int32))
    if "producer_id" in wanted:
        arrays["producer_id"] = pa.array(result.producer_id[b])
    if "is_transactional" in wanted:
        arrays["is_transactional"] = pa.array(result.is_transactional[b])
    schema = pa.schema([RECORD_SCHEMA.field(c) for c in columns])
    return pa.RecordBatch.from_arrays([arrays[c] for c in columns], schema=schema)


def _gather(result: ScanResult, rows: np.ndarray, b: np.ndarray) -> dict[str, pa.Array]:
    in_arena = result.records_in_arena[b]
    is_v2 = result.magic[b] >= fmt.MAGIC_V2
    key_pos = result.key_pos[rows].astype(np.int64)
    key_len = result.key_len[rows].astype(np.int64)
    value_len = result.value_len[rows].astype(np.int64)
    arena = result.arena if len(result.arena) else _EMPTY_BYTES
    sizes = np.empty((len(rows), 3), dtype=np.int64)
    header_sizes(result.buffer, arena, in_arena, is_v2, key_pos, key_len, value_len, sizes)
    n = len(rows)
    n_headers = int(sizes[:, 0].sum())
    k_off = np.empty(n + 1, dtype=np.int64)
    v_off = np.empty(n + 1, dtype=np.int64)
    h_list = np.empty(n + 1, dtype=np.int64)
    hk_off = np.empty(n_headers + 1, dtype=np.int64)
    hv_off = np.empty(n_headers + 1, dtype=np.int64)
    hv_valid = np.empty(n_headers, dtype=np.bool_)
    k_data = np.empty(int(np.maximum(key_len, 0).sum()), dtype=np.uint8)
    v_data = np.empty(int(np.maximum(value_len, 0).sum()), dtype=np.uint8)
    hk_data = np.empty(int(sizes[:, 1].sum()), dtype=np.uint8)
    hv_data = np.empty(int(sizes[:, 2].sum()), dtype=np.uint8)
    gather_records(
        result.buffer, arena, in_arena, is_v2, key_pos, key_len, value_len,
        k_off, k_data, v_off, v_data, h_list, hk_off, hk_data, hv_valid, hv_off, hv_data,
    )
    entries = pa.StructArray.from_arrays(
        [_binary(hk_off, hk_data, np.ones(n_headers, dtype=np.bool_), pa.string()), _binary(hv_off, hv_data, hv_valid)],
        fields=list(HEADER_TYPE.value_type),
    )
    return {
        "key": _binary(k_off, k_data, key_len >= 0),
        "value": _binary(v_off, v_data, value_len >= 0),
        "headers": pa.ListArray.from_arrays(pa.array(h_list.astype(np.int32)), entries, type=HEADER_TYPE),
    }


def read_arrow_batches(
    directory: str | os.PathLike,
    *,
    columns: Sequence[str] = RECORD_COLUMNS,
    segments_from: int | None = None,
    segments_below: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records of the partition at `directory` as record batches, oldest first, one per scan window.

    `segments_from` / `segments_below` restrict the read to the segments whose base offset lies in
    [segments_from, segments_below): ranges that tile the offsets give every record exactly once, even if
    a cleaner merges segments between planning and reading (a merged segment keeps its first base). The log
    is opened as a reader (no lock, nothing written); the active segment ends quietly at a batch its writer is
    still appending. Raises `CorruptRecordError` naming the file and position for any invalid batch before it.
    """
    unknown = set(columns) - set(RECORD_COLUMNS)
    if unknown:
        raise ValueError(f"unknown record columns {sorted(unknown)}; the columns are {list(RECORD_COLUMNS)}")
    with PartitionLog.open(Path(directory), mode="reader") as log:
        segments = log.segments
        start = log.log_start_offset
        for i, segment in enumerate(segments):
            if segments_from is not None and segment.base_offset < segments_from:
                continue
            if segments_below is not None and segment.base_offset >= segments_below:
                break
            active = i == len(segments) - 1
            for _, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, stop_at_invalid=active):
                batch = scan_to_arrow(result, log.topic, log.partition, columns=columns, min_offset=start)
                if batch is not None:
                    yield batch


# ---- writing -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncodedBatches:
    """v2 batches made from a table, grouped by partition: `data[p]` is partition p's batches, in input order,
    offsets counting from 0 in each call (an appender assigns the real ones)."""

    data: dict[int, bytes | memoryview]
    records: dict[int, int]


def binary_column(column: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    """`column` as one binary array (strings become their UTF-8 bytes); a clear error for any other type."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type):
        column = column.cast(pa.binary())
    if not pa.types.is_binary(column.type):
        raise TypeError(f"column {name!r} is {column.type}; it must be binary or string (cast it, or serialise it as JSON)")
    return column


def binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(valid, offsets int64 into data, data uint8) of a binary array; a sliced array's offsets are absolute.

    `data` is always read-only (an Arrow buffer may or may not be mutable), so a compiled kernel sees one type
    and loads one cached specialisation, whichever process built the array."""
    n = len(array)
    _, offsets, data = array.buffers()
    off = np.frombuffer(offsets, dtype=np.int32, count=n + 1, offset=array.offset * 4).astype(np.int64)
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else _EMPTY_BYTES_READONLY
    raw.flags.writeable = False
    valid = np.ones(n, dtype=np.bool_) if array.null_count == 0 else array.is_valid().to_numpy(zero_copy_only=False)
    return valid, off, raw


def _header_parts(headers: pa.Array | None, n: int):
    if headers is None:
        empty = np.zeros(1, dtype=np.int64)
        no_bytes = _EMPTY_BYTES_READONLY
        return np.zeros(n + 1, dtype=np.int64), empty, no_bytes, np.zeros(0, dtype=np.bool_), empty, no_bytes
    lengths = pc.list_value_length(headers).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    list_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=list_off[1:])
    entry_key, entry_value = headers.flatten().flatten()  # this slice's entries; then their two fields
    hk = binary_column(entry_key, "headers.key")
    if hk.null_count:
        raise ValueError("a header key is null; Kafka header keys are strings")
    _, hk_off, hk_data = binary_parts(hk)
    hv_valid, hv_off, hv_data = binary_parts(binary_column(entry_value, "headers.value"))
    return list_off, hk_off, hk_data, hv_valid, hv_off, hv_data


def timestamps_ms(column: pa.ChunkedArray | pa.Array | None, rows: int, write_time_ms: int, name: str = "timestamp") -> np.ndarray:
    """Record timestamps (int64 epoch ms) from a timestamp or epoch-milliseconds integer column (nulls: no
    timestamp, -1); without a column, `write_time_ms` for each of `rows` rows. Raises `TypeError` naming the
    column for any other type, `ValueError` for a timestamp below 0 (Kafka's rule)."""
    if column is None:
        return np.full(rows, write_time_ms, dtype=np.int64)
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
    elif pa.types.is_integer(column.type):
        column = column.cast(pa.int64())
    else:
        raise TypeError(f"the timestamp column {name!r} is {column.type}; it must be a timestamp or epoch milliseconds (long)")
    timestamps = np.asarray(column.fill_null(fmt.NO_TIMESTAMP).to_numpy(), dtype=np.int64)
    negative = np.flatnonzero((timestamps < 0) & (timestamps != fmt.NO_TIMESTAMP))
    if len(negative):  # what a broker refuses too (InvalidTimestampException)
        raise ValueError(f"the timestamp column {name!r} holds {int(timestamps[negative[0]])} ms (before 1970) in "
                         f"{len(negative)} row(s) of this task's input; Kafka refuses record timestamps below 0 "
                         f"(a null is written as -1, no timestamp)")
    return timestamps


class BatchEncoder:
    """Rows → v2 batches per partition, keeping input order within each partition (see `encode`).

    Batches hold at most `records_per_batch` records and a records region of at most `batch_bytes` before
    compression (unless one record alone is larger). Uncompressed batches are written whole by one compiled
    call into a buffer the encoder keeps between calls (a new buffer per call costs a page fault per 4 KiB
    touched), CRCs stamped by a second; compressed ones are built batch by batch around their compressed records.
    """

    def __init__(self, *, compression: int = fmt.COMPRESSION_NONE, records_per_batch: int = 1000,
                 batch_bytes: int = _BATCH_BYTES_DEFAULT) -> None:
        if records_per_batch < 1:
            raise ValueError(f"records per batch must be at least 1, got {records_per_batch}")
        self.compression = compression
        self.records_per_batch = records_per_batch
        self.batch_bytes = batch_bytes
        self._out = np.empty(0, dtype=np.uint8)

    def encode(self, keys: pa.Array, values: pa.Array, timestamps_ms: np.ndarray, partitions: np.ndarray, *,
               headers: pa.Array | None = None) -> EncodedBatches:
        """Encode rows (`partitions[i]` ≥ 0 is row i's partition, -1 leaves the row out); offsets count from 0 per
        partition in each call.

        Keys and values are binary arrays (nulls allowed), `headers` a list<struct<key: string, value: binary>>
        array or None. Uncompressed, `data[p]` is a memoryview of the encoder's buffer, valid until the next call.
        """
        n = len(keys)
        if not (len(values) == n == len(timestamps_ms) == len(partitions)):
            raise ValueError("key, value, timestamp and partition columns differ in length")
        if n == 0:
            return EncodedBatches({}, {})
        k_valid, k_off, k_data = binary_parts(keys)
        v_valid, v_off, v_data = binary_parts(values)
        h_list, hk_off, hk_data, hv_valid, hv_off, hv_data = _header_parts(headers, n)
        partitions = np.ascontiguousarray(partitions, dtype=np.int64)
        low, high = int(partitions.min()), int(partitions.max())
        if low < -1:
            raise ValueError(f"partition numbers must be at least 0 (or -1: left out), got {low}")
        order = np.empty(n, dtype=np.int64)
        part = np.empty(n, dtype=np.int64)
        group_rows(partitions, high + 1, order, part)
        if part[0] == -1:  # rows left out (a null key, say): they sort first
            kept = int(np.searchsorted(part, 0))
            if kept == n:
                return EncodedBatches({}, {})
            order, part = order[kept:], part[kept:]
            n = order.size
        n_headers = int(h_list[-1] - h_list[0])
        payload = (int(k_off[-1] - k_off[0]) + int(v_off[-1] - v_off[0]) + int(hk_off[-1] - hk_off[0])
                   + int(hv_off[-1] - hv_off[0]))
        bound = 21 * n + payload + 20 * n_headers  # every record's bytes (encode_runs' bound)
        ts = np.ascontiguousarray(timestamps_ms, dtype=np.int64)
        columns: _Columns = (k_valid, k_off, k_data, v_valid, v_off, v_data, ts, h_list, hk_off, hk_data, hv_valid,
                             hv_off, hv_data)
        if self.compression != fmt.COMPRESSION_NONE:
            return self._encode_compressed(order, part, columns, bound)
        # A batch is cut at a partition change, at records_per_batch, or when the next record would take its
        # region past batch_bytes: each such cut pairs a region and a next record (≤ 36 bytes + its payload
        # estimated) whose sizes sum past batch_bytes. Should the estimate ever fall short, the kernel says so
        # and the call is redone with room for one batch per row.
        cuts = int(part[-1]) + 1 + n // self.records_per_batch + (2 * bound + 40 * n) // max(1, self.batch_bytes)
        for batches in (min(n, cuts + 1), n):
            size = bound + batches * fmt.RECORD_BATCH_OVERHEAD
            if self._out.size < size:
                self._out = np.empty(max(size, self._out.size * 5 // 4), dtype=np.uint8)
            out = self._out
            next_offset = np.zeros(int(part[-1]) + 1, dtype=np.int64)
            b_part, b_start, b_end = (np.empty(batches, dtype=np.int64) for _ in range(3))
            nb = encode_batches(order, part, *columns, self.records_per_batch, self.batch_bytes,
                                make_attributes(compression=fmt.COMPRESSION_NONE), next_offset, out, b_part, b_start,
                                b_end)
            if nb >= 0:
                break
        else:
            raise RuntimeError(f"encoding {n} rows overran a {size}-byte buffer with room for every row (a bug)")
        stamp_v2_crcs(out, b_start[:nb])
        firsts = np.flatnonzero(np.diff(b_part[:nb], prepend=-1))  # the first batch of each partition
        lasts = np.append(firsts[1:], nb) - 1
        view = out.data
        data: dict[int, bytes | memoryview] = {
            int(b_part[f]): view[int(b_start[f]) : int(b_end[last])] for f, last in zip(firsts, lasts)
        }
        return EncodedBatches(data, {p: int(next_offset[p]) for p in data})

    def _encode_compressed(self, order: np.ndarray, part: np.ndarray, columns: _Columns, bound: int) -> EncodedBatches:
        n = order.size
        out = np.empty(bound, dtype=np.uint8)
        b_part, b_start, b_end, b_count, b_base, b_max = (np.empty(n, dtype=np.int64) for _ in range(6))
        nb = encode_runs(order, part, *columns, self.records_per_batch, self.batch_bytes, out, b_part, b_start,
                         b_end, b_count, b_base, b_max)
        attributes = make_attributes(compression=self.compression)
        pieces: dict[int, list[bytes]] = {}
        counts: dict[int, int] = {}
        view = out.data  # a memoryview of the encoded bytes, sliced without copying
        for i in range(nb):
            p = int(b_part[i])
            count = int(b_count[i])
            base = counts.get(p, 0)
            pieces.setdefault(p, []).append(
                encode_batch_from_region(
                    view[b_start[i] : b_end[i]], records_count=count, base_offset=base, last_offset_delta=count - 1,
                    base_timestamp=int(b_base[i]), max_timestamp=int(b_max[i]), attributes=attributes,
                )
            )
            counts[p] = base + count
        return EncodedBatches({p: b"".join(parts) for p, parts in pieces.items()}, counts)


def encode_table(
    keys: pa.Array,
    values: pa.Array,
    timestamps_ms: np.ndarray,
    partitions: np.ndarray,
    *,
    headers: pa.Array | None = None,
    compression: int = fmt.COMPRESSION_NONE,
    records_per_batch: int = 1000,
    batch_bytes: int = _BATCH_BYTES_DEFAULT,
) -> EncodedBatches:
    """Encode rows as v2 batches per partition (`partitions[i]` is row i's), keeping input order within each:
    `BatchEncoder.encode` once, with `data[p]` as bytes of its own."""
    encoded = BatchEncoder(compression=compression, records_per_batch=records_per_batch,
                           batch_bytes=batch_bytes).encode(keys, values, timestamps_ms, partitions, headers=headers)
    return EncodedBatches({p: bytes(d) for p, d in encoded.data.items()}, encoded.records)
