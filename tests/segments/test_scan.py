"""The bulk scan against the object path (`segments.codec.records`), the spec's test vectors, hand-built legacy
messages, kafka-python's legacy builder, the real-broker fixtures, and byte-mutation corruption cases."""

from __future__ import annotations

import mmap
import random
import struct
import zlib
from pathlib import Path

import crc32c
import numpy as np
import pytest

from segments.codec import format as fmt
from segments.codec.compression import compress
from segments.codec.errors import CorruptRecordError, UnsupportedFormatError
from segments.codec.records import (
    Header,
    Record,
    decode_batch,
    encode_batch,
    encode_batch_from_region,
    encode_control_batch,
    encode_record,
)
from segments.codec.scan import ScanBuffers, scan, warm_up

from ..kafka_fixtures import KAFKA_FIXTURES

CODECS = (fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD)


# ---- helpers -------------------------------------------------------------------------------------------------


def random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def random_field(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.15:
        return None
    if roll < 0.25:
        return b""
    if roll < 0.90:
        return random_bytes(rng, rng.randrange(1, 40))
    return random_bytes(rng, rng.choice((70, 300, 9000)))  # multi-byte length varints


def random_batch(rng: random.Random, base_offset: int) -> tuple[bytes, int]:
    """A random v2 batch built with the object-path encoder; returns (bytes, next base offset)."""
    kind = rng.random()
    if kind < 0.08:
        batch = encode_control_batch(
            offset=base_offset,
            control_type=rng.choice((fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT)),
            timestamp=1_700_000_000_000,
            producer_id=rng.randrange(1000),
            producer_epoch=rng.randrange(10),
            coordinator_epoch=rng.randrange(100),
            partition_leader_epoch=rng.randrange(-1, 50),
        )
        return batch, base_offset + 1
    if kind < 0.16:
        last_offset_delta = rng.randrange(0, 100)
        batch = encode_batch(
            [],
            base_offset=base_offset,
            last_offset_delta=last_offset_delta,
            max_timestamp=rng.randrange(-1, 2**41),
            producer_id=rng.choice((-1, 7)),
            producer_epoch=rng.choice((-1, 3)),
            base_sequence=rng.choice((-1, 12)),
            is_control=rng.random() < 0.5,
        )
        return batch, base_offset + last_offset_delta + 1
    n = rng.randrange(1, 25)
    offset = base_offset
    records = []
    base_ts = 1_700_000_000_000 + rng.randrange(10**9)
    for _ in range(n):
        headers = tuple(
            Header(f"h{h}" * rng.randrange(1, 4), random_field(rng)) for h in range(rng.choice((0, 0, 0, 1, 3)))
        )
        records.append(
            Record(
                offset=offset,
                timestamp=base_ts + rng.randrange(-5000, 5000),
                key=random_field(rng),
                value=random_field(rng),
                headers=headers,
            )
        )
        offset += rng.choice((1, 1, 1, 2, 70, 9000))
    log_append_time = rng.random() < 0.2
    horizon = rng.random() < 0.2
    batch = encode_batch(
        records,
        base_offset=base_offset,
        compression=rng.choice(CODECS),
        timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME if log_append_time else fmt.TIMESTAMP_CREATE_TIME,
        is_transactional=rng.random() < 0.2,
        partition_leader_epoch=rng.randrange(-1, 50),
        producer_id=rng.choice((-1, rng.randrange(2**40))),
        producer_epoch=rng.choice((-1, rng.randrange(2**15))),
        base_sequence=rng.choice((-1, rng.randrange(2**31))),
        max_timestamp=base_ts + 99_999 if log_append_time else None,
        delete_horizon_ms=base_ts + 86_400_000 if horizon else None,
        last_offset_delta=records[-1].offset - base_offset + rng.choice((0, 0, 5)),
    )
    return batch, offset + 10


def random_segment(seed: int, n_batches: int = 30) -> bytes:
    rng = random.Random(seed)
    offset = rng.randrange(2**40)
    parts = []
    for _ in range(n_batches):
        batch, offset = random_batch(rng, offset)
        parts.append(batch)
    return b"".join(parts)


def batch_starts(data: bytes) -> list[int]:
    """Positions of the batches in `data`, from the 12-byte prefixes alone."""
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += struct.unpack_from(">i", data, pos + 8)[0] + fmt.LOG_OVERHEAD
    return starts


def fix_crc(data: bytearray, pos: int) -> None:
    """Recompute the CRC-32C of the v2 batch at `pos`, so that checks after the CRC are reached."""
    size = struct.unpack_from(">i", data, pos + 8)[0] + fmt.LOG_OVERHEAD
    crc = crc32c.crc32c(bytes(data[pos + fmt.ATTRIBUTES_OFFSET : pos + size]))
    struct.pack_into(">I", data, pos + fmt.CRC_OFFSET, crc)


def flip(data: bytes, pos: int) -> bytearray:
    out = bytearray(data)
    out[pos] ^= 0xFF
    return out


def length_prefixed(field: bytes | None) -> bytes:
    return struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field


def legacy_entry(
    offset: int, magic: int, key: bytes | None, value: bytes | None, *, attributes: int = 0, timestamp: int = -1
) -> bytes:
    """One v0/v1 entry built from spec section 2: offset, size, crc, magic, attributes, [timestamp], key, value."""
    body = bytes((magic, attributes))
    if magic == 1:
        body += struct.pack(">q", timestamp)
    body += length_prefixed(key) + length_prefixed(value)
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", offset, len(message)) + message


def legacy_wrapper(
    outer_offset: int, magic: int, codec: int, inner: bytes, *, timestamp: int = -1, log_append_time: bool = False
) -> bytes:
    attributes = codec | (fmt.LEGACY_TIMESTAMP_TYPE_MASK if log_append_time else 0)
    return legacy_entry(outer_offset, magic, None, compress(codec, inner), attributes=attributes, timestamp=timestamp)


def assert_matches_object_path(data: bytes, result, *, base_position: int = 0) -> None:
    """Every batch and record field of the scan equals `decode_batch`'s, and raw record bytes re-encode."""
    starts = batch_starts(data)
    assert result.n_batches == len(starts)
    assert result.batch_position.tolist() == [base_position + s for s in starts]
    assert result.record_start[0] == 0 and result.record_start[-1] == result.n_records
    for i, pos in enumerate(starts):
        batch = decode_batch(data, pos)
        h = batch.header
        assert result.batch_size[i] == h.size_bytes
        assert result.magic[i] == h.magic
        assert result.attributes[i] == h.attributes
        assert result.partition_leader_epoch[i] == h.partition_leader_epoch
        assert result.crc[i] == h.crc
        assert result.base_offset[i] == h.base_offset
        assert result.last_offset[i] == h.last_offset
        assert result.base_timestamp[i] == h.base_timestamp
        assert result.max_timestamp[i] == h.max_timestamp
        assert result.delete_horizon_ms[i] == (-1 if h.delete_horizon_ms is None else h.delete_horizon_ms)
        assert result.producer_id[i] == h.producer_id
        assert result.producer_epoch[i] == h.producer_epoch
        assert result.base_sequence[i] == h.base_sequence
        assert result.records_count[i] == h.records_count
        assert result.compression[i] == h.compression
        assert result.is_control[i] == h.is_control
        assert result.is_transactional[i] == h.is_transactional
        assert result.records_in_arena[i] == (h.compression != 0)
        lo, hi = int(result.record_start[i]), int(result.record_start[i + 1])
        assert hi - lo == len(batch.records)
        raw = []
        for r, record in zip(range(lo, hi), batch.records):
            assert result.batch_index[r] == i
            assert result.offset[r] == record.offset
            assert result.timestamp[r] == record.timestamp
            assert result.key_bytes(r) == record.key
            assert result.value_bytes(r) == record.value
            assert result.key_len[r] == (-1 if record.key is None else len(record.key))
            assert result.value_len[r] == (-1 if record.value is None else len(record.value))
            assert result.is_tombstone[r] == (record.value is None)
            raw.append(result.record_bytes(r))
            if not result.records_in_arena[i]:
                assert pos + fmt.RECORD_BATCH_OVERHEAD <= result.record_pos[r] < pos + h.size_bytes
        # The raw record bytes are what the cleaner copies into a rebuilt batch: they must re-decode.
        if batch.records:
            rebuilt = encode_batch_from_region(
                b"".join(raw),
                records_count=len(raw),
                base_offset=h.base_offset,
                last_offset_delta=h.last_offset_delta,
                base_timestamp=h.base_timestamp,
                max_timestamp=h.max_timestamp,
                attributes=h.attributes,
                partition_leader_epoch=h.partition_leader_epoch,
                producer_id=h.producer_id,
                producer_epoch=h.producer_epoch,
                base_sequence=h.base_sequence,
            )
            assert decode_batch(rebuilt).records == batch.records


@pytest.fixture(scope="module", autouse=True)
def _compiled():
    warm_up()


# ---- model: the scan equals the object path ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_scan_matches_decode_batch_for_random_batches_of_every_codec(seed):
    data = random_segment(seed)
    result = scan(data)
    assert result.end_position == len(data) and not result.torn_tail and not result.limit_reached
    assert_matches_object_path(data, result)


def test_scan_covers_every_codec_control_empty_horizon_and_log_append_time():
    rng = random.Random(99)
    data = b"".join(random_batch(rng, 1000 * i)[0] for i in range(120))
    result = scan(data)
    assert set(result.compression.tolist()) == set(CODECS)
    assert result.is_control.any() and (result.records_count == 0).any()
    assert result.has_delete_horizon.any() and result.timestamp_type.any() and result.is_transactional.any()
    assert_matches_object_path(data, result)


def test_base_position_makes_batch_positions_file_positions_but_record_positions_stay_buffer_indexes():
    data = random_segment(3, 5)
    result = scan(data, base_position=10_000)
    assert_matches_object_path(data, result, base_position=10_000)
    assert result.start_position == 10_000 and result.end_position == 10_000 + len(data)
    assert (result.batch_buffer_pos == np.array(batch_starts(data))).all()


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy", "mmap"])
def test_every_buffer_type_scans_alike(kind, tmp_path):
    data = random_segment(5, 10)
    if kind == "mmap":
        path = tmp_path / "seg.log"
        path.write_bytes(data)
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = mm
    else:
        buf = {
            "bytes": data,
            "bytearray": bytearray(data),
            "memoryview": memoryview(data),
            "numpy": np.frombuffer(data, dtype=np.uint8).copy(),
        }[kind]
    result = scan(buf)
    assert_matches_object_path(data, result)


def test_scan_buffers_reuse_gives_the_same_records():
    buffers = ScanBuffers()
    for seed in (1, 2, 1):
        data = random_segment(seed, 15)
        reused = scan(data, buffers=buffers)
        assert_matches_object_path(data, reused)


def test_the_kept_arena_grows_with_room_up_to_its_limit_so_slightly_larger_windows_reuse_it():
    buffers = ScanBuffers()
    arenas = [buffers.arena(1000 + grow, 1_000_000) for grow in range(0, 250, 7)]  # each window a little larger
    assert {len(a) for a in arenas} == {1250}  # a quarter more than the first window asked: one arena for them all
    assert len(buffers.arena(1300, 1_000_000)) == 2500  # past it: twice as large
    capped = ScanBuffers()
    assert len(capped.arena(600, 700)) == 700  # with room, but not past the limit
    assert len(capped.arena(650, 700)) == 700  # the same arena
    assert len(capped.arena(800, 700)) == 800  # never below the size asked


def test_key_spans_group_keys_by_source_buffer():
    data = random_segment(7, 40)
    result = scan(data)
    seen = []
    for group in result.key_spans():
        for pos, length, r in zip(group.key_pos, group.key_len, group.record_index):
            key = None if length < 0 else group.buffer[pos : pos + length].tobytes()
            assert key == result.key_bytes(int(r))
        seen.extend(group.record_index.tolist())
    assert sorted(seen) == list(range(result.n_records))
    assert len(result.key_spans()) == 2  # this segment has both compressed and uncompressed batches
    mask = result.is_tombstone
    assert sorted(i for g in result.key_spans(mask) for i in g.record_index.tolist()) == np.flatnonzero(mask).tolist()


# ---- golden vectors (docs/format.md section 6) --------------------------------------------------------------------

V1 = "00000000000000000000003b00000001020318a2700000000000000000015dff7b063c0000015dff7b063cffffffffffffffffffffffffffff0000000112000000010631323300"
V2 = "0000000000000001000000400000000202c85cbd230000000000010000015dff7cdd6c0000015dff7cde14ffffffffffffffffffffffffffff000000020c0000000100000e00d00202010000"
V3 = "00000000000000000000004500000000025cd8ef520000000000000000016585b6f3c10000016585b6f3c1ffffffffffffffffffffffffffff000000012600000001066864720208686b6579086876616c"
V4_GZIP = "00000000000000000000005f0000000002e74acea5000100000000000001588dcd593800000000000000000000000000000000000000000000000000011f8b080000096e8800ff001500eaff28000a00080102030406050607020608090a040b0c0300adc9586715000000"
V4_SNAPPY = "00000000000000000000005c00000000028564b224000200000000000001588dcd5938000000000000000000000000000000000000000000000000000182534e4150505900000000010000000100000017155028000a00080102030406050607020608090a040b0c"
V4_LZ4 = "00000000000000000000005900000000029d1291f8000300000000000001588dcd5938000000000000000000000000000000000000000000000000000104224d186440a71500008028000a00080102030406050607020608090a040b0c000000000c3bef92"
V5 = "0000000000000000000000310000000002512e43d900200000000000000000000000000000000000000000000000000000000000000000000000000000"
V7 = "00000000000000050000004200000000023026cf730030000000000000018bcfe568000000018bcfe5680000000000000003e80003ffffffff000000012000000008000000010c00000000000f00"
V7_TOMBSTONE = "000000000000000a000000390000000002cfd5eff80000000000000000018bcfe568000000018bcfe56800ffffffffffffffffffffffffffff000000010e000000026b0100"
V6_V1 = "000000000000000000000019478628c201000000015e1867abaeffffffff00000003313233"
V6_V0 = "000000000000000000000011feb01dbf0000ffffffff00000003313233"


def test_golden_v2_vectors_scan_to_the_documented_fields():
    data = bytes.fromhex(V1 + V2 + V3 + V5 + V7 + V7_TOMBSTONE)
    result = scan(data)
    assert result.n_batches == 6
    assert result.crc.tolist() == [0x0318A270, 0xC85CBD23, 0x5CD8EF52, 0x512E43D9, 0x3026CF73, 0xCFD5EFF8]
    assert result.partition_leader_epoch[:3].tolist() == [1, 2, 0]
    assert result.records_count.tolist() == [1, 2, 1, 0, 1, 1]
    assert result.is_control.tolist() == [False, False, False, True, True, False]
    assert result.offset.tolist() == [0, 1, 2, 0, 5, 10]
    assert result.timestamp[:3].tolist() == [1503229838908, 1503229959532, 1503229959532 + 168]
    assert [result.value_bytes(r) for r in range(result.n_records)] == [b"123", b"", b"", b"hdr", bytes.fromhex("00000000000f"), None]
    assert [result.key_bytes(r) for r in range(result.n_records)] == [None, None, None, None, bytes.fromhex("00000001"), b"k"]
    assert_matches_object_path(data, result)


def test_golden_compressed_vectors_decode_to_the_same_record():
    data = bytes.fromhex(V4_GZIP + V4_SNAPPY + V4_LZ4)
    result = scan(data)
    assert result.compression.tolist() == [1, 2, 3]
    assert result.records_in_arena.all()
    for r in range(3):
        assert result.record_bytes(r) == bytes.fromhex("28000a00080102030406050607020608090a040b0c")
        assert result.key_bytes(r) == bytes.fromhex("01020304") and result.value_bytes(r) == bytes.fromhex("050607")
        assert result.timestamp[r] == 1479847795000 + 5
    assert_matches_object_path(data, result)


def test_golden_legacy_vectors_scan_as_one_record_batches():
    data = bytes.fromhex(V6_V1 + V6_V0)
    result = scan(data)
    assert result.magic.tolist() == [1, 0]
    assert result.crc.tolist() == [0x478628C2, 0xFEB01DBF]
    assert result.max_timestamp.tolist() == [1503648000942, -1]
    assert result.timestamp.tolist() == [1503648000942, -1]
    assert result.offset.tolist() == [0, 0] and result.records_count.tolist() == [1, 1]
    assert [result.value_bytes(r) for r in range(2)] == [b"123", b"123"]
    assert [result.key_bytes(r) for r in range(2)] == [None, None]
    assert result.record_bytes(0) == bytes.fromhex(V6_V1)  # an uncompressed legacy record is its whole entry
    assert result.producer_id.tolist() == [-1, -1] and result.delete_horizon_ms.tolist() == [-1, -1]
    assert not result.is_control.any() and result.is_legacy.all()


# ---- legacy v0/v1 ------------------------------------------------------------------------------------------------


def test_uncompressed_legacy_messages_keep_their_offsets_keys_and_values():
    entries = [
        legacy_entry(5, 0, b"a", b"1"),
        legacy_entry(6, 0, None, b"2"),
        legacy_entry(7, 1, b"b", None, timestamp=1_600_000_000_000),
        legacy_entry(9, 1, b"", b"", timestamp=1_600_000_000_001, attributes=fmt.LEGACY_TIMESTAMP_TYPE_MASK),
    ]
    result = scan(b"".join(entries))
    assert result.offset.tolist() == [5, 6, 7, 9]
    assert result.base_offset.tolist() == result.last_offset.tolist() == [5, 6, 7, 9]
    assert [result.key_bytes(r) for r in range(4)] == [b"a", None, b"b", b""]
    assert [result.value_bytes(r) for r in range(4)] == [b"1", b"2", None, b""]
    assert result.timestamp.tolist() == [-1, -1, 1_600_000_000_000, 1_600_000_000_001]
    assert result.timestamp_type.tolist() == [0, 0, 0, 1]
    assert [result.record_bytes(r) for r in range(4)] == entries


@pytest.mark.parametrize("codec", [fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4])
def test_v1_wrapper_inner_relative_offsets_become_absolute(codec):
    inner = [legacy_entry(i, 1, b"k%d" % i, b"v" * i, timestamp=1_000 + i) for i in range(10)]
    data = legacy_wrapper(1009, 1, codec, b"".join(inner), timestamp=1_009)
    result = scan(data)
    assert result.n_batches == 1 and result.records_count.tolist() == [10]
    assert result.base_offset.tolist() == [1000] and result.last_offset.tolist() == [1009]
    assert result.offset.tolist() == list(range(1000, 1010))
    assert result.timestamp.tolist() == [1_000 + i for i in range(10)]
    assert [result.key_bytes(r) for r in range(10)] == [b"k%d" % i for i in range(10)]
    assert [result.value_bytes(r) for r in range(10)] == [b"v" * i for i in range(10)]
    assert [result.record_bytes(r) for r in range(10)] == inner  # inner entries, verbatim, in the arena
    assert result.records_in_arena.tolist() == [True]


def test_v1_log_append_time_wrapper_overrides_inner_timestamps():
    inner = b"".join(legacy_entry(i, 1, b"k", b"v", timestamp=5) for i in range(3))
    result = scan(legacy_wrapper(42, 1, fmt.COMPRESSION_GZIP, inner, timestamp=777, log_append_time=True))
    assert result.timestamp.tolist() == [777, 777, 777]
    assert result.offset.tolist() == [40, 41, 42]


def test_v0_wrapper_inner_offsets_are_absolute():
    inner = b"".join(legacy_entry(o, 0, b"k", b"v%d" % o) for o in (100, 101, 105))
    result = scan(legacy_wrapper(105, 0, fmt.COMPRESSION_GZIP, inner))
    assert result.offset.tolist() == [100, 101, 105]
    assert result.base_offset.tolist() == [100] and result.last_offset.tolist() == [105]
    assert result.timestamp.tolist() == [-1, -1, -1]


def test_v1_wrapper_with_outer_offset_zero_means_base_zero():
    inner = b"".join(legacy_entry(i, 1, b"k", b"v", timestamp=1) for i in range(3))
    result = scan(legacy_wrapper(0, 1, fmt.COMPRESSION_GZIP, inner))
    assert result.offset.tolist() == [0, 1, 2]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [1, 2, 3])
def test_legacy_wrappers_from_kafka_python_scan_like_kafka_python_reads_them(magic, codec):
    from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder

    if magic == 0 and codec == fmt.COMPRESSION_LZ4:
        pytest.importorskip("xxhash", reason="kafka-python needs xxhash for magic-0 lz4 (the broken checksum)")
    rng = random.Random(magic * 10 + codec)
    parts = []
    next_offset = 50
    for _ in range(4):
        builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
        n = rng.randrange(1, 8)
        for i in range(n):
            inner_offset = i if magic == 1 else next_offset + i
            builder.append(inner_offset, timestamp=1_500_000_000_000 + i, key=random_field(rng), value=random_field(rng))
        wrapper = bytearray(builder.build())
        struct.pack_into(">q", wrapper, 0, next_offset + n - 1)  # the broker's offset; not covered by the CRC
        parts.append(bytes(wrapper))
        parts.append(legacy_entry(next_offset + n, magic, b"plain", b"x", timestamp=3))
        next_offset += n + 1
    data = b"".join(parts)
    result = scan(data)
    expected = []
    for part in parts:
        expected.extend(LegacyRecordBatch(part, magic))
    assert result.n_records == len(expected)
    for r, record in enumerate(expected):
        assert result.offset[r] == record.offset
        assert result.key_bytes(r) == (None if record.key is None else bytes(record.key))
        assert result.value_bytes(r) == (None if record.value is None else bytes(record.value))
        assert result.timestamp[r] == (-1 if record.timestamp is None else record.timestamp)


def test_legacy_and_v2_batches_mix_in_one_buffer():
    v2 = encode_batch([Record(offset=20, timestamp=9, key=b"x", value=b"y")], base_offset=20)
    inner = b"".join(legacy_entry(i, 1, b"k", b"v", timestamp=1) for i in range(2))
    data = legacy_entry(10, 0, b"a", b"b") + legacy_wrapper(12, 1, fmt.COMPRESSION_GZIP, inner) + v2
    result = scan(data)
    assert result.magic.tolist() == [0, 1, 2]
    assert result.offset.tolist() == [10, 11, 12, 20]
    assert result.batch_index.tolist() == [0, 1, 1, 2]
    assert result.record_start.tolist() == [0, 1, 3, 4]


def test_headers_only_leaves_wrapper_inner_fields_unknown_and_records_empty():
    inner = b"".join(legacy_entry(i, 1, b"k", b"v", timestamp=1) for i in range(2))
    data = random_segment(4, 8) + legacy_wrapper(12, 1, fmt.COMPRESSION_GZIP, inner)
    full = scan(data)
    headers = scan(data, headers_only=True)
    assert headers.n_records == 0 and len(headers.record_start) == 0 and len(headers.arena) == 0
    assert headers.batch_position.tolist() == full.batch_position.tolist()
    assert headers.last_offset.tolist() == full.last_offset.tolist()
    assert headers.base_offset[:-1].tolist() == full.base_offset[:-1].tolist()
    assert headers.records_count[:-1].tolist() == full.records_count[:-1].tolist()
    assert headers.base_offset[-1] == -1 and headers.records_count[-1] == -1
    assert headers.crc.tolist() == full.crc.tolist() and headers.max_timestamp.tolist() == full.max_timestamp.tolist()


def test_bad_legacy_crc_is_corruption_at_the_crc_field():
    entry = bytearray(legacy_entry(0, 1, b"k", b"value", timestamp=1))
    entry[-1] ^= 1
    data = legacy_entry(0, 0, b"a", b"b") + bytes(entry)
    with pytest.raises(CorruptRecordError, match="CRC-32 mismatch") as exc:
        scan(data, base_position=100)
    assert exc.value.position == 100 + len(legacy_entry(0, 0, b"a", b"b")) + fmt.LEGACY_CRC_OFFSET
    assert scan(data, verify_crc=False).n_records == 2


def test_bad_inner_legacy_crc_is_reported_at_the_wrapper_value():
    inner = bytearray(b"".join(legacy_entry(i, 1, b"k", b"v", timestamp=1) for i in range(3)))
    inner[-1] ^= 1
    data = legacy_wrapper(2, 1, fmt.COMPRESSION_GZIP, bytes(inner))
    with pytest.raises(CorruptRecordError, match="inner message 2") as exc:
        scan(data)
    value_pos = 12 + 4 + 2 + 8 + 4 + 4  # prefix, crc, magic+attributes, timestamp, null key, value length
    assert exc.value.position == value_pos
    assert scan(data, verify_crc=False).n_records == 3


@pytest.mark.parametrize(
    "inner, match",
    [
        (legacy_entry(0, 0, b"k", b"v"), "does not match wrapper magic"),
        (legacy_wrapper(0, 1, fmt.COMPRESSION_GZIP, legacy_entry(0, 1, b"k", b"v")), "nesting is not allowed"),
        (b"", "holds no inner messages"),
        (legacy_entry(1, 1, b"k", b"v") + legacy_entry(0, 1, b"k", b"v"), "does not follow"),
        (legacy_entry(0, 1, b"k", b"v")[:-1], "runs past the wrapper's decompressed value"),
    ],
)
def test_invalid_wrapper_contents_are_corruption(inner, match):
    with pytest.raises(CorruptRecordError, match=match):
        scan(legacy_wrapper(5, 1, fmt.COMPRESSION_GZIP, inner))


def test_wrapper_with_null_value_is_corruption():
    data = legacy_entry(3, 1, None, None, attributes=fmt.COMPRESSION_GZIP, timestamp=1)
    with pytest.raises(CorruptRecordError, match="null value"):
        scan(data)


def test_legacy_zstd_is_unsupported():
    data = legacy_entry(3, 1, None, b"xx", attributes=fmt.COMPRESSION_ZSTD, timestamp=1)
    with pytest.raises(UnsupportedFormatError):
        scan(data)


# ---- real broker data ------------------------------------------------------------------------------------------------


def scan_file(path: Path):
    data = path.read_bytes()
    result = scan(data)
    assert result.end_position == len(data) and not result.torn_tail
    return data, result


def test_kafka_24_raw_partition_has_the_documented_counts():
    batches = records = tombstones = 0
    keys: set[bytes] = set()
    offsets = []
    for path in sorted((KAFKA_FIXTURES / "kafka-2.4-c2" / "raw").glob("*.log")):
        data, result = scan_file(path)
        assert_matches_object_path(data, result)
        batches += result.n_batches
        records += result.n_records
        tombstones += int(result.is_tombstone.sum())
        keys.update(result.key_bytes(r) for r in range(result.n_records))
        offsets.extend(result.offset.tolist())
    assert (batches, records, len(keys), tombstones) == (57, 2000, 50, 21)
    assert offsets == list(range(2000))


def test_kafka_24_cleaned_partition_keeps_54_records():
    counts = {}
    for path in sorted((KAFKA_FIXTURES / "kafka-2.4-c2" / "kafka-cleaned").glob("*.log")):
        _, result = scan_file(path)
        counts[int(path.stem)] = result.n_records
    assert sum(counts.values()) == 54
    assert counts[1713] == 50 and counts[1996] == 4
    assert all(counts[base] == 0 for base in counts if base <= 1430)


@pytest.mark.parametrize(
    "partition, batches, records",
    [
        ("__consumer_offsets-39", 683, 1241),
        ("__consumer_offsets-36", 1, 1),
        ("first-0", 8, 9),
        ("test-0", 28, 97),
        ("__cluster_metadata-0", 2560, 2563),
    ],
)
def test_public_fixtures_have_the_documented_counts(partition, batches, records):
    data, result = scan_file(KAFKA_FIXTURES / "public" / partition / "00000000000000000000.log")
    assert (result.n_batches, result.n_records) == (batches, records)
    assert_matches_object_path(data, result)
    if partition == "__cluster_metadata-0":
        assert int(result.is_control.sum()) == 2
    if partition == "__consumer_offsets-39":
        assert len({result.key_bytes(r) for r in range(result.n_records)}) == 5
    if partition == "first-0":
        assert (result.key_len == -1).all()
    if partition == "test-0":
        assert (result.producer_id == 0).all()


# ---- torn tails, byte ranges and limits ----------------------------------------------------------------------------


def test_empty_buffer_scans_to_nothing_without_a_torn_tail():
    result = scan(b"")
    assert result.n_batches == 0 and result.n_records == 0 and not result.torn_tail and result.end_position == 0


@pytest.mark.parametrize("cut", [1, 5, 11, 12, 17, 18, 30, 61, 62, -1])
def test_truncated_trailing_batch_is_a_torn_tail_not_an_error(cut):
    data = random_segment(8, 6)
    starts = batch_starts(data)
    last = starts[-1]
    size = len(data) - last
    keep = last + (cut if cut > 0 else size + cut)
    result = scan(data[:keep], base_position=500)
    assert result.torn_tail
    assert result.n_batches == len(starts) - 1
    assert result.end_position == 500 + last
    assert result.torn_batch_bytes == (size if keep - last >= fmt.LOG_OVERHEAD else -1)
    assert_matches_object_path(data[:last], result, base_position=500)


def test_declared_size_past_the_end_is_a_torn_tail():
    data = bytearray(random_segment(9, 3))
    last = batch_starts(bytes(data))[-1]
    struct.pack_into(">i", data, last + 8, 10_000_000)
    result = scan(bytes(data))
    assert result.torn_tail and result.n_batches == 2 and result.torn_batch_bytes == 10_000_012


def test_byte_range_scans_only_the_batches_inside_it():
    data = random_segment(10, 12)
    starts = batch_starts(data)
    result = scan(data, start=starts[3], end=starts[8] + 20)
    assert result.n_batches == 5 and result.torn_tail
    assert result.start_position == starts[3] and result.end_position == starts[8]
    assert result.batch_position.tolist() == starts[3:8]
    full = scan(data)
    lo, hi = int(full.record_start[3]), int(full.record_start[8])
    assert result.offset.tolist() == full.offset[lo:hi].tolist()
    assert result.batch_index.tolist() == (full.batch_index[lo:hi] - 3).tolist()


def test_chunked_scan_continues_from_end_position_and_sees_every_batch():
    data = random_segment(11, 40)
    window = 3000
    offsets, position = [], 0
    while position < len(data):
        end = min(position + window, len(data))
        result = scan(data[position:end], base_position=position)
        if result.n_batches == 0:  # a batch larger than the window: widen it
            window *= 2
            continue
        offsets.extend(result.offset.tolist())
        position = result.end_position
    assert offsets == scan(data).offset.tolist()


def test_records_max_stops_before_the_batch_that_passes_it():
    data = random_segment(12, 20)
    full = scan(data)
    limit = int(full.record_start[7]) + 1  # batch 7 (with records) would pass it
    while full.records_count[7] == 0:
        data = random_segment(13, 20)
        full = scan(data)
        limit = int(full.record_start[7]) + 1
    result = scan(data, records_max=limit)
    assert result.limit_reached and not result.torn_tail
    assert result.n_batches == 7 and result.end_position == full.batch_position[7]
    rest = scan(data, start=result.end_position)
    assert result.offset.tolist() + rest.offset.tolist() == full.offset.tolist()


def test_arena_bytes_max_stops_before_the_compressed_batch_that_passes_it():
    records = [Record(offset=i, timestamp=0, key=b"k", value=b"v" * 1000) for i in range(10)]
    data = b"".join(encode_batch(records, base_offset=0, compression=fmt.COMPRESSION_ZSTD) for _ in range(5))
    one = scan(data[: len(data) // 5]).arena.size
    result = scan(data, arena_bytes_max=2 * one + 1)
    assert result.limit_reached and result.n_batches == 2 and result.arena.size == 2 * one
    first_only = scan(data, arena_bytes_max=1)  # the first batch is always taken
    assert first_only.n_batches == 1


# ---- corruption --------------------------------------------------------------------------------------------------


def test_flipped_byte_in_a_middle_batch_is_a_crc_error_at_that_batch():
    data = random_segment(14, 9)
    starts = batch_starts(data)
    pos = starts[4]
    size = starts[5] - pos
    rng = random.Random(0)
    for at in [pos + fmt.ATTRIBUTES_OFFSET, pos + size - 1] + [rng.randrange(pos + 21, pos + size) for _ in range(10)]:
        with pytest.raises(CorruptRecordError, match="CRC-32C mismatch") as exc:
            scan(flip(data, at), base_position=1_000)
        assert exc.value.position == 1_000 + pos + fmt.CRC_OFFSET


def test_flipped_partition_leader_epoch_is_not_covered_by_the_crc():
    data = random_segment(15, 3)
    pos = batch_starts(data)[1]
    result = scan(bytes(flip(data, pos + fmt.PARTITION_LEADER_EPOCH_OFFSET)))
    assert result.n_batches == 3


def test_the_first_bad_batch_is_reported_when_several_are_bad():
    data = random_segment(16, 10)
    starts = batch_starts(data)
    bad = flip(data, starts[6] + 30)  # CRC error in batch 6
    struct.pack_into(">i", bad, starts[8] + 8, 3)  # length < 14 at batch 8 (found by an earlier pass)
    with pytest.raises(CorruptRecordError, match="CRC") as exc:
        scan(bytes(bad))
    assert exc.value.position == starts[6] + fmt.CRC_OFFSET


def test_verify_crc_false_skips_the_crc_check():
    data = random_segment(17, 5)
    pos = batch_starts(data)[2]
    corrupt = flip(data, pos + fmt.CRC_OFFSET)
    assert scan(bytes(corrupt), verify_crc=False).n_batches == 5


@pytest.mark.parametrize(
    "offset_in_batch, value, cls, where",
    [
        (8, 13, CorruptRecordError, 8),  # declared length < 14 (a 0-filled preallocated tail looks like this)
        (8, 40, CorruptRecordError, 8),  # v2 length below 49
        (16, 3, UnsupportedFormatError, 16),  # unknown magic
    ],
)
def test_impossible_prefix_is_corruption_at_the_field(offset_in_batch, value, cls, where):
    data = bytearray(random_segment(18, 4))
    pos = batch_starts(bytes(data))[2]
    if offset_in_batch == 8:
        struct.pack_into(">i", data, pos + 8, value)
        if value >= 14:  # keep the rest of the buffer long enough that this is not a torn tail
            data += bytes(100)
    else:
        data[pos + offset_in_batch] = value
    with pytest.raises(cls) as exc:
        scan(bytes(data), base_position=7)
    assert exc.value.position == 7 + pos + where


def test_zero_filled_preallocated_tail_is_corruption_as_in_kafka():
    data = random_segment(19, 2)
    with pytest.raises(CorruptRecordError, match="below the minimum 14") as exc:
        scan(data + bytes(4096))
    assert exc.value.position == len(data) + 8


def test_invalid_codec_is_unsupported():
    data = bytearray(encode_batch([Record(offset=0, timestamp=0, key=b"k", value=b"v")], base_offset=0))
    data[fmt.ATTRIBUTES_OFFSET + 1] |= 0x05
    fix_crc(data, 0)
    with pytest.raises(UnsupportedFormatError, match="codec 5") as exc:
        scan(bytes(data))
    assert exc.value.position == fmt.ATTRIBUTES_OFFSET


def v2_batch(region: bytes, count: int, last_offset_delta: int, codec: int = 0) -> bytes:
    return encode_batch_from_region(
        region,
        records_count=count,
        base_offset=100,
        last_offset_delta=last_offset_delta,
        base_timestamp=0,
        max_timestamp=0,
        attributes=codec,
    )


def test_truncated_records_region_is_corruption_not_a_torn_tail():
    region = b"".join(encode_record(d, 0, b"key", b"value") for d in range(3))
    data = v2_batch(region[:-3], 3, 2)  # a whole batch whose records end early
    with pytest.raises(CorruptRecordError, match="runs past the batch's declared size") as exc:
        scan(data, base_position=1_000)
    assert exc.value.position == 1_000 + fmt.RECORD_BATCH_OVERHEAD + 2 * len(encode_record(0, 0, b"key", b"value"))


def test_records_count_above_the_records_present_is_corruption():
    region = b"".join(encode_record(d, 0, b"key", b"value") for d in range(3))
    with pytest.raises(CorruptRecordError) as exc:
        scan(v2_batch(region, 4, 3))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD + len(region)


def test_bytes_left_after_the_records_are_corruption():
    region = b"".join(encode_record(d, 0, b"key", b"value") for d in range(3))
    with pytest.raises(CorruptRecordError, match="incorrect declared batch size") as exc:
        scan(v2_batch(region, 2, 2))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD + 2 * len(encode_record(0, 0, b"key", b"value"))


def test_record_count_that_cannot_fit_the_bytes_is_corruption_before_allocation():
    with pytest.raises(CorruptRecordError, match="cannot fit") as exc:
        scan(v2_batch(b"\x00" * 20, 2_000_000_000, 2**31 - 2))
    assert exc.value.position == fmt.RECORDS_COUNT_OFFSET


@pytest.mark.parametrize("deltas, last", [([0, 2, 1], 2), ([0, 1, 1], 2), ([0, 1, 3], 2), ([-1, 0, 1], 2)])
def test_offset_deltas_must_strictly_increase_within_the_batch(deltas, last):
    records = [encode_record(d, 0, b"k", b"v") for d in deltas]
    with pytest.raises(CorruptRecordError, match="offset delta") as exc:
        scan(v2_batch(b"".join(records), len(records), last))
    bad = next(i for i, d in enumerate(deltas) if d < 0 or d > last or (i and d <= deltas[i - 1]))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD + sum(len(r) for r in records[:bad])


def test_overlong_varint_is_corruption():
    body = b"\x00" + b"\x00" + b"\x00" + b"\x80\x80\x80\x80\x80\x00" + b"\x02v" + b"\x00"  # 6-byte key length
    record = bytes((len(body) * 2,)) + body
    with pytest.raises(CorruptRecordError, match="too long") as exc:
        scan(v2_batch(record, 1, 0))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD + 4


def test_record_whose_fields_do_not_fill_its_length_is_corruption():
    record = bytearray(encode_record(0, 0, b"k", b"v"))
    record[0] += 2  # declare one more byte than the fields use
    record += b"\x00"
    with pytest.raises(CorruptRecordError, match="declared") as exc:
        scan(v2_batch(bytes(record), 1, 0))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_errors_inside_decompressed_records_point_at_the_compressed_region(codec):
    records = [encode_record(d, 0, b"k", b"v") for d in (0, 2, 1)]
    data = encode_batch([Record(offset=0, timestamp=0, key=b"a", value=b"b")], base_offset=0)
    bad = v2_batch(b"".join(records), 3, 2, codec)
    with pytest.raises(CorruptRecordError, match="decompressed records") as exc:
        scan(data + bad, base_position=50)
    assert exc.value.position == 50 + len(data) + fmt.RECORD_BATCH_OVERHEAD


def test_compressed_stream_that_does_not_decode_is_corruption():
    good = encode_batch([Record(offset=0, timestamp=0, key=b"a", value=b"b" * 50)], base_offset=0, compression=1)
    data = bytearray(good)
    data[fmt.RECORD_BATCH_OVERHEAD + 12 : fmt.RECORD_BATCH_OVERHEAD + 20] = b"\xff" * 8
    fix_crc(data, 0)
    with pytest.raises(CorruptRecordError) as exc:
        scan(bytes(data))
    assert exc.value.position >= fmt.RECORD_BATCH_OVERHEAD


@pytest.mark.parametrize(
    "field, value, match",
    [
        (23, struct.pack(">i", -1), "negative last offset delta"),
        (57, struct.pack(">i", -1), "negative record count"),
        (57, struct.pack(">i", 5), "exceeds the 2\\+1 offset slots"),
    ],
)
def test_impossible_header_fields_behind_a_valid_crc_are_corruption(field, value, match):
    region = b"".join(encode_record(d, 0, b"key", b"value") for d in range(3))
    data = bytearray(v2_batch(region, 3, 2))
    data[field : field + 4] = value
    fix_crc(data, 0)
    with pytest.raises(CorruptRecordError, match=match) as exc:
        scan(bytes(data))
    assert exc.value.position == field
    with pytest.raises(CorruptRecordError, match="CRC-32C mismatch"):  # without the fix, the CRC catches it first
        scan(bytes(data[:17]) + bytes(v2_batch(region, 3, 2))[17:21] + bytes(data[21:]))


def test_varint_boundary_values_decode_like_the_object_path():
    deltas = [0, -1, 63, -64, 64, -65, 8191, 8192, 2**31, -(2**31), 2**62, -(2**63), 2**63 - 1]
    offset_deltas = [0, 63, 64, 8191, 8192, 2**20, 2**24, 2**28, 2**30, 2**31 - 4, 2**31 - 3, 2**31 - 2, 2**31 - 1]
    keys = [b"", b"k" * 63, b"k" * 64, None, b"k" * 8192]
    region = b"".join(
        encode_record(od, td, keys[i % len(keys)], b"v" * (i * 700))
        for i, (od, td) in enumerate(zip(offset_deltas, deltas))
    )
    data = v2_batch(region, len(offset_deltas), 2**31 - 1)
    result = scan(data)
    assert result.offset.tolist() == [100 + d for d in offset_deltas]
    assert result.timestamp.tolist() == deltas
    assert_matches_object_path(data, result)


@pytest.mark.parametrize(
    "varint, match",
    [
        (b"\xff\xff\xff\xff\x10", "too long or does not fit"),  # a 5-byte varint with bits past 32
        (b"\x80\x80\x80\x80\x80\x01", "too long or does not fit"),  # 6 bytes
    ],
)
def test_varints_past_kafkas_limits_are_corruption(varint, match):
    body = b"\x00" + b"\x00" + varint + b"\x01" + b"\x01" + b"\x00"  # attributes, ts, offsetDelta, null key/value
    record = bytes((len(body) * 2,)) + body
    with pytest.raises(CorruptRecordError, match=match) as exc:
        scan(v2_batch(record, 1, 0))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD + 3


def test_varlong_with_bits_past_64_is_corruption():
    body = b"\x00" + b"\xff" * 9 + b"\x02" + b"\x00" + b"\x01" + b"\x01" + b"\x00"  # 10th byte carries 2 bits
    record = bytes((len(body) * 2,)) + body
    with pytest.raises(CorruptRecordError, match="too long or does not fit") as exc:
        scan(v2_batch(record, 1, 0))
    assert exc.value.position == fmt.RECORD_BATCH_OVERHEAD + 2
