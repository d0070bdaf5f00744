"""The `logsegments` Spark data source (Spark 4 Python data source API): logs read as rows, rows written as logs.

Owns the Spark side of `segments.spark.arrow_records` (the columns and the Arrow conversion) and of
`segments.spark.bulk_write` (staged pieces and the ordered commit):

* read — `spark.read.format("logsegments").load(PATH)`, PATH a log dir or partition dirs (comma-separated):
  one row per data record with the columns of `SPARK_SCHEMA_DDL`; one input partition per log partition, or
  per run of segments of about `maxPartitionBytes` (default 256 MiB) for a large one; rows leave the
  worker as Arrow record batches. A schema given with `.schema(...)` may name a subset of the columns, and
  only those are built.
* write — `df.write.format("logsegments").option("topic", T).option("partitions", N).mode(...).save(LOGDIR)`:
  each row goes to partition `toPositive(murmur2(key)) % N` (Kafka's default partitioner); within a partition
  the DataFrame's order is kept. Options (case-insensitive): `keyColumn` (default `key`), `valueColumn`
  (`value`), `headersColumn` (`headers`, used if present), `timestampColumn` (default `timestamp` if present,
  else the write time; a timestamp or epoch-milliseconds long column), `compression`
  (none/gzip/snappy/lz4/zstd), `recordsPerBatch` (1000), `batchBytes` (1 MiB), `segment.bytes` (1 GiB).
  Mode `append` (or the default) appends after each partition's log end; `overwrite` replaces the topic's
  partition directories atomically. Key and value columns are binary or string (UTF-8); keys must not be null.

On a cluster the log dir must be a path the driver and every executor see (a shared filesystem), and
logcleaner must be installed on the executors' Python.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ..codec import format as fmt
from ..files.names import parse_segment_file_name
from ..partition.log import LogConfig, parse_partition_dir_name
from .arrow_records import (
    RECORD_COLUMNS,
    SPARK_SCHEMA_DDL,
    binary_column,
    binary_parts,
    encode_table,
    read_arrow_batches,
)
from .bulk_write import (
    STAGING_PREFIX,
    PieceWriter,
    StagedPiece,
    abort_job,
    check_topic_partitions,
    commit_job,
    missing_dirs,
    new_job_id,
)
from .partitioner import partitions_for_spans

__all__ = ["LogSegmentsDataSource", "SegmentRange", "StagedPieces", "plan_input_partitions"]

MAX_PARTITION_BYTES_DEFAULT = 256 * 1024 * 1024
_ENCODE_ROWS = 65536  # rows gathered from Spark's Arrow batches before one encode call


@dataclass(frozen=True)
class SegmentRange(InputPartition):
    """The segments of one partition directory whose base offsets lie in [start, stop) (None: unbounded)."""

    directory: str
    start: int | None
    stop: int | None


@dataclass(frozen=True)
class StagedPieces(WriterCommitMessage):
    """A write task's report: the pieces it staged."""

    pieces: tuple[StagedPiece, ...]


def _partition_dirs(path: Path) -> list[Path]:
    if parse_partition_dir_name(path.name) is not None and path.is_dir():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such log directory or partition directory")
    found = []
    for child in path.iterdir():
        parsed = parse_partition_dir_name(child.name)
        if parsed is not None and child.is_dir() and not child.name.startswith(STAGING_PREFIX):
            found.append((parsed, child))
    return [child for _, child in sorted(found)]


def plan_input_partitions(paths: list[str], max_partition_bytes: int = MAX_PARTITION_BYTES_DEFAULT) -> list[SegmentRange]:
    """One range per partition directory, split at segment boundaries into runs of ≤ `max_partition_bytes`
    (a larger segment alone). The ranges of a partition tile all offsets."""
    ranges = []
    for raw in paths:
        for directory in _partition_dirs(Path(raw)):
            segments = []
            for name in os.listdir(directory):
                parsed = parse_segment_file_name(name)
                if parsed is not None and not parsed.state and parsed.kind == fmt.LOG_SUFFIX:
                    segments.append((parsed.offset, (directory / name).stat().st_size))
            segments.sort()
            start: int | None = None
            size = 0
            for base, seg_bytes in segments:
                if size and size + seg_bytes > max_partition_bytes:
                    ranges.append(SegmentRange(str(directory), start, base))
                    start, size = base, 0
                size += seg_bytes
            ranges.append(SegmentRange(str(directory), start, None))
    return ranges


class LogSegmentsDataSource(DataSource):
    """`logsegments`: Kafka-format log directories as a table of records (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "logsegments"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema: StructType) -> LogSegmentsReader:
        return LogSegmentsReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> LogSegmentsWriter:
        return LogSegmentsWriter(dict(self.options), schema, overwrite)


def _paths(options: dict) -> list[str]:
    raw = options.get("path") or options.get("paths")
    if not raw:
        raise ValueError("logsegments needs a path: .load(LOGDIR) or .save(LOGDIR)")
    return [p for p in (s.strip() for s in raw.strip("[]").split(",")) if p]


class LogSegmentsReader(DataSourceReader):
    def __init__(self, options: dict, schema: StructType) -> None:
        self.paths = _paths(options)
        self.columns = [f.name for f in schema.fields]
        unknown = set(self.columns) - set(RECORD_COLUMNS)
        if unknown:
            raise ValueError(f"logsegments has no column(s) {sorted(unknown)}; its columns are {list(RECORD_COLUMNS)}")
        self.max_partition_bytes = int(options.get("maxpartitionbytes", MAX_PARTITION_BYTES_DEFAULT))

    def partitions(self) -> list[SegmentRange]:
        return plan_input_partitions(self.paths, self.max_partition_bytes)

    def read(self, partition: SegmentRange) -> Iterator:  # type: ignore[override]  # Spark hands back ours
        yield from read_arrow_batches(
            partition.directory, columns=self.columns, segments_from=partition.start, segments_below=partition.stop
        )


def _option(options: dict, name: str, default=None):
    return options.get(name.lower(), default)


class LogSegmentsWriter(DataSourceArrowWriter):
    def __init__(self, options: dict, schema: StructType, overwrite: bool) -> None:
        paths = _paths(options)
        if len(paths) != 1:
            raise ValueError(f"logsegments writes into one log dir, got {paths}")
        self.log_dir = paths[0]
        self.topic = _option(options, "topic")
        if not self.topic:
            raise ValueError('logsegments needs .option("topic", NAME) to write')
        if _option(options, "partitions") is None:
            raise ValueError('logsegments needs .option("partitions", N) to write')
        self.partitions = int(_option(options, "partitions"))
        self.overwrite = overwrite
        names = {f.name for f in schema.fields}
        self.key_column = _option(options, "keyColumn", "key")
        self.value_column = _option(options, "valueColumn", "value")
        self.headers_column = _option(options, "headersColumn", "headers")
        if self.headers_column not in names:
            self.headers_column = None
        self.timestamp_column = _option(options, "timestampColumn", "timestamp" if "timestamp" in names else None)
        for role, column in (("key", self.key_column), ("value", self.value_column), ("timestamp", self.timestamp_column)):
            if column is not None and column not in names:
                raise ValueError(f"the {role} column {column!r} is not in the DataFrame (columns: {sorted(names)})")
        codec = _option(options, "compression", "none").lower()
        if codec not in fmt.COMPRESSION_IDS:
            raise ValueError(f"unknown compression {codec!r}; one of {sorted(fmt.COMPRESSION_IDS)}")
        self.compression = fmt.COMPRESSION_IDS[codec]
        self.records_per_batch = int(_option(options, "recordsPerBatch", 1000))
        self.batch_bytes = int(_option(options, "batchBytes", 1024 * 1024 - fmt.RECORD_BATCH_OVERHEAD))
        self.config = LogConfig(segment_bytes=int(_option(options, "segment.bytes", fmt.SEGMENT_BYTES_DEFAULT)))
        check_topic_partitions(self.log_dir, self.topic, self.partitions, overwrite=overwrite)
        self.created_dirs = missing_dirs(self.log_dir)  # the tasks' staging creates them; an abort removes them
        self.job_id = new_job_id()
        self.write_time_ms = int(time.time() * 1000)

    def write(self, iterator: Iterator) -> StagedPieces:
        from pyspark import TaskContext

        context = TaskContext.get()
        task = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        writer = PieceWriter(self.log_dir, self.job_id, task, attempt)
        try:
            pending, rows, done = [], 0, 0
            for batch in iterator:
                pending.append(batch)
                rows += batch.num_rows
                if rows >= _ENCODE_ROWS:
                    self._encode(pending, writer, done)
                    done += rows
                    pending, rows = [], 0
            if pending:
                self._encode(pending, writer, done)
            return StagedPieces(tuple(writer.finish()))
        finally:
            writer.close()

    def _encode(self, batches: list, writer, first_row: int) -> None:
        import numpy as np
        import pyarrow as pa

        table = pa.Table.from_batches(batches)
        keys = binary_column(table.column(self.key_column), self.key_column)
        if keys.null_count:
            row = first_row + int(np.flatnonzero(~keys.is_valid().to_numpy(zero_copy_only=False))[0])
            raise ValueError(
                f"row {row} of task input: the key column {self.key_column!r} is null; a compacted topic needs a key "
                "for every record"
            )
        values = binary_column(table.column(self.value_column), self.value_column)
        _, offsets, data = binary_parts(keys)
        parts = partitions_for_spans(data, offsets[:-1], np.diff(offsets), self.partitions)
        headers = None
        if self.headers_column is not None:
            headers = table.column(self.headers_column).combine_chunks()
        encoded = encode_table(
            keys, values, self._timestamps(table), parts, headers=headers, compression=self.compression,
            records_per_batch=self.records_per_batch, batch_bytes=self.batch_bytes,
        )
        writer.append(encoded.data, encoded.records)

    def _timestamps(self, table):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.timestamp_column is None:
            return np.full(table.num_rows, self.write_time_ms, dtype=np.int64)
        column = table.column(self.timestamp_column)
        if pa.types.is_timestamp(column.type):
            column = pc.cast(column, pa.timestamp("ms", tz=column.type.tz), safe=False).cast(pa.int64())
        elif pa.types.is_integer(column.type):
            column = column.cast(pa.int64())
        else:
            raise TypeError(
                f"the timestamp column {self.timestamp_column!r} is {column.type}; it must be a timestamp or epoch "
                "milliseconds (long)"
            )
        return column.fill_null(fmt.NO_TIMESTAMP).to_numpy()

    def commit(self, messages: list) -> None:
        pieces = [piece for message in messages if message is not None for piece in message.pieces]
        commit_job(
            self.log_dir, self.job_id, self.topic, self.partitions, pieces, overwrite=self.overwrite, config=self.config
        )

    def abort(self, messages: list) -> None:
        abort_job(self.log_dir, self.job_id, created_dirs=self.created_dirs)
