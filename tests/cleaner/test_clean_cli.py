"""`logcleaner clean` end to end: the Kafka fixture, exit codes, JSON, dry runs, partial rounds."""

from __future__ import annotations

import hashlib
import json
import re

from click.testing import CliRunner
from kafka.record.memory_records import MemoryRecords

from cleaner.cli import main
from segments.partition.checkpoint import read_offset_checkpoint
from segments.partition.log import PartitionLog

from ..segments.helpers import copy_fixture, read_all, write_log


def fixture_partition(tmp_path, name):
    d = copy_fixture(name, tmp_path)
    return d.rename(d.parent / "c2-0")


def records_of(d):
    return [(o, k, v) for o, k, v, _ in read_all(d)]


def test_clean_of_kafka_fixture_keeps_exactly_what_kafkas_cleaner_kept(tmp_path):
    raw = fixture_partition(tmp_path / "ours", "kafka-2.4-c2/raw")
    theirs = fixture_partition(tmp_path / "theirs", "kafka-2.4-c2/kafka-cleaned")
    out = CliRunner().invoke(main, ["clean", str(raw)])
    assert out.exit_code == 0, out.output
    assert "c2-0: cleaned [0, 1996)" in out.output
    ours = records_of(raw)
    assert len(ours) == 54
    assert ours == records_of(theirs)
    with PartitionLog.open(raw, mode="reader") as log:
        headers = [(r.offset, r.headers) for _, r in log.iter_records()]
    with PartitionLog.open(theirs, mode="reader") as log:
        assert headers == [(r.offset, r.headers) for _, r in log.iter_records()]
    verify = CliRunner().invoke(main, ["verify", str(raw)])
    assert verify.exit_code == 0, verify.output
    # kafka-python, an independent reader, sees the same records in every cleaned segment.
    seen = []
    for log_file in sorted(raw.glob("*.log")):
        records = MemoryRecords(log_file.read_bytes())
        while records.has_next():
            batch = records.next_batch()
            seen.extend((r.offset, r.key, r.value) for r in batch)
    assert seen == ours
    assert read_offset_checkpoint(raw.parent / "cleaner-offset-checkpoint") == {("c2", 0): 1996}


def test_clean_json_reports_one_object_per_partition_and_skips_kraft_metadata(tmp_path):
    logs = tmp_path / "logs"
    write_log(logs / "a-0", 60)
    write_log(logs / "a-1", 60)
    copy_fixture("public/__cluster_metadata-0", logs.parent)
    out = CliRunner().invoke(main, ["clean", "--json", "--set", "cleanup.policy=compact", str(logs)])
    assert out.exit_code == 0, out.output
    objs = {o["partition"]: o for o in map(json.loads, out.output.splitlines())}
    assert objs["__cluster_metadata-0"]["status"] == "skipped"
    for name in ("a-0", "a-1"):
        o = objs[name]
        assert o["status"] == "ok" and o["rounds"] == 1
        assert o["records_written"] < o["records_read"]
        for field in ("bytes_read", "bytes_written", "records_indexed", "map_utilization", "index_s", "recopy_s",
                      "invalid_records", "end_offset"):
            assert field in o


def test_failed_partition_exits_1_and_others_are_still_cleaned(tmp_path):
    logs = tmp_path / "logs"
    write_log(logs / "a-0", 60)
    write_log(logs / "b-0", 60)
    seg = sorted((logs / "a-0").glob("*.log"))[0]
    data = bytearray(seg.read_bytes())
    data[200] ^= 1
    seg.write_bytes(bytes(data))
    out = CliRunner().invoke(main, ["clean", "--set", "cleanup.policy=compact", str(logs)])
    assert out.exit_code == 1
    assert f"a-0: FAILED: {seg}: byte " in out.output
    assert "b-0: cleaned" in out.output
    assert seg.read_bytes() == bytes(data)


def test_dry_run_changes_nothing_and_creates_no_file(tmp_path):
    d = tmp_path / "logs" / "a-0"
    write_log(d, 60)
    for index in d.glob("*.index"):  # an index the open would rebuild (and a cleaner would write back)
        index.unlink()
    before = {str(p.relative_to(tmp_path)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
              for p in tmp_path.rglob("*") if p.is_file()}
    out = CliRunner().invoke(main, ["clean", "--dry-run", str(d)])
    assert out.exit_code == 0 and "would clean" in out.output
    after = {str(p.relative_to(tmp_path)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
             for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # no lock file, no rebuilt index, no checkpoint


def test_a_forced_first_offset_outside_the_log_is_refused(tmp_path):
    d = tmp_path / "logs" / "a-0"
    write_log(d, 60)
    with PartitionLog.open(d, mode="reader") as log:
        end = log.log_end_offset
    out = CliRunner().invoke(main, ["clean", "--from-offset", str(end + 1), str(d)])
    assert out.exit_code == 1 and f"--from-offset {end + 1} is outside the log [0, {end}]" in out.output


def test_tombstones_kept_for_their_horizon_are_announced_with_its_time(tmp_path):
    d = tmp_path / "logs" / "a-0"
    with PartitionLog.open(d, mode="writer", create=True) as log:
        log.append_records([(b"a", b"1"), (b"b", b"2")], timestamp_ms=1_699_999_999_000)
        log.append_records([(b"a", None)], timestamp_ms=1_699_999_999_001)  # a tombstone
        log.roll()
        log.append_records([(b"c", b"3")], timestamp_ms=1_699_999_999_002)
    args = ["clean", "--now-ms", "1700000000000", "--set", "delete.retention.ms=86400000", str(d)]
    summary = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert summary["next_delete_horizon_ms"] == 1_700_086_400_000  # stamped now: now + delete.retention.ms
    text = CliRunner().invoke(main, args).output
    assert "tombstones or transaction markers kept until their delete horizon, 2023-11-15T22:13:20Z" in text


def test_tiny_offset_map_cleans_in_several_rounds_to_the_same_result(tmp_path):
    small = tmp_path / "small" / "a-0"
    big = tmp_path / "big" / "a-0"
    write_log(small, 80)
    write_log(big, 80)
    out = CliRunner().invoke(main, ["clean", "--json", "--set", "log.cleaner.dedupe.buffer.size=72", str(small)])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["rounds"] > 3
    assert CliRunner().invoke(main, ["clean", str(big)]).exit_code == 0
    assert records_of(small) == records_of(big)


def test_once_runs_a_single_round(tmp_path):
    d = tmp_path / "logs" / "a-0"
    write_log(d, 80)
    out = CliRunner().invoke(main, ["clean", "--once", "--json", "--set", "log.cleaner.dedupe.buffer.size=72", str(d)])
    summary = json.loads(out.output)
    assert summary["rounds"] == 1 and summary["end_offset"] < summary["first_uncleanable"]


def test_usage_errors_exit_2(tmp_path):
    write_log(tmp_path / "logs" / "a-0", 5)
    write_log(tmp_path / "logs" / "a-1", 5)
    runner = CliRunner()
    assert runner.invoke(main, ["clean", "--from-offset", "3", str(tmp_path / "logs")]).exit_code == 2
    bad = runner.invoke(main, ["clean", "--set", "min.cleanable.dirty.ratio=2", str(tmp_path / "logs")])
    assert bad.exit_code == 2 and "min.cleanable.dirty.ratio" in bad.output and "[0.0, 1.0]" in bad.output
    assert runner.invoke(main, ["clean", "--set", "no.such.setting=1", str(tmp_path / "logs")]).exit_code == 2
    assert runner.invoke(main, ["clean", "--set", "oops", str(tmp_path / "logs")]).exit_code == 2


def test_config_file_topic_override_applies_to_that_topic_only(tmp_path):
    write_log(tmp_path / "logs" / "a-0", 40)
    write_log(tmp_path / "logs" / "b-0", 40)
    config = tmp_path / "logcleaner.toml"
    config.write_text('"log.cleaner.threads" = 1\n"cleanup.policy" = "compact"\n\n[topics.b]\n"cleanup.policy" = "delete"\n'
                      '"retention.ms" = 1000\n')
    with PartitionLog.open(tmp_path / "logs" / "b-0", mode="reader") as log:
        b_active = log.segments[-1].base_offset
    out = CliRunner().invoke(main, ["clean", "-c", str(config), str(tmp_path / "logs")])
    assert out.exit_code == 0, out.output
    assert "a-0: cleaned" in out.output
    # b is not compacted, only its expired segments go (the test's records are years old): all but the active one
    assert re.search(rf"^b-0: deleted \d+ segment\(s\), [\d.]+ MB \(retention.ms\), log start {b_active}$",
                     out.output, re.M), out.output
    assert "b-0: cleaned" not in out.output


def test_forced_range_cleans_only_below_to_offset(tmp_path):
    d = tmp_path / "logs" / "a-0"
    write_log(d, 80)
    with PartitionLog.open(d, mode="reader") as log:
        bases = [s.base_offset for s in log.segments]
    to = bases[3] + 1  # rounded down to bases[3]
    out = CliRunner().invoke(main, ["clean", "--json", "--from-offset", "0", "--to-offset", str(to), str(d)])
    summary = json.loads(out.output)
    assert summary["first_uncleanable"] == bases[3]
    after = read_all(d)
    assert [r for r in after if r[0] >= bases[3]] == [r for r in read_all_copy(tmp_path, 80) if r[0] >= bases[3]]


def read_all_copy(tmp_path, batches):
    d = tmp_path / "copy" / "a-0"
    write_log(d, batches)
    return read_all(d)
