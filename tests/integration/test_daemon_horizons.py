"""The real daemon and delete horizons (issue 23 §1): the horizon pass happens once, then the log is left alone;
and a freshly started daemon finds the horizons an earlier `clean` (or daemon) stamped, and makes that pass.

The partitions are written and read back with kafka-python (`tests/kafka_python_logs`). The daemon's clock is
the `LOGCLEANER_CLOCK_FILE` file; that a quiet period really had the daemon looking for work is shown by the
time-since-last-run gauge dropping to 0 after each move of the clock (it counts on the daemon's clock).
"""

from __future__ import annotations

import signal
import time

import pytest

from ..kafka_python_logs import (
    ABORT,
    COMMIT,
    committed_latest,
    data,
    file_states,
    inactive,
    marker,
    read_partition,
    txn,
    write_partition,
)
from .daemon_helpers import (
    ADMIN_TOKEN,
    DaemonProcess,
    FileClock,
    cleaner_checkpoint,
    free_port,
    run_cli,
    wait_until,
    write_config,
    write_token_file,
)

T0 = 1_700_000_000_000
NOW = T0 + 2 * 86_400_000  # the producers of these logs have expired (producer.id.expiration.ms: one day)
RETENTION_MS = 2000
TIMEOUT_S = 30.0
QUIET_S = 1.5  # three times log.cleaner.backoff.ms


def _write_logs(log_dir) -> None:
    # Issue 23's log: segment 0 a, b, c; segment 1 a tombstone for a and b=b-v2; segment 2 (active) z.
    write_partition(log_dir / "t-0", [
        [data([(b"a", b"a-v1", T0), (b"b", b"b-v1", T0), (b"c", b"c-v1", T0)])],
        [data([(b"a", None, T0 + 1), (b"b", b"b-v2", T0 + 1)])],
        [data([(b"z", b"z", T0 + 2)])],
    ])
    # Markers too: an aborted transaction, a committed one whose data is superseded, one whose data stays.
    write_partition(log_dir / "x-0", [
        [txn([(b"k1", b"aborted", T0)], pid=1), txn([(b"k2", b"old", T0)], pid=2), txn([(b"k3", b"v", T0)], pid=3),
         marker(1, ABORT, timestamp=T0), marker(2, COMMIT, timestamp=T0), marker(3, COMMIT, timestamp=T0)],
        [data([(b"k2", b"new", T0 + 1)])],
        [],
    ])


def _daemon_process(tmp_path, log_dir, clock_ms: int) -> tuple[DaemonProcess, FileClock]:
    port = free_port()
    config = write_config(
        tmp_path / "logcleaner.toml", log_dirs=[log_dir], port=port,
        settings={"log.cleaner.threads": 1, "log.cleaner.backoff.ms": 500,
                  "log.cleaner.delete.retention.ms": RETENTION_MS, "cleanup.policy": "compact"},
        server={"admin_token_file": str(write_token_file(tmp_path / "admin-token"))},
    )
    clock = FileClock(tmp_path / "clock-ms", clock_ms)
    return DaemonProcess(config, port, tmp_path / "daemon.log", clock=clock, admin_token=ADMIN_TOKEN), clock


@pytest.fixture
def daemon(tmp_path):
    log_dir = tmp_path / "logs"
    _write_logs(log_dir)
    process, clock = _daemon_process(tmp_path, log_dir, NOW)
    try:
        yield process.start(), log_dir, clock
    finally:
        process.close()
        print(f"--- daemon log (tail) ---\n{process.log_text()[-3000:]}")  # shown when the test failed


def _looked_for_work_at(process: DaemonProcess, clock: FileClock, now_ms: int) -> None:
    """Move the daemon's clock and wait until a thread has looked for work at that time, then a quiet while."""
    clock.set(now_ms)
    wait_until(lambda: process.metric("logcleaner_time_since_last_run_seconds") == 0, timeout_s=TIMEOUT_S,
               what=f"a selection at {now_ms}")
    time.sleep(QUIET_S)


def test_after_the_horizon_pass_the_daemon_leaves_the_partition_alone(daemon):
    process, log_dir, clock = daemon
    t0, x0 = log_dir / "t-0", log_dir / "x-0"
    labels = {"topic": "t", "partition": "0", "log_dir": str(log_dir)}

    # First round of each: the dirty section; the tombstone and the markers of transactions without data stamped.
    wait_until(lambda: cleaner_checkpoint(log_dir, "t", 0) == 5 and cleaner_checkpoint(log_dir, "x", 0) == 7,
               timeout_s=TIMEOUT_S, what="both partitions cleaned once")
    wait_until(lambda: all(process.partition(p)["rounds"] == 1 for p in ("t-0", "x-0")), timeout_s=TIMEOUT_S,
               what="both rounds recorded")
    assert [(r.key, r.value, r.batch_has_horizon) for r in inactive(read_partition(t0), t0)] == [
        (b"c", b"c-v1", False), (b"a", None, True), (b"b", b"b-v2", True)]
    assert process.partition("t-0")["next_delete_horizon_ms"] == NOW + RETENTION_MS
    assert process.metric("logcleaner_partition_next_delete_horizon_seconds", **labels) == (NOW + RETENTION_MS) / 1000
    assert process.partition("x-0")["next_delete_horizon_ms"] == NOW + RETENTION_MS

    # Nothing is due before the horizon.
    _looked_for_work_at(process, clock, NOW + RETENTION_MS - 1)
    assert [process.partition(p)["rounds"] for p in ("t-0", "x-0")] == [1, 1]

    # At the horizon: one pass each removes the tombstone and the markers.
    clock.set(NOW + RETENTION_MS)
    wait_until(lambda: all(process.partition(p)["rounds"] == 2 for p in ("t-0", "x-0")), timeout_s=TIMEOUT_S,
               what="the horizon pass of both")
    records = read_partition(t0)
    assert [(r.key, r.value, r.batch_has_horizon) for r in inactive(records, t0)] == [
        (b"c", b"c-v1", False), (b"b", b"b-v2", False)]  # no tombstone left, so no horizon either
    assert committed_latest(records) == {b"c": b"c-v1", b"b": b"b-v2", b"z": b"z"}
    x_records = read_partition(x0)
    assert [(r.producer_id, r.control_type) for r in x_records if r.control_type is not None] == [(3, COMMIT)]
    assert committed_latest(x_records) == {b"k2": b"new", b"k3": b"v"}
    for p in ("t-0", "x-0"):
        assert process.partition(p)["next_delete_horizon_ms"] == -1
    assert process.metric("logcleaner_partition_next_delete_horizon_seconds", **labels) == -1

    # Then a quiet log stays quiet: no round, the same files (inodes, mtimes, bytes).
    files = file_states(log_dir)
    for later in (NOW + RETENTION_MS + 1, NOW + RETENTION_MS + 60_000, NOW + 30 * 86_400_000):
        _looked_for_work_at(process, clock, later)
    assert [process.partition(p)["rounds"] for p in ("t-0", "x-0")] == [2, 2]
    assert file_states(log_dir) == files
    assert process.log_text().count("reason=delete horizon") == 2  # one pass per partition, ever


def _horizons_shown(process: DaemonProcess, labels: dict[str, str], horizon_ms: int) -> bool:
    """/status and the metric both show `horizon_ms` as the next delete horizon of t-0 and x-0."""
    if any(process.partition(p)["next_delete_horizon_ms"] != horizon_ms for p in ("t-0", "x-0")):
        return False
    expected = horizon_ms / 1000 if horizon_ms >= 0 else -1
    return process.metric("logcleaner_partition_next_delete_horizon_seconds", **labels) == expected


def test_a_fresh_daemon_removes_tombstones_and_markers_stamped_by_an_earlier_clean_once_their_horizon_passed(
        tmp_path):
    # The operator's report: horizons stamped by `clean` (or `demo`), or by a daemon before its restart, showed as
    # -1 and the log was never selected for the horizon pass; only a trigger removed its tombstones.
    log_dir = tmp_path / "logs"
    t0, x0 = log_dir / "t-0", log_dir / "x-0"
    labels = {"topic": "t", "partition": "0", "log_dir": str(log_dir)}
    _write_logs(log_dir)
    cleaned = run_cli("clean", str(log_dir), "--now-ms", str(NOW), "--set", "cleanup.policy=compact",
                      "--set", f"delete.retention.ms={RETENTION_MS}")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert [(r.key, r.value, r.batch_has_horizon) for r in inactive(read_partition(t0), t0)] == [
        (b"c", b"c-v1", False), (b"a", None, True), (b"b", b"b-v2", True)]
    assert cleaner_checkpoint(log_dir, "t", 0) == 5 and cleaner_checkpoint(log_dir, "x", 0) == 7  # nothing dirty
    horizon = NOW + RETENTION_MS

    process, clock = _daemon_process(tmp_path, log_dir, NOW)
    try:
        process.start()
        # Before any round of its own, the daemon shows the horizons the files carry, and waits for them.
        wait_until(lambda: _horizons_shown(process, labels, horizon), timeout_s=TIMEOUT_S,
                   what="the stamped horizons in /status and /metrics")
        _looked_for_work_at(process, clock, horizon - 1)
        assert [process.partition(p)["rounds"] for p in ("t-0", "x-0")] == [0, 0]

        # After a restart, the same.
        process.send(signal.SIGTERM)
        process.wait_exit()
        process.close()
        process.start()
        wait_until(lambda: _horizons_shown(process, labels, horizon), timeout_s=TIMEOUT_S,
                   what="the stamped horizons in /status and /metrics after a restart")

        # At the horizon, without a trigger: one pass each removes the tombstone and the markers.
        clock.set(horizon)
        wait_until(lambda: all(process.partition(p)["rounds"] == 1 for p in ("t-0", "x-0")), timeout_s=TIMEOUT_S,
                   what="the horizon pass of both")
        records = read_partition(t0)
        assert [(r.key, r.value, r.batch_has_horizon) for r in inactive(records, t0)] == [
            (b"c", b"c-v1", False), (b"b", b"b-v2", False)]
        assert committed_latest(records) == {b"c": b"c-v1", b"b": b"b-v2", b"z": b"z"}
        x_records = read_partition(x0)
        assert [(r.producer_id, r.control_type) for r in x_records if r.control_type is not None] == [(3, COMMIT)]
        assert committed_latest(x_records) == {b"k2": b"new", b"k3": b"v"}
        wait_until(lambda: _horizons_shown(process, labels, -1), timeout_s=TIMEOUT_S, what="no horizon kept")

        # Then the quiet logs stay quiet.
        files = file_states(log_dir)
        for later in (horizon + 1, horizon + 60_000, NOW + 30 * 86_400_000):
            _looked_for_work_at(process, clock, later)
        assert [process.partition(p)["rounds"] for p in ("t-0", "x-0")] == [1, 1]
        assert file_states(log_dir) == files
        assert _horizons_shown(process, labels, -1)
        assert process.log_text().count("reason=delete horizon") == 2  # one pass per partition
    finally:
        process.close()
        print(f"--- daemon log (tail) ---\n{process.log_text()[-3000:]}")  # shown when the test failed
