"""The standard benchmark workloads (issue 6), generated deterministically and fast as Kafka partition directories.

Owns the definition of the workloads and writing them as `<log dir>/<topic>-0/` segment files (`.log`,
`.index`, `.timeindex`), byte-for-byte the same for the same workload, scale and seed. Files are written
directly, not through `segments.partition.log.PartitionLog`, for speed; `logcleaner verify` accepts them. It never
touches anything outside the directory it is given.

| workload | records | keys | value | records/batch | extra |
|---|---:|---:|---:|---:|---|
| W1 | 1,000,000 | 100,000 | 1000 B random | 16 | ~1.02 GB |
| W2 | 8,000,000 | 1,000,000 | 100 B random | 100 | ~0.95 GB |
| W3 | as W1 | | | | every batch lz4-compressed (random values: lz4 cannot shrink them) |
| W4 | as W2 | | | | 20% tombstones; 5 transactional producers (1-4 batches per txn, 10% aborted) |
| Z1 | as W2 | | | | keys Zipf-distributed (exponent 1): a few hot keys, a long cold tail |
| U1 | as W2 | 8,000,000 | | | insert-only: every key once (nothing to compact) |

Common to all: keys are `key-%08d` (12 bytes), drawn uniformly at random from the key space (Z1, U1: see
the table); record `i` has
offset `i` (plus the markers' offsets in W4) and timestamp `T0_MS + offset`; 128 MiB segments (rolled the way
Kafka does: a batch that would pass `segment_bytes` starts a new segment) and a tiny final segment holding
the last `active_records` records, the active segment, which the cleaner leaves alone. `--scale` multiplies
records, keys and segment bytes (so the shape of the log stays), never below one batch / 1 MiB.

How it is fast: every data batch of a workload has the same layout up to its tombstones, so a chunk of
batches is one `(batches, width)` uint8 matrix filled from a one-batch template by broadcasting; the
per-batch header fields come from a big-endian structured array, keys and values are patched in per record
slot (column slices), tombstones overwrite their slot with a shorter template and mask its tail, control
batches (`segments.codec.records.encode_control_batch`) are rows of their own, and one boolean compaction turns
the matrix into the concatenated batches. Python loops run per batch only for CRC-32C (`crc32c`) and lz4.
Values come from numpy's PCG64DXSM (~2 GB/s). A 1 GB workload generates in ~5-10 s on the standard machine.

Next to the partition directory, `<topic>-0.workload.json` records what was written, including the number
of records a full clean must leave (`expected_records_after_clean`): one per distinct key among the
records the clean may touch (not aborted), plus the markers there, plus every record of the active segment.

Usage: python bench/workloads.py W1 DIR [--scale 0.1] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import crc32c
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from segments.codec import format as fmt
from segments.codec.compression import compress
from segments.codec.records import encode_control_batch
from segments.codec.varint import encode_varint
from segments.files.index import OffsetIndex, TimeIndex, build_offset_index_entries, build_time_index_entries

__all__ = ["WORKLOADS", "Workload", "generate"]

MIB = 1024 * 1024
T0_MS = 1_700_000_000_000
KEY_PREFIX = b"key-"
KEY_DIGITS = 8
KEY_BYTES = len(KEY_PREFIX) + KEY_DIGITS
PRODUCER_ID_BASE = 1000
PARTITION_LEADER_EPOCH = 0
CHUNK_BYTES_MAX = 64 * MIB  # the padded batch matrix of one chunk

# The 61-byte v2 batch header (docs/format.md 1.1) as a packed big-endian numpy record.
_HEADER = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)
assert _HEADER.itemsize == fmt.RECORD_BATCH_OVERHEAD


@dataclass(frozen=True)
class Workload:
    name: str
    records: int  # data records, active segment included
    keys: int
    value_bytes: int
    records_per_batch: int
    active_records: int  # data records in the final (active) segment
    segment_bytes: int = 128 * MIB
    compression: int = fmt.COMPRESSION_NONE
    tombstone_fraction: float = 0.0
    key_distribution: str = "uniform"  # "uniform", "zipf" (exponent zipf_s over `keys`), "unique" (insert-only)
    zipf_s: float = 1.0
    txn_producers: int = 0  # 0: plain non-idempotent producer (producer id -1)
    abort_fraction: float = 0.1
    txn_batches_max: int = 4  # a transaction holds 1..txn_batches_max data batches of its producer
    seed: int = 20240611

    @property
    def topic(self) -> str:
        return self.name.lower()

    def scaled(self, scale: float) -> "Workload":
        if scale == 1:
            return self
        r = self.records_per_batch
        records = max(r, int(round(self.records * scale / r)) * r)
        active = max(r, int(round(self.active_records * scale / r)) * r)
        return replace(
            self,
            records=records,
            keys=max(1, int(round(self.keys * scale))),
            active_records=min(active, records // 2 // r * r or r),
            segment_bytes=max(MIB, int(self.segment_bytes * scale)),
        )


WORKLOADS = {
    "W1": Workload("W1", records=1_000_000, keys=100_000, value_bytes=1000, records_per_batch=16, active_records=1024),
    "W2": Workload(
        "W2", records=8_000_000, keys=1_000_000, value_bytes=100, records_per_batch=100, active_records=10_000
    ),
}
WORKLOADS["W3"] = replace(WORKLOADS["W1"], name="W3", compression=fmt.COMPRESSION_LZ4)
WORKLOADS["W4"] = replace(WORKLOADS["W2"], name="W4", tombstone_fraction=0.2, txn_producers=5)
WORKLOADS["Z1"] = replace(WORKLOADS["W2"], name="Z1", key_distribution="zipf", zipf_s=1.0)
WORKLOADS["U1"] = replace(WORKLOADS["W2"], name="U1", keys=WORKLOADS["W2"].records, key_distribution="unique")


# ---- the plan: every batch's offsets, producer fields and kind, before any byte is written ------------------------


@dataclass
class _Plan:
    is_control: np.ndarray  # bool per batch
    base_offset: np.ndarray  # int64 per batch
    producer_id: np.ndarray  # int64 per batch
    base_sequence: np.ndarray  # int64 per batch (-1 for markers and plain producers)
    control_type: np.ndarray  # int8 per batch (-1 for data)
    aborted: np.ndarray  # bool per batch: data of an aborted transaction, or an ABORT marker
    data_index: np.ndarray  # int64 per batch: row in key_ids/tombstone, -1 for markers
    key_ids: np.ndarray  # (data batches, records_per_batch) int64
    tombstone: np.ndarray  # (data batches, records_per_batch) bool
    active_first_batch: int  # index of the first batch of the active segment


def _draw_keys(w: Workload, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` key ids in [0, keys): uniform; Zipf (key of rank k drawn ∝ 1/k^s, ranks shuffled over the ids so
    hot keys are spread through the key space); or each id once, in random order (needs keys ≥ n)."""
    if w.key_distribution == "uniform":
        return rng.integers(0, w.keys, size=n, dtype=np.int64)
    if w.key_distribution == "unique":
        if w.keys < n:
            raise ValueError(f"{w.name}: an insert-only workload needs keys ≥ records ({w.keys} < {n})")
        return rng.permutation(w.keys)[:n].astype(np.int64)
    if w.key_distribution == "zipf":
        cdf = np.cumsum(1.0 / np.arange(1, w.keys + 1, dtype=np.float64) ** w.zipf_s)
        cdf /= cdf[-1]
        ranks = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), w.keys - 1)
        return rng.permutation(w.keys).astype(np.int64)[ranks]
    raise ValueError(f"{w.name}: unknown key distribution {w.key_distribution!r}")


def _plan(w: Workload, rng: np.random.Generator) -> _Plan:
    r = w.records_per_batch
    data_batches = w.records // r
    active_data_batches = w.active_records // r
    key_ids = _draw_keys(w, rng, data_batches * r).reshape(data_batches, r)
    tombstone = (rng.random((data_batches, r)) < w.tombstone_fraction) if w.tombstone_fraction else np.zeros(
        (data_batches, r), dtype=bool
    )
    if not w.txn_producers:
        n = data_batches
        return _Plan(
            is_control=np.zeros(n, bool),
            base_offset=np.arange(n, dtype=np.int64) * r,
            producer_id=np.full(n, fmt.NO_PRODUCER_ID, np.int64),
            base_sequence=np.full(n, fmt.NO_SEQUENCE, np.int64),
            control_type=np.full(n, -1, np.int8),
            aborted=np.zeros(n, bool),
            data_index=np.arange(n, dtype=np.int64),
            key_ids=key_ids,
            tombstone=tombstone,
            active_first_batch=n - active_data_batches,
        )
    # Transactional producers: each data batch belongs to a random producer; a producer's consecutive batches
    # form transactions of 1..txn_batches_max batches, each followed at once by its COMMIT or ABORT marker.
    # Every transaction is closed before the active segment starts (so nothing below it is unstable).
    p_count = w.txn_producers
    producer_of = rng.integers(0, p_count, size=data_batches)
    txn_len = rng.integers(1, w.txn_batches_max + 1, size=data_batches + p_count)
    txn_abort = rng.random(data_batches + p_count) < w.abort_fraction
    kinds: list[int] = []  # data index, or -1 - producer for a marker
    marker_abort: list[bool] = []
    data_aborted = np.zeros(data_batches, bool)
    remaining = [0] * p_count
    aborting = [False] * p_count
    draws = 0
    active_first_batch = -1

    def close(p: int) -> None:
        kinds.append(-1 - p)
        marker_abort.append(aborting[p])
        remaining[p] = 0

    for d in range(data_batches):
        if d == data_batches - active_data_batches:
            for p in range(p_count):
                if remaining[p]:
                    close(p)
            active_first_batch = len(kinds)
        p = int(producer_of[d])
        if not remaining[p]:
            remaining[p] = int(txn_len[draws])
            aborting[p] = bool(txn_abort[draws])
            draws += 1
        kinds.append(d)
        data_aborted[d] = aborting[p]
        remaining[p] -= 1
        if not remaining[p]:
            close(p)
    for p in range(p_count):
        if remaining[p]:
            close(p)
    kinds_a = np.asarray(kinds, dtype=np.int64)
    is_control = kinds_a < 0
    n = len(kinds_a)
    sizes = np.where(is_control, 1, r)
    base_offset = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    producer = np.where(is_control, -1 - kinds_a, producer_of[np.maximum(kinds_a, 0)])
    producer_id = PRODUCER_ID_BASE + producer.astype(np.int64)
    # Each producer's data batches carry consecutive sequence numbers: r per batch.
    base_sequence = np.full(n, fmt.NO_SEQUENCE, np.int64)
    for p in range(p_count):
        idx = np.nonzero(~is_control & (producer == p))[0]
        base_sequence[idx] = np.arange(len(idx), dtype=np.int64) * r
    control_type = np.full(n, -1, np.int8)
    aborted = np.zeros(n, bool)
    m_abort = np.asarray(marker_abort, dtype=bool)
    control_type[is_control] = np.where(m_abort, fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT)
    aborted[is_control] = m_abort
    aborted[~is_control] = data_aborted[kinds_a[~is_control]]
    return _Plan(
        is_control=is_control,
        base_offset=base_offset,
        producer_id=producer_id,
        base_sequence=base_sequence,
        control_type=control_type,
        aborted=aborted,
        data_index=np.where(is_control, -1, kinds_a),
        key_ids=key_ids,
        tombstone=tombstone,
        active_first_batch=active_first_batch,
    )


# ---- the one-batch template ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    """Where record j of a data batch lies in the padded row, full and as a tombstone."""

    start: int  # column of the record's length varint
    full: np.ndarray  # template bytes of the full record (key and value zero)
    tomb: np.ndarray  # template bytes of the tombstone record
    key_full: int  # column offset of the key digits inside the record, full / tombstone
    key_tomb: int
    value: int  # column offset of the value inside the full record


def _record_template(j: int, value_bytes: int | None) -> tuple[np.ndarray, int, int]:
    """Record with offset/timestamp delta j, a zero key, a zero value (None: a tombstone); (bytes, key at, value at)."""
    head = bytes((0,)) + encode_varint(j) + encode_varint(j) + encode_varint(KEY_BYTES)
    key = KEY_PREFIX + b"0" * KEY_DIGITS
    tail = encode_varint(-1 if value_bytes is None else value_bytes) + bytes(value_bytes or 0) + encode_varint(0)
    body = head + key + tail
    prefix = encode_varint(len(body))
    key_at = len(prefix) + len(head) + len(KEY_PREFIX)
    value_at = len(prefix) + len(head) + KEY_BYTES + len(encode_varint(value_bytes or 0))
    return np.frombuffer(prefix + body, dtype=np.uint8), key_at, value_at


def _slots(w: Workload) -> tuple[list[_Slot], np.ndarray]:
    slots = []
    start = fmt.RECORD_BATCH_OVERHEAD
    for j in range(w.records_per_batch):
        full, key_full, value = _record_template(j, w.value_bytes)
        tomb, key_tomb, _ = _record_template(j, None)
        slots.append(_Slot(start, full, tomb, key_full, key_tomb, value))
        start += len(full)
    row = np.zeros(start, dtype=np.uint8)
    for s in slots:
        row[s.start : s.start + len(s.full)] = s.full
    return slots, row


# ---- writing segments ------------------------------------------------------------------------------------------


class _SegmentWriter:
    """Appends whole batches to `<base>.log` files, rolling as Kafka does; writes each segment's indexes at roll."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.file = None
        self.base_offset = -1
        self.size = 0
        self.positions: list[np.ndarray] = []
        self.last_offsets: list[np.ndarray] = []
        self.max_timestamps: list[np.ndarray] = []
        self.segments = 0

    def add(self, data, sizes: np.ndarray, base_offsets: np.ndarray, last_offsets: np.ndarray,
            max_ts: np.ndarray) -> None:
        """Append the concatenated batches `data` (their sizes and offsets given), rolling where one would not fit."""
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        ends = starts + sizes
        view = memoryview(data)
        i, n = 0, len(sizes)
        while i < n:
            if self.file is None:
                self.base_offset = int(base_offsets[i])
                self.file = open(self.directory / f"{self.base_offset:020d}{fmt.LOG_SUFFIX}", "wb")
            room = self.segment_bytes - self.size
            k = int(np.searchsorted(ends[i:] - starts[i], room, side="right"))
            if k == 0:
                if self.size:
                    self.roll()
                    continue
                k = 1  # a batch larger than a segment gets a segment of its own
            self.file.write(view[starts[i] : ends[i + k - 1]])
            self.positions.append(self.size + starts[i : i + k] - starts[i])
            self.last_offsets.append(last_offsets[i : i + k])
            self.max_timestamps.append(max_ts[i : i + k])
            self.size += int(ends[i + k - 1] - starts[i])
            i += k
            if i < n:
                self.roll()

    def roll(self) -> None:
        if self.file is None:
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None
        positions = np.concatenate(self.positions)
        last_offsets = np.concatenate(self.last_offsets)
        max_ts = np.concatenate(self.max_timestamps)
        stem = self.directory / f"{self.base_offset:020d}"
        offsets, index_positions = build_offset_index_entries(positions, last_offsets)
        OffsetIndex.write_entries(f"{stem}{fmt.INDEX_SUFFIX}", self.base_offset, offsets, index_positions)
        timestamps, time_offsets = build_time_index_entries(positions, last_offsets, max_ts)
        TimeIndex.write_entries(f"{stem}{fmt.TIME_INDEX_SUFFIX}", self.base_offset, timestamps, time_offsets)
        self.positions, self.last_offsets, self.max_timestamps = [], [], []
        self.size = 0
        self.segments += 1


# ---- generation ------------------------------------------------------------------------------------------------


def _key_digits(ids: np.ndarray) -> np.ndarray:
    """ASCII digits of `ids` zero-padded to KEY_DIGITS: shape ids.shape + (KEY_DIGITS,), uint8."""
    powers = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)
    return ((ids[..., None] // powers) % 10 + 48).astype(np.uint8)


def _chunk_bytes(w: Workload, plan: _Plan, lo: int, hi: int, slots: list[_Slot], row: np.ndarray,
                 rng: np.random.Generator) -> tuple[bytes | np.ndarray, np.ndarray]:
    """The concatenated batches lo..hi of the plan (CRCs set) and their sizes."""
    r = w.records_per_batch
    n = hi - lo
    width = len(row)
    control = plan.is_control[lo:hi]
    data_rows = np.nonzero(~control)[0]
    d_idx = plan.data_index[lo:hi][data_rows]
    mat = np.empty((n, width), dtype=np.uint8)
    mat[:] = row
    # Header fields; batch_length and crc are set once the sizes are known.
    hdr = np.zeros(n, dtype=_HEADER)
    base = plan.base_offset[lo:hi]
    count = np.where(control, 1, r)
    hdr["base_offset"] = base
    hdr["partition_leader_epoch"] = PARTITION_LEADER_EPOCH
    hdr["magic"] = fmt.MAGIC_V2
    hdr["attributes"] = w.compression | np.where(plan.producer_id[lo:hi] >= 0, fmt.TRANSACTIONAL_FLAG, 0)
    hdr["last_offset_delta"] = count - 1
    hdr["base_timestamp"] = T0_MS + base
    hdr["max_timestamp"] = T0_MS + base + count - 1
    hdr["producer_id"] = plan.producer_id[lo:hi]
    hdr["producer_epoch"] = np.where(plan.producer_id[lo:hi] >= 0, 0, fmt.NO_PRODUCER_EPOCH)
    hdr["base_sequence"] = plan.base_sequence[lo:hi]
    hdr["records_count"] = count
    # Keys and values, one record slot (a column range) at a time.
    keys = _key_digits(plan.key_ids[d_idx])  # (data rows, r, KEY_DIGITS)
    value_total = len(data_rows) * r * w.value_bytes
    values = rng.integers(0, 2**64 - 1, size=(value_total + 7) // 8, dtype=np.uint64, endpoint=True)
    values = values.view(np.uint8)[:value_total].reshape(len(data_rows), r, w.value_bytes)
    all_data = len(data_rows) == n
    tomb = plan.tombstone[d_idx]
    mask = None
    sizes = np.full(n, width, dtype=np.int64)
    if not all_data or tomb.any():
        mask = np.ones((n, width), dtype=bool)
    for j, s in enumerate(slots):
        k0 = s.start + s.key_full
        v0 = s.start + s.value
        if all_data:
            mat[:, k0 : k0 + KEY_DIGITS] = keys[:, j]
            mat[:, v0 : v0 + w.value_bytes] = values[:, j]
        else:
            mat[data_rows, k0 : k0 + KEY_DIGITS] = keys[:, j]
            mat[data_rows, v0 : v0 + w.value_bytes] = values[:, j]
        t_rows = np.nonzero(tomb[:, j])[0]
        if len(t_rows):
            rows = data_rows[t_rows]
            lt = len(s.tomb)
            mat[rows, s.start : s.start + lt] = s.tomb
            kt = s.start + s.key_tomb
            mat[rows, kt : kt + KEY_DIGITS] = keys[t_rows, j]
            mask[rows, s.start + lt : s.start + len(s.full)] = False
            sizes[rows] -= len(s.full) - lt
    # Control batches: rows of their own, valid up to the marker's length.
    for i in np.nonzero(control)[0].tolist():
        b = lo + i
        marker = encode_control_batch(
            offset=int(plan.base_offset[b]), control_type=int(plan.control_type[b]),
            timestamp=T0_MS + int(plan.base_offset[b]), producer_id=int(plan.producer_id[b]), producer_epoch=0,
            partition_leader_epoch=PARTITION_LEADER_EPOCH,
        )
        mat[i, : len(marker)] = np.frombuffer(marker, dtype=np.uint8)
        mask[i, len(marker) :] = False
        sizes[i] = len(marker)
    hdr["batch_length"] = sizes - fmt.LOG_OVERHEAD
    hdr_bytes = hdr.view(np.uint8).reshape(n, fmt.RECORD_BATCH_OVERHEAD)
    mat[data_rows, : fmt.RECORD_BATCH_OVERHEAD] = hdr_bytes[data_rows]
    if w.compression:
        return _compressed(w, mat, sizes, control)
    flat = mat.reshape(-1) if mask is None else mat[mask]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    crcs = np.empty(n, dtype=">u4")
    for i, (s, e) in enumerate(zip(starts.tolist(), (starts + sizes).tolist())):
        crcs[i] = crc32c.crc32c(flat[s + fmt.ATTRIBUTES_OFFSET : e])
    flat[(starts[:, None] + fmt.CRC_OFFSET + np.arange(4))] = crcs.view(np.uint8).reshape(n, 4)
    return flat, sizes


def _compressed(w: Workload, mat: np.ndarray, sizes: np.ndarray, control: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Data rows with their records region compressed by `w.compression`; markers as they are."""
    pieces = []
    out_sizes = np.empty(len(sizes), dtype=np.int64)
    o = fmt.RECORD_BATCH_OVERHEAD
    for i in range(len(sizes)):
        row = mat[i, : sizes[i]]
        if control[i]:
            pieces.append(row.tobytes())
            out_sizes[i] = sizes[i]
            continue
        region = compress(w.compression, row[o:])
        header = bytearray(row[:o].tobytes())
        header[8:12] = (o - fmt.LOG_OVERHEAD + len(region)).to_bytes(4, "big")
        crc = crc32c.crc32c(region, crc32c.crc32c(bytes(header[fmt.ATTRIBUTES_OFFSET :])))
        header[fmt.CRC_OFFSET : fmt.CRC_OFFSET + 4] = crc.to_bytes(4, "big")
        pieces.append(bytes(header))
        pieces.append(region)
        out_sizes[i] = o + len(region)
    return b"".join(pieces), out_sizes


def _expected(w: Workload, plan: _Plan) -> dict:
    """What a full clean must leave, from the plan alone (see the module docstring)."""
    r = w.records_per_batch
    a = plan.active_first_batch
    clean_data = ~plan.is_control[:a] & ~plan.aborted[:a]
    ids = plan.key_ids[plan.data_index[:a][clean_data]]
    distinct = int(len(np.unique(ids)))
    markers_clean = int(np.count_nonzero(plan.is_control[:a]))
    active_records = int(np.count_nonzero(~plan.is_control[a:])) * r + int(np.count_nonzero(plan.is_control[a:]))
    return {
        "distinct_keys_cleanable": distinct,
        "markers_cleanable": markers_clean,
        "active_segment_records": active_records,
        "expected_records_after_clean": distinct + markers_clean + active_records,
    }


def generate(
    workload: str | Workload, log_dir: str | os.PathLike, *, scale: float = 1.0, seed: int | None = None
) -> dict:
    """Write the workload as `<log_dir>/<topic>-0/` (which must not exist); returns and writes its manifest."""
    w = WORKLOADS[workload] if isinstance(workload, str) else workload
    w = w.scaled(scale)
    if seed is not None:
        w = replace(w, seed=seed)
    started = time.perf_counter()
    log_dir = Path(log_dir)
    directory = log_dir / f"{w.topic}-0"
    directory.mkdir(parents=True, exist_ok=False)
    rng = np.random.Generator(np.random.PCG64DXSM(w.seed))
    plan = _plan(w, rng)
    slots, row = _slots(w)
    writer = _SegmentWriter(directory, w.segment_bytes)
    rows_per_chunk = max(1, CHUNK_BYTES_MAX // len(row))
    n = len(plan.base_offset)
    total_bytes = 0
    sizes_all = []
    for lo_stream, hi_stream in ((0, plan.active_first_batch), (plan.active_first_batch, n)):
        for lo in range(lo_stream, hi_stream, rows_per_chunk):
            hi = min(hi_stream, lo + rows_per_chunk)
            data, sizes = _chunk_bytes(w, plan, lo, hi, slots, row, rng)
            counts = np.where(plan.is_control[lo:hi], 1, w.records_per_batch)
            base = plan.base_offset[lo:hi]
            writer.add(data, sizes, base, base + counts - 1, T0_MS + base + counts - 1)
            total_bytes += int(sizes.sum())
            sizes_all.append(sizes)
        writer.roll()  # the active segment starts at the first active batch
    os.sync()
    counts_all = np.where(plan.is_control, 1, w.records_per_batch)
    end_offset = int(plan.base_offset[-1] + counts_all[-1])
    manifest = {
        "workload": asdict(w),
        "scale": scale,
        "partition_dir": str(directory),
        "batches": n,
        "data_batches": int(np.count_nonzero(~plan.is_control)),
        "control_batches": int(np.count_nonzero(plan.is_control)),
        "aborted_data_batches": int(np.count_nonzero(plan.aborted & ~plan.is_control)),
        "records": int(counts_all.sum()),
        "tombstones": int(plan.tombstone.sum()),
        "bytes": total_bytes,
        "segments": writer.segments,
        "active_base_offset": int(plan.base_offset[plan.active_first_batch]),
        "end_offset": end_offset,
        # A clock just after the last record: producers are still active (their last batches are kept).
        "now_ms": T0_MS + end_offset + 60_000,
        "batch_bytes_mean": total_bytes / n,
        **_expected(w, plan),
        "generate_s": time.perf_counter() - started,
    }
    (log_dir / f"{w.topic}-0.workload.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("dir", type=Path, help="log directory to write <topic>-0/ into")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    print(json.dumps(generate(args.workload, args.dir, scale=args.scale, seed=args.seed), indent=1))


if __name__ == "__main__":
    main()
