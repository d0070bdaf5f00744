"""Kafka on-disk format: constants and byte layouts, nothing else.

This module owns every byte offset and field width of the formats in `docs/format.md`:
record batch v2 (section 1), legacy messages v0/v1 (section 2), index entries (section 3) and the
file-name grammar. Other modules use these names and never spell a byte offset themselves. It does
no I/O and holds no state.

The struct layouts are the model: each header field's offset (`*_OFFSET`) and width (`*_BYTES`) is read
off its layout once, at import, by `field_layout`, and kept as a plain int, so the compiled kernels
(`segments.codec._scan_kernels`, `segments.codec._header_kernels`), for which numba freezes module-level
ints as compile-time constants, use the same numbers as `struct`. The asserts below check that the layouts
that share a prefix agree on it.
"""

from __future__ import annotations

import re
import struct

import numpy as np


def field_layout(layout: struct.Struct) -> tuple[tuple[int, int], ...]:
    """(offset, width) in bytes of each field of a big-endian `struct` layout, in order (`4s` is one field)."""
    assert layout.format[0] == ">", layout.format  # big-endian: no padding, so fields lie end to end
    fields = []
    offset = 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", layout.format[1:]):
        width = struct.calcsize(f">{count}{code}")
        fields.append((offset, width))
        offset += width
    assert offset == layout.size, layout.format
    return tuple(fields)


# ---- conventions -----------------------------------------------------------------------------------
NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

# ---- the 17-byte prefix every batch of every magic shares ---------------------------------------------
PREFIX = struct.Struct(">qi")  # baseOffset, length (bytes after this field)
PREFIX_UP_TO_MAGIC = struct.Struct(
    ">q"  # 0  baseOffset (v2) / offset (v0, v1)
    "i"  # 8  length: bytes after this field
    "4s"  # 12 partitionLeaderEpoch (v2) / crc (v0, v1): meaning depends on the magic
    "b"  # 16 magic
)
LOG_OVERHEAD = PREFIX.size  # 12: baseOffset (8) + length (4); a batch's size is length + LOG_OVERHEAD
HEADER_SIZE_UP_TO_MAGIC = PREFIX_UP_TO_MAGIC.size  # 17: a reader needs 17 bytes to know the magic
(
    (BASE_OFFSET_OFFSET, BASE_OFFSET_BYTES),  # 0, 8: the int64 baseOffset (v2) / offset (v0, v1)
    (LENGTH_OFFSET, LENGTH_BYTES),  # 8, 4: the int32 length (v2 batchLength, v0/v1 messageSize)
    _,
    (MAGIC_OFFSET, MAGIC_BYTES),  # 16, 1
) = field_layout(PREFIX_UP_TO_MAGIC)
assert field_layout(PREFIX) == field_layout(PREFIX_UP_TO_MAGIC)[:2]
# The smallest declared length of any magic (a v0 message with null key and value); Kafka's
# FileLogInputStream rejects anything smaller as corrupt before it looks at the magic.
LENGTH_MIN = 14

# ---- record batch v2 header, 61 bytes ------------------------------------------------------------------
MAGIC_V2 = 2
BATCH_V2 = struct.Struct(
    ">q"  # 0  baseOffset
    "i"  # 8  batchLength (bytes after this field)
    "i"  # 12 partitionLeaderEpoch (not covered by the CRC)
    "b"  # 16 magic
    "I"  # 17 crc: CRC-32C over [21, end)
    "h"  # 21 attributes
    "i"  # 23 lastOffsetDelta
    "q"  # 27 baseTimestamp (or the delete horizon when attribute bit 6 is set)
    "q"  # 35 maxTimestamp
    "q"  # 43 producerId
    "h"  # 51 producerEpoch
    "i"  # 53 baseSequence
    "i"  # 57 recordsCount
)
RECORD_BATCH_OVERHEAD = BATCH_V2.size  # 61
(
    _,  # baseOffset: BASE_OFFSET_OFFSET, BASE_OFFSET_BYTES
    _,  # batchLength: LENGTH_OFFSET, LENGTH_BYTES
    (PARTITION_LEADER_EPOCH_OFFSET, PARTITION_LEADER_EPOCH_BYTES),
    _,  # magic: MAGIC_OFFSET, MAGIC_BYTES
    (CRC_OFFSET, CRC_BYTES),
    (ATTRIBUTES_OFFSET, ATTRIBUTES_BYTES),  # the CRC covers [ATTRIBUTES_OFFSET, end of batch)
    (LAST_OFFSET_DELTA_OFFSET, LAST_OFFSET_DELTA_BYTES),
    (BASE_TIMESTAMP_OFFSET, BASE_TIMESTAMP_BYTES),
    (MAX_TIMESTAMP_OFFSET, MAX_TIMESTAMP_BYTES),
    (PRODUCER_ID_OFFSET, PRODUCER_ID_BYTES),
    (PRODUCER_EPOCH_OFFSET, PRODUCER_EPOCH_BYTES),
    (BASE_SEQUENCE_OFFSET, BASE_SEQUENCE_BYTES),
    (RECORDS_COUNT_OFFSET, RECORDS_COUNT_BYTES),
) = field_layout(BATCH_V2)
assert field_layout(BATCH_V2)[:2] == field_layout(PREFIX)
assert field_layout(BATCH_V2)[3] == (MAGIC_OFFSET, MAGIC_BYTES)
BATCH_LENGTH_MIN_V2 = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD  # 49

# attributes (int16; Kafka reads only the low byte)
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

# compression codec ids
COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
COMPRESSION_IDS = {name: cid for cid, name in COMPRESSION_NAMES.items()}

# timestamp types
TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

# varints (section 1.4)
VARINT_BYTES_MAX = 5
VARLONG_BYTES_MAX = 10

# records (section 1.5): varint length, int8 attributes, varlong timestampDelta, varint offsetDelta, varint key
# length, key, varint value length, value, varint header count, headers
RECORD_ATTRIBUTES_BYTES = 1

# control records (section 1.7): key = int16 version, int16 type; marker value = int16 version, int32 epoch
CONTROL_KEY = struct.Struct(">hh")
(CONTROL_KEY_VERSION_OFFSET, CONTROL_KEY_VERSION_BYTES), (CONTROL_KEY_TYPE_OFFSET, CONTROL_KEY_TYPE_BYTES) = (
    field_layout(CONTROL_KEY)
)  # offsets within the key
END_TXN_MARKER_VALUE = struct.Struct(">hi")
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1
CONTROL_TYPE_NAMES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}

# ---- legacy messages v0 / v1 (section 2) -----------------------------------------------------------------
MAGIC_V0 = 0
MAGIC_V1 = 1
LEGACY_HEADER = struct.Struct(
    ">q"  # 0  offset
    "i"  # 8  messageSize (bytes after this field)
    "I"  # 12 crc: CRC-32 (IEEE) over [16, end)
    "b"  # 16 magic
    "b"  # 17 attributes
)
LEGACY_TIMESTAMP = struct.Struct(">q")  # v1 only, right after the attributes
LEGACY_LENGTH = struct.Struct(">i")  # key and value lengths, -1 = null
(
    _legacy_offset,  # offset: BASE_OFFSET_OFFSET, BASE_OFFSET_BYTES
    _legacy_size,  # messageSize: LENGTH_OFFSET, LENGTH_BYTES
    (LEGACY_CRC_OFFSET, LEGACY_CRC_BYTES),
    (LEGACY_MAGIC_OFFSET, _legacy_magic_bytes),
    (LEGACY_ATTRIBUTES_OFFSET, LEGACY_ATTRIBUTES_BYTES),
) = field_layout(LEGACY_HEADER)
assert field_layout(LEGACY_HEADER)[:2] == field_layout(PREFIX)
assert field_layout(LEGACY_HEADER)[3] == (MAGIC_OFFSET, MAGIC_BYTES) and LEGACY_MAGIC_OFFSET == MAGIC_OFFSET
LEGACY_TIMESTAMP_OFFSET = LEGACY_HEADER.size  # 18, v1 only
LEGACY_TIMESTAMP_BYTES = LEGACY_TIMESTAMP.size
LEGACY_LENGTH_BYTES = LEGACY_LENGTH.size
LEGACY_KEY_LENGTH_OFFSET_V0 = LEGACY_HEADER.size  # 18: the int32 key length of a v0 message
LEGACY_KEY_LENGTH_OFFSET_V1 = LEGACY_HEADER.size + LEGACY_TIMESTAMP.size  # 26: of a v1 message
LEGACY_KEY_LENGTH_OFFSET = {0: LEGACY_KEY_LENGTH_OFFSET_V0, 1: LEGACY_KEY_LENGTH_OFFSET_V1}  # by magic
LEGACY_MESSAGE_SIZE_MIN = {0: 14, 1: 22}
LEGACY_COMPRESSION_MASK = 0x07
LEGACY_TIMESTAMP_TYPE_MASK = 0x08
LEGACY_COMPRESSION_MAX = 3  # codecs 0..3 (none, gzip, snappy, lz4); zstd (4) is forbidden in v0/v1

# ---- snappy xerial framing (section 1.6) -------------------------------------------------------------------
XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = struct.Struct(">8sii")  # magic, version, min compatible version
XERIAL_CHUNK_LENGTH = struct.Struct(">i")
XERIAL_VERSION = 1
XERIAL_BLOCK_BYTES = 32 * 1024  # snappy-java's default block size

# ---- lz4 frame (section 1.6) ---------------------------------------------------------------------------------
LZ4_FRAME_MAGIC = b"\x04\x22\x4d\x18"
LZ4_FRAME_DESCRIPTOR_OFFSET = 4  # FLG, BD, [content size], [dict id], then the header checksum byte

# ---- indexes (section 3) ----------------------------------------------------------------------------------
OFFSET_INDEX_ENTRY = struct.Struct(">ii")  # relativeOffset, position
TIME_INDEX_ENTRY = struct.Struct(">qi")  # timestamp, relativeOffset
TXN_INDEX_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset
TXN_INDEX_VERSION = 0
RELATIVE_OFFSET_MAX = 2**31 - 1
# The same three layouts as packed numpy records, for reading and writing whole index files at once.
OFFSET_INDEX_ENTRY_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
TIME_INDEX_ENTRY_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
TXN_INDEX_ENTRY_DTYPE = np.dtype(
    [
        ("version", ">i2"),
        ("producer_id", ">i8"),
        ("first_offset", ">i8"),
        ("last_offset", ">i8"),  # offset of the ABORT marker
        ("last_stable_offset", ">i8"),
    ]
)
assert OFFSET_INDEX_ENTRY_DTYPE.itemsize == OFFSET_INDEX_ENTRY.size == 8
assert TIME_INDEX_ENTRY_DTYPE.itemsize == TIME_INDEX_ENTRY.size == 12
assert TXN_INDEX_ENTRY_DTYPE.itemsize == TXN_INDEX_ENTRY.size == 34
TIME_INDEX_RESERVED_ENTRIES = 1  # the slot kept free for the final (max timestamp) entry of a segment

# ---- producer snapshot (section 3.4) -------------------------------------------------------------------------
SNAPSHOT_HEADER = struct.Struct(">hIi")  # version, crc (CRC-32C over [6, end)), count
SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")

# ---- file names (section 3) -------------------------------------------------------------------------------
OFFSET_DIGITS = 20
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
SEGMENT_FILE_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

# ---- defaults that matter (section 3) ------------------------------------------------------------------------
SEGMENT_BYTES_DEFAULT = 1024**3
SEGMENT_INDEX_BYTES_DEFAULT = 10 * 1024 * 1024
INDEX_INTERVAL_BYTES_DEFAULT = 4096
MAX_MESSAGE_BYTES_DEFAULT = 1_048_588


def offset_file_name(offset: int, suffix: str) -> str:
    """The 20-digit zero-padded file name of a segment file: `00000000000000000042.log`."""
    assert offset >= 0, offset
    return f"{offset:0{OFFSET_DIGITS}d}{suffix}"
