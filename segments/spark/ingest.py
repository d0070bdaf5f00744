"""Bulk ingestion: any Spark-readable files → a topic's partition directories, through the `logsegments` source.

Owns the job behind `logcleaner ingest`: read the source (Parquet, JSON lines, CSV, or any format Spark reads),
turn the key column — and the value column, or the whole row as JSON — into bytes, carry an optional timestamp
column, and write with `df.write.format("logsegments")`. No shuffle: the DataFrame's order (for one file, the
file's order) is the order within every partition. Returns what it wrote, measured on disk before and after.

Conversions: binary columns are taken as they are; strings are their UTF-8 bytes; structs, maps and arrays are
their JSON; other types their string form (e.g. an integer key 42 is the two bytes "42", as Kafka's
StringSerializer would have it). A timestamp column may be a timestamp, a date, epoch milliseconds, or a string
Spark's `to_timestamp` parses.

Errors, and what a failure leaves. Everything that can be checked before Spark starts is checked by
`check_ingest` (the source exists and is readable, its format, the value options, the topic and its partition
count against an existing topic). Rows whose key is null are counted before anything is written: with
`null_keys="error"` the ingest stops there (`NullKeyError`, with the count), with `"drop"` they are left out
and counted in the result. Every other Spark failure — reading the source, a failing task — becomes one
`IngestError` whose message is one line (`describe_spark_error`). The write itself stages its pieces outside
the topic's partitions (`segments.spark.bulk_write`), so a failure before the commit leaves the output as it was:
staged files are removed and a log dir the job created is removed again.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..codec.errors import SegmentError
from ..files.pathcheck import describe_os_error
from ..partition.log import PartitionLog
from .bulk_write import check_topic_partitions
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
    """`null_rows` of `rows` rows have a null key column (with `null_keys="error"`); nothing was written."""

    def __init__(self, *, path: str, column: str, null_rows: int, rows: int) -> None:
        self.column = column
        self.null_rows = null_rows
        self.rows = rows
        super().__init__(
            f"{null_rows} of {rows} rows have a null key column {column!r}; nothing was written "
            "(a compacted topic needs a key for every record; --null-keys drop writes the other rows)",
            path=path,
        )

_FORMATS = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv",
            ".orc": "orc", ".avro": "avro"}


@dataclass
class IngestResult:
    """Records and bytes added per partition (log end offset and size before and after), and timings."""

    topic: str
    partitions: int
    records: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    write_s: float = 0.0
    rows_read: int = 0
    null_key_rows_dropped: int = 0

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
    try:
        check_topic_partitions(out, topic, partitions, overwrite=overwrite)
    except (ValueError, SegmentError) as exc:
        raise IngestUsageError(str(exc)) from None
    return fmt_name


def _check_column(df, name: str, role: str, source: str) -> None:
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


def _as_timestamp(df, name: str):
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
        f"the timestamp column {name!r} is {kind.simpleString()}; use a timestamp, date, epoch ms or a string"
    )


def _partition_state(output: Path, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    state = {}
    for p in range(partitions):
        directory = output / f"{topic}-{p}"
        if directory.is_dir():
            with PartitionLog.open(directory, mode="reader") as plog:
                state[p] = (plog.log_end_offset, plog.size_bytes)
        else:
            state[p] = (0, 0)
    return state


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
) -> IngestResult:
    """Write the rows of `source` into `output` as topic `topic` with `partitions` partitions (see the docstring).

    Requires a session with the `logsegments` data source registered (`get_session`). `null_keys`: "error"
    refuses a source with any null key, "drop" leaves those rows out (`IngestResult.null_key_rows_dropped`).
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
            read_options=read_options or {}, null_keys=null_keys,
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
    segment_bytes: int | None, overwrite: bool, read_options: dict[str, str], null_keys: str,
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
    # Null keys are decided before anything is written: one pass counts rows and non-null keys (for a
    # columnar source it reads the key column only). A key is null exactly when the key column is, since
    # every conversion of `_as_binary` maps a non-null value to non-null bytes.
    key = F.col(f"`{key_column}`")
    counts = df.agg(F.count(F.lit(1)).alias("rows"), F.count(key).alias("keyed")).first()
    rows, null_rows = counts["rows"], counts["rows"] - counts["keyed"]
    if null_rows and null_keys == "error":
        raise NullKeyError(path=source, column=key_column, null_rows=null_rows, rows=rows)
    if null_rows:
        df = df.filter(key.isNotNull())  # a filter keeps the order of the rows it passes
    if value_column is None:  # --value-format json: the whole row
        value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).cast("binary")
    else:
        value = _as_binary(df, value_column)
    columns = [_as_binary(df, key_column).alias("key"), value.alias("value")]
    if timestamp_column:
        columns.append(_as_timestamp(df, timestamp_column).alias("timestamp"))
    before = _partition_state(output, topic, partitions) if not overwrite else {p: (0, 0) for p in range(partitions)}
    writer = (
        df.select(*columns).write.format("logsegments").mode("overwrite" if overwrite else "append")
        .option("topic", topic).option("partitions", partitions).option("compression", compression)
        .option("recordsPerBatch", records_per_batch)
    )
    if segment_bytes is not None:
        writer = writer.option("segment.bytes", segment_bytes)
    started = time.perf_counter()
    writer.save(os.path.abspath(output))  # the tasks' working directory need not be ours
    result = IngestResult(topic, partitions, write_s=time.perf_counter() - started, rows_read=rows,
                          null_key_rows_dropped=null_rows)
    after = _partition_state(output, topic, partitions)
    for p in range(partitions):
        result.records[p] = after[p][0] - before[p][0]
        result.bytes[p] = after[p][1] - before[p][1]
    return result
