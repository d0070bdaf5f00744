"""The Spark integration in a real local-mode session: ingest, the logsegments data source both ways, the
duplication report, and the CLI end to end. Partition choice is checked against kafka-python's murmur2."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from cleaner.duplication import estimate_partition
from segments.partition.log import PartitionLog
from segments.spark.session import SparkUnavailableError, find_java
from segments.tools.verify import verify_paths

from ..kafka_fixtures import copy_kafka_fixture

pytestmark = pytest.mark.slow

TS0 = 1_700_000_000_000


def kafka_partition(key: bytes, n: int) -> int:
    return (kafka_python_murmur2(key) & 0x7FFFFFFF) % n


def _java_or_skip():
    try:
        find_java()
    except SparkUnavailableError as exc:
        pytest.skip(f"Spark cannot start here: {exc}")


@pytest.fixture(scope="module")
def spark():
    _java_or_skip()
    from segments.spark import get_session

    session = get_session("local[2]", app_name="logcleaner-tests", conf={"spark.sql.shuffle.partitions": "4"})
    yield session
    session.stop()


def _records(directory: Path):
    with PartitionLog.open(directory, mode="reader") as plog:
        return [(r.offset, r.key, r.value, r.timestamp, [(h.key, h.value) for h in r.headers])
                for _, r in plog.iter_records()]


def _parquet(path: Path, n: int = 4000, keys: int = 600) -> list[dict]:
    rows = [
        {"id": f"user-{(i * 7919) % keys}", "payload": b"%d:" % i + bytes([i % 256]) * (i % 50),
         "ts": dt.datetime.fromtimestamp((TS0 + 13 * i) / 1000, tz=dt.UTC)}
        for i in range(n)
    ]
    table = pa.table({"id": [r["id"] for r in rows], "payload": pa.array([r["payload"] for r in rows], pa.binary()),
                      "ts": pa.array([r["ts"] for r in rows], pa.timestamp("ms", tz="UTC"))})
    pq.write_table(table, path, row_group_size=700)
    return rows


def test_parquet_ingest_puts_every_row_in_kafkas_partition_in_input_order(spark, tmp_path):
    from segments.spark.ingest import ingest

    rows = _parquet(tmp_path / "in.parquet")
    result = ingest(spark, str(tmp_path / "in.parquet"), topic="users", partitions=5, key_column="id",
                    value_column="payload", timestamp_column="ts", output=str(tmp_path / "logs"),
                    records_per_batch=64, segment_bytes=32 * 1024, compression="lz4")
    assert result.total_records == len(rows)
    # The first task found its Python worker with the kernels loaded: the first ingest of a session warms one
    # (an RDD job given a DataFrame function's worker environment, so both draw from one pool of workers;
    # without, loading them takes the task a good part of a second). Of 6 tasks on 2 cores, at most the
    # other first one started a worker of its own.
    assert result.cold_tasks <= 1
    for p in range(5):
        expected = [(r["id"].encode(), r["payload"], int(r["ts"].timestamp() * 1000)) for r in rows
                    if kafka_partition(r["id"].encode(), 5) == p]
        got = _records(tmp_path / "logs" / f"users-{p}")
        assert [(k, v, t) for _, k, v, t, _ in got] == expected
        assert [o for o, *_ in got] == list(range(len(expected)))
        assert result.records[p] == len(expected)
    report = verify_paths([tmp_path / "logs"])
    assert not report.problems and report.records == len(rows)
    back = spark.read.format("logsegments").load(str(tmp_path / "logs")).select("key", "value", "timestamp").collect()
    assert sorted((r.key, r.value, round(r.timestamp.timestamp() * 1000)) for r in back) == sorted(
        (r["id"].encode(), r["payload"], round(r["ts"].timestamp() * 1000)) for r in rows
    )


def test_ingest_counts_null_keys_in_every_task_and_refuses_or_drops_them(spark, tmp_path):
    from segments.spark.ingest import NullKeyError, ingest

    keys = [None if i % 250 == 249 else f"k{i % 31}" for i in range(2000)]  # 8 null keys, in every row group
    pq.write_table(pa.table({"k": keys, "n": list(range(2000))}), tmp_path / "in.parquet", row_group_size=500)
    out = tmp_path / "new" / "logs"
    with pytest.raises(NullKeyError, match="8 of 2000 rows have a null key column 'k'; nothing was written"):
        ingest(spark, str(tmp_path / "in.parquet"), topic="t", partitions=3, key_column="k", value_format="json",
               output=str(out))
    assert not (tmp_path / "new").exists()  # the staged pieces and the directories the job made are gone

    result = ingest(spark, str(tmp_path / "in.parquet"), topic="t", partitions=3, key_column="k", value_format="json",
                    output=str(out), null_keys="drop")
    assert (result.rows_read, result.null_key_rows_dropped, result.total_records) == (2000, 8, 1992)
    for p in range(3):
        expected = [(k.encode(), {"k": k, "n": i}) for i, k in enumerate(keys)
                    if k is not None and kafka_partition(k.encode(), 3) == p]
        assert [(k, json.loads(v)) for _, k, v, _, _ in _records(out / f"t-{p}")] == expected
    parts = result.timings_s  # the run's parts, each inside the ingest's wall time
    assert {"plan", "worker_start", "kernels", "rows", "job_end", "commit"} <= set(parts)
    assert all(s >= 0 for s in parts.values()) and sum(parts.values()) <= result.write_s + 0.05
    assert result.cold_tasks <= 1  # see the test above


def test_data_source_round_trip_of_headers_nulls_and_timestamps_across_tasks(spark, tmp_path):
    from pyspark.sql import Row

    rows = [
        Row(key=b"k%d" % (i % 37), value=None if i % 9 == 0 else b"v%d" % i,
            headers=[] if i % 4 else [Row(key="trace", value=b"%d" % i), Row(key="empty", value=None)],
            timestamp=dt.datetime.fromtimestamp((TS0 + i) / 1000, tz=dt.UTC))
        for i in range(900)
    ]
    schema = "key binary, value binary, headers array<struct<key:string,value:binary>>, timestamp timestamp"
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 4), schema)  # 4 tasks, input order kept
    out = tmp_path / "logs"
    df.write.format("logsegments").option("topic", "t").option("partitions", 3).option("recordsPerBatch", 50) \
        .mode("append").save(str(out))
    for p in range(3):
        expected = [(r.key, r.value, TS0 + i, [(h.key, h.value) for h in r.headers])
                    for i, r in enumerate(rows) if kafka_partition(r.key, 3) == p]
        assert [(k, v, t, h) for _, k, v, t, h in _records(out / f"t-{p}")] == expected

    back = spark.read.format("logsegments").load(str(out))
    assert back.rdd.getNumPartitions() == 3  # one input partition per log partition
    got = sorted([(r.key, r.value, int(r.timestamp.timestamp() * 1000), [(h.key, h.value) for h in r.headers],
                  r.topic, r.timestamp_type, r.producer_id, r.is_transactional) for r in back.collect()], key=repr)
    assert got == sorted([(r.key, r.value, TS0 + i, [(h.key, h.value) for h in r.headers], "t", 0, -1, False)
                         for i, r in enumerate(rows)], key=repr)


def test_append_continues_after_the_log_end_and_overwrite_replaces(spark, tmp_path):
    out = str(tmp_path / "logs")

    def write(values, mode):
        df = spark.createDataFrame([(b"key-%d" % i, v) for i, v in enumerate(values)], "key binary, value binary")
        df.write.format("logsegments").option("topic", "t").option("partitions", 2).mode(mode).save(out)

    write([b"a"] * 10, "append")
    write([b"b"] * 10, "append")
    for p in range(2):
        got = _records(tmp_path / "logs" / f"t-{p}")
        assert [o for o, *_ in got] == list(range(len(got)))
        values = [v for _, _, v, _, _ in got]
        assert values == sorted(values) and set(values) == {b"a", b"b"}  # all of the first write, then the second
    assert sum(len(_records(tmp_path / "logs" / f"t-{p}")) for p in range(2)) == 20
    write([b"c"] * 4, "overwrite")
    assert sorted(v for p in range(2) for _, _, v, _, _ in _records(tmp_path / "logs" / f"t-{p}")) == [b"c"] * 4
    assert not verify_paths([tmp_path / "logs"]).problems


def test_write_errors_are_clear(spark, tmp_path):
    df = spark.createDataFrame([(b"k", b"v")], "key binary, value binary")
    out = str(tmp_path / "logs")
    df.write.format("logsegments").option("topic", "t").option("partitions", 2).mode("append").save(out)
    with pytest.raises(Exception, match="appending with 3 partitions would move keys"):
        df.write.format("logsegments").option("topic", "t").option("partitions", 3).mode("append").save(out)
    nulls = spark.createDataFrame([(None, b"v")], "key binary, value binary")
    with pytest.raises(Exception, match="is null; a compacted topic needs a key"):
        nulls.write.format("logsegments").option("topic", "u").option("partitions", 1).mode("append").save(out)
    assert not any(p.name.startswith(".logsegments-staging") for p in (tmp_path / "logs").iterdir())


def test_real_kafka_partition_read_through_the_data_source(spark, tmp_path):
    copy_kafka_fixture("kafka-2.4-c2/raw", tmp_path / "logs" / "c2-0")
    df = spark.read.format("logsegments").load(str(tmp_path / "logs"))
    rows = df.select("offset", "key").collect()
    assert len(rows) == 2000 and sorted(r.offset for r in rows) == list(range(2000))
    assert len({r.key for r in rows}) == 50


def test_duplication_counts_with_spark_equal_the_local_tool(spark, tmp_path):
    from segments.spark.duplication import duplication_counts
    from segments.spark.ingest import ingest

    _parquet(tmp_path / "in.parquet", n=6000, keys=900)
    ingest(spark, str(tmp_path / "in.parquet"), topic="users", partitions=3, key_column="id", value_column="payload",
           output=str(tmp_path / "logs"), segment_bytes=16 * 1024)
    local = {p: estimate_partition(tmp_path / "logs" / f"users-{p}", method="exact") for p in range(3)}
    exact = duplication_counts(spark, [str(tmp_path / "logs")], method="exact")
    bloom = duplication_counts(spark, [str(tmp_path / "logs")], method="bloom", memory_bytes=32 * 1024)
    for p in range(3):
        e, b, ref = exact[p], bloom[p], local[p]
        assert (e["name"], e["records"], e["distinct_keys"], e["method"]) == (f"users-{p}", ref.records, ref.distinct_keys, "exact")
        assert b["method"] == "bloom" and abs(b["distinct_keys"] - ref.distinct_keys) <= b["distinct_bound"]
        assert b["records"] == ref.records


def test_cli_ingest_with_compaction_keeps_the_latest_row_per_key(tmp_path):
    _java_or_skip()
    rows = [{"sku": f"sku-{i % 120}", "price": i, "ts": TS0 + i} for i in range(3000)]
    with open(tmp_path / "in.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    cli = Path(sys.executable).with_name("logcleaner")
    proc = subprocess.run(
        [str(cli), "ingest", str(tmp_path / "in.jsonl"), "--topic", "prices", "--partitions", "3", "--key-column", "sku",
         "--value-format", "json", "--timestamp-column", "ts", "--output", str(tmp_path / "logs"), "--compact",
         "--master", "local[2]"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ingested 3000 records into 3 partition(s)" in proc.stdout
    assert "compacted: 2880 duplicate records removed" in proc.stdout
    latest = {}
    for r in rows:
        latest[r["sku"].encode()] = r
    got = {}
    for p in range(3):
        for _, k, v, t, _ in _records(tmp_path / "logs" / f"prices-{p}"):
            assert kafka_partition(k, 3) == p
            assert k not in got
            got[k] = (json.loads(v), t)
    assert got == {k: (r, r["ts"]) for k, r in latest.items()}


def test_missing_java_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(SparkUnavailableError, match="is not an executable"):
        find_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkUnavailableError, match="Java is not installed"):
        find_java()
    old = tmp_path / "bin" / "java"
    old.parent.mkdir()
    old.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    old.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkUnavailableError, match="is Java 11; Spark 4 needs Java 17"):
        find_java()
