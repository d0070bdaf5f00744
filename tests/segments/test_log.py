"""The partition log: append, roll, read with Kafka's semantics, reopen, torn tails, corruption."""

from __future__ import annotations

import os

import pytest

from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError, LockTimeoutError, LogStateError, OffsetOutOfRangeError
from segments.codec.records import decode_batch
from segments.partition.log import LogConfig, PartitionLog, parse_partition_dir_name
from segments.tools.verify import verify_paths

from .helpers import keyed_batch, read_all, write_log


def test_partition_dir_name_splits_at_last_dash():
    assert parse_partition_dir_name("my-topic-12") == ("my-topic", 12)
    assert parse_partition_dir_name("__consumer_offsets-39") == ("__consumer_offsets", 39)
    assert parse_partition_dir_name("t-0.0123456789abcdef0123456789abcdef-delete") is None
    assert parse_partition_dir_name("t-0-future") is None
    assert parse_partition_dir_name("noparts") is None


def test_writer_assigns_consecutive_offsets_across_batches(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True) as log:
        a = log.append_batches(keyed_batch([(b"a", b"1"), (b"b", b"2")]))
        b = log.append_batches(keyed_batch([(b"c", b"3")]) + keyed_batch([(b"d", b"4"), (b"e", b"5")]))
        assert (a.first_offset, a.last_offset) == (0, 1)
        assert (b.first_offset, b.last_offset, b.batches) == (2, 4, 2)
        assert log.log_end_offset == 5
    records = read_all(tmp_path / "t-0")
    assert [(o, k, v) for o, k, v, _ in records] == [
        (0, b"a", b"1"), (1, b"b", b"2"), (2, b"c", b"3"), (3, b"d", b"4"), (4, b"e", b"5")
    ]


def test_log_written_closed_and_reopened_serves_the_same_records(tmp_path):
    n = write_log(tmp_path / "t-0", 200)
    first = read_all(tmp_path / "t-0")
    assert [r[0] for r in first] == list(range(n))
    with PartitionLog.open(tmp_path / "t-0", mode="writer") as log:
        assert log.log_end_offset == n
        assert len(log.segments) > 5
        log.append_batches(keyed_batch([(b"z", b"last")]))
    again = read_all(tmp_path / "t-0")
    assert again[:-1] == first
    assert again[-1][:3] == (n, b"z", b"last")
    assert not verify_paths([tmp_path / "t-0"]).problems


def test_segments_roll_at_segment_bytes_and_stay_under_it(tmp_path):
    write_log(tmp_path / "t-0", 100, segment_bytes=1500)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        sizes = [s.size_bytes for s in log.segments]
        bases = [s.base_offset for s in log.segments]
    assert len(sizes) > 10
    assert all(size <= 1500 for size in sizes)
    assert bases == sorted(bases) and bases[0] == 0


def test_segment_rolls_when_segment_ms_passes_between_record_timestamps(tmp_path):
    config = LogConfig(segment_ms=1000)
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True, config=config) as log:
        log.append_batches(keyed_batch([(b"a", b"1")], timestamp_ms=10_000))
        log.append_batches(keyed_batch([(b"a", b"2")], timestamp_ms=10_500))
        assert len(log.segments) == 1
        log.append_batches(keyed_batch([(b"a", b"3")], timestamp_ms=11_001))
        assert [s.base_offset for s in log.segments] == [0, 2]


def test_segment_rolls_when_offset_index_is_full(tmp_path):
    config = LogConfig(segment_index_bytes=24, index_interval_bytes=0)
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True, config=config) as log:
        for i in range(12):
            log.append_batches(keyed_batch([(b"k", b"%d" % i)]))
        assert len(log.segments) > 2
        assert all(s.offset_index.entries <= 3 for s in log.segments)


def test_an_append_of_many_batches_is_indexed_batch_by_batch_as_the_rebuild_rule_indexes_it(tmp_path):
    # a bulk append (ingest's commit appends chunks of many batches) gets an entry per batch past the interval,
    # not Kafka's one entry per append: the same indexes a rebuild from the .log makes
    config = LogConfig(index_interval_bytes=100)
    batches = [keyed_batch([(b"k%d" % i, b"v" * 120)], timestamp_ms=1_700_000_000_000 + (i * 7) % 5) for i in range(9)]
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True, config=config) as log:
        log.append_batches(b"".join(batches[:6]))
        log.append_batches(b"".join(batches[6:]))
        paths = log.segments[0].paths
        log.roll()
    written = paths.index.read_bytes(), paths.timeindex.read_bytes()
    assert len(written[0]) // 8 == 8  # every batch but the first crossed the interval
    paths.index.unlink()
    paths.timeindex.unlink()
    with PartitionLog.open(tmp_path / "t-0", mode="cleaner", config=config) as log:
        assert log.read(0).data
    assert (paths.index.read_bytes(), paths.timeindex.read_bytes()) == written
    assert not verify_paths([tmp_path / "t-0"]).problems


def test_an_append_whose_index_entries_do_not_fit_rolls_first(tmp_path):
    config = LogConfig(segment_index_bytes=72, index_interval_bytes=0)  # 9 offset entries, 6 time entries
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True, config=config) as log:
        log.append_batches(b"".join(keyed_batch([(b"k", b"%d" % i)]) for i in range(5)))  # 4 offset entries, 1 time
        assert log.segments[0].index_room() == 5
        log.append_batches(b"".join(keyed_batch([(b"k", b"%d" % i)]) for i in range(6)))  # up to 6 more
        assert [s.base_offset for s in log.segments] == [0, 5]
        with pytest.raises(ValueError, match="index entries"):  # more than an empty index holds: nothing written
            log.append_batches(b"".join(keyed_batch([(b"k", b"%d" % i)]) for i in range(7)))
        assert log.log_end_offset == 11 and len(log.segments) == 2


def test_segment_rolls_before_relative_offset_overflows(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True) as log:
        log.append_batches(keyed_batch([(b"a", b"1")]))
        # A batch whose lastOffsetDelta reaches past 2^31-1 of the segment base.
        big = keyed_batch([(b"b", b"2")], last_offset_delta=fmt.RELATIVE_OFFSET_MAX)
        info = log.append_batches(big)
        assert info.segment_base_offset == 1
        assert log.log_end_offset == 1 + fmt.RELATIVE_OFFSET_MAX + 1


def test_read_of_compacted_away_offset_returns_batch_holding_next_surviving_offset(tmp_path):
    from segments.codec.records import Record, encode_batch

    # A batch covering offsets 0..9 with only 3 and 9 present, as compaction leaves it.
    batch = encode_batch(
        [Record(3, 1, b"a", b"x"), Record(9, 2, b"b", b"y")], base_offset=0, last_offset_delta=9
    )
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True) as log:
        log.append_batches(batch)
        log.append_batches(keyed_batch([(b"c", b"z")]))
        fetched = log.read(5)
        first = decode_batch(fetched.data).header
        assert (first.base_offset, first.last_offset) == (0, 9)
        assert decode_batch(log.read(10).data).records[0].offset == 10
        assert log.read(11).data == b""
        with pytest.raises(OffsetOutOfRangeError):
            log.read(12)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(-1)


def test_read_respects_max_bytes_but_returns_at_least_one_batch(tmp_path):
    write_log(tmp_path / "t-0", 20, segment_bytes=100_000)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        one = log.read(0, max_bytes=1)
        assert decode_batch(one.data).header.base_offset == 0
        assert len(one.data) == decode_batch(one.data).header.size_bytes
        many = log.read(0, max_bytes=10_000)
        assert len(many.data) > len(one.data)


def test_offset_for_timestamp_finds_first_record_at_or_after(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True, config=LogConfig(index_interval_bytes=0)) as log:
        for i in range(50):
            log.append_batches(keyed_batch([(b"k", b"v")], timestamp_ms=1000 + 10 * i))
        log.roll()
        for i in range(50, 60):
            log.append_batches(keyed_batch([(b"k", b"v")], timestamp_ms=1000 + 10 * i))
        assert log.offset_for_timestamp(1000) == (0, 1000)
        assert log.offset_for_timestamp(1005) == (1, 1010)
        assert log.offset_for_timestamp(1000 + 10 * 55) == (55, 1550)
        assert log.offset_for_timestamp(10**12) is None


def test_torn_tail_is_truncated_on_reopen(tmp_path):
    n = write_log(tmp_path / "t-0", 30)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        active = log.active_segment.paths.log
    batch = keyed_batch([(b"torn", b"x" * 100)])
    with open(active, "ab") as f:
        f.write(batch[: len(batch) // 2])
    size_with_tail = active.stat().st_size
    with PartitionLog.open(tmp_path / "t-0", mode="writer") as log:
        assert log.log_end_offset == n
        assert log.active_segment.size_bytes == size_with_tail - len(batch) // 2
    assert [r[0] for r in read_all(tmp_path / "t-0")] == list(range(n))


def test_zeroed_preallocated_tail_is_truncated_on_reopen(tmp_path):
    n = write_log(tmp_path / "t-0", 30)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        active = log.active_segment.paths.log
    with open(active, "ab") as f:
        f.write(b"\0" * 5000)
    with PartitionLog.open(tmp_path / "t-0", mode="writer") as log:
        assert log.log_end_offset == n
    assert not verify_paths([tmp_path / "t-0"]).problems


def test_corrupted_batch_in_middle_raises_typed_error_naming_file_and_position(tmp_path):
    write_log(tmp_path / "t-0", 30, segment_bytes=100_000)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        seg = log.segments[0]
        positions = [p for p, _ in seg.iter_headers()]
        path = seg.paths.log
    victim = positions[5]
    data = bytearray(path.read_bytes())
    data[victim + 70] ^= 0xFF
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    with pytest.raises(CorruptRecordError) as info:
        PartitionLog.open(tmp_path / "t-0", mode="writer")
    assert info.value.path == str(path)
    assert victim <= info.value.position < positions[6]
    assert "CRC" in info.value.reason
    assert path.read_bytes() == before  # nothing was changed


def test_corrupt_inactive_segment_is_reported_by_verify_and_reads_never_truncated(tmp_path):
    write_log(tmp_path / "t-0", 60, segment_bytes=1500)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        path = log.segments[1].paths.log
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # the last batch of an inactive segment
    path.write_bytes(bytes(data))
    problems = verify_paths([tmp_path / "t-0"]).problems
    assert len(problems) == 1 and problems[0].path == str(path)
    # Segments below the recovery point are trusted at open (as Kafka does); reading them finds it.
    with PartitionLog.open(tmp_path / "t-0", mode="writer") as log:
        with pytest.raises(CorruptRecordError) as info:
            list(log.iter_batches())
        assert info.value.path == str(path)
    assert path.read_bytes() == bytes(data)


def test_missing_and_corrupt_indexes_are_rebuilt_on_open(tmp_path):
    write_log(tmp_path / "t-0", 100, segment_bytes=3000)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        segs = log.segments
        idx0, tidx1 = segs[0].paths.index, segs[1].paths.timeindex
        want0 = idx0.read_bytes()
        want1 = tidx1.read_bytes()
    assert len(want0) > 0
    idx0.unlink()
    tidx1.write_bytes(want1 + b"\x01\x02\x03")  # torn append
    with PartitionLog.open(tmp_path / "t-0", mode="cleaner", config=LogConfig(index_interval_bytes=256)) as log:
        assert log.read(3).data
    assert idx0.read_bytes() == want0
    assert tidx1.read_bytes() == want1
    assert not verify_paths([tmp_path / "t-0"]).problems


def test_second_writer_is_refused(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True):
        with pytest.raises(LockTimeoutError):
            PartitionLog.open(tmp_path / "t-0", mode="writer")


def test_reader_cannot_append(tmp_path):
    write_log(tmp_path / "t-0", 2)
    with PartitionLog.open(tmp_path / "t-0", mode="reader") as log:
        with pytest.raises(LogStateError):
            log.append_batches(keyed_batch([(b"a", b"b")]))


def test_append_rejects_a_batch_with_a_bad_crc_and_writes_nothing(tmp_path):
    with PartitionLog.open(tmp_path / "t-0", mode="writer", create=True) as log:
        bad = bytearray(keyed_batch([(b"a", b"b")]))
        bad[-1] ^= 1
        with pytest.raises(CorruptRecordError):
            log.append_batches(bytes(bad))
        assert log.active_segment.size_bytes == 0
        assert log.log_end_offset == 0


def test_close_records_recovery_point_in_log_dir(tmp_path):
    from segments.partition.checkpoint import read_offset_checkpoint

    n = write_log(tmp_path / "t-0", 10)
    points = read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint")
    assert points == {("t", 0): n}


def test_empty_log_opens_with_one_empty_active_segment(tmp_path):
    with PartitionLog.open(tmp_path / "t-3", mode="writer", create=True) as log:
        assert log.log_end_offset == 0
        assert log.read(0).data == b""
        assert [s.base_offset for s in log.segments] == [0]
    assert os.path.exists(tmp_path / "t-3" / "00000000000000000000.log")


def test_reader_fetches_records_appended_to_the_active_segment_after_it_listed(tmp_path):
    # A tailing consumer: appends that do not roll leave the directory unchanged, and must still reach it.
    d = tmp_path / "t-0"
    with PartitionLog.open(d, mode="writer", create=True) as writer:
        writer.append_batches(keyed_batch([(b"a", b"1")]))
        with PartitionLog.open(d, mode="reader") as reader:
            assert reader.read(1).data == b""
            writer.append_batches(keyed_batch([(b"b", b"2"), (b"c", b"3")]))
            fetched = reader.read(1)
            assert [(r.offset, r.value) for r in decode_batch(fetched.data).records] == [(1, b"2"), (2, b"3")]
            assert reader.log_end_offset == 3
            assert [r.value for _, r in reader.iter_records(1)] == [b"2", b"3"]


def _copy_batches_from(segment, target, first_offset: int) -> None:
    for pos, header in segment.iter_headers():
        if header.base_offset >= first_offset:
            target.append(segment.pread(pos, header.size_bytes), largest_offset=header.last_offset,
                          max_timestamp=header.max_timestamp, shallow_offset=header.last_offset)


def test_reader_reads_a_segment_swapped_out_after_it_listed_with_that_segments_own_index(tmp_path):
    # File systems stamp directory changes with a coarse clock: a swap in the same tick as a reader's last
    # listing leaves the directory's mtime as the reader saw it, so the reader keeps its (still open) old
    # segment. That segment's index must be the old one too: positions from the cleaned segment's index
    # land in the middle of the old file's batches.
    d = tmp_path / "t-0"
    config = LogConfig(index_interval_bytes=64)

    def value(i: int) -> bytes:
        return b"v%d-" % i + b"x" * (7 * i % 50)  # batches of different sizes

    writer = PartitionLog.open(d, mode="writer", create=True, config=config)
    try:
        for i in range(20):
            writer.append_batches(keyed_batch([(b"k%d" % i, value(i))]))
        with PartitionLog.open(d, mode="reader") as reader:  # lists segment 0 while it is active
            for i in range(20, 40):
                writer.append_batches(keyed_batch([(b"k%d" % i, value(i))]))
            writer.roll()
            reader.refresh(force=True)  # segment 0 stays the same file, now longer and inactive
            listed_mtime_ns = os.stat(d).st_mtime_ns
            with PartitionLog.open(d, mode="cleaner", config=config) as cleaner:
                old = cleaner.segments[0]
                cleaned = cleaner.new_cleaned_segment(0)
                _copy_batches_from(old, cleaned, 15)  # offsets 0..14 compacted away
                cleaned.finalise()
                cleaner.replace_segments([cleaned], [old])
            os.utime(d, ns=(os.stat(d).st_atime_ns, listed_mtime_ns))  # the swap fell in the listing's tick
            for target in (3, 17, 26, 39):
                records = decode_batch(reader.read(target).data).records
                # The old segment's batch at `target`, or (once the swap is seen) the next surviving one.
                assert records[0].offset in (target, max(target, 15))
                assert records[0].value == value(records[0].offset)
            assert [r.offset for _, r in reader.iter_records(26)] == list(range(26, 40))
    finally:
        writer.close()


def test_reader_lists_again_after_a_roll_stamped_in_the_same_tick_as_its_listing(tmp_path):
    # With coarse directory timestamps a roll just after a reader listed can leave the directory's mtime as
    # the reader saw it; the reader must not take that for "unchanged" and stall at the old segment's end.
    import time

    d = tmp_path / "t-0"
    with PartitionLog.open(d, mode="writer", create=True) as writer:
        writer.append_batches(keyed_batch([(b"a", b"1")]))
        with PartitionLog.open(d, mode="reader") as reader:
            tick_ns = time.time_ns() + 10**9  # a stamp the reader's listing cannot be a whole tick past
            os.utime(d, ns=(tick_ns, tick_ns))
            reader.refresh(force=True)
            assert reader.read(1).data == b""
            writer.roll()
            writer.append_batches(keyed_batch([(b"b", b"2")]))
            os.utime(d, ns=(tick_ns, tick_ns))  # the roll fell in the listing's tick
            assert [r.value for r in decode_batch(reader.read(1).data).records] == [b"2"]
            assert reader.log_end_offset == 2
