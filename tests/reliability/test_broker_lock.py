"""A running Kafka broker's log dir is never changed: its `.lock` is respected, and ours keeps a broker out.

The broker's lock is taken by a real JVM exactly as Kafka takes it (`kafka_lock/Kafka.java`, compiled and
run as `java -cp DIR kafka.Kafka`, the broker's main class: FileChannel.tryLock() on `<log dir>/.lock`, an
fcntl F_SETLK write lock), and also by a plain process with `lockf` (the same fcntl lock). logcleaner runs
as the real CLI and the real daemon.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from segments.partition.log import PartitionLog
from tests.integration.daemon_helpers import (
    T0,
    DaemonProcess,
    append_keyed,
    free_port,
    logcleaner_command,
    wait_until,
    write_config,
)

JAVA = shutil.which("java")
JAVAC = shutil.which("javac")
KAFKA_LOCK_SOURCE = Path(__file__).parent / "kafka_lock" / "Kafka.java"

pytestmark = pytest.mark.skipif(JAVA is None or JAVAC is None,
                                reason="needs a JDK (17+, as for Spark) to hold a lock as Kafka does")


@pytest.fixture(scope="module")
def kafka_classes(tmp_path_factory) -> Path:
    """`kafka/Kafka.class` compiled from kafka_lock/Kafka.java, for `java -cp <dir> kafka.Kafka`."""
    out = tmp_path_factory.mktemp("kafka-classes")
    subprocess.run([JAVAC, "-d", str(out), str(KAFKA_LOCK_SOURCE)], check=True, timeout=120)
    return out


def _kafka(classes: Path, mode: str, log_dir: Path) -> list[str]:
    return [JAVA, "-cp", str(classes), "kafka.Kafka", mode, str(log_dir)]


def _tree(root: Path) -> dict[str, tuple]:
    """Every file under `root` (but the .lock files) with its bytes' hash, inode and mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.endswith(".lock"):
            st = p.stat()
            out[str(p.relative_to(root))] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_ino, st.st_mtime_ns)
    return out


def _log_dir(tmp_path: Path, partitions: int = 2) -> Path:
    log_dir = tmp_path / "kafka-logs"
    for p in range(partitions):
        directory = log_dir / f"orders-{p}"
        append_keyed(directory, [(f"k{i % 5}".encode(), f"v{i}".encode()) for i in range(60)],
                     timestamp_ms=T0, records_per_batch=5, segment_bytes=512)
    return log_dir


class Broker:
    """A JVM holding `<log_dir>/.lock` as a Kafka broker does."""

    def __init__(self, classes: Path, log_dir: Path) -> None:
        self.proc = subprocess.Popen(_kafka(classes, "hold", log_dir), stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        assert line == "locked", line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def _broker_would_start(classes: Path, log_dir: Path) -> bool:
    done = subprocess.run(_kafka(classes, "try", log_dir), capture_output=True, text=True, timeout=60)
    return done.stdout.strip() == "locked"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*logcleaner_command(), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def broker_dir(tmp_path, kafka_classes):
    log_dir = _log_dir(tmp_path)
    broker = Broker(kafka_classes, log_dir)
    yield log_dir, broker
    broker.stop()


def test_clean_refuses_in_one_line_naming_the_broker_and_changes_nothing(broker_dir):
    log_dir, broker = broker_dir
    before = _tree(log_dir)
    for target in (log_dir, log_dir / "orders-0"):
        done = _cli("clean", str(target), "--set", "cleanup.policy=compact,delete", "--set", "retention.ms=1")
        assert done.returncode == 1, done
        assert done.stderr.strip() == f"Error: a running Kafka broker (pid {broker.pid}) owns {log_dir}: stop it first"
        assert "Traceback" not in done.stdout + done.stderr
    assert _tree(log_dir) == before


def test_a_lock_held_by_any_other_process_is_refused_naming_that_process(tmp_path):
    log_dir = _log_dir(tmp_path, partitions=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(log_dir / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        done = _cli("clean", str(log_dir), "--set", "cleanup.policy=compact")
        assert done.returncode == 1
        assert f"process {holder.pid} (python" in done.stderr and "Kafka" not in done.stderr and f"owns {log_dir}: stop it first" in done.stderr
    finally:
        holder.kill()
        holder.wait()


def test_read_only_commands_still_work_and_warn_once(broker_dir):
    log_dir, broker = broker_dir
    before = _tree(log_dir)
    segment = sorted((log_dir / "orders-0").glob("*.log"))[0]
    for args in (["verify", str(log_dir)], ["audit", str(log_dir)], ["dump", str(segment)],
                 ["duplication", str(log_dir)]):
        done = _cli(*args)
        assert done.returncode == 0, (args, done)
        warnings = [line for line in done.stderr.splitlines() if "owns" in line]
        assert warnings == [f"warning: a running Kafka broker (pid {broker.pid}) owns {log_dir}: it may be changing "
                            "the files while they are read"], (args, done.stderr)
    assert {k: v for k, v in _tree(log_dir).items() if k.endswith(".log")} == \
        {k: v for k, v in before.items() if k.endswith(".log")}


def test_a_broker_started_while_logcleaner_changes_the_log_dir_refuses_to_start(tmp_path, kafka_classes):
    log_dir = _log_dir(tmp_path, partitions=1)
    with PartitionLog.open(log_dir / "orders-0", mode="cleaner"):
        assert not _broker_would_start(kafka_classes, log_dir)
        with PartitionLog.open(log_dir / "orders-0", mode="reader"):
            pass
        assert not _broker_would_start(kafka_classes, log_dir)  # closing another descriptor of ours kept it
    assert _broker_would_start(kafka_classes, log_dir)  # released with the log


def test_two_of_our_cleaners_share_the_log_dir_lock(tmp_path):
    log_dir = _log_dir(tmp_path, partitions=2)
    with PartitionLog.open(log_dir / "orders-0", mode="cleaner"), \
            PartitionLog.open(log_dir / "orders-1", mode="writer"):
        fd = os.open(log_dir / ".lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


@pytest.mark.slow
def test_the_daemon_takes_an_owned_log_dir_offline_and_cleans_it_once_the_broker_is_gone(tmp_path, kafka_classes):
    log_dir = _log_dir(tmp_path, partitions=1)
    broker = Broker(kafka_classes, log_dir)
    port = free_port()
    config = write_config(tmp_path / "logcleaner.toml", log_dirs=[log_dir], port=port,
                          settings={"min.cleanable.dirty.ratio": 0.01})
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log").start()
    try:
        before = _tree(log_dir)
        status = wait_until(lambda: daemon.status()["offline_log_dirs"], timeout_s=30, what="log dir offline")
        assert status == {str(log_dir): f"a running Kafka broker (pid {broker.pid}) owns {log_dir}: stop it first"}
        assert daemon.metric("logcleaner_log_dirs_offline") == 1
        wait_until(lambda: daemon.log_text().count("log dir offline"), timeout_s=10, what="the offline log line")
        assert daemon.log_text().count("log dir offline") == 1  # logged once, checked again quietly
        assert _tree(log_dir) == before
        broker.stop()
        wait_until(lambda: not daemon.status()["offline_log_dirs"], timeout_s=30, what="log dir back online")
        wait_until(lambda: daemon.partition("orders-0")["rounds"] >= 1, timeout_s=60, what="a round")
        assert daemon.metric("logcleaner_log_dirs_offline") == 0
    finally:
        broker.stop()
        daemon.close()


def test_ingest_into_a_log_dir_a_broker_owns_is_refused_before_spark_starts(broker_dir, tmp_path):
    log_dir, broker = broker_dir
    source = tmp_path / "rows.jsonl"
    source.write_text('{"k": "a", "v": 1}\n{"k": "b", "v": 2}\n')
    before = _tree(log_dir)
    done = _cli("ingest", str(source), "--topic", "orders", "--partitions", "2", "--key-column", "k",
                "--value-format", "json", "--output", str(log_dir))
    assert done.returncode == 1, done
    assert f"a running Kafka broker (pid {broker.pid}) owns {log_dir}: stop it first" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert _tree(log_dir) == before
