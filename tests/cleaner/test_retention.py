"""Retention of whole segments for compacted logs: time, size, log start, high watermark, never the active one."""

from __future__ import annotations

import os

from cleaner.retention import apply_retention, segments_to_delete
from cleaner.settings import Settings
from segments.checkpoint import read_offset_checkpoint, update_offset_checkpoint
from segments.log import LogConfig, PartitionLog
from segments.recovery import parse_segment_file_name

from ..segments.helpers import keyed_batch, read_all

T0 = 1_700_000_000_000


def build(d, segments=5, per_segment=3):
    """`segments` segments (plus an empty active one); segment i holds timestamps T0 + 1000*i + j."""
    with PartitionLog.open(d, mode="writer", create=True, config=LogConfig()) as log:
        for i in range(segments):
            for j in range(per_segment):
                log.append_batches(keyed_batch([(b"k%d" % j, b"v%d-%d" % (i, j))], timestamp_ms=T0 + 1000 * i + j))
            log.roll()


def topic(**values):
    return Settings.from_mappings({"cleanup.policy": "compact,delete", **values}).topic("t")


def bases(d):
    with PartitionLog.open(d, mode="reader") as log:
        return [s.base_offset for s in log.segments]


def test_segment_exactly_retention_ms_old_stays_one_millisecond_more_goes(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    newest_of_first = T0 + 2
    settings = topic(**{"retention.ms": 10_000})
    with PartitionLog.open(d, mode="cleaner") as log:
        assert segments_to_delete(log, settings, newest_of_first + 10_000) == (0, "")
        assert segments_to_delete(log, settings, newest_of_first + 10_001) == (1, "retention.ms")
        result = apply_retention(log, settings, newest_of_first + 10_001)
    assert result.segments_deleted == 1 and result.log_start_offset == 3
    assert bases(d) == [3, 6, 9, 12, 15]
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 3}
    assert [r[0] for r in read_all(d)] == list(range(3, 15))


def test_active_segment_is_never_deleted_even_when_everything_is_expired(tmp_path):
    d = tmp_path / "t-0"
    with PartitionLog.open(d, mode="writer", create=True) as log:
        log.append_batches(keyed_batch([(b"a", b"1")], timestamp_ms=T0))
        log.roll()
        log.append_batches(keyed_batch([(b"b", b"2")], timestamp_ms=T0))  # active, non-empty
    with PartitionLog.open(d, mode="cleaner") as log:
        result = apply_retention(log, topic(**{"retention.ms": 1}), T0 + 10**9)
    assert result.segments_deleted == 1
    assert bases(d) == [1]


def test_size_retention_deletes_oldest_segments_while_log_exceeds_retention_bytes(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    with PartitionLog.open(d, mode="reader") as log:
        sizes = [s.size_bytes for s in log.segments]
    keep_bytes = sum(sizes[2:])
    with PartitionLog.open(d, mode="cleaner") as log:
        result = apply_retention(log, topic(**{"retention.bytes": keep_bytes}), T0)
    assert (result.segments_deleted, result.reason) == (2, "retention.bytes")
    assert bases(d)[0] == 6


def test_nothing_at_or_past_the_high_watermark_is_deleted(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    update_offset_checkpoint(tmp_path / "replication-offset-checkpoint", {("t", 0): 7})
    with PartitionLog.open(d, mode="cleaner") as log:
        result = apply_retention(log, topic(**{"retention.ms": 1}), T0 + 10**9)
    assert result.segments_deleted == 2  # segments [0,3) and [3,6) end below 7; [6,9) does not
    assert bases(d)[0] == 6


def test_compact_only_topic_deletes_just_the_segments_below_log_start(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    update_offset_checkpoint(tmp_path / "log-start-offset-checkpoint", {("t", 0): 7})
    settings = Settings.from_mappings({"cleanup.policy": "compact", "retention.ms": 1}).topic("t")
    with PartitionLog.open(d, mode="cleaner") as log:
        result = apply_retention(log, settings, T0 + 10**9)
    assert (result.segments_deleted, result.reason) == (2, "log start offset")
    assert bases(d)[0] == 6
    assert not [n for n in os.listdir(d) if (p := parse_segment_file_name(n)) is not None and p.state]
