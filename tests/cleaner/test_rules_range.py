"""Where a round cleans: checkpoint, log start, high watermark, min.compaction.lag.ms, forced bounds, full maps."""

from __future__ import annotations

import os
import shutil

import pytest

from segments.codec import format as fmt
from segments.codec.legacy import encode_legacy_message
from segments.codec.records import Record, encode_batch
from segments.partition.checkpoint import read_offset_checkpoint, update_offset_checkpoint

from .builders import (
    BIG_MAP_BYTES,
    ROLL,
    T0,
    TOPIC,
    batch,
    build_log,
    clean,
    full_records,
    partition_dir,
    random_log,
    raw_batches,
    records,
    set_high_watermark,
    write_raw_segment,
)

CHECKPOINT = "cleaner-offset-checkpoint"


def _checkpoint(directory) -> int | None:
    return read_offset_checkpoint(directory.parent / CHECKPOINT).get((TOPIC, 0))


def _set_checkpoint(directory, offset: int) -> None:
    update_offset_checkpoint(directory.parent / CHECKPOINT, {(TOPIC, 0): offset})


def test_round_starts_at_the_checkpoint_and_advances_it_to_its_end_offset(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"a1")]), batch([(b"a", b"a2")]), ROLL, batch([(b"b", b"b1")])])
    _set_checkpoint(d, 2)
    first = clean(d, now_ms=T0 + 1000)
    assert (first.first_dirty, first.end_offset) == (2, 3)
    assert _checkpoint(d) == 3
    assert [o for o, _, _ in records(d)] == [0, 1, 2]  # the clean section's duplicates are not indexed

    build_log(d, [batch([(b"a", b"a3")])])  # 3
    second = clean(d, now_ms=T0 + 1000)
    assert (second.first_dirty, second.end_offset) == (3, 4)
    assert _checkpoint(d) == 4
    assert records(d) == [(2, b"b", b"b1"), (3, b"a", b"a3")]


def test_checkpoint_inside_a_segment_indexes_only_the_records_from_it_on(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")]), batch([(b"b", b"b1")]),  # 0, 1: the clean part of the segment
        batch([(b"b", b"b2"), (b"a", b"a2")]),  # 2-3: the checkpoint is 3, inside this batch
    ])
    _set_checkpoint(d, 3)
    result = clean(d, now_ms=T0 + 1000)
    assert (result.first_dirty, result.end_offset, result.records_indexed) == (3, 4, 1)
    assert records(d) == [(1, b"b", b"b1"), (2, b"b", b"b2"), (3, b"a", b"a2")]  # b2 is read, not indexed


def test_round_with_nothing_dirty_changes_nothing(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"a1")]), batch([(b"a", b"a2")])])
    clean(d, now_ms=T0 + 1000)
    before = raw_batches(d)
    again = clean(d, now_ms=T0 + 1000)
    assert (again.first_dirty, again.end_offset, again.records_read) == (2, 2, 0)
    assert raw_batches(d) == before


@pytest.mark.parametrize("stale", [100, -5])
def test_checkpoint_outside_the_log_is_reset_to_the_log_start(tmp_path, stale):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"a1")]), batch([(b"a", b"a2")]), batch([(b"z", b"z")])])
    (d.parent / CHECKPOINT).write_text(f"0\n1\n{TOPIC} 0 {stale}\n")
    result = clean(d, now_ms=T0 + 1000)
    assert (result.first_dirty, result.end_offset) == (0, 3)
    assert _checkpoint(d) == 3
    assert records(d) == [(1, b"a", b"a2"), (2, b"z", b"z")]


def test_checkpoint_below_the_log_start_offset_is_reset_to_it(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"a1")]), ROLL, batch([(b"a", b"a2")]), batch([(b"a", b"a3")])])
    update_offset_checkpoint(d.parent / "log-start-offset-checkpoint", {(TOPIC, 0): 1})
    _set_checkpoint(d, 0)
    result = clean(d, now_ms=T0 + 1000)
    assert (result.first_dirty, result.end_offset) == (1, 3)
    assert [o for o, _, _ in records(d)] == [2]


def test_high_watermark_bounds_cleaning_rounded_down_to_its_segment(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")]), batch([(b"a", b"a2")]),  # 0, 1
        ROLL,
        batch([(b"a", b"a3")]), batch([(b"b", b"b1")]),  # 2, 3
        ROLL,
        batch([(b"c", b"c1")]),  # 4
    ])
    set_high_watermark(d, 3)
    before = raw_batches(d)
    result = clean(d, now_ms=T0 + 1000)
    assert (result.bound, result.first_uncleanable, result.end_offset) == ("high watermark", 2, 2)
    after = raw_batches(d)
    assert sorted(after) == [1, 2, 3, 4]  # a2 stays: a3 lies past the high watermark's segment
    assert all(after[o] == before[o] for o in (1, 2, 3, 4))


def test_min_compaction_lag_keeps_recent_segments_out_of_the_round(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1", T0)]), batch([(b"a", b"a2", T0 + 1)]),  # 0, 1
        ROLL,
        batch([(b"a", b"a3", T0 + 10_000)]), batch([(b"b", b"b1", T0 + 10_001)]),  # 2, 3
        ROLL,
        batch([(b"b", b"b2", T0 + 20_000)]),  # 4
    ])
    now = T0 + 20_500
    result = clean(d, now_ms=now, settings={"min.compaction.lag.ms": 5_000})
    assert (result.bound, result.first_uncleanable) == ("min.compaction.lag.ms", 4)
    assert records(d) == [(2, b"a", b"a3"), (3, b"b", b"b1"), (4, b"b", b"b2")]


def test_forced_range_cleans_from_the_given_offset_to_the_segment_holding_the_upper_one(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")]), batch([(b"b", b"b1")]),  # 0, 1
        ROLL,
        batch([(b"a", b"a2")]), batch([(b"b", b"b2")]),  # 2, 3
        ROLL,
        batch([(b"a", b"a3")]), batch([(b"c", b"c1")]),  # 4, 5
        ROLL,
        batch([(b"b", b"b3")]),  # 6
    ])
    result = clean(d, now_ms=T0 + 1000, forced_from=3, forced_to=5)
    assert (result.first_dirty, result.first_uncleanable, result.end_offset) == (3, 4, 4)
    assert [o for o, _, _ in records(d)] == [0, 2, 3, 4, 5, 6]  # only b1 (superseded by b2 at 3) went


def test_segment_without_timestamps_falls_back_to_its_mtime_for_the_min_compaction_lag(tmp_path):
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    v0 = [encode_legacy_message(o, b"a", b"a%d" % o, magic=fmt.MAGIC_V0) for o in (0, 1)]
    path = write_raw_segment(d, 0, b"".join(v0))
    write_raw_segment(d, 2, b"")
    now = T0 + 100_000
    lag = {"min.compaction.lag.ms": 10_000}
    os.utime(path, ns=((now - 5_000) * 1_000_000,) * 2)  # too recent
    recent = clean(d, now_ms=now, settings=lag)
    assert (recent.bound, recent.first_uncleanable) == ("min.compaction.lag.ms", 0)
    assert [o for o, _, _ in records(d)] == [0, 1]
    os.utime(path, ns=((now - 50_000) * 1_000_000,) * 2)
    old = clean(d, now_ms=now, settings=lag)
    assert (old.bound, old.first_uncleanable) == ("active segment", 2)
    assert [o for o, _, _ in records(d)] == [1]


def test_offset_gap_between_segments_does_not_stall_a_full_map(tmp_path):
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    write_raw_segment(d, 0, encode_batch([Record(0, T0, b"a", b"1")], base_offset=0)
                      + encode_batch([Record(1, T0, b"a", b"2")], base_offset=1))
    write_raw_segment(d, 5, encode_batch([Record(5, T0, b"b", b"1")], base_offset=5))
    write_raw_segment(d, 10, b"")
    first = clean(d, now_ms=T0 + 1000, map_bytes=48)  # one key: fills at b, after the gap 2..4
    assert (first.map_full, first.end_offset) == (True, 5)
    assert _checkpoint(d) == 5
    second = clean(d, now_ms=T0 + 1000, map_bytes=48)
    assert (second.first_dirty, second.end_offset) == (5, 10) and second.done
    assert records(d) == [(1, b"a", b"2"), (5, b"b", b"1")]


@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("map_bytes", [48, 96])
def test_tiny_map_progresses_round_after_round_and_ends_like_a_big_map(tmp_path, map_bytes, seed):
    small = partition_dir(tmp_path / "small")
    random_log(small, seed)
    big = partition_dir(tmp_path / "big")
    shutil.copytree(small, big)
    done = clean(big, now_ms=T0 + 1000, map_bytes=BIG_MAP_BYTES)
    assert done.done and not done.map_full

    rounds = 0
    while True:
        rounds += 1
        assert rounds < 200
        result = clean(small, now_ms=T0 + 1000, map_bytes=map_bytes)
        assert result.end_offset > result.first_dirty
        if result.done:
            break
    assert rounds > 3
    assert full_records(small) == full_records(big)
