"""Legacy messages, magic 0 and 1 (message formats v0/v1): decode, and encode for tests (pure, no I/O).

Owns `docs/format.md` section 2: the `offset | messageSize | crc | magic | attributes | [timestamp] |
key | value` entry, CRC-32 (IEEE, `zlib.crc32`) over magic..end, and compressed "wrapper" entries whose
value is one compressed inner message set (gzip, snappy, lz4; zstd is forbidden in v0/v1). It never
opens files, reads the clock or logs.

The product only *reads* legacy data: an uncompressed legacy message is kept or dropped whole and a
wrapper is copied verbatim (section 2, minimum support). The encoders exist so that tests and fixtures
can produce legacy data; they are not used to rewrite wrappers.

Headers and batches use the shared `BatchHeader`/`RecordBatch`/`Record` types of `segments.codec.records`,
so a log of mixed magics can be walked uniformly (`segments.codec.batches`). Fields v0/v1 lack hold the NO_*
values. The header of the entry at a position is read by `segments.codec.batches.peek_header`; this module
holds its v0/v1 half (`_legacy_header_fields`), which `decode_legacy_header` also uses for an entry held
whole. Errors carry byte positions relative to the buffer given; the file layer adds the path:
`TruncatedBatchError` when the entry runs past the buffer (a torn tail at the end of a file),
`UnsupportedFormatError` for a magic other than 0/1 or a codec outside 0..3, and `CorruptRecordError`
for everything else.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from . import format as fmt
from .compression import DECOMPRESSED_BYTES_MAX_DEFAULT, compress, decompress
from .errors import CorruptRecordError, TruncatedBatchError, UnsupportedFormatError
from .records import BatchHeader, Record, RecordBatch

__all__ = [
    "decode_legacy_entry",
    "decode_legacy_header",
    "encode_legacy_message",
    "encode_legacy_wrapper",
    "legacy_crc",
]


def legacy_crc(buf: bytes | memoryview, pos: int, size_bytes: int) -> int:
    """The CRC-32 (IEEE) a legacy entry at `pos` of `size_bytes` (offset field included) should carry."""
    return zlib.crc32(memoryview(buf)[pos + fmt.LEGACY_MAGIC_OFFSET : pos + size_bytes])


# ---- decoding -----------------------------------------------------------------------------------------


def decode_legacy_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """The header of the legacy (magic 0/1) entry at `pos`, without checking the CRC or decompressing.

    Requires nothing of the bytes. Ensures, in the returned `BatchHeader`: base_offset = the entry's
    offset field and last_offset_delta = 0, so last_offset = the offset field too; batch_length =
    messageSize; partition_leader_epoch, producer_id, producer_epoch, base_sequence = -1; crc = the
    stored CRC-32; attributes = the legacy attribute byte (codec bits 0..2 and the timestamp-type bit 3
    sit where v2 has them); base_timestamp = max_timestamp = the v1 timestamp (-1 for v0);
    records_count = 1.

    For a compressed wrapper these describe the *outer* message: the offset field is the offset of
    the last inner message (section 2) and records_count is 1, not the number of inner messages. The
    true first offset and count need a full decode (`decode_legacy_entry`).

    Raises `TruncatedBatchError` if the header or the declared entry runs past the buffer,
    `UnsupportedFormatError` for a magic other than 0/1 or a codec outside 0..3 (4 is zstd, which v0/v1
    forbid), and `CorruptRecordError` for a messageSize below 14 (v0) / 22 (v1). To read a header from its
    header bytes alone, of any magic, use `segments.codec.batches.peek_header`.
    """
    header = _legacy_header_fields(buf, pos)
    end = len(buf)
    if pos + header.size_bytes > end:
        raise TruncatedBatchError(
            f"message of {header.size_bytes} bytes runs past the end of the data ({end - pos} bytes left)",
            position=pos,
        )
    return header


def _legacy_header_fields(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Like `decode_legacy_header`, but `buf` need only hold the header, not the rest of the entry.

    The magic-0/1 half of `segments.codec.batches.peek_header` (the twin of `records._v2_header_fields`).
    Needs 18 bytes at `pos` for v0 and 26 for v1 (the timestamp), else `TruncatedBatchError`; checks
    the magic, the minimum messageSize and the codec, not whether the entry fits in `buf`.
    """
    end = len(buf)
    if pos + fmt.LEGACY_HEADER.size > end:
        raise TruncatedBatchError(
            f"{end - pos} bytes left, a legacy message header needs {fmt.LEGACY_HEADER.size}", position=pos
        )
    offset, size, crc, magic, attributes = fmt.LEGACY_HEADER.unpack_from(buf, pos)
    if magic not in fmt.LEGACY_MESSAGE_SIZE_MIN:
        raise UnsupportedFormatError(f"expected magic 0 or 1, found {magic}", position=pos + fmt.LEGACY_MAGIC_OFFSET)
    size_min = fmt.LEGACY_MESSAGE_SIZE_MIN[magic]
    if size < size_min:
        raise CorruptRecordError(
            f"message size {size} is below the minimum {size_min} for magic {magic}",
            position=pos + fmt.LENGTH_OFFSET,
        )
    if magic == fmt.MAGIC_V1 and pos + fmt.LEGACY_KEY_LENGTH_OFFSET[fmt.MAGIC_V1] > end:
        raise TruncatedBatchError(
            f"{end - pos} bytes left, a v1 message header needs {fmt.LEGACY_KEY_LENGTH_OFFSET[fmt.MAGIC_V1]}",
            position=pos,
        )
    attributes &= 0xFF  # the struct reads it signed; it is a bit field
    codec = attributes & fmt.LEGACY_COMPRESSION_MASK
    if codec > fmt.LEGACY_COMPRESSION_MAX:
        name = fmt.COMPRESSION_NAMES.get(codec, "invalid")
        raise UnsupportedFormatError(
            f"compression codec {codec} ({name}) is not allowed with magic {magic}",
            position=pos + fmt.LEGACY_ATTRIBUTES_OFFSET,
        )
    if magic == fmt.MAGIC_V1:
        (timestamp,) = fmt.LEGACY_TIMESTAMP.unpack_from(buf, pos + fmt.LEGACY_TIMESTAMP_OFFSET)
    else:
        timestamp = fmt.NO_TIMESTAMP
    return BatchHeader(
        base_offset=offset,
        batch_length=size,
        partition_leader_epoch=fmt.NO_PARTITION_LEADER_EPOCH,
        magic=magic,
        crc=crc,
        attributes=attributes,
        last_offset_delta=0,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        producer_id=fmt.NO_PRODUCER_ID,
        producer_epoch=fmt.NO_PRODUCER_EPOCH,
        base_sequence=fmt.NO_SEQUENCE,
        records_count=1,
    )


@dataclass(frozen=True, slots=True)
class _Message:
    header: BatchHeader
    key: bytes | None
    value: bytes | None
    value_position: int  # where the value bytes start (after their length), relative to the buffer


def _read_field(buf, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos + fmt.LEGACY_LENGTH.size > end:
        raise CorruptRecordError("key/value length runs past the message's declared size", position=pos)
    (length,) = fmt.LEGACY_LENGTH.unpack_from(buf, pos)
    pos += fmt.LEGACY_LENGTH.size
    if length == -1:
        return None, pos
    if length < -1:
        raise CorruptRecordError(f"invalid key/value length {length}", position=pos - fmt.LEGACY_LENGTH.size)
    if pos + length > end:
        raise CorruptRecordError(
            f"key/value of {length} bytes runs past the message's declared size ({end - pos} bytes left)",
            position=pos - fmt.LEGACY_LENGTH.size,
        )
    return bytes(buf[pos : pos + length]), pos + length


def _decode_message(buf, pos: int, verify_crc: bool) -> _Message:
    header = decode_legacy_header(buf, pos)
    end = pos + header.size_bytes
    if verify_crc:
        actual = legacy_crc(buf, pos, header.size_bytes)
        if actual != header.crc:
            raise CorruptRecordError(
                f"CRC-32 mismatch: stored 0x{header.crc:08x}, computed 0x{actual:08x}",
                position=pos + fmt.LEGACY_CRC_OFFSET,
            )
    key, field_pos = _read_field(buf, pos + fmt.LEGACY_KEY_LENGTH_OFFSET[header.magic], end)
    value_position = field_pos + fmt.LEGACY_LENGTH.size
    value, field_pos = _read_field(buf, field_pos, end)
    if field_pos != end:
        raise CorruptRecordError(
            f"message declared {header.batch_length} bytes but its fields use {field_pos - pos - fmt.LOG_OVERHEAD}",
            position=pos + fmt.LENGTH_OFFSET,
        )
    return _Message(header, key, value, value_position)


def decode_legacy_entry(
    buf: bytes | memoryview,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX_DEFAULT,
) -> RecordBatch:
    """Decode the whole legacy entry at `pos`: header, CRC-32, key and value, and a wrapper's inner set.

    Ensures that the key and value (int32 lengths, -1 = null) consume exactly messageSize bytes and,
    with `verify_crc`, that the CRC-32 over magic..end matches (inner messages' CRCs too).

    An uncompressed message becomes a batch of one `Record` whose header equals
    `decode_legacy_header`. A compressed wrapper's value is decompressed (at most
    `decompressed_bytes_max` bytes) and parsed as a message set, and the result has one `Record` per
    inner message with:
      * absolute offsets: v0 inner offsets are absolute. v1 inner offsets are relative and
        `absolute = outer - lastInnerRelative + innerRelative`; when that base is negative (an outer
        offset of 0, written by old librdkafka, or any outer offset below lastInnerRelative) the
        inner offsets are used as they are, i.e. base 0, as Kafka's and kafka-python's readers do.
      * timestamps: an inner v1 message's own timestamp, or the outer timestamp when the outer
        attributes say LogAppendTime; -1 for v0.
    Its header is the outer one except base_offset = the first inner offset, last_offset_delta =
    last - first inner offset and records_count = the number of inner messages (base_timestamp and
    max_timestamp stay the outer timestamp). Records carry `headers=()`, `timestamp_delta=None` and
    their own message's attribute byte.

    Stricter than Kafka's reader, on purpose (the wrapper's CRC vouches for these bytes, so anything
    malformed inside is corruption, not something to skip): a null wrapper value, an empty inner set,
    a partial inner entry at the end of the set (Kafka stops there silently), an inner magic that
    differs from the wrapper's, inner compression (nesting beyond one level) and inner offsets that do
    not strictly increase are all `CorruptRecordError`. Errors inside the decompressed set are reported
    at the position of the wrapper's value, with the inner position in the reason.

    Raises `TruncatedBatchError` if the entry runs past the buffer, `UnsupportedFormatError` for a
    magic other than 0/1 or a codec outside 0..3, `CorruptRecordError` otherwise.
    """
    outer = _decode_message(buf, pos, verify_crc)
    header = outer.header
    codec = header.compression
    if codec == fmt.COMPRESSION_NONE:
        record = Record(
            offset=header.base_offset,
            timestamp=header.max_timestamp,
            key=outer.key,
            value=outer.value,
            attributes=header.attributes,
        )
        return RecordBatch(header, (record,))
    if outer.value is None:
        raise CorruptRecordError("compressed wrapper message has a null value", position=outer.value_position - 4)
    data = decompress(
        codec,
        outer.value,
        position=outer.value_position,
        magic=header.magic,
        decompressed_bytes_max=decompressed_bytes_max,
    )
    inner = _decode_inner_set(data, header.magic, verify_crc, error_position=outer.value_position)
    log_append_time = header.magic == fmt.MAGIC_V1 and header.timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    if header.magic == fmt.MAGIC_V1:
        base = header.base_offset - inner[-1].header.base_offset
        if base < 0:
            base = 0
    else:
        base = 0
    records = []
    previous_offset = None
    for message in inner:
        offset = base + message.header.base_offset
        if previous_offset is not None and offset <= previous_offset:
            raise CorruptRecordError(
                f"inner message offsets do not increase: {offset} after {previous_offset}",
                position=outer.value_position,
            )
        previous_offset = offset
        records.append(
            Record(
                offset=offset,
                timestamp=header.max_timestamp if log_append_time else message.header.max_timestamp,
                key=message.key,
                value=message.value,
                attributes=message.header.attributes,
            )
        )
    first, last = records[0].offset, records[-1].offset
    batch_header = BatchHeader(
        base_offset=first,
        batch_length=header.batch_length,
        partition_leader_epoch=header.partition_leader_epoch,
        magic=header.magic,
        crc=header.crc,
        attributes=header.attributes,
        last_offset_delta=last - first,
        base_timestamp=header.base_timestamp,
        max_timestamp=header.max_timestamp,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=len(records),
    )
    return RecordBatch(batch_header, tuple(records))


def _decode_inner_set(data: bytes, magic: int, verify_crc: bool, *, error_position: int) -> list[_Message]:
    """The messages of a wrapper's decompressed set. The loop ends because each message is ≥ 26 bytes."""
    messages = []
    pos = 0
    end = len(data)
    while pos < end:
        try:
            message = _decode_message(data, pos, verify_crc)
        except CorruptRecordError as exc:  # TruncatedBatchError and UnsupportedFormatError included
            raise CorruptRecordError(
                f"inner message at byte {pos} of the decompressed set: byte {exc.position}: {exc.reason}",
                position=error_position,
            ) from None
        if message.header.magic != magic:
            raise CorruptRecordError(
                f"inner message at byte {pos} of the decompressed set has magic {message.header.magic}, "
                f"its wrapper magic {magic}",
                position=error_position,
            )
        if message.header.compression != fmt.COMPRESSION_NONE:
            raise CorruptRecordError(
                f"inner message at byte {pos} of the decompressed set is compressed itself "
                f"(codec {message.header.compression}); nesting beyond one level is not allowed",
                position=error_position,
            )
        messages.append(message)
        pos += message.header.size_bytes
    if not messages:
        raise CorruptRecordError("compressed wrapper holds no inner messages", position=error_position)
    return messages


# ---- encoding (tests and fixtures only) -----------------------------------------------------------------


def encode_legacy_message(
    offset: int,
    key: bytes | None,
    value: bytes | None,
    *,
    magic: int,
    timestamp: int = fmt.NO_TIMESTAMP,
    attributes: int = 0,
) -> bytes:
    """One legacy entry (offset and messageSize included) with its CRC-32.

    Meant for uncompressed messages; `attributes` is written as given, so a caller that sets codec
    bits must pass the compressed message set as `value` (`encode_legacy_wrapper` does). A v0 message
    has no timestamp: `timestamp` must stay -1.
    """
    if magic not in fmt.LEGACY_MESSAGE_SIZE_MIN:
        raise ValueError(f"legacy magic must be 0 or 1, not {magic}")
    if magic == fmt.MAGIC_V0 and timestamp != fmt.NO_TIMESTAMP:
        raise ValueError("a v0 message has no timestamp")
    if not 0 <= attributes <= 0xFF:
        raise ValueError(f"attributes {attributes} do not fit one byte")
    parts = [bytes((magic, attributes))]
    if magic == fmt.MAGIC_V1:
        parts.append(fmt.LEGACY_TIMESTAMP.pack(timestamp))
    for field in (key, value):
        if field is None:
            parts.append(fmt.LEGACY_LENGTH.pack(-1))
        else:
            parts.append(fmt.LEGACY_LENGTH.pack(len(field)))
            parts.append(bytes(field))
    body = b"".join(parts)
    crc = zlib.crc32(body)
    size = 4 + len(body)  # the CRC, then magic..end
    return fmt.PREFIX.pack(offset, size) + crc.to_bytes(4, "big") + body


def encode_legacy_wrapper(
    inner_messages: Sequence[Record],
    *,
    magic: int,
    codec: int,
    timestamp_type: int = fmt.TIMESTAMP_CREATE_TIME,
    wrapper_timestamp: int | None = None,
    wrapper_offset: int | None = None,
) -> bytes:
    """A compressed wrapper entry holding `inner_messages` (absolute, strictly increasing offsets).

    As Kafka writes it: inner offsets are absolute (v0) or relative to the first message (v1, so
    gaps survive); the outer offset is the last inner offset unless `wrapper_offset` overrides it (to
    build e.g. librdkafka's outer offset 0); the outer key is null. v1 inner messages keep their
    timestamps; the outer timestamp is `wrapper_timestamp` or, by default, the largest inner
    timestamp. LogAppendTime sets outer attribute bit 3 and needs `wrapper_timestamp` (the append
    time). With magic 0 and lz4 the frame carries Kafka 0.8/0.9's broken header checksum.
    Records' keys, values and (v1) timestamps are used; their headers must be empty.
    """
    if magic not in fmt.LEGACY_MESSAGE_SIZE_MIN:
        raise ValueError(f"legacy magic must be 0 or 1, not {magic}")
    if not fmt.COMPRESSION_GZIP <= codec <= fmt.LEGACY_COMPRESSION_MAX:
        raise ValueError(f"a legacy wrapper's codec must be gzip, snappy or lz4, not {codec}")
    if not inner_messages:
        raise ValueError("a wrapper needs at least one inner message")
    log_append_time = timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    if magic == fmt.MAGIC_V0 and (log_append_time or wrapper_timestamp is not None):
        raise ValueError("a v0 message has no timestamp")
    if log_append_time and wrapper_timestamp is None:
        raise ValueError("a LogAppendTime wrapper needs wrapper_timestamp (the append time)")
    first = inner_messages[0].offset
    parts = []
    previous = None
    for r in inner_messages:
        if previous is not None and r.offset <= previous:
            raise ValueError(f"inner offsets must strictly increase: {r.offset} after {previous}")
        if r.headers:
            raise ValueError("legacy messages have no headers")
        previous = r.offset
        if magic == fmt.MAGIC_V1:
            parts.append(encode_legacy_message(r.offset - first, r.key, r.value, magic=magic, timestamp=r.timestamp))
        else:
            parts.append(encode_legacy_message(r.offset, r.key, r.value, magic=magic))
    compressed = compress(codec, b"".join(parts))
    if magic == fmt.MAGIC_V0 and codec == fmt.COMPRESSION_LZ4:
        compressed = _with_kafka_broken_lz4_header_checksum(compressed)
    if magic == fmt.MAGIC_V1 and wrapper_timestamp is None:
        wrapper_timestamp = max(r.timestamp for r in inner_messages)
    return encode_legacy_message(
        inner_messages[-1].offset if wrapper_offset is None else wrapper_offset,
        None,
        compressed,
        magic=magic,
        timestamp=fmt.NO_TIMESTAMP if wrapper_timestamp is None else wrapper_timestamp,
        attributes=codec | (fmt.LEGACY_TIMESTAMP_TYPE_MASK if log_append_time else 0),
    )


def _with_kafka_broken_lz4_header_checksum(frame: bytes) -> bytes:
    """The frame with its header checksum computed over magic+descriptor, as Kafka 0.8/0.9 wrote it.

    Requires a frame without content size or dictionary id (`compress` writes FLG=0x60, BD=0x40), so
    the header checksum is byte 6. The correct byte hashes only FLG and BD.
    """
    hc_offset = fmt.LZ4_FRAME_DESCRIPTOR_OFFSET + 2
    assert frame.startswith(fmt.LZ4_FRAME_MAGIC) and not frame[fmt.LZ4_FRAME_DESCRIPTOR_OFFSET] & 0x09, frame[:8]
    broken = (_xxh32_short(frame[:hc_offset]) >> 8) & 0xFF
    return frame[:hc_offset] + bytes((broken,)) + frame[hc_offset + 1 :]


_XXH_PRIME32_1 = 2654435761
_XXH_PRIME32_2 = 2246822519
_XXH_PRIME32_3 = 3266489917
_XXH_PRIME32_4 = 668265263
_XXH_PRIME32_5 = 374761393
_U32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _U32


def _xxh32_short(data: bytes, seed: int = 0) -> int:
    """XXH32 of fewer than 16 bytes (the only case an lz4 frame header needs)."""
    assert len(data) < 16, len(data)
    h = (seed + _XXH_PRIME32_5 + len(data)) & _U32
    i = 0
    while i + 4 <= len(data):
        h = (h + int.from_bytes(data[i : i + 4], "little") * _XXH_PRIME32_3) & _U32
        h = (_rotl32(h, 17) * _XXH_PRIME32_4) & _U32
        i += 4
    while i < len(data):
        h = (h + data[i] * _XXH_PRIME32_5) & _U32
        h = (_rotl32(h, 11) * _XXH_PRIME32_1) & _U32
        i += 1
    h ^= h >> 15
    h = (h * _XXH_PRIME32_2) & _U32
    h ^= h >> 13
    h = (h * _XXH_PRIME32_3) & _U32
    h ^= h >> 16
    return h
