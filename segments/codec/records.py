"""Record batch v2: decode and encode, header fields and records as frozen objects (pure, no I/O).

Owns `docs/format.md` sections 1.1-1.7: the 61-byte header, attributes, CRC-32C, records with
headers and null keys/values, compression of the records region, control batches and end-transaction
markers, the delete-horizon bit and empty batches. This is the *object* path, for tools, tests and
building batches; the cleaner's hot loop uses `segments.codec.scan` over the same bytes.

`BatchHeader` is also the header type of legacy v0/v1 entries (`segments.codec.legacy`), so callers can walk
a log of mixed magics uniformly; fields that v0/v1 lack hold the NO_* values. The header of the batch at a
position, whatever its magic, is read by `segments.codec.batches.peek_header`; this module holds its v2 half
(`_v2_header_fields`), which `decode_batch_header` also uses for a batch held whole.

Errors: `TruncatedBatchError` when the buffer ends inside a batch (the file layer turns this into "torn
tail" at end of file), `CorruptRecordError` for everything else that is wrong, with the byte position
relative to the buffer given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import format as fmt
from .compression import DECOMPRESSED_BYTES_MAX_DEFAULT, compress, decompress
from .errors import CorruptRecordError, TruncatedBatchError, UnsupportedFormatError
from .varint import decode_varint, decode_varlong, encode_varint

__all__ = [
    "BatchHeader",
    "Header",
    "Record",
    "RecordBatch",
    "batch_crc",
    "decode_batch",
    "decode_batch_header",
    "decode_control_key",
    "decode_end_txn_marker",
    "encode_batch",
    "encode_batch_from_region",
    "encode_control_batch",
    "encode_record",
    "make_attributes",
    "with_partition_leader_epoch",
]


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of `data`, continuing `crc`, hardware-accelerated where the CPU has it."""
    # crc32c: its import reads its package's metadata (~15 ms), so it is made at the first checksum, not at start-up
    import crc32c as _crc32c

    return _crc32c.crc32c(data, crc)


@dataclass(frozen=True, slots=True)
class Header:
    """A record header: a non-null UTF-8 key and a nullable value."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One record with its absolute offset and effective timestamp.

    `timestamp_delta` is the stored delta when the record was decoded (None when built by hand); it is
    only needed to re-encode LogAppendTime batches exactly, whose stored deltas are not derivable.
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp_delta: int | None = None
    attributes: int = 0


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The header fields of one batch (v2), or of one legacy entry (v0/v1, see `segments.codec.legacy`)."""

    base_offset: int
    batch_length: int  # bytes after the length field; size_bytes = batch_length + 12
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + fmt.LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & fmt.COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & fmt.TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return self.magic >= fmt.MAGIC_V2 and bool(self.attributes & fmt.TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return self.magic >= fmt.MAGIC_V2 and bool(self.attributes & fmt.CONTROL_FLAG)

    @property
    def has_delete_horizon(self) -> bool:
        return self.magic >= fmt.MAGIC_V2 and bool(self.attributes & fmt.DELETE_HORIZON_FLAG)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.has_delete_horizon else None


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded batch: its header and its records in offset order."""

    header: BatchHeader
    records: tuple[Record, ...]


# ---- decoding -----------------------------------------------------------------------------------------


def batch_crc(buf: bytes | memoryview, pos: int, size_bytes: int) -> int:
    """The CRC-32C a v2 batch at `pos` of `size_bytes` should carry (over attributes..end)."""
    return crc32c(memoryview(buf)[pos + fmt.ATTRIBUTES_OFFSET : pos + size_bytes])


def decode_batch_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Decode and check the 61-byte header of the v2 batch at `pos`, which must lie wholly in `buf`.

    Requires the magic byte to be 2 (callers dispatch on magic first). Checks lengths and the codec,
    not the CRC. Raises `TruncatedBatchError` if the header or the declared batch runs past the buffer.
    To read a header from its header bytes alone, of any magic, use `segments.codec.batches.peek_header`.
    """
    header = _v2_header_fields(buf, pos)
    end = len(buf)
    if pos + header.size_bytes > end:
        raise TruncatedBatchError(
            f"batch of {header.size_bytes} bytes runs past the end of the data ({end - pos} bytes left)",
            position=pos,
        )
    return header


def _v2_header_fields(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """Decode and check the 61-byte v2 header at `pos` when the buffer may hold only the header.

    The magic-2 half of `segments.codec.batches.peek_header` (the one reader of a header by position), and the
    first step of `decode_batch_header`: it does not require the rest of the batch to be in `buf`.
    """
    end = len(buf)
    if pos + fmt.RECORD_BATCH_OVERHEAD > end:
        # A batch whose declared length is impossible is corrupt even when the buffer ends before 61
        # bytes (the whole batch may fit): only a plausible batch cut short is a torn tail.
        if pos + fmt.HEADER_SIZE_UP_TO_MAGIC <= end:
            _, batch_length, _, magic = fmt.PREFIX_UP_TO_MAGIC.unpack_from(buf, pos)
            if magic != fmt.MAGIC_V2:
                raise UnsupportedFormatError(f"expected magic 2, found {magic}", position=pos + fmt.MAGIC_OFFSET)
            if batch_length < fmt.BATCH_LENGTH_MIN_V2:
                raise CorruptRecordError(
                    f"batch length {batch_length} is below the minimum {fmt.BATCH_LENGTH_MIN_V2}",
                    position=pos + fmt.LENGTH_OFFSET,
                )
        raise TruncatedBatchError(
            f"{end - pos} bytes left, a batch header needs {fmt.RECORD_BATCH_OVERHEAD}", position=pos
        )
    fields = fmt.BATCH_V2.unpack_from(buf, pos)
    header = BatchHeader(*fields)
    if header.magic != fmt.MAGIC_V2:
        raise UnsupportedFormatError(f"expected magic 2, found {header.magic}", position=pos + fmt.MAGIC_OFFSET)
    if header.batch_length < fmt.BATCH_LENGTH_MIN_V2:
        raise CorruptRecordError(
            f"batch length {header.batch_length} is below the minimum {fmt.BATCH_LENGTH_MIN_V2}",
            position=pos + fmt.LENGTH_OFFSET,
        )
    if header.compression > fmt.COMPRESSION_ZSTD:
        raise UnsupportedFormatError(
            f"invalid compression codec {header.compression} in attributes 0x{header.attributes:04x}",
            position=pos + fmt.ATTRIBUTES_OFFSET,
        )
    if header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"negative last offset delta {header.last_offset_delta}", position=pos + fmt.LAST_OFFSET_DELTA_OFFSET
        )
    if header.records_count < 0:
        raise CorruptRecordError(
            f"negative record count {header.records_count}", position=pos + fmt.RECORDS_COUNT_OFFSET
        )
    return header


def decode_batch(
    buf: bytes | memoryview,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX_DEFAULT,
) -> RecordBatch:
    """Decode the whole v2 batch at `pos`: header, CRC check, decompression, every record.

    Ensures Kafka's framing rules: each record consumes exactly its declared length, exactly
    `recordsCount` records fill the records region, offset deltas strictly increase within
    [0, lastOffsetDelta]. Raises `CorruptRecordError` (positions relative to `buf`).
    """
    header = decode_batch_header(buf, pos)
    view = memoryview(buf)
    if verify_crc:
        actual = batch_crc(view, pos, header.size_bytes)
        if actual != header.crc:
            raise CorruptRecordError(
                f"CRC-32C mismatch: stored 0x{header.crc:08x}, computed 0x{actual:08x}",
                position=pos + fmt.CRC_OFFSET,
            )
    region_pos = pos + fmt.RECORD_BATCH_OVERHEAD
    region_end = pos + header.size_bytes
    if header.compression == fmt.COMPRESSION_NONE:
        data: bytes | memoryview
        data, data_pos, data_end, where = view, region_pos, region_end, 0
    else:
        data = decompress(
            header.compression,
            view[region_pos:region_end],
            position=region_pos,
            decompressed_bytes_max=decompressed_bytes_max,
        )
        # Errors inside decompressed data are reported at the start of the compressed region.
        data_pos, data_end, where = 0, len(data), region_pos
    records = _decode_records(header, data, data_pos, data_end, error_position=where)
    return RecordBatch(header, records)


def _decode_records(header: BatchHeader, data, pos: int, end: int, *, error_position: int) -> tuple[Record, ...]:
    records = []
    previous_delta = -1
    log_append_time = header.timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    try:
        for _ in range(header.records_count):
            record, pos = _decode_record(data, pos, end, header, log_append_time)
            delta = record.offset - header.base_offset
            if delta <= previous_delta or delta > header.last_offset_delta:
                raise CorruptRecordError(
                    f"record offset delta {delta} is out of order or past last offset delta "
                    f"{header.last_offset_delta}",
                    position=pos,
                )
            previous_delta = delta
            records.append(record)
    except TruncatedBatchError as exc:
        # The batch itself is whole (its length was checked), so running out of bytes inside it is
        # an inconsistent declared size: corruption, not a torn tail.
        raise CorruptRecordError(
            f"records run past the batch's declared size: {exc.reason}", position=error_position or exc.position
        ) from None
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.reason, position=error_position or exc.position) from None
    if pos != end:
        raise CorruptRecordError(
            f"incorrect declared batch size: {end - pos} bytes left after {header.records_count} records",
            position=error_position or pos,
        )
    return tuple(records)


def _read_bytes(data, pos: int, end: int, length: int) -> tuple[bytes | None, int]:
    if length == -1:
        return None, pos
    if length < -1:
        raise CorruptRecordError(f"invalid length {length}", position=pos)
    if pos + length > end:
        raise TruncatedBatchError(f"field of {length} bytes runs past the record", position=pos)
    return bytes(data[pos : pos + length]), pos + length


def _decode_record(data, pos: int, end: int, header: BatchHeader, log_append_time: bool) -> tuple[Record, int]:
    start = pos
    length, pos = decode_varint(data, pos, end)
    if length < 0:
        raise CorruptRecordError(f"negative record length {length}", position=start)
    record_end = pos + length
    if record_end > end:
        raise TruncatedBatchError(f"record of {length} bytes runs past the records region", position=start)
    if pos >= record_end:
        raise CorruptRecordError("record too short for its attributes", position=start)
    attributes = data[pos]
    pos += 1
    timestamp_delta, pos = decode_varlong(data, pos, record_end)
    offset_delta, pos = decode_varint(data, pos, record_end)
    key_length, pos = decode_varint(data, pos, record_end)
    key, pos = _read_bytes(data, pos, record_end, key_length)
    value_length, pos = decode_varint(data, pos, record_end)
    value, pos = _read_bytes(data, pos, record_end, value_length)
    header_count, pos = decode_varint(data, pos, record_end)
    if header_count < 0 or header_count > record_end - pos:
        raise CorruptRecordError(f"invalid header count {header_count}", position=pos)
    headers = []
    for _ in range(header_count):
        hkey_length, pos = decode_varint(data, pos, record_end)
        if hkey_length < 0:
            raise CorruptRecordError(f"invalid header key length {hkey_length}", position=pos)
        hkey, pos = _read_bytes(data, pos, record_end, hkey_length)
        assert hkey is not None  # a negative length was refused above
        hvalue_length, pos = decode_varint(data, pos, record_end)
        hvalue, pos = _read_bytes(data, pos, record_end, hvalue_length)
        try:
            headers.append(Header(hkey.decode("utf-8"), hvalue))
        except UnicodeDecodeError:
            raise CorruptRecordError("header key is not UTF-8", position=pos) from None
    if pos != record_end:
        raise CorruptRecordError(
            f"record declared {length} bytes but its fields use {pos - (record_end - length)}", position=start
        )
    timestamp = header.max_timestamp if log_append_time else header.base_timestamp + timestamp_delta
    record = Record(
        offset=header.base_offset + offset_delta,
        timestamp=timestamp,
        key=key,
        value=value,
        headers=tuple(headers),
        timestamp_delta=timestamp_delta,
        attributes=attributes,
    )
    return record, pos


def decode_control_key(key: bytes | None, *, position: int = 0) -> tuple[int, int]:
    """(version, type) of a control record's key; the type may be one Kafka does not know (UNKNOWN)."""
    if key is None or len(key) < fmt.CONTROL_KEY.size:
        raise CorruptRecordError("control record key is shorter than 4 bytes", position=position)
    version, control_type = fmt.CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"negative control record version {version}", position=position)
    return version, control_type


def decode_end_txn_marker(value: bytes | None, *, position: int = 0) -> tuple[int, int]:
    """(version, coordinator epoch) of a COMMIT/ABORT marker's value; longer values are tolerated."""
    if value is None or len(value) < fmt.END_TXN_MARKER_VALUE.size:
        raise CorruptRecordError("end transaction marker value is shorter than 6 bytes", position=position)
    return fmt.END_TXN_MARKER_VALUE.unpack_from(value)


# ---- encoding -----------------------------------------------------------------------------------------


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header] = (),
    attributes: int = 0,
) -> bytes:
    """One record, length prefix included (section 1.5)."""
    parts = [bytes((attributes & 0xFF,)), encode_varint(timestamp_delta), encode_varint(offset_delta)]
    for field in (key, value):
        if field is None:
            parts.append(encode_varint(-1))
        else:
            parts.append(encode_varint(len(field)))
            parts.append(bytes(field))
    parts.append(encode_varint(len(headers)))
    for h in headers:
        hkey = h.key.encode("utf-8")
        parts.append(encode_varint(len(hkey)))
        parts.append(hkey)
        if h.value is None:
            parts.append(encode_varint(-1))
        else:
            parts.append(encode_varint(len(h.value)))
            parts.append(bytes(h.value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def encode_batch_from_region(
    records_region: bytes | memoryview,
    *,
    records_count: int,
    base_offset: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int,
    partition_leader_epoch: int = fmt.NO_PARTITION_LEADER_EPOCH,
    producer_id: int = fmt.NO_PRODUCER_ID,
    producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
    base_sequence: int = fmt.NO_SEQUENCE,
) -> bytes:
    """A v2 batch around already-encoded, uncompressed records; compresses per `attributes` and sets the CRC.

    This is the primitive the cleaner uses to rebuild a batch from the raw bytes of its kept records.
    """
    codec = attributes & fmt.COMPRESSION_MASK
    if codec > fmt.COMPRESSION_ZSTD:
        raise ValueError(f"invalid compression codec {codec}")
    if records_count == 0 and codec != fmt.COMPRESSION_NONE:
        raise ValueError("an empty batch carries no compressed stream: clear the codec bits")
    region = compress(codec, records_region) if codec else bytes(records_region)
    batch_length = fmt.RECORD_BATCH_OVERHEAD - fmt.LOG_OVERHEAD + len(region)
    header = bytearray(
        fmt.BATCH_V2.pack(
            base_offset,
            batch_length,
            partition_leader_epoch,
            fmt.MAGIC_V2,
            0,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            records_count,
        )
    )
    crc = crc32c(memoryview(header)[fmt.ATTRIBUTES_OFFSET :])
    crc = crc32c(region, crc)
    header[fmt.CRC_OFFSET : fmt.CRC_OFFSET + 4] = crc.to_bytes(4, "big")
    return bytes(header) + region


def make_attributes(
    *,
    compression: int = fmt.COMPRESSION_NONE,
    timestamp_type: int = fmt.TIMESTAMP_CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    has_delete_horizon: bool = False,
) -> int:
    """The attributes int16 for these properties."""
    return (
        compression
        | (fmt.TIMESTAMP_TYPE_MASK if timestamp_type else 0)
        | (fmt.TRANSACTIONAL_FLAG if is_transactional else 0)
        | (fmt.CONTROL_FLAG if is_control else 0)
        | (fmt.DELETE_HORIZON_FLAG if has_delete_horizon else 0)
    )


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int,
    compression: int = fmt.COMPRESSION_NONE,
    timestamp_type: int = fmt.TIMESTAMP_CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = fmt.NO_PARTITION_LEADER_EPOCH,
    producer_id: int = fmt.NO_PRODUCER_ID,
    producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
    base_sequence: int = fmt.NO_SEQUENCE,
    last_offset_delta: int | None = None,
    base_timestamp: int | None = None,
    max_timestamp: int | None = None,
    delete_horizon_ms: int | None = None,
) -> bytes:
    """Encode `records` (absolute offsets, strictly increasing, ≥ base_offset) as one v2 batch.

    Defaults follow Kafka's builder: lastOffsetDelta = the last record's delta; baseTimestamp = the
    delete horizon if given (bit 6 set), else the first record's timestamp, else -1 for an empty batch;
    CreateTime maxTimestamp = the largest record timestamp (-1 if empty). LogAppendTime batches need
    `max_timestamp` (the append time). An empty batch must be given `last_offset_delta`.
    """
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    elif base_timestamp is None:
        base_timestamp = records[0].timestamp if records else fmt.NO_TIMESTAMP
    if max_timestamp is None:
        if timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME:
            raise ValueError("a LogAppendTime batch needs max_timestamp (the append time)")
        max_timestamp = max((r.timestamp for r in records), default=fmt.NO_TIMESTAMP)
    if last_offset_delta is None:
        if not records:
            raise ValueError("an empty batch needs last_offset_delta")
        last_offset_delta = records[-1].offset - base_offset
    log_append_time = timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    parts = []
    previous_delta = -1
    for r in records:
        offset_delta = r.offset - base_offset
        if offset_delta <= previous_delta or offset_delta > last_offset_delta:
            raise ValueError(f"record offset {r.offset} is out of order or outside the batch")
        previous_delta = offset_delta
        if log_append_time and r.timestamp_delta is not None:
            timestamp_delta = r.timestamp_delta
        else:
            timestamp_delta = r.timestamp - base_timestamp
        parts.append(encode_record(offset_delta, timestamp_delta, r.key, r.value, r.headers, r.attributes))
    attributes = make_attributes(
        compression=compression if records else fmt.COMPRESSION_NONE,
        timestamp_type=timestamp_type,
        is_transactional=is_transactional,
        is_control=is_control,
        has_delete_horizon=delete_horizon_ms is not None,
    )
    return encode_batch_from_region(
        b"".join(parts),
        records_count=len(records),
        base_offset=base_offset,
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        attributes=attributes,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def encode_control_batch(
    *,
    offset: int,
    control_type: int,
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    partition_leader_epoch: int = fmt.NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker batch as Kafka writes it: one record, codec none, baseSequence -1."""
    key = fmt.CONTROL_KEY.pack(0, control_type)
    value = fmt.END_TXN_MARKER_VALUE.pack(0, coordinator_epoch)
    return encode_batch(
        [Record(offset=offset, timestamp=timestamp, key=key, value=value)],
        base_offset=offset,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )


def with_partition_leader_epoch(batch: bytes, epoch: int) -> bytes:
    """The same batch with its partition leader epoch replaced (the CRC does not cover it)."""
    out = bytearray(batch)
    start = fmt.PARTITION_LEADER_EPOCH_OFFSET
    out[start : start + 4] = epoch.to_bytes(4, "big", signed=True)
    return bytes(out)

