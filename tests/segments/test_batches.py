"""Walking buffers of concatenated batches of any magic: framing, torn tails versus corruption, fixtures.

The torn-tail rule (docs/format.md section 3): a walk stops when 17 bytes or fewer remain or when a
declared batch runs past the end; a declared size below 14, or anything wrong inside a whole batch, is
corruption. Real broker segments under tests/fixtures/kafka must walk cleanly with the counts their
README lists.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segments.codec import format as fmt
from segments.codec.batches import (
    TAIL_RAISE,
    TAIL_STOP,
    decode_any_batch,
    iter_batch_headers,
    iter_batches,
    peek_header,
    read_next_offset,
)
from segments.codec.errors import CorruptRecordError, TruncatedBatchError, UnsupportedFormatError
from segments.codec.legacy import (
    decode_legacy_entry,
    decode_legacy_header,
    encode_legacy_message,
    encode_legacy_wrapper,
)
from segments.codec.records import (
    Header,
    Record,
    batch_crc,
    decode_batch,
    decode_batch_header,
    encode_batch,
    encode_control_batch,
)

from ..kafka_fixtures import KAFKA_FIXTURES


def put(data: bytes, position: int, raw: bytes) -> bytes:
    out = bytearray(data)
    out[position : position + len(raw)] = raw
    return bytes(out)


def flip(data: bytes, position: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[position] ^= mask
    return bytes(out)


def fix_v2_crc(batch: bytes) -> bytes:
    return put(batch, fmt.CRC_OFFSET, batch_crc(batch, 0, len(batch)).to_bytes(4, "big"))


def _mixed_log() -> list[bytes]:
    """One log holding every kind of entry, in offset order: v0, v1, legacy wrappers, v2 batches."""
    return [
        encode_legacy_message(0, b"a", b"v0", magic=0),
        encode_legacy_wrapper(
            [Record(1, -1, b"b", b"1"), Record(2, -1, None, b"2")], magic=0, codec=fmt.COMPRESSION_LZ4
        ),
        encode_legacy_message(3, b"c", None, magic=1, timestamp=1_000),
        encode_legacy_wrapper(
            [Record(4, 1_001, b"d", b"4"), Record(6, 1_003, b"e", b"6")], magic=1, codec=fmt.COMPRESSION_GZIP
        ),
        encode_batch(
            [Record(7, 2_000, b"f", b"7", (Header("h", None),)), Record(9, 1_999, b"g", b"")],
            base_offset=7,
            compression=fmt.COMPRESSION_ZSTD,
            last_offset_delta=3,
        ),
        encode_control_batch(offset=11, control_type=1, timestamp=2_100, producer_id=5, producer_epoch=0),
        encode_batch([], base_offset=12, last_offset_delta=4, producer_id=5, producer_epoch=0, base_sequence=0),
    ]


MIXED = _mixed_log()
MIXED_BUF = b"".join(MIXED)
MIXED_POSITIONS = [sum(len(b) for b in MIXED[:i]) for i in range(len(MIXED))]


def _decode_single(entry: bytes):
    return decode_batch(entry) if entry[fmt.MAGIC_OFFSET] == 2 else decode_legacy_entry(entry)


def _header_single(entry: bytes):
    return decode_batch_header(entry) if entry[fmt.MAGIC_OFFSET] == 2 else decode_legacy_header(entry)


# ---- whole buffers -----------------------------------------------------------------------------------------------


def test_headers_of_a_mixed_magic_log_are_yielded_at_their_positions():
    walked = list(iter_batch_headers(MIXED_BUF))
    assert [pos for pos, _ in walked] == MIXED_POSITIONS
    assert [h.magic for _, h in walked] == [0, 0, 1, 1, 2, 2, 2]
    assert [h for _, h in walked] == [_header_single(e) for e in MIXED]


def test_full_decodes_of_a_mixed_magic_log_give_every_record_in_offset_order():
    walked = list(iter_batches(MIXED_BUF))
    assert [pos for pos, _ in walked] == MIXED_POSITIONS
    assert [b for _, b in walked] == [_decode_single(e) for e in MIXED]
    offsets = [r.offset for _, b in walked for r in b.records]
    assert offsets == [0, 1, 2, 3, 4, 6, 7, 9, 11]


def test_legacy_wrapper_headers_report_the_outer_offset_and_full_decodes_the_inner_range():
    pos, header = list(iter_batch_headers(MIXED_BUF))[3]
    assert (header.base_offset, header.last_offset, header.records_count) == (6, 6, 1)
    _, batch = list(iter_batches(MIXED_BUF))[3]
    assert (batch.header.base_offset, batch.header.last_offset, batch.header.records_count) == (4, 6, 2)


def test_read_next_offset_is_the_last_batchs_last_offset_plus_one():
    assert read_next_offset(MIXED_BUF) == 12 + 4 + 1


def test_read_next_offset_of_a_legacy_wrapper_uses_its_offset_field():
    assert read_next_offset(MIXED[3]) == 7
    assert read_next_offset(b"".join(MIXED[:2])) == 3


def test_read_next_offset_of_a_buffer_without_whole_batches_is_none():
    assert read_next_offset(b"") is None
    assert read_next_offset(MIXED[0][:-1]) is None


def test_read_next_offset_ignores_a_torn_tail():
    assert read_next_offset(MIXED_BUF[:-1]) == 11 + 1


def test_an_empty_buffer_yields_nothing_in_either_mode():
    assert list(iter_batch_headers(b"", tail=TAIL_RAISE)) == []
    assert list(iter_batches(b"", tail=TAIL_RAISE)) == []


def test_start_and_end_restrict_the_walk_and_positions_stay_relative_to_the_buffer():
    start, end = MIXED_POSITIONS[2], MIXED_POSITIONS[5]
    walked = list(iter_batches(MIXED_BUF, start, end, tail=TAIL_RAISE))
    assert [pos for pos, _ in walked] == MIXED_POSITIONS[2:5]


def test_an_end_inside_a_batch_is_a_torn_tail_there():
    end = MIXED_POSITIONS[5] - 1
    assert [pos for pos, _ in iter_batch_headers(MIXED_BUF, 0, end)] == MIXED_POSITIONS[:4]
    with pytest.raises(TruncatedBatchError) as info:
        list(iter_batches(MIXED_BUF, 0, end, tail=TAIL_RAISE))
    assert info.value.position == MIXED_POSITIONS[4]


def test_invalid_range_or_tail_mode_is_a_programming_error():
    with pytest.raises(ValueError):
        list(iter_batch_headers(MIXED_BUF, 10, 5))
    with pytest.raises(ValueError):
        list(iter_batch_headers(MIXED_BUF, 0, len(MIXED_BUF) + 1))
    with pytest.raises(ValueError):
        list(iter_batches(MIXED_BUF, tail="ignore"))


def test_decode_any_reads_the_batch_at_a_known_position():
    for pos, entry in zip(MIXED_POSITIONS, MIXED):
        assert peek_header(MIXED_BUF, pos) == _header_single(entry)
        assert decode_any_batch(MIXED_BUF, pos) == _decode_single(entry)


def test_peek_header_needs_only_the_header_bytes_of_any_magic():
    for entry in MIXED:
        header_bytes = fmt.RECORD_BATCH_OVERHEAD if entry[fmt.MAGIC_OFFSET] == fmt.MAGIC_V2 else (
            fmt.LEGACY_KEY_LENGTH_OFFSET[entry[fmt.MAGIC_OFFSET]])
        assert peek_header(entry[:header_bytes]) == _header_single(entry)
        assert peek_header(b"xy" + entry[:header_bytes], 2) == _header_single(entry)
        with pytest.raises(TruncatedBatchError):
            peek_header(entry[: header_bytes - 1])
    with pytest.raises(TruncatedBatchError, match="fewer than 17 bytes left"):
        peek_header(MIXED[0][: fmt.HEADER_SIZE_UP_TO_MAGIC - 1])


def test_decode_any_at_a_cut_batch_is_truncated():
    with pytest.raises(TruncatedBatchError):
        decode_any_batch(MIXED_BUF[:-1], MIXED_POSITIONS[-1])
    with pytest.raises(TruncatedBatchError):
        decode_any_batch(MIXED_BUF[: MIXED_POSITIONS[-1] + 10], MIXED_POSITIONS[-1])


# ---- torn tails -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("walk", [iter_batch_headers, iter_batches], ids=["headers", "batches"])
def test_truncated_trailing_batch_is_ignored_in_stop_mode_and_reported_in_raise_mode(walk):
    last = MIXED_POSITIONS[-1]
    for cut in range(last + 1, len(MIXED_BUF)):
        buf = MIXED_BUF[:cut]
        assert [pos for pos, _ in walk(buf)] == MIXED_POSITIONS[:-1]
        assert [pos for pos, _ in walk(buf, tail=TAIL_STOP)] == MIXED_POSITIONS[:-1]
        seen = []
        with pytest.raises(TruncatedBatchError, match="torn tail") as info:
            for pos, _ in walk(buf, tail=TAIL_RAISE):
                seen.append(pos)
        assert seen == MIXED_POSITIONS[:-1]
        assert info.value.position == last


@pytest.mark.parametrize("index", range(len(MIXED)))
def test_every_kind_of_batch_cut_anywhere_is_a_torn_tail(index):
    entry = MIXED[index]
    for cut in range(1, len(entry)):
        assert list(iter_batches(entry[:cut])) == []
        with pytest.raises(TruncatedBatchError) as info:
            list(iter_batches(entry[:cut], tail=TAIL_RAISE))
        assert info.value.position == 0


@pytest.mark.parametrize("remaining", range(1, fmt.HEADER_SIZE_UP_TO_MAGIC + 1))
def test_seventeen_bytes_or_fewer_are_a_torn_tail_whatever_they_hold(remaining):
    garbage = bytes([0xFF]) * remaining  # would be an impossible length if it were read
    buf = MIXED[0] + garbage
    assert [pos for pos, _ in iter_batch_headers(buf)] == [0]
    with pytest.raises(TruncatedBatchError) as info:
        list(iter_batch_headers(buf, tail=TAIL_RAISE))
    assert info.value.position == len(MIXED[0])


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(range(len(MIXED))), data=st.data())
def test_any_prefix_of_a_log_yields_exactly_the_whole_batches_it_contains(order, data):
    entries = [MIXED[i] for i in order]
    buf = b"".join(entries)
    cut = data.draw(st.integers(0, len(buf)))
    ends = [sum(len(e) for e in entries[: i + 1]) for i in range(len(entries))]
    whole = [e for e, end in zip(entries, ends) if end <= cut]
    assert [b for _, b in iter_batches(buf[:cut])] == [_decode_single(e) for e in whole]
    if cut in (0, *ends):
        assert len(list(iter_batches(buf[:cut], tail=TAIL_RAISE))) == len(whole)
    else:
        with pytest.raises(TruncatedBatchError) as info:
            list(iter_batches(buf[:cut], tail=TAIL_RAISE))
        assert info.value.position == sum(len(e) for e in whole)


# ---- corruption before the tail -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [TAIL_STOP, TAIL_RAISE])
@pytest.mark.parametrize("length", [-1, 0, 13])
def test_declared_length_below_14_is_corrupt_in_either_mode(tail, length):
    bad = put(MIXED[2], fmt.LENGTH_OFFSET, length.to_bytes(4, "big", signed=True))
    buf = MIXED[0] + bad + MIXED[4]
    with pytest.raises(CorruptRecordError, match="below the minimum 14") as info:
        list(iter_batch_headers(buf, tail=tail))
    assert not isinstance(info.value, TruncatedBatchError)
    assert info.value.position == len(MIXED[0]) + fmt.LENGTH_OFFSET


@pytest.mark.parametrize("zeros", [18, 100, 4096])
def test_a_zero_filled_preallocated_tail_longer_than_17_bytes_is_corrupt(zeros):
    buf = MIXED_BUF + bytes(zeros)
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batch_headers(buf))
    assert not isinstance(info.value, TruncatedBatchError)
    assert info.value.position == len(MIXED_BUF) + fmt.LENGTH_OFFSET


@pytest.mark.parametrize("magic", [3, 7, 0x7F, -1])
def test_unknown_magic_is_unsupported_at_byte_16_of_its_batch(magic):
    bad = put(MIXED[4], fmt.MAGIC_OFFSET, magic.to_bytes(1, "big", signed=True))
    buf = MIXED[0] + bad
    for walk in (iter_batch_headers, iter_batches):
        with pytest.raises(UnsupportedFormatError, match=f"unknown magic {magic}") as info:
            list(walk(buf))
        assert info.value.position == len(MIXED[0]) + fmt.MAGIC_OFFSET


@pytest.mark.parametrize("tail", [TAIL_STOP, TAIL_RAISE])
def test_a_bad_crc_before_the_tail_is_corruption_for_full_decodes_but_not_for_headers(tail):
    bad_index = 4
    buf = b"".join(flip(e, len(e) - 1) if i == bad_index else e for i, e in enumerate(MIXED))
    assert len(list(iter_batch_headers(buf, tail=tail))) == len(MIXED)  # headers do not check CRCs
    seen = []
    with pytest.raises(CorruptRecordError, match="CRC-32C mismatch") as info:
        for pos, _ in iter_batches(buf, tail=tail):
            seen.append(pos)
    assert seen == MIXED_POSITIONS[:bad_index]
    assert info.value.position == MIXED_POSITIONS[bad_index] + fmt.CRC_OFFSET


def test_a_bad_legacy_crc_before_the_tail_is_corruption():
    buf = MIXED[0] + flip(MIXED[2], len(MIXED[2]) - 1) + MIXED[4]
    with pytest.raises(CorruptRecordError, match="CRC-32 mismatch") as info:
        list(iter_batches(buf))
    assert info.value.position == len(MIXED[0]) + fmt.LEGACY_CRC_OFFSET


@pytest.mark.parametrize("batch_length", [14, 20, 48])
def test_a_whole_v2_batch_shorter_than_its_header_is_corrupt_not_a_torn_tail(batch_length):
    # A 61-byte header cannot fit, but the declared batch ends before the buffer does: the length
    # is impossible, so this is corruption even at the very end of the buffer.
    bad = put(MIXED[4], fmt.LENGTH_OFFSET, batch_length.to_bytes(4, "big"))[: fmt.LOG_OVERHEAD + batch_length]
    for buf in (MIXED[0] + bad, MIXED[0] + bad + MIXED[0]):
        for walk in (iter_batch_headers, iter_batches):
            for tail in (TAIL_STOP, TAIL_RAISE):
                with pytest.raises(CorruptRecordError) as info:
                    list(walk(buf, tail=tail))
                assert not isinstance(info.value, TruncatedBatchError)
        with pytest.raises(CorruptRecordError) as info:
            peek_header(buf, len(MIXED[0]))
        assert not isinstance(info.value, TruncatedBatchError)


@pytest.mark.parametrize("message_size", [14, 21])
def test_a_whole_v1_message_below_22_bytes_is_corrupt(message_size):
    bad = put(MIXED[2], fmt.LENGTH_OFFSET, message_size.to_bytes(4, "big"))[: fmt.LOG_OVERHEAD + message_size]
    with pytest.raises(CorruptRecordError, match="below the minimum 22") as info:
        list(iter_batch_headers(MIXED[0] + bad))
    assert not isinstance(info.value, TruncatedBatchError)


def test_records_inconsistent_with_a_whole_batch_are_corrupt_not_truncated():
    # Declare one more record than the v2 batch holds: the records run out inside a whole batch.
    entry = MIXED[4]
    count_at = fmt.RECORDS_COUNT_OFFSET
    bad = fix_v2_crc(put(entry, count_at, (3).to_bytes(4, "big")))
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(MIXED[0] + bad, tail=TAIL_RAISE))
    assert not isinstance(info.value, TruncatedBatchError)


def test_corruption_error_can_be_placed_in_a_file():
    buf = MIXED[0] + flip(MIXED[4], len(MIXED[4]) - 1)
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(buf))
    located = info.value.located("/logs/t-0/00000000000000000000.log", 4096)
    assert located.path.endswith(".log")
    assert located.position == 4096 + len(MIXED[0]) + fmt.CRC_OFFSET
    assert "00000000000000000000.log" in str(located)


# ---- real broker segments -------------------------------------------------------------------------------------------


def _fixture_dir(relative: str) -> Path:
    return KAFKA_FIXTURES / relative


def _walk_dir(path: Path):
    logs = sorted(path.glob("*.log"))
    assert logs, f"no .log files in {path}"
    batches = []
    for log in logs:
        data = log.read_bytes()
        walked = list(iter_batches(data, tail=TAIL_RAISE))  # a broker-written log has no torn tail
        if walked:
            last_pos, last = walked[-1]
            assert last_pos + last.header.size_bytes == len(data)
        assert len(list(iter_batch_headers(data, tail=TAIL_RAISE))) == len(walked)
        batches.extend(batch for _, batch in walked)
    return batches


def _counts(batches):
    return len(batches), sum(len(b.records) for b in batches)


@pytest.mark.parametrize(
    ("relative", "batch_count", "record_count"),
    [
        ("public/__consumer_offsets-39", 683, 1241),
        ("public/__consumer_offsets-36", 1, 1),
        ("public/first-0", 8, 9),
        ("public/test-0", 28, 97),
        ("public/__cluster_metadata-0", 2560, 2563),
        ("kafka-2.4-c2/raw", 57, 2000),
    ],
)
def test_fixture_log_walks_cleanly_with_the_documented_counts(relative, batch_count, record_count):
    assert _counts(_walk_dir(_fixture_dir(relative))) == (batch_count, record_count)


def test_every_fixture_log_walks_cleanly_with_crcs_verified():
    logs = sorted(KAFKA_FIXTURES.rglob("*.log"))
    assert logs
    for log in logs:
        data = log.read_bytes()
        end = max((pos + b.header.size_bytes for pos, b in iter_batches(data, tail=TAIL_RAISE)), default=0)
        assert end == len(data), log


def test_kafka_2_4_raw_partition_has_50_keys_21_tombstones_and_offsets_0_to_1999():
    batches = _walk_dir(_fixture_dir("kafka-2.4-c2/raw"))
    records = [r for b in batches for r in b.records]
    assert [r.offset for r in records] == list(range(2000))
    assert len({r.key for r in records}) == 50
    assert sum(r.value is None for r in records) == 21
    assert all(b.header.magic == 2 and b.header.compression == fmt.COMPRESSION_NONE for b in batches)
    assert any(r.headers for r in records)


def test_kafka_2_4_cleaned_partition_keeps_54_records_one_per_key_plus_the_active_segment():
    path = _fixture_dir("kafka-2.4-c2/kafka-cleaned")
    records = [r for b in _walk_dir(path) for r in b.records]
    assert len(records) == 54
    active = [r for _, b in iter_batches((path / "00000000000000001996.log").read_bytes()) for r in b.records]
    assert len(active) == 4
    cleaned = [r for r in records if r not in active]
    assert len({r.key for r in cleaned}) == 50 == len(cleaned)
    assert [r.offset for r in cleaned] == list(range(1946, 1996))


def test_kafka_2_4_cleaned_records_are_the_latest_per_key_of_the_raw_log():
    raw = [r for b in _walk_dir(_fixture_dir("kafka-2.4-c2/raw")) for r in b.records]
    cleaned = [r for b in _walk_dir(_fixture_dir("kafka-2.4-c2/kafka-cleaned")) for r in b.records]
    latest = {}
    for r in raw:
        if r.offset < 1996:
            latest[r.key] = r
    kept = sorted(latest.values(), key=lambda r: r.offset)
    # Timestamps are left out on purpose: in these fixtures every kafka-cleaned record (the active
    # segment's too) is stamped about 29.88 s earlier than the same offset in raw/, so the two
    # directories come from two producer runs of the same data, not from one run before and after.
    assert [(r.offset, r.key, r.value, r.headers) for r in cleaned[:50]] == [
        (r.offset, r.key, r.value, r.headers) for r in kept
    ]


def test_cluster_metadata_log_has_two_control_batches():
    batches = _walk_dir(_fixture_dir("public/__cluster_metadata-0"))
    assert sum(b.header.is_control for b in batches) == 2


def test_consumer_offsets_39_has_5_distinct_keys():
    records = [r for b in _walk_dir(_fixture_dir("public/__consumer_offsets-39")) for r in b.records]
    assert len(Counter(r.key for r in records)) == 5


def test_test_0_is_written_by_an_idempotent_producer_with_id_0():
    batches = _walk_dir(_fixture_dir("public/test-0"))
    assert {b.header.producer_id for b in batches} == {0}
    assert all(r.key is None for b in batches for r in b.records)


def test_read_next_offset_of_the_raw_fixture_segments_chains_to_the_next_segment_base():
    path = _fixture_dir("kafka-2.4-c2/raw")
    logs = sorted(path.glob("*.log"))
    bases = [int(p.name.split(".")[0]) for p in logs]
    next_offsets = [read_next_offset(p.read_bytes()) for p in logs]
    assert next_offsets[:-1] == bases[1:]
    assert next_offsets[-1] == 2000


def test_crc_checks_can_be_skipped_for_every_magic():
    v2 = encode_batch([Record(20, 5, b"k", b"value")], base_offset=20)
    entries = [flip(MIXED[0], len(MIXED[0]) - 1, 0x01), flip(MIXED[2], 30, 0x01), flip(v2, len(v2) - 2, 0x01)]
    buf = b"".join(entries)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(buf))
    values = [r.value for _, b in iter_batches(buf, verify_crc=False) for r in b.records]
    assert values == [b"v1", None, b"valud"]
