"""Compiled kernels of the bulk scan (`segments.codec.scan`); private, called only from there.

Every kernel is `compiled.njit(cache=True, nogil=True, **compiled.BARE)` (it allocates nothing, so it runs
without reference counting: docs/design.md, "Compiled kernels ahead of time") over uint8 arrays, reads
big-endian fields by hand and never raises: a kernel that meets invalid bytes writes an error record into its
`info` array (`info[INFO_CODE]`, the byte index, the batch index and up to three details) and returns how many
batches it completed before the bad one. `segments.codec.scan` turns that record into a typed exception. Buffers
passed in are read-only views, so every kernel is compiled for exactly one array type and the on-disk cache is hit
by every later process.

Byte layouts come from `segments.codec.format`: every header field is read at its `fmt.*_OFFSET` (plain ints,
which numba freezes as compile-time constants), with the reader of its `fmt.*_BYTES` width; the module asserts
those widths at import, and tests/segments/test_header_layout.py checks `parse_headers` against `fmt.BATCH_V2`.
The header *writer* of compiled code is `segments.codec._header_kernels.write_v2_header`.
"""

from __future__ import annotations

import numpy as np

from . import compiled
from . import format as fmt
from ._intrinsics import prefetch

# ---- layout constants: `fmt.*` ints are used as they are; these are the ones numba cannot look up there -------
_LEGACY_SIZE_MIN_V0 = fmt.LEGACY_MESSAGE_SIZE_MIN[fmt.MAGIC_V0]  # a dict: not a compile-time constant
_LEGACY_SIZE_MIN_V1 = fmt.LEGACY_MESSAGE_SIZE_MIN[fmt.MAGIC_V1]
_CODEC_MAX_V2 = fmt.COMPRESSION_ZSTD
_CODEC_MAX_LEGACY = fmt.LEGACY_COMPRESSION_MAX
# Each field is read by the primitive of its width (`_u8`, `_i16`, `_u32` / `_i32`, `_i64` below): if format.py
# ever changed a width, the reads would be wrong, so say so at import.
assert (fmt.BASE_OFFSET_BYTES, fmt.LENGTH_BYTES, fmt.PARTITION_LEADER_EPOCH_BYTES, fmt.MAGIC_BYTES) == (8, 4, 4, 1)
assert (fmt.CRC_BYTES, fmt.ATTRIBUTES_BYTES, fmt.LAST_OFFSET_DELTA_BYTES, fmt.BASE_TIMESTAMP_BYTES) == (4, 2, 4, 8)
assert (fmt.MAX_TIMESTAMP_BYTES, fmt.PRODUCER_ID_BYTES, fmt.PRODUCER_EPOCH_BYTES) == (8, 8, 2)
assert (fmt.BASE_SEQUENCE_BYTES, fmt.RECORDS_COUNT_BYTES) == (4, 4)
assert (fmt.LEGACY_CRC_BYTES, fmt.LEGACY_ATTRIBUTES_BYTES, fmt.LEGACY_TIMESTAMP_BYTES) == (4, 1, 8)
assert fmt.LEGACY_LENGTH_BYTES == 4
# The smallest v2 record: length, attributes, timestampDelta, offsetDelta, keyLength, valueLength and
# headersCount, one byte each. It bounds recordsCount by the bytes present before anything is allocated.
RECORD_BYTES_MIN = 7

# ---- batch matrix columns (int64) ----------------------------------------------------------------------------
COL_POSITION = 0  # index of the batch's first byte in the buffer
COL_SIZE = 1  # bytes including the 12-byte log overhead
COL_MAGIC = 2
COL_ATTRIBUTES = 3
COL_LEADER_EPOCH = 4
COL_CRC = 5
COL_BASE_OFFSET = 6
COL_LAST_OFFSET = 7
COL_BASE_TIMESTAMP = 8
COL_MAX_TIMESTAMP = 9
COL_PRODUCER_ID = 10
COL_PRODUCER_EPOCH = 11
COL_BASE_SEQUENCE = 12
COL_RECORDS_COUNT = 13  # -1 for a legacy wrapper until its inner messages are counted
COL_RECORDS_POS = 14  # where the records (or legacy messages) start: buffer index, or arena index once moved
COL_RECORDS_BYTES = 15
COL_IN_ARENA = 16  # 1 when COL_RECORDS_POS indexes the arena
COL_LEGACY_LAST_INNER = 17  # a legacy wrapper's last inner offset as stored (relative for v1)
BATCH_COLUMNS = 18

# ---- status / error codes --------------------------------------------------------------------------------------
INFO_CODE = 0
INFO_POSITION = 1  # byte index in the buffer, or in the arena for errors inside decompressed data
INFO_BATCH = 2
INFO_DETAIL = 3  # three detail slots: 3, 4, 5
INFO_STOP = 6  # count_batches: index where complete batches end
INFO_TORN = 7  # count_batches: 1 when an incomplete batch follows
INFO_TORN_BYTES = 8  # count_batches: the declared size of that batch, or -1 when unknown
INFO_SIZE = 9

OK = 0
E_LENGTH_MIN = 1
E_MAGIC = 2
E_V2_LENGTH_MIN = 3
E_CODEC = 4
E_LAST_OFFSET_DELTA = 5
E_COUNT_NEGATIVE = 6
E_COUNT_SLOTS = 7
E_COUNT_BYTES = 8
E_LEGACY_SIZE_MIN = 9
E_LEGACY_CODEC = 10
E_LEGACY_KEY_LENGTH = 11
E_LEGACY_VALUE_LENGTH = 12
E_LEGACY_TRAILING = 13
E_LEGACY_NULL_WRAPPER = 14
E_LEGACY_INNER_TRUNCATED = 15
E_LEGACY_INNER_MAGIC = 16
E_LEGACY_INNER_COMPRESSED = 17
E_LEGACY_INNER_ORDER = 18
E_LEGACY_WRAPPER_OFFSET = 19
E_LEGACY_EMPTY_WRAPPER = 20
E_VARINT_TRUNCATED = 21
E_VARINT_LONG = 22
E_RECORD_LENGTH = 23
E_RECORD_PAST_REGION = 24
E_RECORD_TOO_SHORT = 25
E_KEY_LENGTH = 26
E_VALUE_LENGTH = 27
E_HEADER_COUNT = 28
E_HEADER_KEY_LENGTH = 29
E_HEADER_VALUE_LENGTH = 30
E_RECORD_SIZE = 31
E_OFFSET_DELTA = 32
E_REGION_TRAILING = 33
E_LEGACY_INNER_SIZE_MIN = 34

_jit = compiled.njit(cache=True, nogil=True, **compiled.BARE)  # these kernels allocate nothing
_inline = compiled.njit(cache=True, nogil=True, inline="always")


# ---- primitives -------------------------------------------------------------------------------------------------


@_inline
def _u8(d, p):
    return np.int64(d[np.uint64(p)])


@_inline
def _i16(d, p):
    v = (np.int64(d[np.uint64(p)]) << 8) | np.int64(d[np.uint64(p + 1)])
    return v - ((v & 0x8000) << 1)


@_inline
def _u32(d, p):
    return (np.int64(d[np.uint64(p)]) << 24) | (np.int64(d[np.uint64(p + 1)]) << 16) | (np.int64(d[np.uint64(p + 2)]) << 8) | np.int64(d[np.uint64(p + 3)])


@_inline
def _i32(d, p):
    v = _u32(d, p)
    return v - ((v & 0x80000000) << 1)


@_inline
def _i64(d, p):
    return (_i32(d, p) << 32) | _u32(d, p + 4)


@_inline
def _varint(d, p, end):
    """Zigzag varint (at most 5 bytes, 32-bit value) at p: (value, next p); next p is -1 when the bytes
    run past `end` and -2 when the varint is too long or does not fit 32 bits."""
    if p + 1 < end:  # one or two bytes: lengths below 8192 and the usual deltas
        b0 = np.int64(d[np.uint64(p)])
        if b0 < 0x80:
            return (b0 >> 1) ^ -(b0 & 1), p + 1
        b1 = np.int64(d[np.uint64(p + 1)])
        if b1 < 0x80:
            z = (b0 & 0x7F) | (b1 << 7)
            return (z >> 1) ^ -(z & 1), p + 2
    return _varint_slow(d, p, end)


@_jit
def _varint_slow(d, p, end):
    z = np.int64(0)
    shift = 0
    for i in range(fmt.VARINT_BYTES_MAX):
        if p + i >= end:
            return np.int64(0), np.int64(-1)
        b = np.int64(d[np.uint64(p + i)])
        z |= (b & 0x7F) << shift
        if b < 0x80:
            if z >> 32:
                return np.int64(0), np.int64(-2)
            return (z >> 1) ^ -(z & 1), p + i + 1
        shift += 7
    return np.int64(0), np.int64(-2)


@_inline
def _varlong(d, p, end):
    """Zigzag varlong (at most 10 bytes, 64-bit value); the same contract as `_varint`."""
    if p + 1 < end:
        b0 = np.int64(d[np.uint64(p)])
        if b0 < 0x80:
            return (b0 >> 1) ^ -(b0 & 1), p + 1
        b1 = np.int64(d[np.uint64(p + 1)])
        if b1 < 0x80:
            z = (b0 & 0x7F) | (b1 << 7)
            return (z >> 1) ^ -(z & 1), p + 2
    return _varlong_slow(d, p, end)


@_jit
def _varlong_slow(d, p, end):
    z = np.int64(0)
    shift = 0
    for i in range(fmt.VARLONG_BYTES_MAX):
        if p + i >= end:
            return np.int64(0), np.int64(-1)
        b = np.int64(d[np.uint64(p + i)])
        if i == fmt.VARLONG_BYTES_MAX - 1 and (b & 0x7F) > 1:  # bits past 64
            return np.int64(0), np.int64(-2)
        z |= (b & 0x7F) << shift
        if b < 0x80:
            # logical shift right by one, then undo the zigzag
            return ((z >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(z & 1), p + i + 1
        shift += 7
    return np.int64(0), np.int64(-2)


@compiled.njit("void(int64[::1], int64, int64, int64, int64, int64, int64)", cache=True, nogil=True, **compiled.BARE)
def _fail(info, code, position, batch, d1, d2, d3):
    info[INFO_CODE] = code
    info[INFO_POSITION] = position
    info[INFO_BATCH] = batch
    info[INFO_DETAIL] = d1
    info[INFO_DETAIL + 1] = d2
    info[INFO_DETAIL + 2] = d3


@_jit
def _parse_legacy(d, p, end):
    """Check the legacy entry at p (offset, size, message) that must end by `end`.

    Returns (code, error index, size incl. overhead, magic, attributes, timestamp, key index, key length,
    value index, value length, detail); code is OK or an E_LEGACY_* code.
    """
    size = _i32(d, p + fmt.LENGTH_OFFSET) + fmt.LOG_OVERHEAD
    magic = _u8(d, p + fmt.MAGIC_OFFSET)
    attributes = _u8(d, p + fmt.LEGACY_ATTRIBUTES_OFFSET)
    size_min = (_LEGACY_SIZE_MIN_V1 if magic == fmt.MAGIC_V1 else _LEGACY_SIZE_MIN_V0) + fmt.LOG_OVERHEAD
    z = np.int64(0)
    if size < size_min:
        return E_LEGACY_SIZE_MIN, p + fmt.LENGTH_OFFSET, size, magic, attributes, z, z, z, z, z, size_min
    if attributes & fmt.COMPRESSION_MASK > _CODEC_MAX_LEGACY:
        return E_LEGACY_CODEC, p + fmt.LEGACY_ATTRIBUTES_OFFSET, size, magic, attributes, z, z, z, z, z, z
    q = p + fmt.LEGACY_KEY_LENGTH_OFFSET_V0
    timestamp = np.int64(-1)
    if magic == fmt.MAGIC_V1:
        timestamp = _i64(d, p + fmt.LEGACY_TIMESTAMP_OFFSET)
        q = p + fmt.LEGACY_KEY_LENGTH_OFFSET_V1
    message_end = p + size
    key_length = _i32(d, q)
    if key_length < -1 or q + fmt.LEGACY_LENGTH_BYTES + max(key_length, 0) + fmt.LEGACY_LENGTH_BYTES > message_end:
        return E_LEGACY_KEY_LENGTH, q, size, magic, attributes, timestamp, z, key_length, z, z, z
    key_pos = q + fmt.LEGACY_LENGTH_BYTES
    q = key_pos + max(key_length, 0)
    value_length = _i32(d, q)
    if value_length < -1 or q + fmt.LEGACY_LENGTH_BYTES + max(value_length, 0) > message_end:
        return E_LEGACY_VALUE_LENGTH, q, size, magic, attributes, timestamp, key_pos, key_length, z, value_length, z
    value_pos = q + fmt.LEGACY_LENGTH_BYTES
    q = value_pos + max(value_length, 0)
    if q != message_end:
        return (E_LEGACY_TRAILING, q, size, magic, attributes, timestamp, key_pos, key_length, value_pos,
                value_length, message_end - q)
    return OK, p, size, magic, attributes, timestamp, key_pos, key_length, value_pos, value_length, z


# ---- pass 1: find the batches -------------------------------------------------------------------------------


@_jit
def count_batches(buf, start, end, info):
    """Walk the 12-byte prefixes from `start`; return how many whole batches lie in [start, end).

    Stops at `end` exactly, at a torn tail (≤ 17 bytes left, or a declared size past `end`: INFO_TORN = 1,
    INFO_TORN_BYTES = the declared size when the length field is present) or at a declared length < 14
    (an error). INFO_STOP = where the counted batches end.
    """
    p = start
    n = 0
    info[INFO_TORN] = 0
    info[INFO_TORN_BYTES] = -1
    while True:
        left = end - p
        if left <= fmt.HEADER_SIZE_UP_TO_MAGIC:
            if left > 0:
                info[INFO_TORN] = 1
                if left >= fmt.LOG_OVERHEAD:
                    length = _i32(buf, p + fmt.LENGTH_OFFSET)
                    if length >= _LEGACY_SIZE_MIN_V0:
                        info[INFO_TORN_BYTES] = length + fmt.LOG_OVERHEAD
            break
        length = _i32(buf, p + fmt.LENGTH_OFFSET)
        if length < _LEGACY_SIZE_MIN_V0:
            _fail(info, E_LENGTH_MIN, p + fmt.LENGTH_OFFSET, n, length, _LEGACY_SIZE_MIN_V0, 0)
            break
        size = length + fmt.LOG_OVERHEAD
        if size > left:
            info[INFO_TORN] = 1
            info[INFO_TORN_BYTES] = size
            break
        n += 1
        p += size
    info[INFO_STOP] = p
    return n


# ---- pass 2: batch headers --------------------------------------------------------------------------------


@_jit
def parse_headers(buf, start, n, hdr, info):
    """Fill `hdr[i]` (BATCH_COLUMNS int64 columns) for the `n` batches counted from `start`.

    Checks only what must hold before a CRC can be checked, as Kafka's reader does: magic 0..2, a v2 length
    ≥ 49, a legacy message size ≥ its magic's minimum. Everything the CRC covers is checked afterwards by
    `check_headers`, so a flipped byte there is reported as a CRC mismatch. Returns the number of good
    batches (n, or the index of the bad one with `info` filled).
    """
    p = start
    for i in range(n):
        length = _i32(buf, p + fmt.LENGTH_OFFSET)
        size = length + fmt.LOG_OVERHEAD
        magic = _u8(buf, p + fmt.MAGIC_OFFSET)
        row = hdr[i]
        row[COL_POSITION] = p
        row[COL_SIZE] = size
        row[COL_MAGIC] = magic
        row[COL_IN_ARENA] = 0
        row[COL_LEGACY_LAST_INNER] = -1
        if magic == fmt.MAGIC_V2:
            if length < fmt.BATCH_LENGTH_MIN_V2:
                _fail(info, E_V2_LENGTH_MIN, p + fmt.LENGTH_OFFSET, i, length, fmt.BATCH_LENGTH_MIN_V2, 0)
                return i
            base_offset = _i64(buf, p + fmt.BASE_OFFSET_OFFSET)
            row[COL_ATTRIBUTES] = _i16(buf, p + fmt.ATTRIBUTES_OFFSET)
            row[COL_LEADER_EPOCH] = _i32(buf, p + fmt.PARTITION_LEADER_EPOCH_OFFSET)
            row[COL_CRC] = _u32(buf, p + fmt.CRC_OFFSET)
            row[COL_BASE_OFFSET] = base_offset
            row[COL_LAST_OFFSET] = base_offset + _i32(buf, p + fmt.LAST_OFFSET_DELTA_OFFSET)
            row[COL_BASE_TIMESTAMP] = _i64(buf, p + fmt.BASE_TIMESTAMP_OFFSET)
            row[COL_MAX_TIMESTAMP] = _i64(buf, p + fmt.MAX_TIMESTAMP_OFFSET)
            row[COL_PRODUCER_ID] = _i64(buf, p + fmt.PRODUCER_ID_OFFSET)
            row[COL_PRODUCER_EPOCH] = _i16(buf, p + fmt.PRODUCER_EPOCH_OFFSET)
            row[COL_BASE_SEQUENCE] = _i32(buf, p + fmt.BASE_SEQUENCE_OFFSET)
            row[COL_RECORDS_COUNT] = _i32(buf, p + fmt.RECORDS_COUNT_OFFSET)
            row[COL_RECORDS_POS] = p + fmt.RECORD_BATCH_OVERHEAD
            row[COL_RECORDS_BYTES] = size - fmt.RECORD_BATCH_OVERHEAD
        elif magic == fmt.MAGIC_V0 or magic == fmt.MAGIC_V1:
            size_min = (_LEGACY_SIZE_MIN_V1 if magic == fmt.MAGIC_V1 else _LEGACY_SIZE_MIN_V0) + fmt.LOG_OVERHEAD
            if size < size_min:
                _fail(info, E_LEGACY_SIZE_MIN, p + fmt.LENGTH_OFFSET, i, size, size_min, 0)
                return i
            offset = _i64(buf, p + fmt.BASE_OFFSET_OFFSET)
            row[COL_ATTRIBUTES] = _u8(buf, p + fmt.LEGACY_ATTRIBUTES_OFFSET)
            row[COL_LEADER_EPOCH] = -1
            row[COL_CRC] = _u32(buf, p + fmt.LEGACY_CRC_OFFSET)
            row[COL_BASE_OFFSET] = offset
            row[COL_LAST_OFFSET] = offset
            row[COL_BASE_TIMESTAMP] = -1
            row[COL_MAX_TIMESTAMP] = _i64(buf, p + fmt.LEGACY_TIMESTAMP_OFFSET) if magic == fmt.MAGIC_V1 else -1
            row[COL_PRODUCER_ID] = -1
            row[COL_PRODUCER_EPOCH] = -1
            row[COL_BASE_SEQUENCE] = -1
            row[COL_RECORDS_COUNT] = 1
            row[COL_RECORDS_POS] = p
            row[COL_RECORDS_BYTES] = size
        else:
            _fail(info, E_MAGIC, p + fmt.MAGIC_OFFSET, i, magic, 0, 0)
            return i
        p += size
    return n


@_jit
def check_headers(buf, n, hdr, info):
    """Check the CRC-covered header fields of batches [0, n) and locate legacy wrappers' compressed values.

    v2: codec ≤ 4, lastOffsetDelta ≥ 0, 0 ≤ recordsCount ≤ lastOffsetDelta + 1 and, uncompressed,
    recordsCount ≤ bytes / 7 (so the record arrays can be sized from it). Legacy: codec ≤ 3, key and value
    lengths that end the message exactly, a non-null wrapper value; a wrapper gets COL_RECORDS_COUNT = -1
    (unknown until decompressed) and COL_RECORDS_POS/BYTES = its compressed value. Returns the number of
    good batches.
    """
    for i in range(n):
        row = hdr[i]
        p = row[COL_POSITION]
        attributes = row[COL_ATTRIBUTES]
        codec = attributes & fmt.COMPRESSION_MASK
        if row[COL_MAGIC] == fmt.MAGIC_V2:
            if codec > _CODEC_MAX_V2:
                _fail(info, E_CODEC, p + fmt.ATTRIBUTES_OFFSET, i, codec, attributes, 0)
                return i
            last_offset_delta = row[COL_LAST_OFFSET] - row[COL_BASE_OFFSET]
            if last_offset_delta < 0:
                _fail(info, E_LAST_OFFSET_DELTA, p + fmt.LAST_OFFSET_DELTA_OFFSET, i, last_offset_delta, 0, 0)
                return i
            count = row[COL_RECORDS_COUNT]
            if count < 0:
                _fail(info, E_COUNT_NEGATIVE, p + fmt.RECORDS_COUNT_OFFSET, i, count, 0, 0)
                return i
            if count > last_offset_delta + 1:
                _fail(info, E_COUNT_SLOTS, p + fmt.RECORDS_COUNT_OFFSET, i, count, last_offset_delta, 0)
                return i
            if codec == 0 and count * RECORD_BYTES_MIN > row[COL_RECORDS_BYTES]:
                _fail(info, E_COUNT_BYTES, p + fmt.RECORDS_COUNT_OFFSET, i, count, row[COL_RECORDS_BYTES], 0)
                return i
        else:
            size = row[COL_SIZE]
            code, where, _, _, _, _, _, _, value_pos, value_length, detail = _parse_legacy(buf, p, p + size)
            if code != OK:
                _fail(info, code, where, i, size, detail, attributes)
                return i
            if codec:
                if value_length < 0:
                    _fail(info, E_LEGACY_NULL_WRAPPER, value_pos - fmt.LEGACY_LENGTH_BYTES, i, 0, 0, 0)
                    return i
                row[COL_RECORDS_COUNT] = -1
                row[COL_RECORDS_POS] = value_pos
                row[COL_RECORDS_BYTES] = value_length
    return n


# ---- pass 3 (legacy wrappers only): count inner messages ----------------------------------------------------


@_jit
def count_legacy_inner(arena, hdr, wrappers, info):
    """For each batch index in `wrappers` (legacy wrappers whose inner message set now sits in the arena),
    count the inner entries and note the last one's stored offset. Entries must tile the set exactly.
    Returns how many wrappers were counted (a shorter count means `info` holds an error)."""
    for w in range(wrappers.shape[0]):
        i = wrappers[w]
        row = hdr[i]
        p = row[COL_RECORDS_POS]
        end = p + row[COL_RECORDS_BYTES]
        count = 0
        last = np.int64(-1)
        while p < end:
            if end - p < fmt.LOG_OVERHEAD:
                _fail(info, E_LEGACY_INNER_TRUNCATED, p, i, end - p, fmt.LOG_OVERHEAD, 0)
                return w
            size = _i32(arena, p + fmt.LENGTH_OFFSET) + fmt.LOG_OVERHEAD
            if size < _LEGACY_SIZE_MIN_V0 + fmt.LOG_OVERHEAD:
                _fail(info, E_LEGACY_INNER_SIZE_MIN, p + fmt.LENGTH_OFFSET, i, size,
                      _LEGACY_SIZE_MIN_V0 + fmt.LOG_OVERHEAD, 0)
                return w
            if size > end - p:
                _fail(info, E_LEGACY_INNER_TRUNCATED, p, i, end - p, size, 0)
                return w
            last = _i64(arena, p + fmt.BASE_OFFSET_OFFSET)
            count += 1
            p += size
        if count == 0:
            _fail(info, E_LEGACY_EMPTY_WRAPPER, row[COL_RECORDS_POS], i, 0, 0, 0)
            return w
        row[COL_RECORDS_COUNT] = count
        row[COL_LEGACY_LAST_INNER] = last
    return wrappers.shape[0]


# ---- pass 4: records ------------------------------------------------------------------------------------------

# The record walk reads each record's length, its key's length and its fields after the value: a load or two a
# record that misses the cache in a window no earlier pass touched (the recopy's scan checks no CRC). Prefetching
# the bytes this far ahead of the record being read keeps those loads in flight: the recopy's scan of W1 (~1 KiB
# records) took 37% less time, W2's (~100 bytes) 17% less; 4 KiB ahead was no better (bench/RESULTS.md, twentieth
# round).
RECORD_PREFETCH_BYTES = 2048


@_jit
def _walk_v2(d, i, row, r, info, offset, timestamp, key_pos, key_len, value_len, record_pos, record_size,
             batch_index):
    """Records of v2 batch i (data `d`), written from record index r. Returns True when all were good."""
    p = row[COL_RECORDS_POS]
    end = p + row[COL_RECORDS_BYTES]
    count = row[COL_RECORDS_COUNT]
    base_offset = row[COL_BASE_OFFSET]
    last_offset_delta = row[COL_LAST_OFFSET] - base_offset
    log_append_time = (row[COL_ATTRIBUTES] & fmt.TIMESTAMP_TYPE_MASK) != 0
    base_timestamp = row[COL_BASE_TIMESTAMP]
    max_timestamp = row[COL_MAX_TIMESTAMP]
    previous_delta = np.int64(-1)
    for k in range(count):
        # `p` (the next record's start) depends only on each record's length varint, not on its fields, so
        # the CPU can start on the next record while this one's fields are still being decoded.
        start = p
        prefetch(d, min(p + RECORD_PREFETCH_BYTES, d.size - 1))
        length, c = _varint(d, p, end)
        if c < 0:
            _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, start, i, k, 0, 0)
            return False
        if length < 0:
            _fail(info, E_RECORD_LENGTH, start, i, k, length, 0)
            return False
        record_end = c + length
        if record_end > end:
            _fail(info, E_RECORD_PAST_REGION, start, i, k, length, end - c)
            return False
        if c >= record_end:
            _fail(info, E_RECORD_TOO_SHORT, start, i, k, length, 0)
            return False
        p = record_end
        c += 1  # attributes: unused
        q = c
        timestamp_delta, c = _varlong(d, c, record_end)
        if c < 0:
            _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
            return False
        q = c
        offset_delta, c = _varint(d, c, record_end)
        if c < 0:
            _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
            return False
        q = c
        klen, c = _varint(d, c, record_end)
        if c < 0:
            _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
            return False
        kpos = c
        if klen < -1 or c + klen > record_end:
            _fail(info, E_KEY_LENGTH, q, i, k, klen, record_end - c)
            return False
        if klen > 0:
            c += klen
        q = c
        vlen, c = _varint(d, c, record_end)
        if c < 0:
            _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
            return False
        if vlen < -1 or c + vlen > record_end:
            _fail(info, E_VALUE_LENGTH, q, i, k, vlen, record_end - c)
            return False
        if vlen > 0:
            c += vlen
        q = c
        header_count, c = _varint(d, c, record_end)
        if c < 0:
            _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
            return False
        if header_count < 0 or header_count > record_end - c:
            _fail(info, E_HEADER_COUNT, q, i, k, header_count, record_end - c)
            return False
        for _h in range(header_count):
            q = c
            hklen, c = _varint(d, c, record_end)
            if c < 0:
                _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
                return False
            if hklen < 0 or c + hklen > record_end:
                _fail(info, E_HEADER_KEY_LENGTH, q, i, k, hklen, record_end - c)
                return False
            c += hklen
            q = c
            hvlen, c = _varint(d, c, record_end)
            if c < 0:
                _fail(info, E_VARINT_TRUNCATED if c == -1 else E_VARINT_LONG, q, i, k, 0, 0)
                return False
            if hvlen < -1 or c + hvlen > record_end:
                _fail(info, E_HEADER_VALUE_LENGTH, q, i, k, hvlen, record_end - c)
                return False
            if hvlen > 0:
                c += hvlen
        if c != record_end:
            _fail(info, E_RECORD_SIZE, start, i, k, length, c - (record_end - length))
            return False
        if offset_delta <= previous_delta or offset_delta > last_offset_delta:
            _fail(info, E_OFFSET_DELTA, start, i, offset_delta, previous_delta, last_offset_delta)
            return False
        previous_delta = offset_delta
        offset[r] = base_offset + offset_delta
        timestamp[r] = max_timestamp if log_append_time else base_timestamp + timestamp_delta
        key_pos[r] = kpos
        key_len[r] = klen
        value_len[r] = vlen
        record_pos[r] = start
        record_size[r] = record_end - start
        batch_index[r] = i
        r += 1
    if p != end:
        _fail(info, E_REGION_TRAILING, p, i, end - p, count, 0)
        return False
    return True


@_jit
def _walk_legacy(d, i, row, r, info, offset, timestamp, key_pos, key_len, value_len, record_pos, record_size,
                 batch_index):
    """Messages of legacy batch i: the entry itself (uncompressed) or its inner set (a wrapper, in `d`)."""
    p = row[COL_RECORDS_POS]
    end = p + row[COL_RECORDS_BYTES]
    count = row[COL_RECORDS_COUNT]
    outer_magic = row[COL_MAGIC]
    wrapper = (row[COL_ATTRIBUTES] & fmt.COMPRESSION_MASK) != 0
    outer_offset = row[COL_LAST_OFFSET]
    outer_timestamp = row[COL_MAX_TIMESTAMP]
    outer_log_append_time = outer_magic == fmt.MAGIC_V1 and (row[COL_ATTRIBUTES] & fmt.TIMESTAMP_TYPE_MASK) != 0
    # v1 inner offsets are relative: absolute = outer - lastInner + inner; an outer offset of 0 (old
    # librdkafka) means base 0. v0 inner offsets are absolute.
    relative_base = np.int64(-1)
    if wrapper and outer_magic == fmt.MAGIC_V1:
        last_inner = row[COL_LEGACY_LAST_INNER]
        if outer_offset == 0:
            relative_base = 0
        elif outer_offset < last_inner:
            _fail(info, E_LEGACY_WRAPPER_OFFSET, row[COL_POSITION], i, outer_offset, last_inner, 0)
            return False
        else:
            relative_base = outer_offset - last_inner
    previous = np.int64(-1)
    for k in range(count):
        code, where, size, magic, attributes, ts, kpos, klen, _vpos, vlen, detail = _parse_legacy(d, p, end)
        if code != OK:
            _fail(info, code, where, i, size, detail, attributes)
            return False
        if wrapper:
            if magic != outer_magic:
                _fail(info, E_LEGACY_INNER_MAGIC, p + fmt.MAGIC_OFFSET, i, magic, outer_magic, 0)
                return False
            if attributes & fmt.COMPRESSION_MASK:
                _fail(info, E_LEGACY_INNER_COMPRESSED, p + fmt.LEGACY_ATTRIBUTES_OFFSET, i, attributes, 0, 0)
                return False
        stored = _i64(d, p + fmt.BASE_OFFSET_OFFSET)
        absolute = relative_base + stored if relative_base >= 0 else stored
        if k > 0 and absolute <= previous:
            _fail(info, E_LEGACY_INNER_ORDER, p, i, absolute, previous, 0)
            return False
        previous = absolute
        if k == 0:
            row[COL_BASE_OFFSET] = absolute
        offset[r] = absolute
        timestamp[r] = outer_timestamp if outer_log_append_time else ts
        key_pos[r] = kpos
        key_len[r] = klen
        value_len[r] = vlen
        record_pos[r] = p
        record_size[r] = size
        batch_index[r] = i
        r += 1
        p += size
    return True


@_jit
def walk_records(buf, arena, hdr, n, record_start, info, offset, timestamp, key_pos, key_len, value_len,
                 record_pos, record_size, batch_index):
    """Decode and check every record of batches [0, n) into the per-record arrays.

    Batch i's records go to [record_start[i], record_start[i+1]); its data is `arena` when
    hdr[i, COL_IN_ARENA] else `buf`. Returns the number of batches completed (n unless `info` has an error).
    """
    for i in range(n):
        row = hdr[i]
        d = arena if row[COL_IN_ARENA] else buf
        r = record_start[i]
        if row[COL_MAGIC] == fmt.MAGIC_V2:
            ok = _walk_v2(d, i, row, r, info, offset, timestamp, key_pos, key_len, value_len, record_pos,
                          record_size, batch_index)
        else:
            ok = _walk_legacy(d, i, row, r, info, offset, timestamp, key_pos, key_len, value_len, record_pos,
                              record_size, batch_index)
        if not ok:
            return i
    return n


# ---- the common path of a window in few calls (`scan.scan`) ------------------------------------------------------

# window_ranges / finish_window results
W_DONE = 0  # the batch columns are filled (and every record walked, unless headers only)
W_ARENA = 1  # compressed batches or legacy wrappers: the caller decompresses them (the stepwise path)
W_RECORDS = 2  # the record arrays given are too short: the caller walks into larger ones, then fills columns
W_STEPWISE = 3  # an invalid batch or a CRC mismatch: the caller scans the window again stepwise, for its error

# finish_window's `scalars`
WS_LIMIT = 0  # batches the result keeps (a records_max limit may end it early)
WS_RECORDS = 1  # records in them
WS_LIMIT_REACHED = 2  # 1 when records_max ended the scan early
WS_LEGACY = 3  # 1 when a legacy entry's CRC-32 is left to the caller (with verify)
WS_COMPRESSED = 4  # W_ARENA: how many batches are compressed (their indexes in `rows`)
WS_LZ4_V2 = 5  # W_ARENA: 1 when every one of them is an lz4 v2 batch
WS_COMPRESSED_BYTES = 6  # W_ARENA: their records regions' bytes
W_SCALARS = 7

# fill_columns' blocks: the rows of the int64, int32, int16 and flag blocks
C64_POSITION = 0  # file position: COL_POSITION + base_position
C64_SIZE = 1
C64_BASE_OFFSET = 2
C64_LAST_OFFSET = 3
C64_BASE_TIMESTAMP = 4
C64_MAX_TIMESTAMP = 5
C64_DELETE_HORIZON = 6
C64_PRODUCER_ID = 7
C64_RECORDS_POS = 8
C64_RECORDS_BYTES = 9
C64_ROWS = 10
C32_LEADER_EPOCH = 0
C32_BASE_SEQUENCE = 1
C32_RECORDS_COUNT = 2
C32_ROWS = 3
C16_ATTRIBUTES = 0
C16_PRODUCER_EPOCH = 1
C16_ROWS = 2
F_CONTROL = 0
F_TRANSACTIONAL = 1
F_DELETE_HORIZON = 2
F_LEGACY = 3
F_ROWS = 4


@_jit
def window_ranges(buf, start, n, hdr, ranges, info):
    """`parse_headers`, then the range each batch's stored CRC covers: ranges[0, i] to ranges[1, i] (a v2
    batch's CRC-32C from its attributes to its end; an empty range for a legacy entry, whose CRC-32 the caller
    checks). Returns the number of good batches, as `parse_headers`."""
    good = parse_headers(buf, start, n, hdr, info)
    for i in range(good):
        p = hdr[i, COL_POSITION]
        if hdr[i, COL_MAGIC] == fmt.MAGIC_V2:
            ranges[0, i] = p + fmt.ATTRIBUTES_OFFSET
            ranges[1, i] = p + hdr[i, COL_SIZE]
        else:
            ranges[0, i] = p
            ranges[1, i] = p
    return good


@_jit
def fill_columns(hdr, n, base_position, headers_only, i64, i32, i16, magic, crc, in_arena, compression, flags):
    """The batch columns of `ScanResult` from the first `n` rows of `hdr`: the int64 ones in the rows of `i64`
    (C64_*), the int32 ones in `i32` (C32_*), the int16 ones in `i16` (C16_*), magic (int8), the stored CRC
    (uint32), whether the records were decompressed (bool), the codec (int8) and the flags of `flags` (F_*:
    control, transactional, a delete horizon, all three v2 only; legacy). The delete horizon is the base
    timestamp of a v2 batch with the horizon flag, else -1; with `headers_only` a legacy wrapper's base offset
    is -1 (unknown)."""
    for i in range(n):
        row = hdr[i]
        m = row[COL_MAGIC]
        attributes = row[COL_ATTRIBUTES]
        v2 = m >= fmt.MAGIC_V2
        i64[C64_POSITION, i] = row[COL_POSITION] + base_position
        i64[C64_SIZE, i] = row[COL_SIZE]
        base_offset = row[COL_BASE_OFFSET]
        if headers_only and not v2 and (attributes & fmt.COMPRESSION_MASK) != 0:
            base_offset = -1
        i64[C64_BASE_OFFSET, i] = base_offset
        i64[C64_LAST_OFFSET, i] = row[COL_LAST_OFFSET]
        i64[C64_BASE_TIMESTAMP, i] = row[COL_BASE_TIMESTAMP]
        i64[C64_MAX_TIMESTAMP, i] = row[COL_MAX_TIMESTAMP]
        horizon = v2 and (attributes & fmt.DELETE_HORIZON_FLAG) != 0
        i64[C64_DELETE_HORIZON, i] = row[COL_BASE_TIMESTAMP] if horizon else fmt.NO_TIMESTAMP
        i64[C64_PRODUCER_ID, i] = row[COL_PRODUCER_ID]
        i64[C64_RECORDS_POS, i] = row[COL_RECORDS_POS]
        i64[C64_RECORDS_BYTES, i] = row[COL_RECORDS_BYTES]
        i32[C32_LEADER_EPOCH, i] = row[COL_LEADER_EPOCH]
        i32[C32_BASE_SEQUENCE, i] = row[COL_BASE_SEQUENCE]
        i32[C32_RECORDS_COUNT, i] = row[COL_RECORDS_COUNT]
        i16[C16_ATTRIBUTES, i] = attributes
        i16[C16_PRODUCER_EPOCH, i] = row[COL_PRODUCER_EPOCH]
        magic[i] = m
        crc[i] = row[COL_CRC]
        in_arena[i] = row[COL_IN_ARENA] != 0
        compression[i] = attributes & fmt.COMPRESSION_MASK
        flags[F_CONTROL, i] = v2 and (attributes & fmt.CONTROL_FLAG) != 0
        flags[F_TRANSACTIONAL, i] = v2 and (attributes & fmt.TRANSACTIONAL_FLAG) != 0
        flags[F_DELETE_HORIZON, i] = horizon
        flags[F_LEGACY, i] = not v2


@_jit
def finish_window(buf, arena, n, hdr, computed, verify, headers_only, records_max, base_position, info, rows,
                  record_start, offset, timestamp, key_pos, key_len, value_len, record_pos, record_size, batch_index,
                  i64, i32, i16, magic, crc, in_arena, compression, flags, scalars):
    """The rest of a window's scan after `window_ranges` and, with `verify`, the CRC-32C of its ranges in
    `computed`: the CRC comparison (v2 batches; legacy entries are left to the caller, WS_LEGACY), `check_headers`,
    then, unless some batch is compressed or a legacy wrapper (W_ARENA, their indexes in `rows`: the caller
    decompresses them), `finish_records`. Any invalid batch or CRC mismatch: W_STEPWISE, for the caller to scan
    stepwise and report it as it always has. `scalars` (WS_*) say what the result keeps."""
    scalars[WS_LIMIT] = n
    scalars[WS_RECORDS] = 0
    scalars[WS_LIMIT_REACHED] = 0
    scalars[WS_LEGACY] = 0
    scalars[WS_COMPRESSED] = 0
    for i in range(n):
        if hdr[i, COL_MAGIC] != fmt.MAGIC_V2:
            if verify:
                scalars[WS_LEGACY] = 1
        elif verify and computed[i] != hdr[i, COL_CRC]:
            return W_STEPWISE
    if check_headers(buf, n, hdr, info) < n:
        return W_STEPWISE
    if headers_only:
        fill_columns(hdr, n, base_position, headers_only, i64, i32, i16, magic, crc, in_arena, compression, flags)
        return W_DONE
    compressed = 0
    lz4_v2 = 1
    compressed_bytes = 0
    for i in range(n):
        codec = hdr[i, COL_ATTRIBUTES] & fmt.COMPRESSION_MASK
        if codec != fmt.COMPRESSION_NONE:
            rows[compressed] = i
            compressed += 1
            compressed_bytes += hdr[i, COL_RECORDS_BYTES]
            if hdr[i, COL_MAGIC] != fmt.MAGIC_V2 or codec != fmt.COMPRESSION_LZ4:
                lz4_v2 = 0
    if compressed:
        scalars[WS_COMPRESSED] = compressed
        scalars[WS_LZ4_V2] = lz4_v2
        scalars[WS_COMPRESSED_BYTES] = compressed_bytes
        return W_ARENA
    return finish_records(buf, arena, n, hdr, records_max, base_position, info, record_start, offset, timestamp,
                          key_pos, key_len, value_len, record_pos, record_size, batch_index, i64, i32, i16, magic,
                          crc, in_arena, compression, flags, scalars)


@_jit
def finish_records(buf, arena, n, hdr, records_max, base_position, info, record_start, offset, timestamp, key_pos,
                   key_len, value_len, record_pos, record_size, batch_index, i64, i32, i16, magic, crc, in_arena,
                   compression, flags, scalars):
    """The records of a window's batches [0, n) whose headers are checked and whose compressed records (if any)
    sit in `arena`: a decompressed v2 batch's count checked against its bytes, the record offsets
    `record_start`, the `records_max` limit, the records walked into the per-record arrays (when they are long
    enough: else W_RECORDS, with WS_LIMIT and WS_RECORDS set) and `fill_columns`. W_STEPWISE at anything
    invalid. No legacy wrapper may be among the batches (their inner messages are counted stepwise)."""
    scalars[WS_LIMIT_REACHED] = 0
    for i in range(n):
        if (hdr[i, COL_IN_ARENA] and hdr[i, COL_MAGIC] == fmt.MAGIC_V2
                and hdr[i, COL_RECORDS_COUNT] * RECORD_BYTES_MIN > hdr[i, COL_RECORDS_BYTES]):
            return W_STEPWISE
    record_start[0] = 0
    for i in range(n):
        record_start[i + 1] = record_start[i] + hdr[i, COL_RECORDS_COUNT]
    limit = n
    if record_start[n] > records_max and n > 1:
        # The first batch whose records would pass the bound ends the scan (keep at least one batch).
        limit = 0
        while limit < n and record_start[limit + 1] <= records_max:
            limit += 1
        limit = max(limit, 1)
        scalars[WS_LIMIT_REACHED] = 1
    scalars[WS_LIMIT] = limit
    scalars[WS_RECORDS] = record_start[limit]
    if record_start[limit] > offset.size:
        return W_RECORDS
    if walk_records(buf, arena, hdr, limit, record_start, info, offset, timestamp, key_pos, key_len, value_len,
                    record_pos, record_size, batch_index) < limit:
        return W_STEPWISE
    fill_columns(hdr, limit, base_position, False, i64, i32, i16, magic, crc, in_arena, compression, flags)
    return W_DONE
