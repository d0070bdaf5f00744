"""Retention of whole segments (the delete policy): time at its boundary, size, log start, high watermark, never the
active segment; as a library call and through `logcleaner clean` with a controlled clock (`--now-ms`)."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from cleaner.cli import main
from cleaner.retention import apply_retention, segments_to_delete
from cleaner.settings import Settings
from segments.codec.errors import OffsetOutOfRangeError
from segments.files.names import parse_segment_file_name
from segments.partition.checkpoint import read_offset_checkpoint, update_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog

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


# ---- `logcleaner clean` with a controlled clock (--now-ms) ----------------------------------------------------

def clean_cli(*args):
    out = CliRunner().invoke(main, ["clean", *map(str, args)])
    assert out.exit_code == 0, out.output
    return out.output


def newest_timestamps(d):
    with PartitionLog.open(d, mode="reader") as log:
        return [s.max_timestamp for s in log.segments]


def test_clean_delete_policy_keeps_a_segment_exactly_retention_ms_old_and_deletes_it_one_millisecond_later(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    newest_of_first = newest_timestamps(d)[0]
    assert newest_of_first == T0 + 2
    policy = ["--set", "cleanup.policy=delete", "--set", "retention.ms=10000"]
    assert clean_cli(d, *policy, "--now-ms", newest_of_first + 10_000) == "t-0: nothing to do\n"
    assert bases(d) == [0, 3, 6, 9, 12, 15]
    assert not (tmp_path / "log-start-offset-checkpoint").exists()
    output = clean_cli(d, *policy, "--now-ms", newest_of_first + 10_001)
    assert output == "t-0: deleted 1 segment(s), 0.00 MB (retention.ms), log start 3\n"
    assert bases(d) == [3, 6, 9, 12, 15]
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 3}


def test_retention_hours_minutes_and_ms_follow_kafkas_precedence_in_clean(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    now = newest_timestamps(d)[0] + 60_001  # the first segment is one minute and a millisecond old
    policy = ["--set", "cleanup.policy=delete", "--now-ms", now]
    assert "nothing to do" in clean_cli(d, *policy, "--set", "log.retention.hours=1")
    assert "nothing to do" in clean_cli(d, *policy, "--set", "log.retention.hours=0",  # minutes win over hours
                                        "--set", "log.retention.minutes=2")
    assert "nothing to do" in clean_cli(d, *policy, "--set", "log.retention.minutes=1",  # ms wins over minutes
                                        "--set", "log.retention.ms=60001")
    assert "deleted 1 segment(s)" in clean_cli(d, *policy, "--set", "log.retention.minutes=1")
    assert bases(d)[0] == 3


def test_clean_size_retention_deletes_the_oldest_segments_until_the_log_fits(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    with PartitionLog.open(d, mode="reader") as log:
        sizes = [s.size_bytes for s in log.segments]
    newest_three = sum(sizes[3:])  # segments 3, 4 and the active one

    def clean_to(limit):
        return clean_cli(d, "--set", "cleanup.policy=delete", "--set", "retention.ms=-1",
                         "--set", f"retention.bytes={limit}", "--now-ms", T0 + 10**12)

    # As Kafka: a segment goes only if the log is still at least retention.bytes without it.
    assert "deleted 2 segment(s), 0.00 MB (retention.bytes), log start 6" in clean_to(newest_three + 1)
    assert bases(d) == [6, 9, 12, 15]
    assert "deleted 1 segment(s), 0.00 MB (retention.bytes), log start 9" in clean_to(newest_three)
    assert bases(d) == [9, 12, 15]
    assert "nothing to do" in clean_to(newest_three)


def test_clean_never_deletes_the_active_segment_and_a_reader_at_the_old_start_gets_out_of_range(tmp_path):
    d = tmp_path / "t-0"
    with PartitionLog.open(d, mode="writer", create=True) as log:
        for i in range(3):
            log.append_batches(keyed_batch([(b"k", b"v%d" % i)], timestamp_ms=T0 + i))
            log.roll()
        log.append_batches(keyed_batch([(b"k", b"active")], timestamp_ms=T0))  # active, non-empty, expired too
    with PartitionLog.open(d, mode="reader") as reader:  # a consumer positioned at the log start, open throughout
        assert reader.log_start_offset == 0 and reader.read(0).data
        output = clean_cli(d, "--set", "cleanup.policy=delete", "--set", "retention.ms=1", "--now-ms", T0 + 10**9)
        assert output == "t-0: deleted 3 segment(s), 0.00 MB (retention.ms), log start 3\n"
        with pytest.raises(OffsetOutOfRangeError) as raised:
            reader.read(0)
        assert (raised.value.log_start_offset, raised.value.log_end_offset) == (3, 4)
        assert [r[2] for r in read_all(d, 3)] == [b"active"]
    assert bases(d) == [3]
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 3}
    with PartitionLog.open(d, mode="reader") as fresh:
        assert fresh.log_start_offset == 3
        with pytest.raises(OffsetOutOfRangeError):
            fresh.read(2)
    # the active segment alone is never deleted, however old
    assert clean_cli(d, "--set", "cleanup.policy=delete", "--set", "retention.ms=1", "--now-ms", T0 + 10**10) == (
        "t-0: nothing to do\n")


def test_clean_dry_run_reports_what_retention_would_delete_and_changes_nothing(tmp_path):
    d = tmp_path / "t-0"
    build(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    output = clean_cli(d, "--dry-run", "--set", "cleanup.policy=delete", "--set", "retention.ms=1",
                       "--now-ms", T0 + 10**9)
    assert output == "t-0 [delete: --set]: would delete 5 segment(s), 0.00 MB (retention.ms), log start 15\n"
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert not (tmp_path / "log-start-offset-checkpoint").exists()


def test_compact_delete_deletes_expired_segments_compacts_the_rest_and_measures_size_after_compacting(tmp_path):
    d = tmp_path / "t-0"
    build(d, segments=6, per_segment=3)  # keys k0..k2 in every segment: compaction keeps the last three records
    with PartitionLog.open(d, mode="reader") as log:
        sizes = [s.size_bytes for s in log.segments]
    now = T0 + 1000 * 1 + 2 + 10_001  # segments 0 and 1 are more than 10 s old; the others are not
    # Before compacting, segments 2..5 hold 4 × 3 records; after, three records in one segment. A limit
    # between the two sizes would delete segments if it were applied first: it must not be.
    limit = sum(sizes[2:]) - 1
    output = clean_cli(d, "--set", "cleanup.policy=compact,delete", "--set", "retention.ms=10000",
                       "--set", f"retention.bytes={limit}", "--now-ms", now)
    assert "deleted 2 segment(s)" in output and "(retention.ms), log start 6" in output
    assert "cleaned [6, 18)" in output
    records = read_all(d)
    assert [(o, k, v) for o, k, v, _ in records] == [(15, b"k0", b"v5-0"), (16, b"k1", b"v5-1"), (17, b"k2", b"v5-2")]
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {("t", 0): 6}
    # and a limit below the compacted size deletes, after compacting, the oldest segments that exceed it
    with PartitionLog.open(d, mode="writer") as log:
        for i in range(2):
            log.append_batches(keyed_batch([(b"k9", b"late%d" % i)], timestamp_ms=now))
            log.roll()
    output = clean_cli(d, "--set", "cleanup.policy=compact,delete", "--set", "retention.ms=-1",
                       "--set", "retention.bytes=0", "--now-ms", now)
    assert "(retention.bytes)" in output
    with PartitionLog.open(d, mode="reader") as log:
        assert len(log.segments) == 1 and log.segments[0].size_bytes == 0  # only the (empty) active one is left
