"""A Spark session ready for `logsegments`: Java found, workers on this interpreter, the data source registered.

Owns starting Spark the way every logcleaner entry point (CLI, tests, benchmarks) needs it: `PYSPARK_PYTHON`
set to the running interpreter (where logcleaner is installed) unless the user set it, Java located
(`JAVA_HOME`, else `java` on PATH) with a clear `SparkUnavailableError` when it is missing or older than 17,
quiet logs, and the `logsegments` data source registered on the session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["SparkUnavailableError", "find_java", "get_session"]

JAVA_MIN = 17


class SparkUnavailableError(RuntimeError):
    """Spark cannot start here: no Java, too old a Java, or pyspark not installed."""


def find_java() -> tuple[str, int]:
    """(path of the java binary Spark will use, its major version); raises SparkUnavailableError."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = str(Path(home) / "bin" / "java")
        if not os.access(java, os.X_OK):
            raise SparkUnavailableError(f"JAVA_HOME is {home}, but {java} is not an executable (Spark needs Java {JAVA_MIN}+)")
    else:
        found = shutil.which("java")
        if found is None:
            raise SparkUnavailableError(
                f"Java is not installed: Spark needs Java {JAVA_MIN} or later on PATH or in JAVA_HOME "
                "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
            )
        java = found
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkUnavailableError(f"{java} -version failed: {exc}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if match is None:
        raise SparkUnavailableError(f"cannot read the Java version from `{java} -version`: {out.strip()[:200]}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_x" style
        major = int(match.group(2))
    if major < JAVA_MIN:
        raise SparkUnavailableError(f"{java} is Java {major}; Spark 4 needs Java {JAVA_MIN} or later")
    return java, major


def get_session(master: str = "local[*]", *, app_name: str = "logcleaner", conf: dict[str, str] | None = None):
    """A SparkSession (the active one if any) with the `logsegments` data source registered."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailableError(
            "pyspark is not installed: pip install 'logcleaner[spark]' (Spark 4 with the Python data source API)"
        ) from None
    find_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.python.worker.reuse": "true",
    }
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from .source import LogSegmentsDataSource

    spark.dataSource.register(LogSegmentsDataSource)
    return spark
