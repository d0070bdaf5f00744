"""The bulk scan: a buffer of concatenated batches → numpy arrays, with no Python loop per record.

Owns the cleaner's hot read path over `docs/format.md` sections 1-3: it walks a whole `.log` segment, or a
window of one, given as a numpy uint8 array, `bytes`, `bytearray`, `memoryview` or `mmap`, checks every
batch the way Kafka's reader does and returns one `ScanResult` of column arrays (each described there). Batch
v2 and legacy v0/v1 entries may be mixed. It is pure: it never opens files, logs or reads the clock.

Rules a caller must know:
* It stops without raising at a torn tail (`torn_tail`) or at a limit (`limit_reached`), with `end_position`
  where the whole batches end; the caller decides what a torn tail means (a crash at EOF, or just the end of a
  read window) and scans again from `end_position`. The first batch is always taken.
* Anything invalid before that raises `CorruptRecordError` (`UnsupportedFormatError` for an unknown magic or
  codec) for the first bad batch, at a file position.
* Record positions index `buffer` or the `arena` of decompressed records; batch positions are file positions.

The work per scan, every check, where it is stricter than Kafka, the limits and the cold start: see
docs/design.md, "The bulk scan". A window takes four compiled calls without the GIL on its common path
(`count_batches`, `window_ranges`, the CRC-32C of its v2 batches, `finish_window`: the checks, the records and
the batch columns); lz4 v2 frames add one decoding call and one for the records; other compressed batches go
through the stepwise stages after the checks; a window with an invalid batch is scanned again stage by stage
(`_scan_steps`), which reports its first error.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

import numpy as np

from . import _crc_kernels as crc
from . import _scan_kernels as k
from . import format as fmt
from .compression import DECOMPRESSED_BYTES_MAX_DEFAULT, decompress
from .errors import CorruptRecordError, UnsupportedFormatError

__all__ = [
    "ARENA_BYTES_MAX_DEFAULT",
    "RECORDS_MAX_DEFAULT",
    "KeySpans",
    "ScanBuffers",
    "ScanResult",
    "scan",
    "warm_up",
]

# One scan's decompressed side buffer. The default is large enough for a 64 MiB window of well-compressed
# data and small enough to keep a cleaner thread's memory bounded.
ARENA_BYTES_MAX_DEFAULT = 512 * 1024 * 1024
# One scan's per-record arrays: 48 bytes per record, so the default bounds them at 768 MiB.
RECORDS_MAX_DEFAULT = 16 * 1024 * 1024

_LEGACY_CRC_START = fmt.LEGACY_MAGIC_OFFSET  # CRC-32 covers [magic, end)
# The per-record arrays (`_empty_records`) and the batch columns' blocks (`_batch_columns`), as kernels take them.
_Records = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# `_result` unpacks the blocks' rows in this order (the kernels' C64_*, C32_*, C16_*, F_* constants).
assert (k.C64_POSITION, k.C64_SIZE, k.C64_BASE_OFFSET, k.C64_LAST_OFFSET, k.C64_BASE_TIMESTAMP, k.C64_MAX_TIMESTAMP,
        k.C64_DELETE_HORIZON, k.C64_PRODUCER_ID, k.C64_RECORDS_POS, k.C64_RECORDS_BYTES, k.C64_ROWS) == tuple(range(11))
assert (k.C32_LEADER_EPOCH, k.C32_BASE_SEQUENCE, k.C32_RECORDS_COUNT, k.C32_ROWS) == tuple(range(4))
assert (k.C16_ATTRIBUTES, k.C16_PRODUCER_EPOCH, k.C16_ROWS) == tuple(range(3))
assert (k.F_CONTROL, k.F_TRANSACTIONAL, k.F_DELETE_HORIZON, k.F_LEGACY, k.F_ROWS) == tuple(range(5))


class KeySpans(NamedTuple):
    """Keys of some records, all in one source buffer: `hash_key_spans(buffer, key_pos, key_len, seed)`
    hashes them, `record_index` says which records they are."""

    buffer: np.ndarray
    key_pos: np.ndarray
    key_len: np.ndarray
    record_index: np.ndarray


@dataclass(frozen=True, slots=True)
class ScanResult:
    """The batches and records of one scan, as column arrays.

    Batch arrays (length `n_batches`; a "batch" is a v2 batch, an uncompressed legacy message, or a legacy
    compressed wrapper whose inner messages are its records):

    | array | dtype | meaning |
    |---|---|---|
    | batch_position | int64 | file position of the batch: `base_position` + index in `buffer` |
    | batch_size | int64 | bytes of the batch including the 12-byte log overhead |
    | magic | int8 | 0, 1 or 2 |
    | attributes | int16 | v2 attributes; legacy attributes byte |
    | partition_leader_epoch | int32 | -1 for legacy |
    | crc | uint32 | the stored CRC (CRC-32C for v2, CRC-32 for legacy) |
    | base_offset, last_offset | int64 | v2: baseOffset, baseOffset + lastOffsetDelta. Legacy: the message offset; a wrapper's first inner and outer offset (base_offset is -1 for a wrapper with `headers_only`) |
    | base_timestamp, max_timestamp | int64 | v2 header fields; legacy: -1 and the message timestamp (-1 for v0) |
    | delete_horizon_ms | int64 | baseTimestamp when attribute bit 6 is set (v2), else -1 |
    | producer_id / producer_epoch / base_sequence | int64 / int16 / int32 | -1 for legacy |
    | records_count | int32 | records of the batch (v2 header field; 1 for a legacy message; a wrapper's inner message count, -1 with `headers_only`) |
    | record_start | int64, length `n_batches + 1` | records of batch i are `[record_start[i], record_start[i+1])`; empty with `headers_only` |
    | records_in_arena | bool | the batch's records were decompressed: their positions index `arena`, not `buffer` |
    | records_pos, records_bytes | int64 | where the records region (legacy: the message(s)) starts, in `buffer` or `arena`, and its length |
    | compression | int8 | codec id: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (read-only, as the four below) |
    | is_control, is_transactional, has_delete_horizon | bool | the attribute flag, v2 batches only |
    | is_legacy | bool | magic 0 or 1 |

    Record arrays (length `n_records`; empty with `headers_only`):

    | array | dtype | meaning |
    |---|---|---|
    | offset | int64 | absolute offset (v1 inner relative offsets already made absolute) |
    | timestamp | int64 | effective timestamp: LogAppendTime batches give maxTimestamp (legacy: the wrapper's), v0 gives -1 |
    | key_pos | int64 | index of the key's first byte in the record's source (`buffer` or `arena`); for a null key, where it would start |
    | key_len | int32 | -1 = null key |
    | value_len | int32 | -1 = null value (a tombstone) |
    | record_pos | int64 | index of the raw record in its source: v2 from its length varint; legacy from its 12-byte offset/size prefix |
    | record_size | int32 | bytes of that raw record, so kept records can be copied verbatim into a rebuilt batch |
    | batch_index | int32 | index of the record's batch |

    The record's source is `arena` when `records_in_arena[batch_index]`, else `buffer`; `key_spans()` gives both
    groups ready for a key hasher. Positions in the record arrays are array indexes (not file positions); batch
    positions are file positions (`batch_buffer_pos` gives the buffer index).
    """

    buffer: np.ndarray  # the scanned data (read-only uint8 view); positions not in the arena index it
    arena: np.ndarray  # decompressed records (read-only uint8); empty when nothing was compressed
    base_position: int  # file position of buffer[0]
    start_position: int  # file position where the scan started
    end_position: int  # file position where the scanned whole batches end
    torn_tail: bool  # an incomplete batch follows end_position
    torn_batch_bytes: int  # its declared size, or -1 when unknown or when there is no torn tail
    limit_reached: bool  # stopped early at arena_bytes_max or records_max; more whole batches follow
    headers_only: bool
    # per batch
    batch_position: np.ndarray
    batch_size: np.ndarray
    magic: np.ndarray
    attributes: np.ndarray
    partition_leader_epoch: np.ndarray
    crc: np.ndarray
    base_offset: np.ndarray
    last_offset: np.ndarray
    base_timestamp: np.ndarray
    max_timestamp: np.ndarray
    delete_horizon_ms: np.ndarray
    producer_id: np.ndarray
    producer_epoch: np.ndarray
    base_sequence: np.ndarray
    records_count: np.ndarray
    record_start: np.ndarray
    records_in_arena: np.ndarray
    records_pos: np.ndarray
    records_bytes: np.ndarray
    # per batch, derived from magic and attributes (read-only)
    compression: np.ndarray
    is_control: np.ndarray
    is_transactional: np.ndarray
    has_delete_horizon: np.ndarray
    is_legacy: np.ndarray
    # per record
    offset: np.ndarray
    timestamp: np.ndarray
    key_pos: np.ndarray
    key_len: np.ndarray
    value_len: np.ndarray
    record_pos: np.ndarray
    record_size: np.ndarray
    batch_index: np.ndarray

    # ---- sizes and derived batch columns (vectorised) ----

    @property
    def n_batches(self) -> int:
        return len(self.batch_position)

    @property
    def n_records(self) -> int:
        return len(self.offset)

    @property
    def batch_buffer_pos(self) -> np.ndarray:
        """Index of each batch's first byte in `buffer` (int64)."""
        return self.batch_position - self.base_position

    @property
    def timestamp_type(self) -> np.ndarray:
        """Per batch (int8): 1 for LogAppendTime, else 0 (v0 has no timestamp type)."""
        return ((self.attributes & fmt.TIMESTAMP_TYPE_MASK) != 0).astype(np.int8) * (self.magic > 0)

    @property
    def next_offset(self) -> np.ndarray:
        return self.last_offset + 1

    # ---- derived record columns ----

    @property
    def record_in_arena(self) -> np.ndarray:
        """Per record (bool): its positions index `arena`."""
        return self.records_in_arena[self.batch_index]

    @property
    def is_tombstone(self) -> np.ndarray:
        return self.value_len < 0

    # ---- bytes of one batch or record (for tools and tests, not hot loops) ----

    def source(self, record: int) -> np.ndarray:
        """The buffer record `record`'s positions index: `arena` or `buffer`."""
        return self.arena if self.records_in_arena[self.batch_index[record]] else self.buffer

    def batch_bytes(self, batch: int) -> bytes:
        pos = int(self.batch_position[batch]) - self.base_position
        return self.buffer[pos : pos + int(self.batch_size[batch])].tobytes()

    def record_bytes(self, record: int) -> bytes:
        pos = int(self.record_pos[record])
        return self.source(record)[pos : pos + int(self.record_size[record])].tobytes()

    def key_bytes(self, record: int) -> bytes | None:
        length = int(self.key_len[record])
        if length < 0:
            return None
        pos = int(self.key_pos[record])
        return self.source(record)[pos : pos + length].tobytes()

    def value_bytes(self, record: int) -> bytes | None:
        length = int(self.value_len[record])
        if length < 0:
            return None
        # The value length field follows the key: a zigzag varint in v2, an int32 in legacy messages.
        pos = int(self.key_pos[record]) + max(int(self.key_len[record]), 0)
        if self.magic[self.batch_index[record]] >= fmt.MAGIC_V2:
            pos += _varint_size(length)
        else:
            pos += fmt.LEGACY_LENGTH.size
        return self.source(record)[pos : pos + length].tobytes()

    def key_spans(self, records: np.ndarray | None = None) -> tuple[KeySpans, ...]:
        """Keys grouped by source buffer: at most one group for `buffer` and one for `arena`.

        `records` (a bool mask or indices over the records) restricts the result; by default every record.
        """
        index = np.arange(self.n_records, dtype=np.int64) if records is None else np.asarray(records)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        in_arena = self.records_in_arena[self.batch_index[index]]
        groups = []
        for buffer, mask in ((self.buffer, ~in_arena), (self.arena, in_arena)):
            chosen = index[mask]
            if len(chosen):
                groups.append(KeySpans(buffer, self.key_pos[chosen], self.key_len[chosen], chosen))
        return tuple(groups)


class ScanBuffers:
    """Per-record output memory reused across scans, for a caller that scans a file window by window.

    Fresh arrays cost a page fault per 4 KiB on first touch (about 15% of a scan of small records); reusing
    them avoids that. A `ScanResult` made with a `ScanBuffers` shares its record arrays and its arena of
    decompressed records with it and is valid only until the next scan that is given the same object. Capacity
    grows to the largest scan seen (the record arrays bounded by `records_max`, the arena by the decoded bytes
    of one window, doubled when it grows) and is never given back; one per thread. (A window's arena is ~4x its
    compressed bytes: at 32 MiB and more, glibc maps a fresh one for each window, and unmapping it held the GIL
    ~0.2 ms a window, besides the page faults of its first touch.)
    """

    __slots__ = ("_arena", "_arrays", "_capacity")

    def __init__(self) -> None:
        self._arrays: _Records = _empty_records()
        self._capacity = 0
        self._arena = _EMPTY_U8

    def arena(self, size: int, limit: int) -> np.ndarray:
        """A writable arena of at least `size` bytes (contents undefined): the one kept, or a new one of twice its
        size or a quarter more than `size`, whichever is larger (at most `limit`, at least `size`). Not fitted:
        windows end at whole batches, so their sizes differ a little, and each new largest one would otherwise
        leave the pages its predecessor had touched for new ones (W3: up to ~0.09 s of first touches a process on
        this project's VMs; bench/RESULTS.md, seventeenth round)."""
        if len(self._arena) < size:
            roomy = max(2 * len(self._arena), size + size // 4)
            self._arena = np.empty(max(size, min(roomy, limit)), dtype=np.uint8)
        return self._arena

    def keep_arena(self, arena: np.ndarray) -> None:
        """Keep `arena`, grown during a scan, for the next scans."""
        self._arena = arena

    def records(self, n: int) -> tuple[np.ndarray, ...]:
        """Views of length `n` of the per-record arrays (contents undefined)."""
        if n > self._capacity:
            self._capacity = max(n, self._capacity + self._capacity // 2)
            self._arrays = _empty_records(self._capacity)
        return tuple(a[:n] for a in self._arrays)

    def arrays(self) -> _Records:
        """The per-record arrays at their whole capacity (contents undefined): a scan that finds its records fit
        writes them here without asking for views first."""
        return self._arrays


def _varint_size(value: int) -> int:
    z = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def _as_uint8(data) -> np.ndarray:
    """A read-only 1-D uint8 view of `data` (no copy), so every kernel sees one array type."""
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
            raise ValueError(f"expected a contiguous 1-D uint8 array, got {data.dtype} with shape {data.shape}")
        view = data.view()
    else:
        view = np.frombuffer(data, dtype=np.uint8)
    view.flags.writeable = False
    return view


_EMPTY_U8 = np.empty(0, dtype=np.uint8)
_EMPTY_U8.flags.writeable = False
_NO_RECORD_START = np.empty(0, dtype=np.int64)  # the record_start of a headers-only scan


def scan(
    data,
    *,
    start: int = 0,
    end: int | None = None,
    base_position: int = 0,
    verify_crc: bool = True,
    headers_only: bool = False,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX_DEFAULT,
    arena_bytes_max: int = ARENA_BYTES_MAX_DEFAULT,
    records_max: int = RECORDS_MAX_DEFAULT,
    buffers: ScanBuffers | None = None,
) -> ScanResult:
    """Scan the batches in `data[start:end]` into arrays.

    Requires `start` to be the first byte of a batch (or `end`) and `0 ≤ start ≤ end ≤ len(data)`;
    `base_position` is the file position of `data[0]`. With `verify_crc` every batch's stored CRC is checked
    (and a legacy wrapper's inner messages' CRCs). With `headers_only` records are neither decompressed nor
    decoded: only the batch arrays are filled. With `buffers` the record arrays live in (and stay owned by)
    that `ScanBuffers`.

    Ensures every batch in [start_position, end_position) was checked and decoded, and that the scan stopped
    at `end`, at a torn tail, or at a limit (see docs/design.md, "The bulk scan"). The result keeps a view of
    `data`.
    Raises `CorruptRecordError` / `UnsupportedFormatError` at the first invalid batch (file positions).
    """
    buf = _as_uint8(data)
    end = len(buf) if end is None else end
    if not 0 <= start <= end <= len(buf):
        raise ValueError(f"invalid range [{start}, {end}) of a {len(buf)}-byte buffer")
    if records_max < 1 or arena_bytes_max < 0:
        raise ValueError("records_max must be ≥ 1 and arena_bytes_max ≥ 0")
    args = (buf, start, end, base_position, verify_crc, headers_only, decompressed_bytes_max, arena_bytes_max,
            records_max, buffers)
    info = np.zeros(k.INFO_SIZE, dtype=np.int64)
    n = int(k.count_batches(buf, start, end, info))
    if info[k.INFO_CODE] != k.OK:
        return _scan_steps(*args)
    # The common path: the headers and CRC ranges, the CRC-32C of every v2 batch, then the checks, the records and
    # the batch columns in one more call; anything else (an error, compressed batches) goes stepwise.
    hdr = np.empty((n, k.BATCH_COLUMNS), dtype=np.int64)
    ranges = np.empty((3, n), dtype=np.int64)  # CRC ranges: starts, ends, computed CRCs
    if k.window_ranges(buf, start, n, hdr, ranges, info) < n:
        return _scan_steps(*args)
    if verify_crc and n:
        crc.batch_crcs(buf, ranges[0], ranges[1], ranges[2])
    columns = _batch_columns(n)
    full = _NO_RECORDS if buffers is None or headers_only else buffers.arrays()
    record_start = np.empty(n + 1, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)  # compressed batches
    scalars = np.empty(k.W_SCALARS, dtype=np.int64)
    status = k.finish_window(buf, _EMPTY_U8, n, hdr, ranges[2], verify_crc, headers_only, records_max, base_position,
                             info, rows, record_start, *full, *columns, scalars)
    if status == k.W_STEPWISE or (scalars[k.WS_LEGACY] and _first_bad_crc(buf, hdr[:n], legacy_only=True) is not None):
        return _scan_steps(*args)
    facts = info.tolist()
    stop, torn_tail, torn_batch_bytes = facts[k.INFO_STOP], bool(facts[k.INFO_TORN]), facts[k.INFO_TORN_BYTES]
    arena = _EMPTY_U8
    if status == k.W_ARENA:
        lz4k = _lz4_kernels()
        if not (scalars[k.WS_LZ4_V2] and lz4k.ENABLED):
            return _scan_back(args, n, stop, torn_tail, torn_batch_bytes, hdr, n, _Failure(base_position), info)
        decoded = _lz4_arena(buf, hdr, rows[: int(scalars[k.WS_COMPRESSED])], int(scalars[k.WS_COMPRESSED_BYTES]),
                             decompressed_bytes_max, arena_bytes_max, buffers)
        if decoded is None:  # an error or a limit: stepwise, which reports it as it always has
            return _scan_steps(*args)
        arena = decoded
        status = k.finish_records(buf, arena, n, hdr, records_max, base_position, info, record_start, *full,
                                  *columns, scalars)
        if status == k.W_STEPWISE:
            return _scan_steps(*args)
    limit, n_records, limit_reached = scalars[: k.WS_LIMIT_REACHED + 1].tolist()
    records: tuple[np.ndarray, ...]
    if headers_only:
        record_start, records = _NO_RECORD_START, _NO_RECORDS
    elif status == k.W_RECORDS:
        records = _empty_records(n_records) if buffers is None else buffers.records(n_records)
        if k.walk_records(buf, arena, hdr, limit, record_start, info, *records) < limit:
            return _scan_steps(*args)
        k.fill_columns(hdr, limit, base_position, headers_only, *columns)
    else:
        records = tuple([a[:n_records] for a in full])
    if not headers_only and limit < n:
        record_start = record_start[: limit + 1]
    if limit < n:  # a resource limit ended the scan early
        stop = int(hdr[limit, k.COL_POSITION])
        torn_tail, torn_batch_bytes = False, -1
    return _result(args, arena, stop, torn_tail, torn_batch_bytes, bool(limit_reached), columns, limit, record_start,
                   records)


@functools.cache
def _lz4_kernels() -> ModuleType:
    """`_lz4_kernels`, imported at the first window with compressed batches (it binds liblz4)."""
    from . import _lz4_kernels as lz4k  # binds liblz4; scan.py is imported only where kernels run

    return lz4k


def _lz4_arena(buf, hdr, rows, compressed_bytes, decompressed_bytes_max, arena_bytes_max,
               buffers: ScanBuffers | None) -> np.ndarray | None:
    """The records of the batches `rows` (every one an lz4 v2 batch) decoded into one read-only arena by
    `_lz4_kernels.decode_frames` (their header rows moved to it), or None at a frame it cannot decode or at the
    arena's limit (the stepwise `_decompress_all` then says what happened). The arena is `buffers`' (kept,
    grown) if given, else a fresh one."""
    lz4k = _lz4_kernels()
    estimate = _LZ4_ARENA_RATIO * compressed_bytes + _LZ4_ARENA_BYTES_MIN
    limit = max(arena_bytes_max, _LZ4_ARENA_BYTES_MIN)
    size = min(estimate, limit)
    arena = np.empty(size, dtype=np.uint8) if buffers is None else buffers.arena(size, limit)
    state, work, scratch = lz4k.new_state(decompressed_bytes_max, arena_bytes_max)
    j = 0
    while True:
        j = int(lz4k.decode_frames(buf, hdr, rows, j, arena, state, work, scratch))
        status = int(state[lz4k.S_STATUS])
        if status == lz4k.DONE:
            break
        if status != lz4k.GROW:
            return None
        arena = _grown(arena, int(state[lz4k.S_USED]), int(state[lz4k.S_DETAIL]))
        if buffers is not None:
            buffers.keep_arena(arena)
    used = int(state[lz4k.S_USED])
    arena = arena[:used] if used else _EMPTY_U8
    arena.flags.writeable = False
    return arena


def _scan_steps(buf, start, end, base_position, verify_crc, headers_only, decompressed_bytes_max, arena_bytes_max,
                records_max, buffers) -> ScanResult:
    """`scan` stage by stage, each stage over the batches before the first bad one any earlier stage found: the
    path of a window with an invalid batch (whose error it raises, the first in the window) or a legacy CRC to
    check, and the reference the common path's fewer calls follow."""
    args = (buf, start, end, base_position, verify_crc, headers_only, decompressed_bytes_max, arena_bytes_max,
            records_max, buffers)
    info = np.zeros(k.INFO_SIZE, dtype=np.int64)

    # Pass 1: count batches (prefixes only), then read their headers.
    n = int(k.count_batches(buf, start, end, info))
    stop = int(info[k.INFO_STOP])
    torn_tail = bool(info[k.INFO_TORN])
    torn_batch_bytes = int(info[k.INFO_TORN_BYTES])
    failure = _Failure(base_position)
    if info[k.INFO_CODE] != k.OK:
        failure.kernel(n, info)
        torn_tail, torn_batch_bytes = False, -1
    hdr = np.empty((n, k.BATCH_COLUMNS), dtype=np.int64)
    good = int(k.parse_headers(buf, start, n, hdr, info))
    if good < n:
        failure.kernel(good, info)
    limit = failure.limit(n)

    if verify_crc and limit:
        bad = _first_bad_crc(buf, hdr[:limit])
        if bad is not None:
            failure.set(bad, _crc_error(hdr[bad], buf, base_position))
            limit = bad
    # Fields the CRC covers are checked once the CRC has vouched for them (a flipped byte is a CRC error).
    good = int(k.check_headers(buf, limit, hdr, info))
    if good < limit:
        failure.kernel(good, info)
        limit = good
    return _scan_back(args, n, stop, torn_tail, torn_batch_bytes, hdr, limit, failure, info)


def _scan_back(args, n, stop, torn_tail, torn_batch_bytes, hdr, limit, failure, info) -> ScanResult:
    """The stages after the header checks: decompression, legacy wrappers' inner messages, the records, the
    inner CRCs; raises the first error any stage found (`failure`), else the result."""
    (buf, _, _, base_position, verify_crc, headers_only, decompressed_bytes_max, arena_bytes_max, records_max,
     buffers) = args
    limit_reached = False
    arena = _EMPTY_U8
    compressed_pos = None  # buffer index of each batch's compressed region, for errors found in the arena
    records: tuple[np.ndarray, ...]
    if not headers_only and limit:
        arena, compressed_pos, limit, limit_reached = _decompress_all(
            buf, hdr, limit, failure, base_position, decompressed_bytes_max, arena_bytes_max
        )
        limit = _count_inner(arena, hdr, limit, failure, info, compressed_pos)

    if headers_only:
        record_start = _NO_RECORD_START
        records = _NO_RECORDS
    else:
        counts = hdr[:limit, k.COL_RECORDS_COUNT]
        record_start = np.zeros(limit + 1, dtype=np.int64)
        np.cumsum(counts, out=record_start[1:])
        if record_start[-1] > records_max and limit > 1:
            # The first batch whose records would pass the bound ends the scan (keep at least one batch).
            limit = max(int(np.searchsorted(record_start[1:], records_max, side="right")), 1)
            record_start = record_start[: limit + 1]
            failure.drop_from(limit)
            limit_reached = True
        n_records = int(record_start[-1])
        records = _empty_records(n_records) if buffers is None else buffers.records(n_records)
        done = int(k.walk_records(buf, arena, hdr, limit, record_start, info, *records))
        if done < limit:
            failure.kernel(done, info, _arena_region(hdr, done, compressed_pos))
            limit = done
        if verify_crc and limit:
            limit = _verify_inner_crcs(arena, hdr, limit, record_start, records, failure, compressed_pos)
        if limit < len(record_start) - 1:
            record_start = record_start[: limit + 1]
            records = tuple(a[: record_start[-1]] for a in records)

    failure.raise_if_any()

    if limit < n:  # a resource limit ended the scan early
        stop = int(hdr[limit, k.COL_POSITION])
        torn_tail, torn_batch_bytes = False, -1
    columns = _batch_columns(limit)
    k.fill_columns(hdr, limit, base_position, headers_only, *columns)
    arena.flags.writeable = False
    return _result(args, arena, stop, torn_tail, torn_batch_bytes, limit_reached, columns, limit, record_start, records)


def _batch_columns(n: int) -> _Columns:
    """Room for the batch columns of `n` batches, in `_scan_kernels.fill_columns`' argument order: the int64,
    int32 and int16 blocks (a row per column), magic, crc, records_in_arena, compression, the flag block."""
    return (
        np.empty((k.C64_ROWS, n), dtype=np.int64),
        np.empty((k.C32_ROWS, n), dtype=np.int32),
        np.empty((k.C16_ROWS, n), dtype=np.int16),
        np.empty(n, dtype=np.int8),
        np.empty(n, dtype=np.uint32),
        np.empty(n, dtype=np.bool_),
        np.empty(n, dtype=np.int8),
        np.empty((k.F_ROWS, n), dtype=np.bool_),
    )


def _result(args, arena, stop, torn_tail, torn_batch_bytes, limit_reached, columns, limit, record_start,
            records) -> ScanResult:
    """The `ScanResult` of the first `limit` batches, whose columns `fill_columns` wrote into `columns`."""
    buf, start, base_position, headers_only = args[0], args[1], args[3], args[5]
    i64, i32, i16, magic, crc_, in_arena, compression, flags = columns
    compression.flags.writeable = False  # derived: a consumer changing them would change what others read
    flags.flags.writeable = False
    if limit < len(magic):
        i64, i32, i16, magic, crc_, in_arena, compression, flags = (
            i64[:, :limit], i32[:, :limit], i16[:, :limit], magic[:limit], crc_[:limit], in_arena[:limit],
            compression[:limit], flags[:, :limit])
    # A block's rows as views (`list` of a 2-D array: one call); each row is contiguous.
    (position, size, base_offset, last_offset, base_timestamp, max_timestamp, delete_horizon, producer_id, records_pos,
     records_bytes) = list(i64)
    leader_epoch, base_sequence, records_count = list(i32)
    attributes, producer_epoch = list(i16)
    control, transactional, has_horizon, legacy = list(flags)
    return ScanResult(
        buffer=buf,
        arena=arena,
        base_position=base_position,
        start_position=base_position + start,
        end_position=base_position + stop,
        torn_tail=torn_tail,
        torn_batch_bytes=torn_batch_bytes,
        limit_reached=limit_reached,
        headers_only=headers_only,
        batch_position=position,
        batch_size=size,
        magic=magic,
        attributes=attributes,
        partition_leader_epoch=leader_epoch,
        crc=crc_,
        base_offset=base_offset,
        last_offset=last_offset,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        delete_horizon_ms=delete_horizon,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=records_count,
        record_start=record_start,
        records_in_arena=in_arena,
        records_pos=records_pos,
        records_bytes=records_bytes,
        compression=compression,
        is_control=control,
        is_transactional=transactional,
        has_delete_horizon=has_horizon,
        is_legacy=legacy,
        offset=records[0],
        timestamp=records[1],
        key_pos=records[2],
        key_len=records[3],
        value_len=records[4],
        record_pos=records[5],
        record_size=records[6],
        batch_index=records[7],
    )


def _empty_records(n: int = 0) -> _Records:
    """Per-record arrays in walk_records' argument order: offset, timestamp, key_pos, key_len, value_len,
    record_pos, record_size, batch_index."""
    return (
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int32),
    )


_NO_RECORDS = _empty_records()  # the record arrays of a headers-only scan


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel, so the first real scan pays no compile time."""
    empty_batch = fmt.BATCH_V2.pack(
        0, fmt.BATCH_LENGTH_MIN_V2, -1, fmt.MAGIC_V2, 0, 0, 0, -1, -1, -1, -1, -1, 0
    )  # a valid empty v2 batch (CRC not checked)
    scan(empty_batch, verify_crc=False)
    info = np.zeros(k.INFO_SIZE, dtype=np.int64)
    hdr = np.zeros((1, k.BATCH_COLUMNS), dtype=np.int64)
    k.count_legacy_inner(_EMPTY_U8, hdr, np.zeros(0, dtype=np.int64), info)
    crc.crc32c(_EMPTY_U8)


# ---- stages --------------------------------------------------------------------------------------------------


class _Failure:
    """The first bad batch seen so far and its error; later stages only look at batches before it."""

    def __init__(self, base_position: int) -> None:
        self.base_position = base_position
        self.batch: int | None = None
        self.error: CorruptRecordError | None = None

    def limit(self, n: int) -> int:
        return n if self.batch is None else min(n, self.batch)

    def set(self, batch: int, error: CorruptRecordError) -> None:
        if self.batch is None or batch <= self.batch:
            self.batch, self.error = batch, error

    def drop_from(self, batch: int) -> None:
        """Forget an error at or after `batch`: a resource limit ended the scan before it."""
        if self.batch is not None and self.batch >= batch:
            self.batch, self.error = None, None

    def kernel(self, batch: int, info: np.ndarray, arena_region: tuple[int, int] | None = None) -> None:
        """Record the kernel error in `info`; `arena_region` = (buffer index of the batch's compressed
        region, arena index of its decompressed records) when the kernel's position indexes the arena."""
        self.set(batch, _kernel_error(info, self.base_position, arena_region))

    def raise_if_any(self) -> None:
        if self.error is not None:
            raise self.error


def _first_bad_crc(buf: np.ndarray, hdr: np.ndarray, *, legacy_only: bool = False) -> int | None:
    """Index of the first batch whose stored CRC does not match its bytes, or None (with `legacy_only`, of the
    legacy entries only: the common path of `scan` has checked the v2 batches).

    The CRC-32C of every v2 batch is one compiled call without the GIL; legacy entries (CRC-32) take zlib.
    """
    pos = hdr[:, k.COL_POSITION]
    ends = pos + hdr[:, k.COL_SIZE]
    v2 = hdr[:, k.COL_MAGIC] == fmt.MAGIC_V2
    computed = np.empty(len(hdr), dtype=np.int64)
    if legacy_only:
        computed[v2] = hdr[v2, k.COL_CRC]
    elif v2.all():
        crc.batch_crcs(buf, pos + fmt.ATTRIBUTES_OFFSET, ends, computed)
    else:
        rows = np.flatnonzero(v2)
        if len(rows):
            part = np.empty(len(rows), dtype=np.int64)
            crc.batch_crcs(buf, pos[rows] + fmt.ATTRIBUTES_OFFSET, ends[rows], part)
            computed[rows] = part
    if not v2.all():
        view = buf.data
        legacy = np.flatnonzero(~v2)
        computed[legacy] = [
            zlib.crc32(view[a:b]) for a, b in zip((pos[legacy] + _LEGACY_CRC_START).tolist(), ends[legacy].tolist())
        ]
    bad = np.flatnonzero(computed != hdr[:, k.COL_CRC])
    return int(bad[0]) if len(bad) else None


def _crc_error(row: np.ndarray, buf: np.ndarray, base_position: int) -> CorruptRecordError:
    pos = int(row[k.COL_POSITION])
    size = int(row[k.COL_SIZE])
    if row[k.COL_MAGIC] == fmt.MAGIC_V2:
        actual = crc.crc32c(buf, pos + fmt.ATTRIBUTES_OFFSET, pos + size)
        name, where = "CRC-32C", pos + fmt.CRC_OFFSET
    else:
        actual = zlib.crc32(buf.data[pos + _LEGACY_CRC_START : pos + size])
        name, where = "CRC-32", pos + fmt.LEGACY_CRC_OFFSET
    return CorruptRecordError(
        f"{name} mismatch in the batch at byte {base_position + pos}: stored 0x{int(row[k.COL_CRC]):08x}, "
        f"computed 0x{actual:08x}",
        position=base_position + where,
    )


def _decompress_all(buf, hdr, limit, failure, base_position, decompressed_bytes_max, arena_bytes_max):
    """Decompress the records of every compressed batch before `limit` into one arena.

    Returns (arena, compressed_pos, limit, limit_reached); rows of moved batches now index the arena. The lz4
    frames of v2 batches are decoded by one compiled call for the window (`_lz4_kernels.decode_frames`, the GIL
    released) when liblz4 could be bound; every other stream batch by batch by `compression.decompress`.
    """
    from . import _lz4_kernels as lz4k  # binds liblz4; scan.py is imported only where kernels run

    magic = hdr[:limit, k.COL_MAGIC]
    codec = hdr[:limit, k.COL_ATTRIBUTES] & fmt.COMPRESSION_MASK
    compressed = np.flatnonzero(codec != fmt.COMPRESSION_NONE)
    if not len(compressed):
        return _EMPTY_U8, None, limit, False
    compressed_pos = hdr[:, k.COL_RECORDS_POS].copy()
    if lz4k.ENABLED and np.any((codec[compressed] == fmt.COMPRESSION_LZ4) & (magic[compressed] == fmt.MAGIC_V2)):
        arena, moved, limit, limit_reached = _decompress_with_kernel(
            buf, hdr, compressed, limit, failure, base_position, decompressed_bytes_max, arena_bytes_max
        )
    else:
        arena, moved, limit, limit_reached = _decompress_each(
            buf, hdr, compressed, limit, failure, base_position, decompressed_bytes_max, arena_bytes_max
        )
    # A v2 batch's count is checked against its bytes before the record arrays are sized by it.
    rows = hdr[moved]
    too_many = np.flatnonzero(
        (rows[:, k.COL_MAGIC] == fmt.MAGIC_V2)
        & (rows[:, k.COL_RECORDS_COUNT] * k.RECORD_BYTES_MIN > rows[:, k.COL_RECORDS_BYTES])
    )
    if len(too_many):
        i = int(moved[int(too_many[0])])
        count, size = int(hdr[i, k.COL_RECORDS_COUNT]), int(hdr[i, k.COL_RECORDS_BYTES])
        failure.set(
            i,
            CorruptRecordError(
                f"records count {count} cannot fit the {size} decompressed bytes of the batch at byte "
                f"{base_position + int(hdr[i, k.COL_POSITION])} (a record takes at least "
                f"{k.RECORD_BYTES_MIN} bytes)",
                position=base_position + int(hdr[i, k.COL_POSITION]) + fmt.RECORDS_COUNT_OFFSET,
            ),
        )
        limit = min(limit, i)
    return arena, compressed_pos, limit, limit_reached


def _decompress_each(buf, hdr, compressed, limit, failure, base_position, decompressed_bytes_max, arena_bytes_max):
    """`_decompress_all` batch by batch through `compression.decompress`; returns (arena, moved rows, limit,
    limit_reached)."""
    codec = hdr[:, k.COL_ATTRIBUTES] & fmt.COMPRESSION_MASK
    magic = hdr[:, k.COL_MAGIC]
    view = memoryview(buf)
    parts: list[bytes] = []
    moved: list[int] = []
    total = 0
    limit_reached = False
    for i in compressed.tolist():
        pos = int(hdr[i, k.COL_RECORDS_POS])
        region = view[pos : pos + int(hdr[i, k.COL_RECORDS_BYTES])]
        try:
            out = decompress(
                int(codec[i]),
                region,
                position=base_position + pos,
                magic=int(magic[i]),
                decompressed_bytes_max=decompressed_bytes_max,
            )
        except CorruptRecordError as exc:
            failure.set(i, exc)
            limit = i
            break
        if total + len(out) > arena_bytes_max and i > 0:
            failure.drop_from(i)
            limit, limit_reached = i, True
            break
        parts.append(out)
        moved.append(i)
        total += len(out)
    # One join (a single copy in C) instead of a numpy slice assignment per batch.
    arena = np.frombuffer(b"".join(parts), dtype=np.uint8) if total else _EMPTY_U8
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    rows_moved = np.asarray(moved, dtype=np.int64)
    hdr[rows_moved, k.COL_RECORDS_POS] = np.cumsum(sizes) - sizes
    hdr[rows_moved, k.COL_RECORDS_BYTES] = sizes
    hdr[rows_moved, k.COL_IN_ARENA] = 1
    return arena, rows_moved, limit, limit_reached


# The arena of a window with lz4 frames starts at this many times their compressed bytes (grown when short;
# pages never written are never touched).
_LZ4_ARENA_RATIO = 4
_LZ4_ARENA_BYTES_MIN = 64 * 1024


def _decompress_with_kernel(buf, hdr, compressed, limit, failure, base_position, decompressed_bytes_max,
                            arena_bytes_max):
    """`_decompress_all` with the lz4 v2 frames decoded by `_lz4_kernels.decode_frames`, one call per run of
    them (one per window when every compressed batch is lz4 v2), the others by `compression.decompress`, in
    batch order into one arena with the same limits and errors; returns (arena, moved rows, limit,
    limit_reached)."""
    from . import _lz4_kernels as lz4k

    rows = compressed.astype(np.int64)
    estimate = _LZ4_ARENA_RATIO * int(hdr[rows, k.COL_RECORDS_BYTES].sum()) + _LZ4_ARENA_BYTES_MIN
    arena = np.empty(min(estimate, max(arena_bytes_max, _LZ4_ARENA_BYTES_MIN)), dtype=np.uint8)
    state, work, scratch = lz4k.new_state(decompressed_bytes_max, arena_bytes_max)
    limit_reached = False
    j = 0
    while j < len(rows):
        j = int(lz4k.decode_frames(buf, hdr, rows, j, arena, state, work, scratch))
        status = int(state[lz4k.S_STATUS])
        if status == lz4k.DONE:
            break
        i = int(rows[j])
        used = int(state[lz4k.S_USED])
        if status == lz4k.GROW:
            arena = _grown(arena, used, int(state[lz4k.S_DETAIL]))
            continue
        if status == lz4k.ARENA_LIMIT:
            failure.drop_from(i)
            limit, limit_reached = i, True
            break
        if status != lz4k.OTHER:
            failure.set(i, lz4k.frame_error(state, base_position + int(hdr[i, k.COL_RECORDS_POS])))
            limit = i
            break
        pos = int(hdr[i, k.COL_RECORDS_POS])
        try:
            out = decompress(
                int(hdr[i, k.COL_ATTRIBUTES] & fmt.COMPRESSION_MASK),
                memoryview(buf)[pos : pos + int(hdr[i, k.COL_RECORDS_BYTES])],
                position=base_position + pos,
                magic=int(hdr[i, k.COL_MAGIC]),
                decompressed_bytes_max=decompressed_bytes_max,
            )
        except CorruptRecordError as exc:
            failure.set(i, exc)
            limit = i
            break
        if used + len(out) > arena_bytes_max and i > 0:
            failure.drop_from(i)
            limit, limit_reached = i, True
            break
        if used + len(out) > len(arena):
            arena = _grown(arena, used, used + len(out))
        arena[used : used + len(out)] = np.frombuffer(out, dtype=np.uint8)
        hdr[i, k.COL_RECORDS_POS] = used
        hdr[i, k.COL_RECORDS_BYTES] = len(out)
        hdr[i, k.COL_IN_ARENA] = 1
        state[lz4k.S_USED] = used + len(out)
        j += 1
    used = int(state[lz4k.S_USED])
    return (arena[:used] if used else _EMPTY_U8), rows[:j], limit, limit_reached


def _grown(arena: np.ndarray, used: int, needed: int) -> np.ndarray:
    """A larger arena holding `arena[:used]`, with room for at least `needed` bytes."""
    grown = np.empty(max(needed, 2 * len(arena)), dtype=np.uint8)
    grown[:used] = arena[:used]
    return grown


def _count_inner(arena, hdr, limit, failure, info, compressed_pos) -> int:
    """Count the inner messages of the legacy wrappers before `limit`; returns the new limit."""
    wrappers = np.flatnonzero(
        (hdr[:limit, k.COL_MAGIC] < fmt.MAGIC_V2) & (hdr[:limit, k.COL_IN_ARENA] != 0)
    ).astype(np.int64)
    if not len(wrappers):
        return limit
    done = int(k.count_legacy_inner(arena, hdr, wrappers, info))
    if done < len(wrappers):
        bad = int(wrappers[done])
        failure.kernel(bad, info, _arena_region(hdr, bad, compressed_pos))
        return min(limit, bad)
    return limit


def _verify_inner_crcs(arena, hdr, limit, record_start, records, failure, compressed_pos) -> int:
    """Check the CRC-32 of every inner message of the legacy wrappers before `limit`."""
    wrappers = np.flatnonzero((hdr[:limit, k.COL_MAGIC] < fmt.MAGIC_V2) & (hdr[:limit, k.COL_IN_ARENA] != 0))
    if not len(wrappers):
        return limit
    view = memoryview(arena)
    record_pos, record_size = records[5], records[6]
    for i in wrappers.tolist():
        for r in range(int(record_start[i]), int(record_start[i + 1])):
            pos, size = int(record_pos[r]), int(record_size[r])
            stored = int.from_bytes(view[pos + fmt.LEGACY_CRC_OFFSET : pos + fmt.LEGACY_CRC_OFFSET + 4], "big")
            actual = zlib.crc32(view[pos + _LEGACY_CRC_START : pos + size])
            if stored != actual:
                where = failure.base_position + int(compressed_pos[i])
                failure.set(
                    i,
                    CorruptRecordError(
                        f"CRC-32 mismatch in inner message {r - int(record_start[i])} of the legacy wrapper at "
                        f"byte {failure.base_position + int(hdr[i, k.COL_POSITION])} (byte {pos - int(hdr[i, k.COL_RECORDS_POS])} "
                        f"of its decompressed value): stored 0x{stored:08x}, computed 0x{actual:08x}",
                        position=where,
                    ),
                )
                return i
    return limit


# ---- kernel error codes → typed exceptions ----------------------------------------------------------------------

_MESSAGES = {
    k.E_LENGTH_MIN: "declared batch length {d1} is below the minimum {d2}",
    k.E_MAGIC: "unknown magic {d1}",
    k.E_V2_LENGTH_MIN: "declared batch length {d1} is below the v2 minimum {d2}",
    k.E_CODEC: "invalid compression codec {d1} in attributes 0x{d2:04x}",
    k.E_LAST_OFFSET_DELTA: "negative last offset delta {d1}",
    k.E_COUNT_NEGATIVE: "negative record count {d1}",
    k.E_COUNT_SLOTS: "record count {d1} exceeds the {d2}+1 offset slots of the batch",
    k.E_COUNT_BYTES: "record count {d1} cannot fit the {d2}-byte records region (a record takes at least 7 bytes)",
    k.E_LEGACY_SIZE_MIN: "legacy message size {d1} (with overhead) is below the minimum {d2}",
    k.E_LEGACY_CODEC: "invalid legacy compression codec in attributes 0x{d3:02x}",
    k.E_LEGACY_KEY_LENGTH: "legacy key length is invalid or runs past the message of {d1} bytes",
    k.E_LEGACY_VALUE_LENGTH: "legacy value length is invalid or runs past the message of {d1} bytes",
    k.E_LEGACY_TRAILING: "{d2} bytes left in the legacy message after its value",
    k.E_LEGACY_NULL_WRAPPER: "compressed legacy wrapper has a null value",
    k.E_LEGACY_INNER_TRUNCATED: "inner message runs past the wrapper's decompressed value ({d1} bytes left, {d2} needed)",
    k.E_LEGACY_INNER_SIZE_MIN: "inner message size {d1} (with overhead) is below the minimum {d2}",
    k.E_LEGACY_INNER_MAGIC: "inner message magic {d1} does not match wrapper magic {d2}",
    k.E_LEGACY_INNER_COMPRESSED: "inner message is compressed (attributes 0x{d1:02x}); nesting is not allowed",
    k.E_LEGACY_INNER_ORDER: "inner message offset {d1} does not follow offset {d2}",
    k.E_LEGACY_WRAPPER_OFFSET: "wrapper offset {d1} is below its last inner offset {d2}",
    k.E_LEGACY_EMPTY_WRAPPER: "compressed legacy wrapper holds no inner messages",
    k.E_VARINT_TRUNCATED: "varint of record {d1} runs past the record or the batch's declared size",
    k.E_VARINT_LONG: "varint of record {d1} is too long or does not fit its width",
    k.E_RECORD_LENGTH: "record {d1} has negative length {d2}",
    k.E_RECORD_PAST_REGION: "record {d1} of {d2} bytes runs past the batch's declared size ({d3} bytes left)",
    k.E_RECORD_TOO_SHORT: "record {d1} of {d2} bytes is too short for its attributes",
    k.E_KEY_LENGTH: "record {d1} has key length {d2}, invalid or past the record ({d3} bytes left)",
    k.E_VALUE_LENGTH: "record {d1} has value length {d2}, invalid or past the record ({d3} bytes left)",
    k.E_HEADER_COUNT: "record {d1} has invalid header count {d2} ({d3} bytes left)",
    k.E_HEADER_KEY_LENGTH: "record {d1} has invalid header key length {d2} ({d3} bytes left)",
    k.E_HEADER_VALUE_LENGTH: "record {d1} has invalid header value length {d2} ({d3} bytes left)",
    k.E_RECORD_SIZE: "record {d1} declared {d2} bytes but its fields use {d3}",
    k.E_OFFSET_DELTA: "record offset delta {d1} does not follow {d2} or is past the last offset delta {d3}",
    k.E_REGION_TRAILING: "incorrect declared batch size: {d1} bytes left after {d2} records",
}
_UNSUPPORTED = {k.E_MAGIC, k.E_CODEC, k.E_LEGACY_CODEC}


def _arena_region(hdr: np.ndarray, batch: int, compressed_pos: np.ndarray | None) -> tuple[int, int] | None:
    if compressed_pos is None or not hdr[batch, k.COL_IN_ARENA]:
        return None
    return int(compressed_pos[batch]), int(hdr[batch, k.COL_RECORDS_POS])


def _kernel_error(info: np.ndarray, base_position: int, arena_region: tuple[int, int] | None) -> CorruptRecordError:
    code = int(info[k.INFO_CODE])
    pos = int(info[k.INFO_POSITION])
    d1, d2, d3 = (int(x) for x in info[k.INFO_DETAIL : k.INFO_DETAIL + 3])
    info[: k.INFO_DETAIL + 3] = 0
    reason = _MESSAGES[code].format(d1=d1, d2=d2, d3=d3)
    if arena_region is not None:
        # The kernel's position indexes the arena: report the batch's compressed region instead, and say
        # where inside the decompressed data the problem is.
        region_pos, arena_pos = arena_region
        reason = f"{reason} (at byte {pos - arena_pos} of the batch's decompressed records)"
        pos = region_pos
    cls = UnsupportedFormatError if code in _UNSUPPORTED else CorruptRecordError
    return cls(reason, position=base_position + pos)
