"""Golden bytes from docs/format.md section 6 pin the v2 and legacy codecs; byte mutations pin the checks.

Covers conformance checklist item 1 (decode V1-V11 to exactly the listed fields, re-encode uncompressed
batches to the same bytes, the CRC covers [21, end) but not the partition leader epoch), the varint
table of section 1.4, the CRC-32C self-test values, and the corruption rules of section 1.5/1.6
(each corruption reaches its own check because the CRC is fixed up after the mutation). Every vector here is
written out in docs/format.md, and a test keeps it so.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from segments.codec import format as fmt
from segments.codec.compression import compress
from segments.codec.errors import CorruptRecordError, TruncatedBatchError, UnsupportedFormatError
from segments.codec.legacy import decode_legacy_entry, decode_legacy_header
from segments.codec.records import (
    Header,
    Record,
    batch_crc,
    crc32c,
    decode_batch,
    decode_batch_header,
    decode_control_key,
    decode_end_txn_marker,
    encode_batch,
    encode_batch_from_region,
    encode_control_batch,
)
from segments.codec.varint import decode_varint, decode_varlong, encode_varint, varint_size

from ..kafka_fixtures import KAFKA_FIXTURES

# ---- the vectors, verbatim from section 6 -----------------------------------------------------------------

V1 = bytes.fromhex(
    "00000000000000000000003b00000001020318a2700000000000000000015dff7b063c0000015dff7b063c"
    "ffffffffffffffffffffffffffff0000000112000000010631323300"
)
V2 = bytes.fromhex(
    "0000000000000001000000400000000202c85cbd230000000000010000015dff7cdd6c0000015dff7cde14"
    "ffffffffffffffffffffffffffff000000020c0000000100000e00d00202010000"
)
V3 = bytes.fromhex(
    "00000000000000000000004500000000025cd8ef520000000000000000016585b6f3c10000016585b6f3c1"
    "ffffffffffffffffffffffffffff000000012600000001066864720208686b6579086876616c"
)
V4_NONE = bytes.fromhex(
    "0000000000000000000000460000000002547961fd000000000000000001588dcd5938000000000000000000"
    "000000000000000000000000000000000128000a00080102030406050607020608090a040b0c"
)
V4_GZIP = bytes.fromhex(
    "00000000000000000000005f0000000002e74acea5000100000000000001588dcd5938000000000000000000"
    "00000000000000000000000000000000011f8b080000096e8800ff001500eaff28000a00080102030406050607"
    "020608090a040b0c0300adc9586715000000"
)
V4_SNAPPY = bytes.fromhex(
    "00000000000000000000005c00000000028564b224000200000000000001588dcd5938000000000000000000"
    "000000000000000000000000000000000182534e4150505900000000010000000100000017155028000a0008"
    "0102030406050607020608090a040b0c"
)
V4_LZ4 = bytes.fromhex(
    "00000000000000000000005900000000029d1291f8000300000000000001588dcd5938000000000000000000"
    "000000000000000000000000000000000104224d186440a71500008028000a00080102030406050607020608"
    "090a040b0c000000000c3bef92"
)
V4_RECORDS_REGION = bytes.fromhex("28000a00080102030406050607020608090a040b0c")
V5_CONTROL = bytes.fromhex(
    "0000000000000000000000310000000002512e43d900200000000000000000000000000000000000000000000000"
    "000000000000000000000000000000"
)
V5_EMPTY = bytes.fromhex(
    "0000000000000000000000310000000002595fb7dd00000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000"
)
V7_COMMIT = bytes.fromhex(
    "00000000000000050000004200000000023026cf730030000000000000018bcfe568000000018bcfe568000000"
    "0000000003e80003ffffffff000000012000000008000000010c00000000000f00"
)
V7_TOMBSTONE = bytes.fromhex(
    "000000000000000a000000390000000002cfd5eff80000000000000000018bcfe568000000018bcfe56800ffff"
    "ffffffffffffffffffffffff000000010e000000026b0100"
)
V6_V1 = bytes.fromhex("000000000000000000000019478628c201000000015e1867abaeffffffff00000003313233")
V6_V0 = bytes.fromhex("000000000000000000000011feb01dbf0000ffffffff00000003313233")
# Derived from docs/format.md and checked against kafka-python's reader when written: V4 in Kafka's lz4 frame
# settings and in zstd, a tombstone batch stamped with a delete horizon, a kept empty batch, a v1 gzip wrapper.
V4_LZ4_KAFKA = bytes.fromhex(
    "000000000000000000000055000000000219d9ba31000300000000000001588dcd5938000000000000000000"
    "000000000000000000000000000000000104224d186040821500008028000a00080102030406050607020608"
    "090a040b0c00000000"
)
V4_ZSTD = bytes.fromhex(
    "00000000000000000000004f000000000250c17621000400000000000001588dcd5938000000000000000000"
    "000000000000000000000000000000000128b52ffd2015a9000028000a00080102030406050607020608090a"
    "040b0c"
)
V9_DELETE_HORIZON = bytes.fromhex(
    "000000000000000a0000003c0000000002b06ca6c80040000000000000018bd50bc4000000018bcfe568"
    "00ffffffffffffffffffffffffffff000000011400ffefb25200026b0100"
)
V10_KEPT_EMPTY = bytes.fromhex(
    "0000000000000014000000310000000302c3424a7e000000000004ffffffffffffffff0000018bcfe56804"
    "000000000000000700010000000c00000000"
)
V8_V1_GZIP_WRAPPER = bytes.fromhex(
    "00000000000000160000006ae9d86bc401010000018bcfe56816ffffffff000000541f8b0800000000000003"
    "63608003e9f2e74d058c400663f7f9a71922400653b60190642e3332802a01c94a07ba06f3c1958982951942"
    "94194295318194592d52e8812b13032b338228330200bfec7efe75000000"
)
# Real: the first batch of the __cluster_metadata-0 fixture, a KRaft LEADER_CHANGE control record (Kafka 3.8).
V11_LEADER_CHANGE = bytes.fromhex(
    "00000000000000000000004f00000001028186d1e5002000000000000001947fb47e10000001947fb47e10"
    "ffffffffffffffffffffffffffff000000013a0000000800000002260000000000010200000001000200000001"
    "000000"
)
V11_VALUE = bytes.fromhex("00000000000102000000010002000000010000")  # LeaderChangeMessage v0: leader 1, voters [1]
HORIZON_MS = 1700000000000 + 86_400_000

V4_BASE_TIMESTAMP = 1479847795000
V4_RECORD = Record(
    offset=0,
    timestamp=V4_BASE_TIMESTAMP + 5,
    key=bytes.fromhex("01020304"),
    value=bytes.fromhex("050607"),
    headers=(Header("\x08\t\n", bytes.fromhex("0b0c")),),
)

# Expected header fields: (base_offset, batch_length, partition_leader_epoch, crc, attributes,
# last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, records_count)
_HEADER_FIELDS = (
    "base_offset",
    "batch_length",
    "partition_leader_epoch",
    "crc",
    "attributes",
    "last_offset_delta",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "records_count",
)

VECTORS = {
    "V1": (
        V1,
        (0, 59, 1, 0x0318A270, 0, 0, 1503229838908, 1503229838908, -1, -1, -1, 1),
        [Record(0, 1503229838908, None, b"123")],
    ),
    "V2": (
        V2,
        (1, 64, 2, 0xC85CBD23, 0, 1, 1503229959532, 1503229959700, -1, -1, -1, 2),
        [Record(1, 1503229959532, None, b""), Record(2, 1503229959532 + 168, None, b"")],
    ),
    "V3": (
        V3,
        (0, 69, 0, 0x5CD8EF52, 0, 0, 1535546684353, 1535546684353, -1, -1, -1, 1),
        [Record(0, 1535546684353, None, b"hdr", (Header("hkey", b"hval"),))],
    ),
    "V4-none": (V4_NONE, (0, 70, 0, 0x547961FD, 0, 0, V4_BASE_TIMESTAMP, 0, 0, 0, 0, 1), [V4_RECORD]),
    "V4-gzip": (V4_GZIP, (0, 95, 0, 0xE74ACEA5, 1, 0, V4_BASE_TIMESTAMP, 0, 0, 0, 0, 1), [V4_RECORD]),
    "V4-snappy": (V4_SNAPPY, (0, 92, 0, 0x8564B224, 2, 0, V4_BASE_TIMESTAMP, 0, 0, 0, 0, 1), [V4_RECORD]),
    "V4-lz4": (V4_LZ4, (0, 89, 0, 0x9D1291F8, 3, 0, V4_BASE_TIMESTAMP, 0, 0, 0, 0, 1), [V4_RECORD]),
    "V5-control": (V5_CONTROL, (0, 49, 0, 0x512E43D9, 0x20, 0, 0, 0, 0, 0, 0, 0), []),
    "V5-empty": (V5_EMPTY, (0, 49, 0, 0x595FB7DD, 0, 0, 0, 0, 0, 0, 0, 0), []),
    "V7-commit": (
        V7_COMMIT,
        (5, 66, 0, 0x3026CF73, 0x30, 0, 1700000000000, 1700000000000, 1000, 3, -1, 1),
        [Record(5, 1700000000000, bytes.fromhex("00000001"), bytes.fromhex("00000000000f"))],
    ),
    "V7-tombstone": (
        V7_TOMBSTONE,
        (10, 57, 0, 0xCFD5EFF8, 0, 0, 1700000000000, 1700000000000, -1, -1, -1, 1),
        [Record(10, 1700000000000, b"k", None)],
    ),
    "V4-lz4-kafka": (V4_LZ4_KAFKA, (0, 85, 0, 0x19D9BA31, 3, 0, V4_BASE_TIMESTAMP, 0, 0, 0, 0, 1), [V4_RECORD]),
    "V4-zstd": (V4_ZSTD, (0, 79, 0, 0x50C17621, 4, 0, V4_BASE_TIMESTAMP, 0, 0, 0, 0, 1), [V4_RECORD]),
    "V9-horizon": (
        V9_DELETE_HORIZON,
        (10, 60, 0, 0xB06CA6C8, 0x40, 0, HORIZON_MS, 1700000000000, -1, -1, -1, 1),
        [Record(10, 1700000000000, b"k", None)],
    ),
    "V10-kept-empty": (V10_KEPT_EMPTY, (20, 49, 3, 0xC3424A7E, 0, 4, -1, 1700000000004, 7, 1, 12, 0), []),
    "V11-leader-change": (
        V11_LEADER_CHANGE,
        (0, 79, 1, 0x8186D1E5, 0x20, 0, 1737309322768, 1737309322768, -1, -1, -1, 1),
        [Record(0, 1737309322768, bytes.fromhex("00000002"), V11_VALUE)],
    ),
}
UNCOMPRESSED = ["V1", "V2", "V3", "V4-none", "V5-control", "V5-empty", "V7-commit", "V7-tombstone", "V10-kept-empty",
                "V11-leader-change"]


FORMAT_DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def test_every_vector_here_is_written_out_in_docs_format_md():
    text = FORMAT_DOC.read_text()
    written = {name: vector for name, (vector, _fields, _records) in VECTORS.items()}
    written |= {"V4-records": V4_RECORDS_REGION, "V6-v1": V6_V1, "V6-v0": V6_V0, "V8": V8_V1_GZIP_WRAPPER}
    assert [name for name, vector in written.items() if vector.hex() not in text] == []


# ---- byte-mutation helpers -----------------------------------------------------------------------------


def flip(data: bytes, position: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[position] ^= mask
    return bytes(out)


def put(data: bytes, position: int, raw: bytes) -> bytes:
    out = bytearray(data)
    out[position : position + len(raw)] = raw
    return bytes(out)


def fix_crc(batch: bytes) -> bytes:
    """The v2 batch with its CRC recomputed, so that a decoder gets past the CRC to the next check."""
    return put(batch, fmt.CRC_OFFSET, batch_crc(batch, 0, len(batch)).to_bytes(4, "big"))


def set_length(batch: bytes, batch_length: int) -> bytes:
    return put(batch, fmt.LENGTH_OFFSET, batch_length.to_bytes(4, "big"))


def strip_deltas(records):
    return [dataclasses.replace(r, timestamp_delta=None) for r in records]


# ---- decoding the vectors --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VECTORS))
def test_vector_decodes_to_exactly_the_listed_fields(name):
    data, header_fields, records = VECTORS[name]
    batch = decode_batch(data)
    assert {f: getattr(batch.header, f) for f in _HEADER_FIELDS} == dict(zip(_HEADER_FIELDS, header_fields))
    assert batch.header.magic == 2
    assert batch.header.size_bytes == len(data)
    assert strip_deltas(batch.records) == records
    assert decode_batch_header(data) == batch.header


def test_v1_record_deltas_and_attributes_are_zero():
    (record,) = decode_batch(V1).records
    assert record.timestamp_delta == 0
    assert record.attributes == 0


def test_v2_second_record_carries_timestamp_delta_168():
    records = decode_batch(V2).records
    assert [r.timestamp_delta for r in records] == [0, 168]


@pytest.mark.parametrize("name", ["V4-gzip", "V4-snappy", "V4-lz4", "V4-lz4-kafka", "V4-zstd"])
def test_compressed_v4_batches_hold_the_same_record_as_the_uncompressed_one(name):
    data = VECTORS[name][0]
    batch = decode_batch(data)
    assert batch.records == decode_batch(V4_NONE).records
    assert batch.header.compression == fmt.COMPRESSION_IDS[name.split("-")[1]]


def test_v4_uncompressed_records_region_is_the_listed_21_bytes():
    assert V4_NONE[fmt.RECORD_BATCH_OVERHEAD :] == V4_RECORDS_REGION


def test_v5_control_batch_is_an_empty_control_header():
    header = decode_batch(V5_CONTROL).header
    assert header.is_control and not header.is_transactional
    assert header.records_count == 0 and header.size_bytes == fmt.RECORD_BATCH_OVERHEAD


def test_v7_commit_marker_key_and_value_decode_to_commit_with_epoch_15():
    batch = decode_batch(V7_COMMIT)
    assert batch.header.is_control and batch.header.is_transactional
    (record,) = batch.records
    assert decode_control_key(record.key) == (0, fmt.CONTROL_TYPE_COMMIT)
    assert decode_end_txn_marker(record.value) == (0, 15)


def test_v7_tombstone_has_a_null_value_and_a_non_null_key():
    (record,) = decode_batch(V7_TOMBSTONE).records
    assert record.value is None and record.key == b"k"


# ---- re-encoding reproduces the bytes ---------------------------------------------------------------------


def _reencode(data: bytes) -> bytes:
    """Encode the decoded batch again with every header field carried over."""
    batch = decode_batch(data)
    h = batch.header
    return encode_batch(
        batch.records,
        base_offset=h.base_offset,
        compression=h.compression,
        timestamp_type=h.timestamp_type,
        is_transactional=h.is_transactional,
        is_control=h.is_control,
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        last_offset_delta=h.last_offset_delta,
        base_timestamp=h.base_timestamp,
        max_timestamp=h.max_timestamp,
    )


@pytest.mark.parametrize("name", UNCOMPRESSED)
def test_uncompressed_vector_reencodes_to_the_same_bytes(name):
    data = VECTORS[name][0]
    assert _reencode(data) == data


def test_v1_is_reproduced_by_an_encoder_given_only_the_spec_fields():
    built = encode_batch([Record(0, 1503229838908, None, b"123")], base_offset=0, partition_leader_epoch=1)
    assert built == V1


def test_v4_uncompressed_is_reproduced_from_its_records_region():
    built = encode_batch_from_region(
        V4_RECORDS_REGION,
        records_count=1,
        base_offset=0,
        last_offset_delta=0,
        base_timestamp=V4_BASE_TIMESTAMP,
        max_timestamp=0,
        attributes=0,
        partition_leader_epoch=0,
        producer_id=0,
        producer_epoch=0,
        base_sequence=0,
    )
    assert built == V4_NONE


def test_v7_commit_marker_is_reproduced_by_encode_control_batch():
    built = encode_control_batch(
        offset=5,
        control_type=fmt.CONTROL_TYPE_COMMIT,
        timestamp=1700000000000,
        producer_id=1000,
        producer_epoch=3,
        coordinator_epoch=15,
        partition_leader_epoch=0,
    )
    assert built == V7_COMMIT


def test_v7_tombstone_is_reproduced_by_encode_batch():
    built = encode_batch([Record(10, 1700000000000, b"k", None)], base_offset=10, partition_leader_epoch=0)
    assert built == V7_TOMBSTONE


def test_v5_empty_control_header_is_reproduced_by_encode_batch():
    built = encode_batch(
        [],
        base_offset=0,
        is_control=True,
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
        partition_leader_epoch=0,
        producer_id=0,
        producer_epoch=0,
        base_sequence=0,
    )
    assert built == V5_CONTROL


# ---- CRC-32C ------------------------------------------------------------------------------------------------


def test_crc32c_matches_the_self_test_values():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"a") == 0xC1D04330


@pytest.mark.parametrize("name", list(VECTORS))
def test_every_stored_crc_equals_the_crc32c_of_bytes_21_to_end(name):
    data = VECTORS[name][0]
    assert int.from_bytes(data[17:21], "big") == crc32c(data[21:])


@pytest.mark.parametrize("name", list(VECTORS))
@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_changing_any_byte_at_or_after_21_breaks_the_crc(name, mask):
    data = VECTORS[name][0]
    stored = int.from_bytes(data[17:21], "big")
    for position in range(fmt.ATTRIBUTES_OFFSET, len(data)):
        mutated = flip(data, position, mask)
        assert batch_crc(mutated, 0, len(mutated)) != stored, position
        with pytest.raises(CorruptRecordError):
            decode_batch(mutated)


@pytest.mark.parametrize("name", list(VECTORS))
def test_changing_the_partition_leader_epoch_bytes_keeps_the_crc_valid(name):
    data = VECTORS[name][0]
    original = decode_batch(data)
    for position in range(fmt.PARTITION_LEADER_EPOCH_OFFSET, fmt.MAGIC_OFFSET):
        mutated = flip(data, position)
        batch = decode_batch(mutated)  # the CRC check passes
        assert batch.records == original.records
        assert batch.header.partition_leader_epoch != original.header.partition_leader_epoch
        assert dataclasses.replace(batch.header, partition_leader_epoch=0) == dataclasses.replace(
            original.header, partition_leader_epoch=0
        )


@pytest.mark.parametrize("position", range(fmt.CRC_OFFSET, fmt.ATTRIBUTES_OFFSET))
def test_a_changed_stored_crc_is_reported_at_the_crc_field(position):
    with pytest.raises(CorruptRecordError, match="CRC-32C mismatch") as info:
        decode_batch(flip(V1, position))
    assert info.value.position == fmt.CRC_OFFSET


def test_a_record_byte_flip_is_reported_at_the_crc_field_of_a_batch_placed_after_other_bytes():
    buf = b"\x00" * 100 + flip(V3, 75)
    with pytest.raises(CorruptRecordError, match="CRC-32C mismatch") as info:
        decode_batch(buf, 100)
    assert info.value.position == 100 + fmt.CRC_OFFSET


def test_crc_check_can_be_skipped_and_then_the_flipped_value_byte_shows():
    batch = decode_batch(flip(V1, len(V1) - 2, 0x01), verify_crc=False)  # the last value byte: "3" -> "2"
    assert batch.records[0].value == b"122"


def test_v4_in_kafkas_lz4_frame_settings_is_reproduced_by_encode_batch():
    built = encode_batch([V4_RECORD], base_offset=0, compression=fmt.COMPRESSION_LZ4, partition_leader_epoch=0,
                         producer_id=0, producer_epoch=0, base_sequence=0, base_timestamp=V4_BASE_TIMESTAMP,
                         max_timestamp=0)
    assert built == V4_LZ4_KAFKA
    assert built[fmt.RECORD_BATCH_OVERHEAD : fmt.RECORD_BATCH_OVERHEAD + 7] == bytes.fromhex("04224d18604082")


def test_v9_is_v7_tombstone_stamped_with_its_delete_horizon_and_the_same_record_time():
    batch = decode_batch(V9_DELETE_HORIZON)
    assert batch.header.has_delete_horizon and batch.header.delete_horizon_ms == HORIZON_MS
    (record,) = batch.records
    assert record.timestamp_delta == 1700000000000 - HORIZON_MS
    assert decode_batch(V7_TOMBSTONE).records[0].timestamp == record.timestamp
    built = encode_batch([Record(10, 1700000000000, b"k", None)], base_offset=10, partition_leader_epoch=0,
                         delete_horizon_ms=HORIZON_MS)
    assert built == V9_DELETE_HORIZON


def test_v10_kept_empty_batch_keeps_the_offset_range_and_producer_fields():
    header = decode_batch(V10_KEPT_EMPTY).header
    assert (header.base_offset, header.last_offset, header.records_count) == (20, 24, 0)
    assert header.size_bytes == fmt.RECORD_BATCH_OVERHEAD and header.compression == fmt.COMPRESSION_NONE


def test_v11_is_the_first_batch_of_the_kraft_fixture_and_a_leader_change():
    fixture = KAFKA_FIXTURES / "public" / "__cluster_metadata-0" / "00000000000000000000.log"
    assert fixture.read_bytes()[: len(V11_LEADER_CHANGE)] == V11_LEADER_CHANGE
    batch = decode_batch(V11_LEADER_CHANGE)
    assert batch.header.is_control and not batch.header.is_transactional
    assert decode_control_key(batch.records[0].key) == (0, 2)  # LEADER_CHANGE


# ---- legacy V6 ------------------------------------------------------------------------------------------------


def test_v6_v1_message_decodes_to_the_listed_fields():
    batch = decode_legacy_entry(V6_V1)
    header = decode_legacy_header(V6_V1)
    assert header == batch.header
    assert (header.base_offset, header.magic, header.crc, header.attributes) == (0, 1, 0x478628C2, 0)
    assert header.max_timestamp == header.base_timestamp == 1503648000942
    assert header.size_bytes == len(V6_V1)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch.records] == [(0, 1503648000942, None, b"123")]


def test_v6_v0_message_decodes_to_the_listed_fields():
    batch = decode_legacy_entry(V6_V0)
    header = batch.header
    assert (header.base_offset, header.magic, header.crc, header.attributes) == (0, 0, 0xFEB01DBF, 0)
    assert header.max_timestamp == -1
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch.records] == [(0, -1, None, b"123")]


def test_v8_v1_gzip_wrapper_decodes_to_its_three_inner_messages_at_absolute_offsets():
    batch = decode_legacy_entry(V8_V1_GZIP_WRAPPER)
    header = decode_legacy_header(V8_V1_GZIP_WRAPPER)
    assert (header.base_offset, header.magic, header.crc, header.attributes) == (22, 1, 0xE9D86BC4, 1)
    assert header.max_timestamp == 1700000000022
    assert [(r.offset, r.timestamp, r.key, r.value) for r in batch.records] == [
        (20, 1700000000020, b"k0", b"v20"), (21, 1700000000021, b"k1", b"v21"), (22, 1700000000022, b"k2", b"v22")
    ]


# ---- varints (section 1.4) ----------------------------------------------------------------------------------

VARINT_TABLE = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (8191, "fe7f"),
    (8192, "808001"),
]


@pytest.mark.parametrize(("value", "encoded"), VARINT_TABLE)
def test_varint_table_encodes_and_decodes(value, encoded):
    raw = bytes.fromhex(encoded)
    assert encode_varint(value) == raw
    assert varint_size(value) == len(raw)
    assert decode_varint(raw, 0, len(raw)) == (value, len(raw))
    assert decode_varlong(raw, 0, len(raw)) == (value, len(raw))


@pytest.mark.parametrize("value", [2**31 - 1, -(2**31)])
def test_int32_extremes_take_five_bytes_as_a_varint(value):
    raw = encode_varint(value)
    assert len(raw) == fmt.VARINT_BYTES_MAX
    assert decode_varint(raw, 0, len(raw)) == (value, len(raw))


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63)])
def test_int64_extremes_take_ten_bytes_as_a_varlong(value):
    raw = encode_varint(value)
    assert len(raw) == fmt.VARLONG_BYTES_MAX
    assert decode_varlong(raw, 0, len(raw)) == (value, len(raw))


def test_varint_longer_than_five_bytes_is_rejected():
    raw = bytes.fromhex("808080808001")
    with pytest.raises(CorruptRecordError, match="longer than 5") as info:
        decode_varint(raw, 0, len(raw))
    assert not isinstance(info.value, TruncatedBatchError)


def test_varlong_longer_than_ten_bytes_is_rejected():
    raw = bytes.fromhex("80" * 10 + "01")
    with pytest.raises(CorruptRecordError, match="longer than 10"):
        decode_varlong(raw, 0, len(raw))


def test_five_byte_varint_whose_value_does_not_fit_32_bits_is_rejected():
    raw = encode_varint(2**31)  # zigzag 2**32: five bytes, but 33 bits
    assert len(raw) == 5
    with pytest.raises(CorruptRecordError, match="32 bits"):
        decode_varint(raw, 0, len(raw))


def test_varint_cut_short_by_the_end_is_truncated():
    raw = bytes.fromhex("8080")
    with pytest.raises(TruncatedBatchError):
        decode_varint(raw, 0, len(raw))


# ---- corruption: each reaches its own check because the CRC is fixed up --------------------------------------


@pytest.mark.parametrize("cut", range(len(V1)))
def test_a_truncated_batch_raises_truncated_batch_error_at_its_start(cut):
    with pytest.raises(TruncatedBatchError) as info:
        decode_batch(V1[:cut])
    assert info.value.position == 0


def test_a_changed_magic_is_unsupported_at_byte_16():
    with pytest.raises(UnsupportedFormatError) as info:
        decode_batch(put(V1, fmt.MAGIC_OFFSET, b"\x03"))
    assert info.value.position == fmt.MAGIC_OFFSET


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_invalid_codec_5_to_7_is_unsupported_at_the_attributes(codec):
    mutated = fix_crc(put(V1, fmt.ATTRIBUTES_OFFSET, codec.to_bytes(2, "big")))
    with pytest.raises(UnsupportedFormatError, match="codec") as info:
        decode_batch(mutated)
    assert info.value.position == fmt.ATTRIBUTES_OFFSET


def test_batch_length_below_49_is_corrupt_at_the_length_field():
    mutated = set_length(V1, 48)
    with pytest.raises(CorruptRecordError, match="below the minimum") as info:
        decode_batch(mutated)
    assert not isinstance(info.value, TruncatedBatchError)
    assert info.value.position == fmt.LENGTH_OFFSET


@pytest.mark.parametrize("batch_length", [5, 20, 48])
def test_a_whole_batch_shorter_than_a_header_is_corrupt_even_at_the_end_of_the_buffer(batch_length):
    # The declared batch (12 + batch_length bytes) fits in the buffer, so this is not a torn tail.
    mutated = set_length(V1, batch_length)[: fmt.LOG_OVERHEAD + max(batch_length, 5)]
    for decode in (decode_batch, decode_batch_header):
        with pytest.raises(CorruptRecordError, match="below the minimum") as info:
            decode(mutated)
        assert not isinstance(info.value, TruncatedBatchError)
        assert info.value.position == fmt.LENGTH_OFFSET


def test_bytes_left_after_records_count_records_is_an_incorrect_declared_batch_size():
    # V2 holds two records of 7 and 8 bytes; declare one record: 8 bytes remain after it.
    mutated = fix_crc(put(V2, fmt.RECORDS_COUNT_OFFSET, (1).to_bytes(4, "big")))
    with pytest.raises(CorruptRecordError, match="incorrect declared batch size") as info:
        decode_batch(mutated)
    assert info.value.position == fmt.RECORD_BATCH_OVERHEAD + 7


def test_more_declared_records_than_present_is_corrupt_not_a_torn_tail():
    mutated = fix_crc(put(V1, fmt.RECORDS_COUNT_OFFSET, (2).to_bytes(4, "big")))
    with pytest.raises(CorruptRecordError, match="records run past") as info:
        decode_batch(mutated)
    assert not isinstance(info.value, TruncatedBatchError)
    assert info.value.position == len(V1)


def test_record_length_larger_than_its_fields_is_corrupt_at_the_record_start():
    # V1's record declares 9 bytes; declare 10 and pad the batch by one byte so the record still fits.
    mutated = put(V1, fmt.RECORD_BATCH_OVERHEAD, encode_varint(10)) + b"\x00"
    mutated = fix_crc(set_length(mutated, len(mutated) - fmt.LOG_OVERHEAD))
    with pytest.raises(CorruptRecordError, match="record declared 10 bytes but its fields use 9") as info:
        decode_batch(mutated)
    assert info.value.position == fmt.RECORD_BATCH_OVERHEAD


def test_record_length_smaller_than_its_fields_is_corrupt():
    mutated = fix_crc(put(V1, fmt.RECORD_BATCH_OVERHEAD, encode_varint(8)))
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(mutated)
    assert not isinstance(info.value, TruncatedBatchError)


def test_value_length_past_the_record_is_corrupt():
    # the value length varint of V1 sits at 61 + 5 = 66 ("06" = 3); make it 100
    mutated = fix_crc(put(V1, 66, encode_varint(100)))
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(mutated)
    assert not isinstance(info.value, TruncatedBatchError)


def test_negative_header_count_is_corrupt():
    mutated = fix_crc(put(V1, len(V1) - 1, encode_varint(-1)))
    with pytest.raises(CorruptRecordError, match="header count"):
        decode_batch(mutated)


def test_offset_deltas_out_of_order_are_corrupt():
    # V2's second record has offset delta 1 at byte 61 + 7 + 4; make it 0 (equal to the first)
    mutated = fix_crc(put(V2, 61 + 7 + 4, encode_varint(0)))
    with pytest.raises(CorruptRecordError, match="out of order"):
        decode_batch(mutated)


def test_offset_delta_past_last_offset_delta_is_corrupt():
    mutated = fix_crc(put(V2, 23, (0).to_bytes(4, "big")))  # lastOffsetDelta 1 -> 0
    with pytest.raises(CorruptRecordError, match="past last offset delta"):
        decode_batch(mutated)


@pytest.mark.parametrize("name", ["V4-gzip", "V4-snappy", "V4-lz4"])
def test_a_corrupted_compressed_stream_with_a_valid_crc_is_corrupt_not_truncated(name):
    data = VECTORS[name][0]
    # Drop the stream's last byte: every codec notices (gzip/lz4 trailer, snappy block length).
    mutated = data[:-1]
    mutated = fix_crc(set_length(mutated, len(mutated) - fmt.LOG_OVERHEAD))
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(mutated)
    assert type(info.value) is CorruptRecordError
    assert fmt.RECORD_BATCH_OVERHEAD <= info.value.position < len(mutated)


def test_a_flipped_byte_inside_a_gzip_stream_with_a_valid_crc_is_corrupt():
    mutated = fix_crc(flip(V4_GZIP, fmt.RECORD_BATCH_OVERHEAD + 12))
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(mutated)
    assert info.value.position >= fmt.RECORD_BATCH_OVERHEAD


def test_compressed_records_that_do_not_parse_are_reported_at_the_compressed_region():
    # A gzip stream of garbage records: the error points at the start of the compressed region.
    region = compress(fmt.COMPRESSION_GZIP, b"\x7f\x7f\x7f")
    batch = encode_batch_from_region(
        b"\x7f\x7f\x7f", records_count=1, base_offset=0, last_offset_delta=0,
        base_timestamp=0, max_timestamp=0, attributes=fmt.COMPRESSION_GZIP,
    )
    assert batch[fmt.RECORD_BATCH_OVERHEAD :] == region
    with pytest.raises(CorruptRecordError) as info:
        decode_batch(batch)
    assert info.value.position == fmt.RECORD_BATCH_OVERHEAD
