"""Legacy v0/v1 messages (docs/format.md section 2): headers, full decodes, wrappers and corruption.

Cross-checks against kafka-python's legacy reader and builder live in test_kafka_python_compat.py.
"""

from __future__ import annotations

import dataclasses
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segments.codec import format as fmt
from segments.codec.batches import peek_header
from segments.codec.compression import compress
from segments.codec.errors import CorruptRecordError, TruncatedBatchError, UnsupportedFormatError
from segments.codec.legacy import (
    decode_legacy_entry,
    decode_legacy_header,
    encode_legacy_message,
    encode_legacy_wrapper,
    legacy_crc,
)
from segments.codec.records import Record

V6_V1 = bytes.fromhex("000000000000000000000019478628c201000000015e1867abaeffffffff00000003313233")
V6_V0 = bytes.fromhex("000000000000000000000011feb01dbf0000ffffffff00000003313233")
LEGACY_CODECS = [fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4]
LEGACY_CODEC_IDS = [fmt.COMPRESSION_NAMES[c] for c in LEGACY_CODECS]


def put(data: bytes, position: int, raw: bytes) -> bytes:
    out = bytearray(data)
    out[position : position + len(raw)] = raw
    return bytes(out)


def flip(data: bytes, position: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[position] ^= mask
    return bytes(out)


def fix_crc(entry: bytes, pos: int = 0) -> bytes:
    """The legacy entry at `pos` with its CRC-32 recomputed, so the next check is reached."""
    (size,) = fmt.LEGACY_LENGTH.unpack_from(entry, pos + fmt.LENGTH_OFFSET)
    crc = legacy_crc(entry, pos, fmt.LOG_OVERHEAD + size)
    return put(entry, pos + fmt.LEGACY_CRC_OFFSET, crc.to_bytes(4, "big"))


def set_size(entry: bytes, size: int) -> bytes:
    return put(entry, fmt.LENGTH_OFFSET, size.to_bytes(4, "big", signed=True))


def records_of(batch):
    return [(r.offset, r.timestamp, r.key, r.value) for r in batch.records]


# ---- uncompressed messages -----------------------------------------------------------------------------------


def test_v6_vectors_are_reproduced_by_encode_legacy_message():
    assert encode_legacy_message(0, None, b"123", magic=1, timestamp=1503648000942) == V6_V1
    assert encode_legacy_message(0, None, b"123", magic=0) == V6_V0


def test_legacy_header_fields_follow_the_shared_batch_header_conventions():
    header = decode_legacy_header(V6_V1)
    assert (header.base_offset, header.last_offset, header.next_offset) == (0, 0, 1)
    assert (header.batch_length, header.size_bytes) == (0x19, len(V6_V1))
    assert (header.partition_leader_epoch, header.producer_id, header.producer_epoch, header.base_sequence) == (
        -1,
        -1,
        -1,
        -1,
    )
    assert (header.records_count, header.compression, header.timestamp_type) == (1, 0, 0)
    assert not (header.is_control or header.is_transactional or header.has_delete_horizon)


keys_values = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=50))


@settings(max_examples=150, deadline=None)
@given(
    offset=st.integers(0, 2**62),
    key=keys_values,
    value=keys_values,
    magic=st.sampled_from([0, 1]),
    timestamp=st.integers(-1, 2**42),
    log_append_time=st.booleans(),
)
def test_uncompressed_message_round_trips(offset, key, value, magic, timestamp, log_append_time):
    timestamp = timestamp if magic == 1 else -1
    attributes = fmt.LEGACY_TIMESTAMP_TYPE_MASK if log_append_time and magic == 1 else 0
    entry = encode_legacy_message(offset, key, value, magic=magic, timestamp=timestamp, attributes=attributes)
    batch = decode_legacy_entry(entry)
    assert batch.header == decode_legacy_header(entry)
    assert batch.header.size_bytes == len(entry)
    assert (batch.header.magic, batch.header.max_timestamp, batch.header.attributes) == (magic, timestamp, attributes)
    assert batch.records == (Record(offset, timestamp, key, value, attributes=attributes),)


def test_a_message_placed_after_other_bytes_decodes_with_buffer_positions():
    buf = b"\xaa" * 33 + V6_V1 + b"\xbb" * 5
    assert decode_legacy_entry(buf, 33).records == decode_legacy_entry(V6_V1).records
    with pytest.raises(CorruptRecordError, match="CRC-32 mismatch") as info:
        decode_legacy_entry(flip(buf, 33 + len(V6_V1) - 1), 33)
    assert info.value.position == 33 + fmt.LEGACY_CRC_OFFSET


# ---- wrappers ---------------------------------------------------------------------------------------------------


def _inner(offsets, magic, timestamps=None):
    return [
        Record(
            offset=o,
            timestamp=(timestamps[i] if timestamps else 1_600_000_000_000 + 7 * i) if magic == 1 else -1,
            key=None if i % 3 == 2 else b"k%d" % (i % 4),
            value=None if i % 5 == 4 else b"v" * i,
        )
        for i, o in enumerate(offsets)
    ]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=LEGACY_CODEC_IDS)
def test_wrapper_round_trips_with_absolute_offsets_and_inner_timestamps(codec, magic):
    inner = _inner([100, 101, 103, 110], magic)
    entry = encode_legacy_wrapper(inner, magic=magic, codec=codec)
    batch = decode_legacy_entry(entry)
    assert list(batch.records) == inner
    header = batch.header
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (100, 10, 4)
    assert header.compression == codec
    assert header.max_timestamp == (max(r.timestamp for r in inner) if magic == 1 else -1)
    outer = decode_legacy_header(entry)
    assert (outer.base_offset, outer.last_offset, outer.records_count) == (110, 110, 1)
    assert dataclasses.replace(header, base_offset=110, last_offset_delta=0, records_count=1) == outer


@settings(max_examples=60, deadline=None)
@given(
    magic=st.sampled_from([0, 1]),
    codec=st.sampled_from(LEGACY_CODECS),
    first=st.integers(0, 2**50),
    gaps=st.lists(st.integers(1, 100), max_size=15),
    keys=st.lists(keys_values, min_size=16, max_size=16),
    values=st.lists(keys_values, min_size=16, max_size=16),
    timestamps=st.lists(st.integers(-1, 2**42), min_size=16, max_size=16),
)
def test_wrapper_round_trip_property(magic, codec, first, gaps, keys, values, timestamps):
    offsets = [first]
    for gap in gaps:
        offsets.append(offsets[-1] + gap)
    inner = [
        Record(o, timestamps[i] if magic == 1 else -1, keys[i], values[i]) for i, o in enumerate(offsets)
    ]
    batch = decode_legacy_entry(encode_legacy_wrapper(inner, magic=magic, codec=codec))
    assert list(batch.records) == inner
    assert batch.header.last_offset == offsets[-1]


def test_v1_relative_inner_offsets_are_based_on_the_outer_offset():
    # Inner relative offsets 0, 2, 5 under outer offset 105: absolute 100, 102, 105.
    inner = _inner([0, 2, 5], 1)
    entry = encode_legacy_wrapper(inner, magic=1, codec=fmt.COMPRESSION_GZIP, wrapper_offset=105)
    assert [r.offset for r in decode_legacy_entry(entry).records] == [100, 102, 105]


def test_v1_outer_offset_0_means_base_0():
    # Old librdkafka wrote wrappers with outer offset 0 and inner offsets 0..n-1.
    inner = _inner([0, 1, 2], 1)
    entry = encode_legacy_wrapper(inner, magic=1, codec=fmt.COMPRESSION_SNAPPY, wrapper_offset=0)
    batch = decode_legacy_entry(entry)
    assert [r.offset for r in batch.records] == [0, 1, 2]
    assert (batch.header.base_offset, batch.header.last_offset) == (0, 2)


def test_v0_inner_offsets_are_absolute_whatever_the_outer_offset():
    inner = _inner([7, 8, 9], 0)
    entry = encode_legacy_wrapper(inner, magic=0, codec=fmt.COMPRESSION_GZIP, wrapper_offset=0)
    assert [r.offset for r in decode_legacy_entry(entry).records] == [7, 8, 9]


def test_v1_log_append_time_on_the_wrapper_overrides_inner_timestamps():
    inner = _inner([10, 11, 12], 1, timestamps=[5, 6, 7])
    entry = encode_legacy_wrapper(
        inner,
        magic=1,
        codec=fmt.COMPRESSION_LZ4,
        timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME,
        wrapper_timestamp=1_700_000_000_000,
    )
    batch = decode_legacy_entry(entry)
    assert batch.header.timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    assert [r.timestamp for r in batch.records] == [1_700_000_000_000] * 3


def test_v1_create_time_wrapper_keeps_inner_timestamps_and_carries_the_largest():
    inner = _inner([10, 11, 12], 1, timestamps=[50, 90, 70])
    batch = decode_legacy_entry(encode_legacy_wrapper(inner, magic=1, codec=fmt.COMPRESSION_GZIP))
    assert [r.timestamp for r in batch.records] == [50, 90, 70]
    assert batch.header.max_timestamp == 90


def test_magic_0_lz4_wrapper_carries_the_broken_header_checksum_and_still_decodes():
    inner = _inner([3, 4], 0)
    entry = encode_legacy_wrapper(inner, magic=0, codec=fmt.COMPRESSION_LZ4)
    value = entry[fmt.LEGACY_KEY_LENGTH_OFFSET[0] + 8 :]  # after null key and value length
    correct = compress(fmt.COMPRESSION_LZ4, b"")[6]  # FLG/BD are the same, so the correct HC is too
    assert value[:4] == fmt.LZ4_FRAME_MAGIC and value[6] != correct
    assert list(decode_legacy_entry(entry).records) == inner


@pytest.mark.parametrize("magic", [0, 1])
def test_uncompressed_v0_v1_entries_are_not_wrappers(magic):
    entry = encode_legacy_message(5, b"k", b"v", magic=magic, timestamp=9 if magic else -1)
    batch = decode_legacy_entry(entry)
    assert (batch.header.base_offset, batch.header.records_count) == (5, 1)


# ---- wrapper corruption -----------------------------------------------------------------------------------------


def _wrapper_around(inner_set: bytes, *, magic: int = 1, codec: int = fmt.COMPRESSION_GZIP, offset: int = 0) -> bytes:
    return encode_legacy_message(
        offset, None, compress(codec, inner_set), magic=magic, timestamp=0 if magic else -1, attributes=codec
    )


def _value_position(magic: int) -> int:
    return fmt.LEGACY_KEY_LENGTH_OFFSET[magic] + 8  # null key length, value length


def test_nested_compression_is_corrupt():
    nested = encode_legacy_wrapper(_inner([0, 1], 1), magic=1, codec=fmt.COMPRESSION_GZIP)
    entry = _wrapper_around(nested + encode_legacy_message(2, b"k", b"v", magic=1, timestamp=0))
    with pytest.raises(CorruptRecordError, match="nesting") as info:
        decode_legacy_entry(entry)
    assert info.value.position == _value_position(1)


def test_wrapper_with_a_null_value_is_corrupt():
    entry = encode_legacy_message(0, None, None, magic=1, timestamp=0, attributes=fmt.COMPRESSION_GZIP)
    with pytest.raises(CorruptRecordError, match="null value"):
        decode_legacy_entry(entry)


def test_wrapper_with_no_inner_messages_is_corrupt():
    with pytest.raises(CorruptRecordError, match="no inner messages"):
        decode_legacy_entry(_wrapper_around(b""))


@pytest.mark.parametrize("partial_bytes", [5, 20, 30])
def test_partial_inner_entry_at_the_end_of_the_set_is_corrupt(partial_bytes):
    inner_set = encode_legacy_message(0, b"k", b"value", magic=1, timestamp=0)
    entry = _wrapper_around(inner_set + inner_set[:partial_bytes])
    with pytest.raises(CorruptRecordError, match=f"inner message at byte {len(inner_set)} ") as info:
        decode_legacy_entry(entry)
    assert type(info.value) is CorruptRecordError  # a whole wrapper: not a torn tail
    assert info.value.position == _value_position(1)


def test_inner_magic_different_from_the_wrapper_magic_is_corrupt():
    entry = _wrapper_around(encode_legacy_message(0, b"k", b"v", magic=0), magic=1)
    with pytest.raises(CorruptRecordError, match="magic 0, its wrapper magic 1"):
        decode_legacy_entry(entry)


def test_inner_offsets_that_do_not_increase_are_corrupt():
    inner_set = encode_legacy_message(5, b"a", b"1", magic=0) + encode_legacy_message(5, b"b", b"2", magic=0)
    with pytest.raises(CorruptRecordError, match="do not increase"):
        decode_legacy_entry(_wrapper_around(inner_set, magic=0))


def test_inner_message_with_a_bad_crc_is_corrupt_unless_crcs_are_not_verified():
    good = encode_legacy_message(0, b"k", b"value", magic=1, timestamp=3)
    entry = _wrapper_around(flip(good, len(good) - 1, 0x01))
    with pytest.raises(CorruptRecordError, match="inner message at byte 0 .*: byte 12: CRC-32 mismatch"):
        decode_legacy_entry(entry)
    assert decode_legacy_entry(entry, verify_crc=False).records[0].value == b"valud"  # "e" ^ 0x01


@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=LEGACY_CODEC_IDS)
def test_corrupted_compressed_value_with_a_valid_crc_is_corrupt(codec):
    entry = encode_legacy_wrapper(_inner(range(40), 1), magic=1, codec=codec)
    mutated = entry[:-3]  # the compressed stream loses its end
    mutated = fix_crc(set_size(mutated, len(mutated) - fmt.LOG_OVERHEAD))
    # the value length field still declares the longer value: fix it up too
    value_length_at = fmt.LEGACY_KEY_LENGTH_OFFSET[1] + 4
    (value_length,) = fmt.LEGACY_LENGTH.unpack_from(mutated, value_length_at)
    mutated = fix_crc(put(mutated, value_length_at, (value_length - 3).to_bytes(4, "big")))
    with pytest.raises(CorruptRecordError) as info:
        decode_legacy_entry(mutated)
    assert type(info.value) is CorruptRecordError
    assert info.value.position >= _value_position(1)


def test_wrapper_inner_set_beyond_decompressed_bytes_max_is_corrupt():
    entry = encode_legacy_wrapper(_inner(range(50), 1), magic=1, codec=fmt.COMPRESSION_GZIP)
    with pytest.raises(CorruptRecordError, match="limit"):
        decode_legacy_entry(entry, decompressed_bytes_max=100)


# ---- codecs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [4, 5, 6, 7])
def test_zstd_and_codecs_5_to_7_are_unsupported_in_legacy_messages(magic, codec):
    entry = encode_legacy_message(0, None, b"x" * 20, magic=magic, timestamp=0 if magic else -1, attributes=codec)
    for decode in (decode_legacy_header, decode_legacy_entry):
        with pytest.raises(UnsupportedFormatError, match=f"codec {codec}") as info:
            decode(entry)
        assert info.value.position == fmt.LEGACY_ATTRIBUTES_OFFSET


def test_encoders_refuse_zstd_and_v0_timestamps():
    with pytest.raises(ValueError):
        encode_legacy_wrapper(_inner([0], 1), magic=1, codec=fmt.COMPRESSION_ZSTD)
    with pytest.raises(ValueError):
        encode_legacy_message(0, None, b"", magic=0, timestamp=5)
    with pytest.raises(ValueError):
        encode_legacy_wrapper(_inner([0], 1), magic=1, codec=1, timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME)


def test_header_fields_need_only_the_header_bytes():
    for entry, header_bytes in ((V6_V0, 18), (V6_V1, 26)):
        assert peek_header(entry[:header_bytes]) == decode_legacy_header(entry)
        with pytest.raises(TruncatedBatchError):
            peek_header(entry[: header_bytes - 1])
        with pytest.raises(TruncatedBatchError):
            decode_legacy_header(entry[:header_bytes])


# ---- framing corruption -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("entry", "size_min"), [(V6_V0, 14), (V6_V1, 22)])
def test_message_size_below_the_minimum_of_its_magic_is_corrupt(entry, size_min):
    for size in (-1, 0, size_min - 1):
        with pytest.raises(CorruptRecordError, match="below the minimum") as info:
            decode_legacy_header(set_size(entry, size))
        assert not isinstance(info.value, TruncatedBatchError)
        assert info.value.position == fmt.LENGTH_OFFSET


@pytest.mark.parametrize("entry", [V6_V0, V6_V1], ids=["v0", "v1"])
def test_a_truncated_entry_raises_truncated_batch_error_at_its_start(entry):
    for cut in range(len(entry)):
        for decode in (decode_legacy_header, decode_legacy_entry):
            with pytest.raises(TruncatedBatchError) as info:
                decode(entry[:cut])
            assert info.value.position == 0


@pytest.mark.parametrize("entry", [V6_V0, V6_V1], ids=["v0", "v1"])
def test_any_byte_change_covered_by_the_crc_is_detected_at_the_crc_field(entry):
    for position in range(fmt.LEGACY_MAGIC_OFFSET, len(entry)):
        mutated = flip(entry, position, 0x01)
        assert legacy_crc(mutated, 0, len(mutated)) != zlib.crc32(entry[fmt.LEGACY_MAGIC_OFFSET :])
        with pytest.raises(CorruptRecordError):
            decode_legacy_entry(mutated)
    with pytest.raises(CorruptRecordError, match="CRC-32 mismatch") as info:
        decode_legacy_entry(flip(entry, len(entry) - 1))
    assert info.value.position == fmt.LEGACY_CRC_OFFSET


def test_unknown_magic_is_unsupported_at_byte_16():
    with pytest.raises(UnsupportedFormatError) as info:
        decode_legacy_header(put(V6_V0, fmt.LEGACY_MAGIC_OFFSET, b"\x02"))
    assert info.value.position == fmt.LEGACY_MAGIC_OFFSET


def test_bytes_left_after_the_value_are_corrupt():
    # Grow the message by one byte the fields do not account for.
    mutated = fix_crc(set_size(V6_V1 + b"\x00", 0x19 + 1))
    with pytest.raises(CorruptRecordError, match="message declared 26 bytes but its fields use 25") as info:
        decode_legacy_entry(mutated)
    assert info.value.position == fmt.LENGTH_OFFSET


def test_value_length_past_the_message_is_corrupt_not_truncated():
    value_length_at = fmt.LEGACY_KEY_LENGTH_OFFSET[1] + 4
    mutated = fix_crc(put(V6_V1, value_length_at, (4).to_bytes(4, "big")))
    with pytest.raises(CorruptRecordError, match="runs past the message") as info:
        decode_legacy_entry(mutated)
    assert type(info.value) is CorruptRecordError
    assert info.value.position == value_length_at


def test_key_length_below_minus_one_is_corrupt():
    mutated = fix_crc(put(V6_V0, fmt.LEGACY_KEY_LENGTH_OFFSET[0], (-2).to_bytes(4, "big", signed=True)))
    with pytest.raises(CorruptRecordError, match="invalid key/value length -2"):
        decode_legacy_entry(mutated)
