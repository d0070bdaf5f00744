"""A Spark session ready for `logsegments`: Java found, workers on this interpreter, the data source registered.

Owns starting Spark the way every logcleaner entry point (CLI, tests, benchmarks) needs it: `PYSPARK_PYTHON`
set to the running interpreter (where logcleaner is installed) unless the user set it, Java located
(`JAVA_HOME`, else `java` on PATH) with a clear `SparkUnavailableError` when it is missing or older than 17,
quiet logs, and the `logsegments` data source registered on the session.

It also owns what Spark prints. Spark, its log and its Python workers write to the JVM's stderr; a command
that reports its own errors in one line (`logcleaner ingest`) passes a `JvmConsole`, and the JVM starts with
its stderr on a pipe that the console reads: Spark's progress bar goes on to a terminal, the rest to a log
file or nowhere. `describe_spark_error` turns any Spark or Py4J exception into one line.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO, TextIO

__all__ = [
    "JvmConsole", "SparkUnavailableError", "describe_spark_error", "find_java", "get_session", "ignore_jvm_gone_warning",
    "kill_child_jvms", "quiet_py4j", "stop_session",
]

log = logging.getLogger(__name__)

JAVA_MIN = 17
_MESSAGE_CHARS_MAX = 400  # a one-line error message is cut here
_CONSOLE_TAIL_BYTES_MAX = 64 * 1024  # of the JVM's stderr, kept for an error message
_CONSOLE_READ_BYTES = 64 * 1024
_CONSOLE_PENDING_CHARS_MAX = 4096  # an unfinished progress-bar update held back until its end arrives
_CONSOLE_JOIN_S_MAX = 5.0


class SparkUnavailableError(RuntimeError):
    """Spark cannot start here: no Java, too old a Java, pyspark not installed, or the JVM or context failed."""


# "ValueError: row 3 ...": the exception line that ends a Python traceback
_PYTHON_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): ?(.*)$")
_CONDITION_TAG = re.compile(r"^\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]\s*")
_SQLSTATE = re.compile(r"\s*SQLSTATE: [0-9A-Z]+\.?\s*$")
_JAVA_EXCEPTION_PREFIX = re.compile(r"^(?:[a-z][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): ")
_LOST_TASK = re.compile(r"most recent failure: Lost task [^\n]*?\): ")
_STACK_FRAME = re.compile(r"^\s+(?:at |\.\.\. \d+ more)")
_EXCEPTION_LINE = re.compile(r"(?:Exception|Error)(?: in thread \"\w+\")?[: ]")


def describe_spark_error(exc: BaseException) -> tuple[str, str | None]:
    """One line for a Spark or Py4J exception, and its Spark error condition (e.g. "PATH_NOT_FOUND") if any.

    A failure in a Python worker (a task, a data source) is told by the worker's own exception, the last line
    of its traceback; a JVM failure by the first line of its message, the failing task's when a job aborted,
    without the `[CONDITION]` tag and `SQLSTATE`. Never raises; at most `_MESSAGE_CHARS_MAX` characters.
    """
    from py4j.protocol import Py4JError

    text, condition = str(exc), None
    java = getattr(exc, "java_exception", None)  # a Py4JJavaError: ask the Java exception itself
    try:
        if java is not None:
            text = str(java.getMessage() or java.toString())
            condition = java.getCondition()
        elif hasattr(exc, "getCondition"):
            condition = exc.getCondition()
    except Py4JError:
        condition = None  # not a SparkThrowable (no getCondition), or the JVM is gone: the text is what we have
    message = None
    start = text.rfind("Traceback (most recent call last)")
    if start >= 0:
        for line in reversed(text[start:].splitlines()):
            match = _PYTHON_EXCEPTION_LINE.match(line)
            if match:
                kind = match.group(1).rsplit(".", 1)[-1]
                message = match.group(2) if kind == "ValueError" else f"{kind}: {match.group(2)}"
                break
    if message is None:
        lost = _LOST_TASK.search(text)
        if lost:
            text = text[lost.end():]
        lines = [line for line in text.strip().splitlines() if line.strip()]
        message = lines[0] if lines else type(exc).__name__
        message = _JAVA_EXCEPTION_PREFIX.sub("", message.strip())
        tag = _CONDITION_TAG.match(message)
        if tag:
            condition = condition or tag.group(1)
            message = message[tag.end():]
        message = _SQLSTATE.sub("", message)
    message = " ".join(message.split())
    if len(message) > _MESSAGE_CHARS_MAX:
        message = message[: _MESSAGE_CHARS_MAX - 3] + "..."
    return message, condition


class JvmConsole:
    """The Spark JVM's stderr, read on a thread: progress-bar updates to `progress`, everything to `log`.

    Spark's progress bar is `\\r[Stage 1:==>   (3 + 2) / 8]` updates, cleared with `\\r`, spaces, `\\r`; those
    go to `progress` (a terminal; None: not shown). Every byte goes to `log` (a binary file; None: dropped),
    and the last `_CONSOLE_TAIL_BYTES_MAX` bytes are kept for `last_line()`. `end_progress()` clears a bar that
    is showing and stops showing more, before a command prints its result or its error.
    """

    _BAR = re.compile(r"\r((?:\[Stage [^\[\]\r\n]*\])+)|\r( +)\r")

    def __init__(self, progress: TextIO | None = None, log_file: BinaryIO | None = None) -> None:
        self._progress = progress
        self._log_file = log_file
        self._tail = bytearray()
        self._pending = ""
        self._bar_chars = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def attach(self) -> int:
        """A pipe's write end for the JVM's stderr (the caller closes it once the JVM has it); starts reading."""
        assert self._thread is None, "a console reads one JVM"
        read_fd, write_fd = os.pipe()
        # The one thread of this package: it only drains the pipe, so the JVM never blocks on a full one.
        self._thread = threading.Thread(target=self._drain, args=(read_fd,), name="spark-jvm-stderr", daemon=True)
        self._thread.start()
        return write_fd

    def _drain(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(_CONSOLE_READ_BYTES):
                self.feed(chunk)

    def feed(self, chunk: bytes) -> None:
        """Take bytes the JVM wrote (the reading thread calls this; tests call it directly)."""
        with self._lock:
            if self._log_file is not None:
                self._log_file.write(chunk)
                self._log_file.flush()
            self._tail += chunk
            del self._tail[: max(0, len(self._tail) - _CONSOLE_TAIL_BYTES_MAX)]
            if self._progress is None:
                return
            text = self._pending + self._decoder.decode(chunk)
            end = 0
            for match in self._BAR.finditer(text):
                bar, blank = match.groups()
                self._progress.write("\r" + bar if bar is not None else "\r" + blank + "\r")
                self._bar_chars = len(bar) if bar is not None else 0
                end = match.end()
            self._progress.flush()
            rest = text[end:]
            cr = rest.rfind("\r")  # an update cut by the pipe: keep it until the rest arrives
            tail = rest[cr:] if cr >= 0 else ""
            self._pending = tail if "\n" not in tail and len(tail) <= _CONSOLE_PENDING_CHARS_MAX else ""

    def end_progress(self) -> None:
        """Clear a progress bar that is showing; show no more."""
        with self._lock:
            if self._progress is not None and self._bar_chars:
                self._progress.write("\r" + " " * self._bar_chars + "\r")
                self._progress.flush()
            self._progress = None
            self._bar_chars = 0

    def write_log(self, data: bytes) -> None:
        """Add `data` to the log file only (pyspark's own Python-side log records come this way)."""
        with self._lock:
            if self._log_file is not None:
                self._log_file.write(data)
                self._log_file.flush()

    def close(self) -> None:
        """End the progress bar and close the log file; from now on the JVM's output is only kept in the tail
        (the JVM lives until this process exits, so the reading thread may still get some)."""
        self.end_progress()
        with self._lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def failure_line(self, wait_s: float = 0.0) -> str:
        """What the JVM last said went wrong: its last exception line (else its last line that is not a stack
        frame), without the exception's class; "" if it said nothing. Waits up to `wait_s` for the JVM to
        close its stderr first."""
        if self._thread is not None and wait_s > 0:
            self._thread.join(min(wait_s, _CONSOLE_JOIN_S_MAX))
        with self._lock:
            text = bytes(self._tail).decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip() and not _STACK_FRAME.match(line)]
        failures = [line for line in lines if _EXCEPTION_LINE.search(line)]
        line = (failures or lines or [""])[-1]
        line = _JAVA_EXCEPTION_PREFIX.sub("", line.removeprefix('Exception in thread "main" ').removeprefix("Caused by: "))
        return " ".join(line.split())[:_MESSAGE_CHARS_MAX]


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


class _ConsoleLogHandler(logging.Handler):
    def __init__(self, console: JvmConsole) -> None:
        super().__init__()
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        self._console.write_log((self.format(record) + "\n").encode("utf-8", "replace"))


# pyspark's Python side logs every query error (with its JVM stack trace) to stderr through these loggers
_PYSPARK_STDERR_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")


def _route_pyspark_loggers(console: JvmConsole) -> None:
    from pyspark.logger import PySparkLogger

    for name in _PYSPARK_STDERR_LOGGERS:
        logger = PySparkLogger.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(_ConsoleLogHandler(console))
        logger.propagate = False


def get_session(
    master: str = "local[*]",
    *,
    app_name: str = "logcleaner",
    conf: dict[str, str] | None = None,
    console: JvmConsole | None = None,
):
    """A SparkSession (the active one if any) with the `logsegments` data source registered.

    With `console`, a JVM started here writes its stderr to the console (see `JvmConsole`). Raises
    `SparkUnavailableError`, with one line, when pyspark or Java is missing or Spark does not start.
    """
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailableError(
            "pyspark is not installed: pip install 'logcleaner[spark]' (Spark 4 with the Python data source API)"
        ) from None
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    find_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.python.worker.reuse": "true",
    }
    settings.update(conf or {})
    if console is not None:
        _route_pyspark_loggers(console)
    try:
        if console is not None and SparkContext._active_spark_context is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
            _start_context_on_console(SparkConf, SparkContext, settings, console)
        builder = SparkSession.builder
        for key, value in settings.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    except (PySparkException, Py4JError) as exc:
        message = describe_spark_error(exc)[0]
        said = console.failure_line() if console is not None else ""
        if said and said not in message:
            message += f"; the JVM's last error: {said}"
        raise SparkUnavailableError(f"Spark did not start (master {master!r}): {message}") from None
    from .source import LogSegmentsDataSource

    spark.dataSource.register(LogSegmentsDataSource)
    return spark


def _start_context_on_console(SparkConf, SparkContext, settings: dict[str, str], console: JvmConsole) -> None:  # noqa: N803
    """Launch the JVM with its stderr on `console` (pyspark's `popen_kwargs` hook) and make its SparkContext."""
    from pyspark.errors import PySparkRuntimeError
    from pyspark.java_gateway import launch_gateway

    spark_conf = SparkConf()
    for key, value in settings.items():
        spark_conf.set(key, value)
    write_fd = console.attach()
    try:
        gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": write_fd})
    except PySparkRuntimeError:
        os.close(write_fd)
        write_fd = -1
        said = console.failure_line(wait_s=_CONSOLE_JOIN_S_MAX)
        raise SparkUnavailableError(
            f"Spark did not start (master {settings['spark.master']!r}): its JVM exited{': ' + said if said else ''}"
        ) from None
    finally:
        if write_fd >= 0:
            os.close(write_fd)
    SparkContext(conf=spark_conf, gateway=gateway)


def ignore_jvm_gone_warning() -> None:
    """From now on in this process, leave out pyspark's warning that stopping found the JVM gone ("Unable to cleanly
    shutdown Spark JVM process", printed on stderr): said when the JVM died first, of a signal its process group
    got or of the failure the command reports itself."""
    import warnings

    warnings.filterwarnings("ignore", message="Unable to cleanly shutdown Spark JVM process", category=RuntimeWarning)


def stop_session(spark) -> None:
    """Stop `spark`; a JVM that is already gone is not an error here (the failure that killed it is reported)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    ignore_jvm_gone_warning()
    try:
        spark.stop()
    except (PySparkException, Py4JError, OSError) as exc:
        log.debug("stopping Spark failed error=%s", exc)


# ---- stopping a job short: Ctrl-C, SIGTERM ---------------------------------------------------------------


class _DropPy4jRecords:
    """A filter of the root logger: py4j logs a KeyboardInterrupt while it waits on the JVM to the root logger
    itself (`logging.exception`), traceback included."""

    @staticmethod
    def filter(record) -> bool:
        return f"{os.sep}py4j{os.sep}" not in (record.pathname or "")


_DROP_PY4J_RECORDS = _DropPy4jRecords()


def quiet_py4j() -> None:
    """Silence py4j's and pyspark's own logging of a connection that breaks as the job is cancelled and the
    session stopped, or as a Ctrl-C cuts a call to the JVM short (the error that matters is reported in one
    line)."""
    import logging

    for name in ("py4j", "pyspark"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    root = logging.getLogger()
    if _DROP_PY4J_RECORDS not in root.filters:
        root.addFilter(_DROP_PY4J_RECORDS)
    try:  # the driver's accumulator server prints a traceback when the JVM ends under it (a signal to the group)
        from pyspark import accumulators
    except ImportError:
        return
    for name in ("AccumulatorTCPServer", "AccumulatorUnixServer"):
        server = getattr(accumulators, name, None)
        if isinstance(server, type):
            setattr(server, "handle_error", _quiet_handle_error)  # a class of pyspark's: not typed as a server here


def _quiet_handle_error(self, request, client_address) -> None:
    """socketserver's `handle_error` without the traceback on stderr: logged at debug level instead."""
    log.debug("accumulator server connection from %s ended: %s", client_address, sys.exc_info()[1])


def _child_jvms() -> list[int]:
    """This process's children that are Spark's JVM (`spark-submit`, which execs `java ... SparkSubmit`)."""
    me = os.getpid()
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []  # no procfs: nothing found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) != me or fields[0] == b"Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if b"SparkSubmit" in cmdline or b"spark-submit" in cmdline or b"spark-class" in cmdline:
            pids.append(int(entry))
    return pids


def kill_child_jvms(timeout_s: float = 5.0) -> None:
    """End the JVM this process launched for Spark (after `stop`, or a start-up interrupted half-way): SIGTERM,
    then SIGKILL after `timeout_s`, each reaped, so that no SparkSubmit is left running without its driver."""
    pids = _child_jvms()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while pids and time.monotonic() < deadline:
            for pid in list(pids):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid  # reaped elsewhere
                if done:
                    pids.remove(pid)
            if pids:
                time.sleep(0.05)
        if not pids:
            return
