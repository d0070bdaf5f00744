"""Spark integration, a client of the storage layers: the `logsegments` data source, a session, ingestion, duplication.

The only package of logcleaner that imports pyspark (install the `spark` extra). Submodules: `session`
(starting Spark with Java checked and the data source registered), `source` (the data source), `ingest`
(files → segments), `duplication` (what compaction would remove, at scale); and the Arrow side of the storage
format that only Spark needs: `arrow_records` and its kernels (records as Arrow columns), `partitioner` (Kafka's
murmur2 partitioner), `bulk_write` (staged pieces from many tasks, one ordered commit). It uses the storage
layers' public modules (`codec`, `files`, `partition`); nothing outside this package imports it, except the
CLI's `ingest`, `duplication --spark` and `clean --spark`, when they run, and `cleaner.spark_clean` (the tasks of
`clean --spark`, the one module of `cleaner/` beside the CLI that imports pyspark, for Spark's exceptions).
"""

from .session import JvmConsole, SparkUnavailableError, describe_spark_error, find_java, get_session, stop_session

__all__ = ["JvmConsole", "SparkUnavailableError", "describe_spark_error", "find_java", "get_session", "stop_session"]
