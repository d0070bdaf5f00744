"""Bulk ingestion: any Spark-readable files → a topic's partition directories, through the `logsegments` source.

Owns the job behind `logcleaner ingest`: read the source (Parquet, JSON lines, CSV, or any format Spark reads),
turn the key column — and the value column, or the whole row as JSON — into bytes, carry an optional timestamp
column, and write with `df.write.format("logsegments")`. No shuffle: the DataFrame's order (for one file, the
file's order) is the order within every partition. Returns what it wrote, measured on disk before and after.

Conversions: binary columns are taken as they are; strings are their UTF-8 bytes; structs, maps and arrays are
their JSON; other types their string form (e.g. an integer key 42 is the two bytes "42", as Kafka's
StringSerializer would have it). A timestamp column may be a timestamp, a date, epoch milliseconds, or a string
Spark's `to_timestamp` parses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["IngestResult", "guess_format", "ingest"]

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

    @property
    def total_records(self) -> int:
        return sum(self.records.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def guess_format(source: str) -> str:
    """The Spark format of `source` from its extension (a directory: from the first data file in it)."""
    path = Path(source)
    candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    for candidate in candidates:
        for suffix in reversed(candidate.suffixes):
            if suffix.lower() in _FORMATS:
                return _FORMATS[suffix.lower()]
    raise ValueError(f"{source}: cannot tell the input format from the file names; pass --format")


def _as_binary(df, name: str):
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if name not in df.columns:
        raise ValueError(f"column {name!r} is not in the input (columns: {df.columns})")
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

    if name not in df.columns:
        raise ValueError(f"timestamp column {name!r} is not in the input (columns: {df.columns})")
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
    raise ValueError(f"timestamp column {name!r} is {kind.simpleString()}; use a timestamp, date, epoch ms or a string")


def _partition_state(output: Path, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    from ..log import PartitionLog

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
) -> IngestResult:
    """Write the rows of `source` into `output` as topic `topic` with `partitions` partitions (see the docstring)."""
    from pyspark.sql import functions as F

    if (value_column is None) == (value_format is None):
        raise ValueError("give exactly one of a value column or a value format (json)")
    if value_format is not None and value_format != "json":
        raise ValueError(f"unknown value format {value_format!r}; the one value format is json (the whole row)")
    fmt_name = input_format or guess_format(source)
    reader = spark.read.format(fmt_name)
    options = {"header": "true"} if fmt_name == "csv" else {}
    options.update(read_options or {})
    df = reader.options(**options).load(source)
    value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns])).cast("binary") if value_format else _as_binary(df, value_column)
    columns = [_as_binary(df, key_column).alias("key"), value.alias("value")]
    if timestamp_column:
        columns.append(_as_timestamp(df, timestamp_column).alias("timestamp"))
    out = Path(output)
    before = _partition_state(out, topic, partitions) if not overwrite else {p: (0, 0) for p in range(partitions)}
    writer = (
        df.select(*columns).write.format("logsegments").mode("overwrite" if overwrite else "append")
        .option("topic", topic).option("partitions", partitions).option("compression", compression)
        .option("recordsPerBatch", records_per_batch)
    )
    if segment_bytes is not None:
        writer = writer.option("segment.bytes", segment_bytes)
    started = time.perf_counter()
    writer.save(str(out))
    result = IngestResult(topic, partitions, write_s=time.perf_counter() - started)
    after = _partition_state(out, topic, partitions)
    for p in range(partitions):
        result.records[p] = after[p][0] - before[p][0]
        result.bytes[p] = after[p][1] - before[p][1]
    return result
