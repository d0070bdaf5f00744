"""Spark integration: the `logsegments` data source, a ready session, bulk ingestion and the duplication report.

The only package of logcleaner that imports pyspark (install the `spark` extra). Submodules: `session`
(starting Spark with Java checked and the data source registered), `source` (the data source), `ingest`
(files → segments), `duplication` (what compaction would remove, at scale).
"""

from .session import JvmConsole, SparkUnavailableError, describe_spark_error, find_java, get_session, stop_session

__all__ = ["JvmConsole", "SparkUnavailableError", "describe_spark_error", "find_java", "get_session", "stop_session"]
