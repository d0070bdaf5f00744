"""Segment grouping and the cleaned segments' files: size limits, offset span, names, mtimes and indexes."""

from __future__ import annotations

import os

from cleaner.recopy import group_segments
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from segments.partition.log import LogConfig, PartitionLog
from segments.tools.verify import verify_paths

from .builders import (
    ROLL,
    T0,
    batch,
    batches,
    build_log,
    clean,
    partition_dir,
    records,
    segment_bases,
    write_raw_segment,
)

SPAN_MAX = fmt.RELATIVE_OFFSET_MAX  # 2^31 - 1
INDEX_EVERY_BATCH = LogConfig(index_interval_bytes=1)


def _groups(directory, end_offset: int, *, segment_bytes=2**31 - 1, segment_index_bytes=2**31 - 1, config=None,
            first_uncleanable=None):
    with PartitionLog.open(directory, mode="cleaner", config=config or LogConfig()) as log:
        groups = group_segments(
            log.segments,
            end_offset,
            first_uncleanable=end_offset if first_uncleanable is None else first_uncleanable,
            segment_bytes=segment_bytes,
            segment_index_bytes=segment_index_bytes,
        )
        return [[s.base_offset for s in g] for g in groups]


def _sizes(directory):
    """(log, offset index, time index) bytes of each segment, by base offset."""
    with PartitionLog.open(directory, mode="reader") as log:
        return {
            s.base_offset: (s.size_bytes, os.stat(s.paths.index).st_size, os.stat(s.paths.timeindex).st_size)
            for s in log.segments
        }


def _unique_batches(first: int, n: int, *, timestamp_step: int = 0):
    return [batch([(b"k%d" % (first + i), b"v" * 20, T0 + timestamp_step * (first + i))]) for i in range(n)]


def test_groups_are_bounded_by_segment_bytes(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [*_unique_batches(0, 3), ROLL, *_unique_batches(3, 2), ROLL, *_unique_batches(5, 1)])
    sizes = _sizes(d)
    fits_two = sizes[0][0] + sizes[3][0]
    assert _groups(d, 6, segment_bytes=fits_two) == [[0, 3], [5]]
    assert _groups(d, 6, segment_bytes=fits_two - 1) == [[0], [3, 5]]
    assert _groups(d, 6, segment_bytes=fits_two + sizes[5][0]) == [[0, 3, 5]]
    clean(d, now_ms=T0 + 1000, settings={"segment.bytes": fits_two})
    assert segment_bases(d) == [0, 5, 6]
    assert [o for o, _, _ in records(d)] == list(range(6))


def test_groups_are_bounded_by_offset_index_bytes(tmp_path):
    d = partition_dir(tmp_path)  # equal timestamps: one time-index entry per segment, many offset entries
    build_log(d, [*_unique_batches(0, 5), ROLL, *_unique_batches(5, 5), ROLL, *_unique_batches(10, 3)],
              config=INDEX_EVERY_BATCH)
    sizes = _sizes(d)
    offset_two, time_two = sizes[0][1] + sizes[5][1], sizes[0][2] + sizes[5][2]
    assert time_two < offset_two
    assert _groups(d, 13, segment_index_bytes=offset_two, config=INDEX_EVERY_BATCH)[0] == [0, 5]
    assert _groups(d, 13, segment_index_bytes=offset_two - 1, config=INDEX_EVERY_BATCH)[0] == [0]
    clean(d, now_ms=T0 + 1000, settings={"segment.index.bytes": offset_two - 1}, config=INDEX_EVERY_BATCH)
    assert segment_bases(d)[:2] == [0, 5]


def test_groups_are_bounded_by_time_index_bytes(tmp_path):
    d = partition_dir(tmp_path)  # increasing timestamps: the time index outgrows the offset index
    build_log(d, [*_unique_batches(0, 5, timestamp_step=10), ROLL, *_unique_batches(5, 5, timestamp_step=10),
                  ROLL, *_unique_batches(10, 3, timestamp_step=10)], config=INDEX_EVERY_BATCH)
    sizes = _sizes(d)
    offset_two, time_two = sizes[0][1] + sizes[5][1], sizes[0][2] + sizes[5][2]
    assert offset_two < time_two
    assert _groups(d, 13, segment_index_bytes=time_two, config=INDEX_EVERY_BATCH)[0] == [0, 5]
    assert _groups(d, 13, segment_index_bytes=time_two - 1, config=INDEX_EVERY_BATCH)[0] == [0]


def test_groups_are_bounded_by_the_2_31_offset_span(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1")], last_offset_delta=2**30),  # 0 .. 2^30
        ROLL,
        batch([(b"b", b"1")], last_offset_delta=2**30 - 3),  # 2^30+1 .. 2^31-2
        ROLL,
        batch([(b"c", b"1")]),  # 2^31-1: the span from 0 is exactly 2^31-1
        ROLL,
        batch([(b"d", b"1")]),  # 2^31
    ])
    assert segment_bases(d) == [0, 2**30 + 1, SPAN_MAX, SPAN_MAX + 1, SPAN_MAX + 2]
    assert _groups(d, SPAN_MAX + 2) == [[0, 2**30 + 1, SPAN_MAX], [SPAN_MAX + 1]]
    clean(d, now_ms=T0 + 1000)
    assert segment_bases(d) == [0, SPAN_MAX + 1, SPAN_MAX + 2]
    assert [o for o, _, _ in records(d)] == [0, 2**30 + 1, SPAN_MAX, SPAN_MAX + 1]
    assert not verify_paths([d]).problems


def test_group_never_spans_more_than_2_31_offsets_when_the_map_fills_mid_segment(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"x", b"1")], last_offset_delta=100),  # 0 .. 100
        ROLL,
        batch([(b"a", b"1"), (b"b", b"1")]),  # 101, 102
        batch([(b"c", b"1")], last_offset_delta=SPAN_MAX - 9),  # 103 .. 2^31+93 (same segment)
    ])
    result = clean(d, now_ms=T0 + 1000, map_bytes=72)  # two keys: the map fills at offset 102
    assert result.map_full and result.end_offset == 102
    assert segment_bases(d) == [0, 101, SPAN_MAX + 95]
    assert [o for o, _, _ in records(d)] == [0, 101, 102, 103]


def test_empty_segments_group_with_their_neighbours_whatever_their_offsets(tmp_path):
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    far = 2**31 + 5
    write_raw_segment(d, 0, encode_batch([Record(0, T0, b"a", b"1"), Record(1, T0, b"b", b"1")], base_offset=0))
    write_raw_segment(d, far, b"")  # an empty segment far beyond the first one's span
    write_raw_segment(d, far + 5, encode_batch([Record(far + 5, T0, b"c", b"1")], base_offset=far + 5))
    write_raw_segment(d, far + 6, b"")  # the active segment
    assert _groups(d, far + 6) == [[0, far], [far + 5]]
    clean(d, now_ms=T0 + 1000)
    assert segment_bases(d) == [0, far + 5, far + 6]
    assert [o for o, _, _ in records(d)] == [0, 1, far + 5]


def test_empty_segment_between_small_ones_is_merged_away(tmp_path):
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    write_raw_segment(d, 0, encode_batch([Record(0, T0, b"a", b"1")], base_offset=0))
    write_raw_segment(d, 1, b"")
    write_raw_segment(d, 3, encode_batch([Record(3, T0, b"a", b"2")], base_offset=3))
    write_raw_segment(d, 4, b"")
    clean(d, now_ms=T0 + 1000)
    assert segment_bases(d) == [0, 4]
    assert records(d) == [(3, b"a", b"2")]


def test_last_batch_of_each_group_is_kept_as_an_empty_header(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1")]), batch([(b"b", b"1")]),  # 0, 1
        ROLL,
        batch([(b"c", b"1")]), batch([(b"d", b"1")]),  # 2, 3
        ROLL,
        batch([(b"b", b"2"), (b"d", b"2")]),  # 4-5
    ])
    sizes = _sizes(d)
    clean(d, now_ms=T0 + 1000, settings={"segment.bytes": sizes[0][0]})  # one group per segment
    kept = {b.header.base_offset: b.header.records_count for b in batches(d)}
    assert kept == {0: 1, 1: 0, 2: 1, 3: 0, 4: 2}  # Kafka would keep only the round's last batch empty
    assert segment_bases(d) == [0, 2, 4, 6]


def test_cleaned_segment_is_named_after_the_groups_first_segment_and_has_its_last_segments_mtime(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1")]), batch([(b"b", b"1")]),  # 0, 1: a goes, yet the segment keeps its name
        ROLL,
        batch([(b"a", b"2")]),  # 2
        ROLL,
        batch([(b"c", b"1")]),  # 3
        ROLL,
        batch([(b"d", b"1")]),  # 4
    ])
    mtimes_ns = {0: 1_600_000_000_000_000_000, 2: 1_600_000_100_123_456_789,
                 3: 1_600_000_200_000_000_000, 4: 1_600_000_300_987_654_321}
    for base, mtime in mtimes_ns.items():
        os.utime(d / fmt.offset_file_name(base, fmt.LOG_SUFFIX), ns=(mtime, mtime))
    sizes = _sizes(d)
    segment_bytes = sizes[0][0] + sizes[2][0]  # groups [0, 2] and [3, 4]
    clean(d, now_ms=T0 + 1000, settings={"segment.bytes": segment_bytes})
    assert segment_bases(d) == [0, 3, 5]
    assert [o for o, _, _ in records(d)] == [1, 2, 3, 4]
    assert os.stat(d / fmt.offset_file_name(0, fmt.LOG_SUFFIX)).st_mtime_ns == mtimes_ns[2]
    assert os.stat(d / fmt.offset_file_name(3, fmt.LOG_SUFFIX)).st_mtime_ns == mtimes_ns[4]


def test_cleaned_indexes_pass_verify_and_the_time_index_ends_with_the_max_timestamp(tmp_path):
    d = partition_dir(tmp_path)
    timestamps = [T0 + t for t in (50, 10, 90, 30, 70, 20, 60, 40)]
    steps = []
    for i, ts in enumerate(timestamps):
        steps.append(batch([(b"k%d" % (i % 5), b"v%d" % i * 10, ts), (b"u%d" % i, b"w" * 30, ts - 5)]))
        if i == 3:
            steps.append(ROLL)
    build_log(d, steps, config=INDEX_EVERY_BATCH)
    clean(d, now_ms=T0 + 1000, config=INDEX_EVERY_BATCH)
    assert segment_bases(d) == [0, 16]
    assert not verify_paths([d]).problems
    kept = batches(d)
    max_ts = max(b.header.max_timestamp for b in kept)
    holder = max(kept, key=lambda b: b.header.max_timestamp)
    with PartitionLog.open(d, mode="reader") as log:
        cleaned = log.segments[0]
        assert cleaned.time_index.last_entry == (max_ts, holder.header.last_offset)
        assert cleaned.offset_index.entries == len(kept) - 1  # one entry per batch after the first
        assert [cleaned.offset_index.entry(i)[0] for i in range(cleaned.offset_index.entries)] == [
            b.header.last_offset for b in kept[1:]
        ]
