"""Bulk ingestion: any Spark-readable files → a topic's partition directories, through the `logsegments` source.

Owns the job behind `logcleaner ingest`: read the source (Parquet, JSON lines, CSV, or any format Spark reads),
turn the key column — and the value column, or the whole row as JSON — into bytes, carry an optional timestamp
column, and stage and commit them (below). No shuffle: the DataFrame's order (for one file, the file's order)
is the order within every partition. Returns what it wrote: the committed pieces' records and bytes.

Conversions: binary columns are taken as they are; strings are their UTF-8 bytes; structs, maps and arrays are
their JSON; other types their string form (e.g. an integer key 42 is the two bytes "42", as Kafka's
StringSerializer would have it). A timestamp column may be a timestamp, a date, epoch milliseconds, or a string
Spark's `to_timestamp` parses.

The job is one pass over the input: each Spark task gets its rows as Arrow batches (`mapInArrow`), drops or
counts the rows with a null key, encodes the rest and stages them as pieces (`segments.spark.bulk_write`), and
reports its pieces, counts and timings in one row; the commit then runs here, in the calling process, which
has the staging protocol's code loaded already. No Python process is started for planning or committing (the
`logsegments` data source's writer needs one for each), and the source is read once (no separate pass to
count null keys).

Errors, and what a failure leaves. Everything that can be checked before Spark starts is checked by
`check_ingest` (the source exists and is readable, its format, the value options, the topic name and its
partition count against an existing topic, the output can be created and written). Rows whose key is null are counted by the tasks: with `null_keys="error"` a
task that meets one stops staging and only counts, and the ingest raises `NullKeyError` (with the count) with
nothing written; with `"drop"` they are left out and counted in the result. Every other Spark failure —
reading the source, a failing task — becomes one `IngestError` whose message is one line
(`describe_spark_error`). The tasks stage their pieces outside the topic's partitions, so a failure before the
commit leaves the output as it was: staged files are removed and a log dir the job created is removed again.
An interrupted job (KeyboardInterrupt, a signal's exception) is cancelled, and its tasks waited for, before
the staging is removed; the staging directory is made here before the job, so a task that starts after the
abort fails rather than make it again. Once the commit has started it is not aborted (`on_commit`).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..codec import format as fmt
from ..codec.errors import SegmentError, display_path
from ..files.pathcheck import describe_os_error
from ..partition.log import LogConfig
from .bulk_write import (
    PieceWriter,
    StagedPiece,
    abort_job,
    check_topic_partitions,
    commit_job,
    missing_dirs,
    new_job_id,
    staging_dir,
)
from .session import describe_spark_error

__all__ = [
    "NULL_KEY_POLICIES",
    "IngestError",
    "IngestResult",
    "IngestUsageError",
    "NullKeyError",
    "check_ingest",
    "guess_format",
    "ingest",
]

log = logging.getLogger(__name__)

NULL_KEY_POLICIES = ("error", "drop")
_COLUMNS_NAMED_MAX = 30  # columns listed in an unknown-column message
# Spark error conditions that mean the command line names something that is not there (exit 2, not 1).
_USAGE_CONDITIONS = ("PATH_NOT_FOUND", "DATA_SOURCE_NOT_FOUND", "UNRESOLVED_COLUMN")


class IngestError(SegmentError):
    """An ingest that did not write: the data or Spark failed. The message is one line."""

    def __init__(self, reason: str, *, path: str | None = None) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {reason}" if path else reason)


class IngestUsageError(IngestError):
    """The request names something that is not there or cannot be: a source, column, format, option or topic."""


class NullKeyError(IngestError):
    """`null_rows` of `rows` rows have a null key column (with `null_keys="error"`, or every row with either
    policy); nothing was written."""

    def __init__(self, *, path: str, column: str, null_rows: int, rows: int) -> None:
        self.column = column
        self.null_rows = null_rows
        self.rows = rows
        if null_rows == rows:  # with either policy: dropping every row is a wrong key column, not an ingest
            message = (f"every one of the {rows} rows has a null key column {column!r}; nothing was written "
                       "(is it the right key column?)")
        else:
            message = (f"{null_rows} of {rows} rows have a null key column {column!r}; nothing was written "
                       "(a compacted topic needs a key for every record; --null-keys drop writes the other rows)")
        super().__init__(message, path=path)

_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv",
            ".orc": "orc", ".avro": "avro"}


@dataclass
class IngestResult:
    """Records and bytes this ingest added per partition (its own: another writer's appends meanwhile are not
    counted), rows read and null keys dropped, the parts of `write_s` (`timings_s`), and how many tasks found
    no warm Python worker."""

    topic: str
    partitions: int
    records: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    write_s: float = 0.0
    rows_read: int = 0
    null_key_rows_dropped: int = 0
    timings_s: dict[str, float] = field(default_factory=dict)
    cold_tasks: int = 0  # tasks that started a Python worker of their own (not one warmed beforehand)

    @property
    def total_records(self) -> int:
        return sum(self.records.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def guess_format(source: str) -> str:
    """The Spark format of `source` from its extension (a directory: from the first data file in it; a glob:
    from the files it matches). Raises `IngestUsageError` when no name tells."""
    candidates = []
    for path in map(Path, sorted(glob.glob(source)) if glob.has_magic(source) else [source]):
        if path.is_dir():
            candidates += sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
        else:
            candidates.append(path)
    for candidate in candidates:
        for suffix in reversed(candidate.suffixes):
            if suffix.lower() in _FORMATS:
                return _FORMATS[suffix.lower()]
    raise IngestUsageError("cannot tell the input format from the file names; pass --format", path=source)


def _local_path(source: str) -> str | None:
    """The local filesystem path of `source`, or None for another filesystem's URI (hdfs://, s3a://, ...)."""
    if source.startswith("file://"):
        return source[len("file://"):]
    if source.startswith("file:"):
        return source[len("file:"):]
    head = source.split("/", 1)[0]
    return None if head.endswith(":") and "://" in source else source


def _check_source_readable(source: str) -> None:
    """A local source exists and can be read (a file opened, a directory listed); other URIs are Spark's."""
    local = _local_path(source)
    if local is None:
        return
    paths = sorted(glob.glob(local)) if glob.has_magic(local) else [local]
    if not paths:
        raise IngestUsageError("no file matches this pattern", path=source)
    for path in paths:
        try:
            if os.path.isdir(path):
                os.listdir(path)
            else:
                with open(path, "rb"):
                    pass
        except FileNotFoundError:
            raise IngestUsageError("no such file or directory", path=source) from None
        except OSError as exc:
            raise IngestError(f"cannot read the source: {describe_os_error(exc)}", path=source) from None


def check_ingest(
    source: str,
    *,
    topic: str,
    partitions: int,
    output: str,
    value_column: str | None = None,
    value_format: str | None = None,
    input_format: str | None = None,
    null_keys: str = "error",
    overwrite: bool = False,
) -> str:
    """Check what can be checked without Spark; returns the input format (given, or guessed from the names).

    Requires nothing of Spark and changes nothing. Raises `IngestUsageError` for a source that does not exist,
    a format that cannot be told, inconsistent value options, an unknown null-key policy, an invalid topic, an
    output that is not a directory, or an append whose partition count differs from the topic's;
    `IngestError` for a source that exists but cannot be read.
    """
    if (value_column is None) == (value_format is None):
        raise IngestUsageError("give exactly one of a value column or a value format (json)")
    if value_format is not None and value_format != "json":
        raise IngestUsageError(f"unknown value format {value_format!r}; the one value format is json (the whole row)")
    if null_keys not in NULL_KEY_POLICIES:
        raise IngestUsageError(f"unknown null-key policy {null_keys!r}; one of {', '.join(NULL_KEY_POLICIES)}")
    _check_source_readable(source)
    fmt_name = input_format or guess_format(source)
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise IngestUsageError("the output exists and is not a directory", path=output)
    _check_output_writable(out)
    try:
        check_topic_partitions(out, topic, partitions, overwrite=overwrite)
    except (ValueError, SegmentError) as exc:
        raise IngestUsageError(str(exc)) from None
    return fmt_name


def _check_output_writable(out: Path) -> None:
    """The output, or the nearest directory above it that exists (where the ingest would create it), takes a
    new directory: tried for real (a probe made and removed at once), so that a read-only or immutable
    directory, a file in the way, or a missing permission is said before Spark starts."""
    existing = Path(os.path.abspath(out))
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise IngestUsageError(f"the output cannot be created: {display_path(existing)} is not a directory",
                               path=str(out))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".logcleaner-probe-", dir=existing))
    except OSError as exc:
        refused = OSError(exc.errno, exc.strerror, str(existing))  # the directory, not the probe's name
        raise IngestUsageError(f"the output cannot be written: {describe_os_error(refused)}", path=str(out)) from None


def _check_column(df, name: str, role: str, source: str) -> None:
    if not df.columns:
        raise IngestUsageError("the input has no columns (an empty file?)", path=source)
    if name not in df.columns:
        shown = ", ".join(df.columns[:_COLUMNS_NAMED_MAX]) + (", ..." if len(df.columns) > _COLUMNS_NAMED_MAX else "")
        raise IngestUsageError(f"the {role} column {name!r} is not in the input (columns: {shown})", path=source)


def _as_binary(df, name: str):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    column = F.col(f"`{name}`")
    kind = df.schema[name].dataType
    if isinstance(kind, T.BinaryType):
        return column
    if isinstance(kind, T.StringType):
        return column.cast("binary")
    if isinstance(kind, (T.StructType, T.MapType, T.ArrayType)):
        return F.to_json(column).cast("binary")
    return column.cast("string").cast("binary")


def _as_timestamp(df, name: str, source: str):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    column = F.col(f"`{name}`")
    kind = df.schema[name].dataType
    if isinstance(kind, (T.TimestampType, T.TimestampNTZType)):
        return column
    if isinstance(kind, T.DateType):
        return column.cast("timestamp")
    if isinstance(kind, T.StringType):
        return F.to_timestamp(column)
    if isinstance(kind, T.IntegralType):
        return F.timestamp_millis(column)
    raise IngestUsageError(
        f"the timestamp column {name!r} is {kind.simpleString()}; use a timestamp, date, epoch ms or a string",
        path=source,
    )


def ingest(
    spark,
    source: str,
    *,
    topic: str,
    partitions: int,
    key_column: str,
    output: str,
    value_column: str | None = None,
    value_format: str | None = None,
    input_format: str | None = None,
    timestamp_column: str | None = None,
    compression: str = "none",
    records_per_batch: int = 1000,
    segment_bytes: int | None = None,
    overwrite: bool = False,
    read_options: dict[str, str] | None = None,
    null_keys: str = "error",
    job_id: str | None = None,
    on_commit: Callable[[bool], None] | None = None,
) -> IngestResult:
    """Write the rows of `source` into `output` as topic `topic` with `partitions` partitions (see the docstring).

    Requires a session with the `logsegments` data source registered (`get_session`). `null_keys`: "error"
    refuses a source with any null key, "drop" leaves those rows out (`IngestResult.null_key_rows_dropped`).
    `job_id` (default: a new one, `bulk_write.new_job_id`) names the staging directory, so that a caller
    interrupted while Spark still runs can stop Spark and then `bulk_write.abort_job` what is left.
    `on_commit(True)` is called as the commit starts and `on_commit(False)` when it has ended: from there on
    the job is no longer aborted but finished (the CLI holds Ctrl-C and SIGTERM meanwhile).
    Ensures that when it raises, the output is as it was (see the module docstring). Raises
    `IngestUsageError` (see `check_ingest`; also an unknown column or a timestamp column of another type),
    `NullKeyError`, and `IngestError` for any other failure of Spark or of the data, each with a one-line
    message.
    """
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    fmt_name = check_ingest(
        source, topic=topic, partitions=partitions, output=output, value_column=value_column,
        value_format=value_format, input_format=input_format, null_keys=null_keys, overwrite=overwrite,
    )
    try:
        return _ingest(
            spark, source, fmt_name, topic=topic, partitions=partitions, key_column=key_column, output=Path(output),
            value_column=value_column, timestamp_column=timestamp_column, compression=compression,
            records_per_batch=records_per_batch, segment_bytes=segment_bytes, overwrite=overwrite,
            read_options=read_options or {}, null_keys=null_keys, job_id=job_id or new_job_id(), on_commit=on_commit,
        )
    except (PySparkException, Py4JError) as exc:
        message, condition = describe_spark_error(exc)
        usage = condition is not None and condition.split(".")[0] in _USAGE_CONDITIONS
        if timestamp_column is not None and (condition or "").startswith("CAST_INVALID_INPUT"):
            message = f"the timestamp column {timestamp_column!r}: {message}"  # the one conversion that can fail
        raise (IngestUsageError if usage else IngestError)(f"Spark failed: {message}", path=source) from None


def _ingest(
    spark, source: str, fmt_name: str, *, topic: str, partitions: int, key_column: str, output: Path,
    value_column: str | None, timestamp_column: str | None, compression: str, records_per_batch: int,
    segment_bytes: int | None, overwrite: bool, read_options: dict[str, str], null_keys: str, job_id: str,
    on_commit: Callable[[bool], None] | None,
) -> IngestResult:

    started = time.perf_counter()
    if records_per_batch < 1:
        raise IngestUsageError(f"records per batch must be at least 1, got {records_per_batch}")
    if compression.lower() not in fmt.COMPRESSION_IDS:
        raise IngestUsageError(f"unknown compression {compression!r}; one of {', '.join(sorted(fmt.COMPRESSION_IDS))}")
    config = LogConfig() if segment_bytes is None else LogConfig(segment_bytes=segment_bytes)
    warm_up = _WarmUp(spark)  # the Python workers and the commit's kernels, while Spark reads the schema
    try:
        return _write(spark, source, fmt_name, warm_up, started, topic=topic, partitions=partitions,
                      key_column=key_column, output=output, value_column=value_column, timestamp_column=timestamp_column,
                      compression=compression, records_per_batch=records_per_batch, config=config, overwrite=overwrite,
                      read_options=read_options, null_keys=null_keys, job_id=job_id, on_commit=on_commit)
    finally:
        warm_up.wait_for_workers()  # never left running: the caller may stop the session next


def _write(
    spark, source: str, fmt_name: str, warm_up: _WarmUp, started: float, *, topic: str, partitions: int,
    key_column: str, output: Path, value_column: str | None, timestamp_column: str | None, compression: str,
    records_per_batch: int, config: LogConfig, overwrite: bool, read_options: dict[str, str], null_keys: str,
    job_id: str, on_commit: Callable[[bool], None] | None,
) -> IngestResult:
    from pyspark.sql import functions as F

    options = {"header": "true"} if fmt_name == "csv" else {}
    options.update(read_options)
    df = spark.read.format(fmt_name).options(**options).load(source)
    _check_column(df, key_column, "key", source)
    if value_column is not None:
        _check_column(df, value_column, "value", source)
    if timestamp_column is not None:
        _check_column(df, timestamp_column, "timestamp", source)
    if value_column is None:  # --value-format json: the whole row
        value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]), JSON_OPTIONS).cast("binary")
    else:
        value = _as_binary(df, value_column)
    # A key is null exactly when the key column is: every conversion of `_as_binary` maps a non-null value to
    # non-null bytes. The tasks count (and drop, or refuse) those rows.
    columns = [_as_binary(df, key_column).alias("key"), value.alias("value")]
    if timestamp_column:
        columns.append(_as_timestamp(df, timestamp_column, source).alias("timestamp"))
    log_dir = os.path.abspath(output)  # the tasks' working directory need not be ours
    created = missing_dirs(log_dir)  # made below with the staging directory; a failure removes them again
    task = StageTask(
        log_dir=log_dir, job_id=job_id, partitions=partitions, compression=fmt.COMPRESSION_IDS[compression.lower()],
        records_per_batch=records_per_batch, batch_bytes=_BATCH_BYTES, write_time_ms=int(time.time() * 1000),
        drop_null_keys=null_keys == "drop", timestamp_column=timestamp_column or "timestamp",
    )
    warm_up.wait_for_workers()  # its workers are idle again, and the job's tasks reuse them
    timings: dict[str, float] = {"plan": time.perf_counter() - started}
    context = spark.sparkContext
    group = context.getLocalProperty("spark.jobGroup.id")
    try:
        # made here, not by the tasks: one that starts after an abort removed it fails instead of writing
        staging_dir(log_dir, job_id).mkdir(parents=True)
        submitted = time.time()
        context.setJobGroup(job_id, f"logcleaner ingest of {source}", interruptOnCancel=True)
        try:
            reports = [json.loads(row[0]) for row in df.select(*columns).mapInArrow(task, _REPORT_SCHEMA).collect()]
        except BaseException as exc:
            if not isinstance(exc, Exception):  # interrupted (Ctrl-C, a signal): the tasks stop before the abort
                _cancel_job_group(context, job_id)
            raise
        finally:
            with contextlib.suppress(Exception):  # a JVM gone (a signal to the process group) fails this too
                context.setLocalProperty("spark.jobGroup.id", group)
        job_done = time.time()
        rows = sum(r["rows"] for r in reports)
        null_rows = sum(r["null_keys"] for r in reports)
        if null_rows and (null_keys == "error" or null_rows == rows):
            raise NullKeyError(path=source, column=key_column, null_rows=null_rows, rows=rows)
        pieces = [StagedPiece(**piece) for r in reports for piece in r["pieces"]]
        try:
            if on_commit is not None:
                on_commit(True)
            try:
                summary = commit_job(log_dir, task.job_id, topic, partitions, pieces, overwrite=overwrite,
                                     config=config)
            finally:
                if on_commit is not None:
                    on_commit(False)
        except (SegmentError, OSError, ValueError) as exc:
            message = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
            raise IngestError(f"the commit failed: {message}", path=source) from None
    except BaseException:
        abort_job(log_dir, task.job_id, created_dirs=created)
        raise
    timings.update(_job_timings(reports, submitted, job_done))
    timings["commit"] = time.time() - job_done
    result = IngestResult(topic, partitions, write_s=time.perf_counter() - started, rows_read=rows,
                          null_key_rows_dropped=null_rows, timings_s=timings,
                          cold_tasks=sum(1 for r in reports if not r["warm"]))
    for p in range(partitions):
        result.records[p] = summary.records[p]
        result.bytes[p] = summary.bytes[p]
    return result


def _cancel_job_group(context, job_id: str, timeout_s: float = 10.0) -> None:
    """Cancel the ingest's job and wait (at most `timeout_s`) until Spark says none of its jobs runs, so that
    no task stages a piece after the abort. Bounded and quiet: the JVM may be going away (a signal to the
    process group reaches it too); whatever happens here, the caller aborts the job next."""
    def cancel() -> None:
        try:
            context.cancelJobGroup(job_id)
            tracker = context.statusTracker()
            while time.monotonic() < deadline:
                jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(job_id)]
                if all(info is None or info.status != "RUNNING" for info in jobs):
                    return
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001 (the JVM gone or going: nothing more to wait for)
            log.debug("cancelling the ingest job failed error=%s", exc)

    deadline = time.monotonic() + timeout_s
    canceller = threading.Thread(target=cancel, name="ingest-cancel", daemon=True)
    canceller.start()
    canceller.join(timeout_s + 1.0)


def _job_timings(reports: list[dict], submitted: float, done: float) -> dict[str, float]:
    """The job's parts, one after another, from the tasks' reports (epoch seconds): until a task first ran our
    code (Python worker started, this module unpickled and imported), until a task first had the compiled
    kernels loaded, the rows (until the last task was done), and what Spark took after the last task."""
    if not reports:
        return {"job": done - submitted}
    first_called = min(r["called"] for r in reports)
    first_ready = max(first_called, min(r["kernels_ready"] for r in reports))
    last_done = max(first_ready, max(r["done"] for r in reports))
    return {
        "worker_start": max(0.0, first_called - submitted),
        "kernels": first_ready - first_called,
        "rows": last_done - first_ready,
        "job_end": max(0.0, done - last_done),
    }


class _WarmUp:
    """What the first job of a session would otherwise wait for, started on threads of this process while
    Spark reads the source's schema: a job of one tiny task that starts a Python worker and loads the encoder's
    kernels in it (workers are reused, `spark.python.worker.reuse`, so the ingest's first task finds it ready;
    once per SparkContext), and here the scan kernels the commit checks the pieces with. A failure of either is
    left to the real job to meet and report. One worker, not one per core: a worker's start takes about a
    second of a core (imports, LLVM), and more of them at once take the cores the JVM's own cold start needs
    (on the 2-core benchmark machine the first job of the flights table took ~1-2 s longer with two); a job's
    further concurrent tasks start theirs while the first one works.

    The warm-up is an RDD job: a session's first DataFrame waits for its SQL state to be built (seconds, in a
    fresh JVM), an RDD job does not. Spark keeps one pool of Python workers per environment, and a DataFrame's
    Python function runs with `SPARK_SIMPLIFIED_TRACEBACK=1` (`spark.sql.execution.pyspark.udf.
    simplifiedTraceback.enabled`) added to `SparkContext.environment`; the warm-up's function is made with that
    variable too, so its workers are in the pool the ingest's tasks draw from (the tasks report whether they
    found a warm worker: `IngestResult.cold_tasks`)."""

    _warmed: weakref.WeakSet = weakref.WeakSet()  # the SparkContexts whose workers an ingest has warmed

    def __init__(self, spark) -> None:
        self._workers: threading.Thread | None = None
        context = spark.sparkContext
        if context not in self._warmed:  # later ingests of the session find the workers of the first
            self._warmed.add(context)
            self._workers = threading.Thread(target=self._start_workers, args=(spark,), name="ingest-warm-workers",
                                             daemon=True)
            self._workers.start()
        threading.Thread(target=self._load_commit_kernels, name="ingest-warm-commit", daemon=True).start()

    @staticmethod
    def _start_workers(spark) -> None:
        try:
            context = spark.sparkContext
            rdd = context.parallelize([0], 1).mapPartitions(_warm_partition)
            environment = context.environment
            added = {k: v for k, v in _dataframe_worker_environment(context).items() if k not in environment}
            environment.update(added)
            try:
                rdd._jrdd  # the Python function is made here, with the environment as it is now
            finally:
                for key in added:
                    environment.pop(key, None)
            rdd.collect()
        except BaseException as exc:  # noqa: BLE001 (a thread's end: the ingest's own job reports real failures)
            log.debug("warming the Python workers failed error=%s", exc)

    @staticmethod
    def _load_commit_kernels() -> None:
        try:
            from ..codec.scan import warm_up

            warm_up()
        except BaseException as exc:  # noqa: BLE001
            log.debug("loading the scan kernels failed error=%s", exc)

    def wait_for_workers(self) -> None:
        if self._workers is not None:
            self._workers.join()


def _dataframe_worker_environment(context) -> dict[str, str]:
    """What Spark adds to `SparkContext.environment` for the Python workers of a DataFrame's functions."""
    enabled = context.getConf().get("spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled", "true")
    return {"SPARK_SIMPLIFIED_TRACEBACK": "1"} if enabled.strip().lower() == "true" else {}


def _warm_partition(rows: Iterator) -> Iterator:
    _load_kernels()
    for _ in rows:
        pass
    yield 1  # a result: a Python worker whose task returned nothing is not reused (pyspark 4.3)


_REPORT_SCHEMA = "report string"
# `--value-format json`: a null column is written as `"name":null`, not left out (Spark's default), so that every
# value of a topic has the same fields
JSON_OPTIONS = {"ignoreNullFields": "false"}
_ENCODE_ROWS = 65536  # rows gathered from Spark's Arrow batches before one encode call
_BATCH_BYTES = 1024 * 1024 - fmt.RECORD_BATCH_OVERHEAD
_kernels_loaded = False  # per Python worker process: `_load_kernels` has run


def _load_kernels() -> None:
    """Import the encoder and call each kernel once on one row, so its compiled code loads now."""
    global _kernels_loaded
    if _kernels_loaded:
        return
    import numpy as np
    import pyarrow as pa

    from .arrow_records import BatchEncoder, binary_parts
    from .partitioner import partitions_for_spans

    keys = pa.array([b"k"], pa.binary())
    _, offsets, data = binary_parts(keys)
    parts = partitions_for_spans(data, offsets[:-1], np.diff(offsets), 1)
    BatchEncoder().encode(keys, pa.array([b"v"], pa.binary()), np.zeros(1, dtype=np.int64), parts)
    _kernels_loaded = True


@dataclass(frozen=True)
class StageTask:
    """What each Spark task of an ingest runs (`mapInArrow`): its rows (Arrow batches of `key`, `value` and an
    optional `timestamp`) → staged pieces, one per partition it has rows for; yields one report row (JSON:
    pieces, rows, null keys, timings). A row with a null key is dropped with `drop_null_keys`; otherwise the
    first one stops the staging (the driver refuses the job) and the rest of the input is only counted."""

    log_dir: str
    job_id: str
    partitions: int
    compression: int
    records_per_batch: int
    batch_bytes: int
    write_time_ms: int
    drop_null_keys: bool
    timestamp_column: str = "timestamp"  # the input's name for it, for messages

    def __call__(self, batches: Iterator) -> Iterator:
        import pyarrow as pa
        from pyspark import TaskContext

        called = time.time()
        warm = _kernels_loaded  # this worker ran a task of ours before (the warm-up's, or an ingest's)
        _load_kernels()
        kernels_ready = time.time()
        from .arrow_records import BatchEncoder

        context = TaskContext.get()
        task = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        encoder = BatchEncoder(compression=self.compression, records_per_batch=self.records_per_batch,
                               batch_bytes=self.batch_bytes)
        writer: PieceWriter | None = PieceWriter(self.log_dir, self.job_id, task, attempt, staging_made=True)
        rows = null_keys = pending_rows = 0
        pending: list = []
        try:
            for batch in batches:
                rows += batch.num_rows
                nulls = batch.column(0).null_count
                if nulls:  # dropped: left out by the encoder, see _stage
                    null_keys += nulls
                    if not self.drop_null_keys and writer is not None:
                        writer.close()
                        writer, pending = None, []
                if writer is None:
                    continue
                pending.append(batch)
                pending_rows += batch.num_rows
                if pending_rows >= _ENCODE_ROWS:
                    self._stage(pa.Table.from_batches(pending), encoder, writer)
                    pending, pending_rows = [], 0
            if writer is not None and pending:
                self._stage(pa.Table.from_batches(pending), encoder, writer)
            pieces = writer.finish() if writer is not None else []
        finally:
            if writer is not None:
                writer.close()
        report = {"pieces": [_piece_dict(piece) for piece in pieces], "rows": rows, "null_keys": null_keys,
                  "called": called, "kernels_ready": kernels_ready, "done": time.time(), "warm": warm}
        yield pa.RecordBatch.from_pydict({"report": [json.dumps(report)]})

    def _stage(self, table, encoder, writer: PieceWriter) -> None:
        import numpy as np

        from .arrow_records import binary_column, binary_parts, timestamps_ms
        from .partitioner import partitions_for_spans

        keys = binary_column(table.column("key"), "key")
        values = binary_column(table.column("value"), "value")
        valid, offsets, data = binary_parts(keys)
        parts = partitions_for_spans(data, offsets[:-1], np.diff(offsets), self.partitions)
        if keys.null_count:
            parts[~valid] = -1  # a null key: the row is left out (the task counted it)
        timestamps = timestamps_ms(table.column("timestamp") if "timestamp" in table.column_names else None,
                                   table.num_rows, self.write_time_ms, self.timestamp_column)
        encoded = encoder.encode(keys, values, timestamps, parts)
        writer.append(encoded.data, encoded.records)


def _piece_dict(piece: StagedPiece) -> dict:
    return {"partition": piece.partition, "path": piece.path, "records": piece.records, "bytes": piece.bytes,
            "task": piece.task, "attempt": piece.attempt}
