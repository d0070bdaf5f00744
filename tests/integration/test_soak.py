"""Soak: a writer, the real daemon and three readers share two partitions, each in its own process, for minutes.

The writer (`soak_processes writer`) appends a seeded plan of keyed plain and transactional batches, with
tombstones, COMMIT and ABORT markers, to an uncompressed and a compressed partition, rolling 32 KiB segments
several times a second. The daemon (`logcleaner run`) cleans them continuously: dirty ratio 0, two threads,
50 ms backoff, a short `delete.retention.ms` so tombstones and spent markers really go. Three readers use
`PartitionLog` as consumers would: one tails from offset 0 (and checks that what it saw up to the end is the
plan's committed state), one fetches from random offsets, one iterates from random offsets. Every record any
reader sees must be the one the plan put at its offset, and offsets must only grow within a pass.

After the writer stops, the daemon finishes cleaning (its checkpoint reaches the log end) while the readers
still read; then the readers and the daemon stop (SIGTERM, exit 0) and the log must hold exactly the writer's
last committed write per key (a tombstoned key has no value), no aborted data and no open transaction, pass
`logcleaner verify`, have no leftover files, and be much smaller than what was written.

The CI run lasts about a minute (`SOAK_SECONDS_DEFAULT` in `tests/conftest.py`); `--soak-seconds N` or
`LOGCLEANER_SOAK_SECONDS=N` runs longer.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .daemon_helpers import (
    DaemonProcess,
    cleaner_checkpoint,
    free_port,
    log_end_offset,
    run_cli,
    wait_until,
    write_config,
)
from .soak_processes import (
    PARTITIONS,
    SEGMENT_BYTES,
    read_view,
    view_differences,
)

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
WRITE_RATE_RECORDS_PER_S = 2400.0  # over both partitions
DELETE_RETENTION_MS = 3000
READERS = (("tail", 1), ("fetch", 2), ("iter", 3))  # (role, seed)
MONITOR_INTERVAL_S = 0.5
WRITER_GRACE_S = 30.0  # past the soak length: ending open transactions, the final roll
FINAL_CLEAN_TIMEOUT_S = 30.0
READER_EXIT_TIMEOUT_S = 30.0
LEFTOVER_SUFFIXES = (".cleaned", ".swap", ".deleted", ".tmp")
DAEMON_SETTINGS = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": 0.0,
    "min.compaction.lag.ms": 0,
    "delete.retention.ms": DELETE_RETENTION_MS,
    "segment.bytes": SEGMENT_BYTES,  # cleaned groups stay as tiny as the writer's segments
    "index.interval.bytes": 1024,
    "log.cleaner.threads": 2,
    "log.cleaner.backoff.ms": 50,
    "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
}


def _spawn(args: list[str], output: Path) -> subprocess.Popen:
    with open(output, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.soak_processes", *args],
            cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )


class Soak:
    """The processes of one soak run and where their outputs go; `close()` kills whatever still runs."""

    def __init__(self, tmp_path: Path, seconds: float) -> None:
        self.tmp_path = tmp_path
        self.seconds = seconds
        self.log_dir = tmp_path / "logs"
        self.log_dir.mkdir()
        self.stop_file = tmp_path / "stop-readers"
        self.writer_out = tmp_path / "writer.json"
        self.progress = tmp_path / "writer-progress.json"  # outside the log dir: it must not touch its mtime
        port = free_port()
        config = write_config(tmp_path / "logcleaner.toml", log_dirs=[self.log_dir], port=port,
                              settings=DAEMON_SETTINGS)
        self.daemon = DaemonProcess(config, port, tmp_path / "daemon.log")
        self.writer: subprocess.Popen | None = None
        self.readers: dict[str, subprocess.Popen] = {}

    def reader_out(self, role: str) -> Path:
        return self.tmp_path / f"reader-{role}.json"

    def output(self, name: str) -> str:
        path = self.tmp_path / f"{name}.out"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def start(self) -> None:
        self.daemon.start()
        self.writer = _spawn(["writer", "--log-dir", str(self.log_dir), "--seconds", str(self.seconds),
                              "--rate", str(WRITE_RATE_RECORDS_PER_S), "--out", str(self.writer_out),
                              "--progress", str(self.progress)],
                             self.tmp_path / "writer.out")
        for role, seed in READERS:
            self.readers[role] = _spawn(
                ["reader", "--log-dir", str(self.log_dir), "--role", role, "--seed", str(seed),
                 "--delete-retention-ms", str(DELETE_RETENTION_MS), "--stop-file", str(self.stop_file),
                 "--out", str(self.reader_out(role)), "--progress", str(self.progress)],
                self.tmp_path / f"reader-{role}.out",
            )

    def assert_alive(self) -> None:
        assert self.daemon.running(), f"the daemon exited\n{self.daemon.log_text()[-3000:]}"
        for role, proc in self.readers.items():
            assert proc.poll() is None, f"reader {role} exited with {proc.returncode}\n{self.output('reader-' + role)}"

    def checkpoints_at_log_end(self, written: dict) -> bool:
        for spec in PARTITIONS:
            topic, partition = spec.name.rsplit("-", 1)
            if cleaner_checkpoint(self.log_dir, topic, int(partition)) != written[spec.name]["log_end_offset"]:
                return False
        return True

    def stop_readers(self) -> dict[str, dict]:
        self.stop_file.touch()
        reports = {}
        for role, proc in self.readers.items():
            code = proc.wait(READER_EXIT_TIMEOUT_S)
            assert code == 0, f"reader {role} exited with {code}\n{self.output('reader-' + role)}"
            reports[role] = json.loads(self.reader_out(role).read_text())
        return reports

    def close(self) -> None:
        for proc in [self.writer, *self.readers.values()]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(READER_EXIT_TIMEOUT_S)
        self.daemon.close()
        # Shown by pytest only when the test failed.
        print(f"--- daemon log (tail) ---\n{self.daemon.log_text()[-3000:]}")
        print(f"--- writer ---\n{self.output('writer')}")
        for role in self.readers:
            print(f"--- reader {role} ---\n{self.output('reader-' + role)}")


def _leftovers(log_dir: Path) -> list[str]:
    return sorted(str(path.relative_to(log_dir)) for path in log_dir.rglob("*") if path.name.endswith(LEFTOVER_SUFFIXES))


def test_soak_concurrent_writer_cleaner_and_readers_agree_with_the_writer(tmp_path, soak_seconds):
    soak = Soak(tmp_path, soak_seconds)
    started_s = time.monotonic()
    try:
        soak.start()
        # While the writer runs: everyone stays up, and we note how far the log was when the cleaner's first
        # round of each partition was done (readers must see records written after that).
        first_round_log_end: dict[str, int] = {}
        deadline_s = time.monotonic() + soak_seconds + WRITER_GRACE_S
        while soak.writer.poll() is None:
            assert time.monotonic() < deadline_s, f"the writer is still running\n{soak.output('writer')}"
            soak.assert_alive()
            for name, status in soak.daemon.partitions().items():
                if status["rounds"] >= 1 and name not in first_round_log_end:
                    first_round_log_end[name] = log_end_offset(soak.log_dir / name)
            time.sleep(MONITOR_INTERVAL_S)
        assert soak.writer.returncode == 0, soak.output("writer")
        written = json.loads(soak.writer_out.read_text())["partitions"]
        assert sorted(first_round_log_end) == sorted(spec.name for spec in PARTITIONS), "no round while writing"
        soak_s = time.monotonic() - started_s

        # The final cleaning, with the readers still reading.
        wait_until(lambda: soak.checkpoints_at_log_end(written), timeout_s=FINAL_CLEAN_TIMEOUT_S,
                   what="the cleaner checkpoint to reach the log end")
        soak.assert_alive()
        reports = soak.stop_readers()
        statuses = soak.daemon.partitions()
        metrics = soak.daemon.metrics()
        soak.daemon.send(signal.SIGTERM)
        assert soak.daemon.wait_exit() == 0
    finally:
        soak.close()

    # No reader saw an offset go backwards or a record the writer never wrote, and each one got far.
    for role, report in reports.items():
        assert report["violation_count"] == 0, f"reader {role}: {report['violations'][:10]}"
        for spec in PARTITIONS:
            counts = report["counts"][spec.name]
            assert counts["records"] > 1000, (role, spec.name, counts)
            assert counts["max_offset"] > first_round_log_end[spec.name], (role, spec.name, counts)
            if role in ("tail", "fetch"):
                assert counts["fetches"] > 100, (role, spec.name, counts)
            if role == "tail":
                assert counts["view_checks"] >= 3, (role, spec.name, counts)

    # The cleaner was busy and never failed.
    rounds_ok = metrics[("logcleaner_rounds_total", frozenset({("result", "ok")}))]
    assert metrics[("logcleaner_rounds_total", frozenset({("result", "failed")}))] == 0
    assert all(status["last_error"] is None for status in statuses.values()), statuses
    assert "Traceback" not in soak.daemon.log_text()
    assert rounds_ok >= 10 * len(PARTITIONS)
    records_written = sum(w["records"] for w in written.values())
    records_removed = metrics[("logcleaner_records_removed_total", frozenset())]
    assert records_removed > records_written / 2

    # The log holds exactly the writer's last committed write per key, and nothing aborted or open.
    final = {}
    for spec in PARTITIONS:
        w = written[spec.name]
        assert w["aborted_records"] > 0 and w["tombstones"] > 0 and w["commits"] > 0, w  # the plan has them all
        view, records_left, aborted_left = read_view(soak.log_dir / spec.name)
        expected = {k.encode(): v.encode() for k, v in w["latest"].items()}
        assert view_differences(expected, view.values()) == []
        assert view.open_producers == []
        assert aborted_left == 0
        assert records_left < w["records"] / 5
        size_bytes = sum(p.stat().st_size for p in (soak.log_dir / spec.name).glob("*.log"))
        assert size_bytes < w["bytes"] / 5
        final[spec.name] = {"records": records_left, "log_bytes": size_bytes}
    verify = run_cli("verify", str(soak.log_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert _leftovers(soak.log_dir) == []

    summary = {
        "soak_s": round(soak_s, 1),
        "records_written": records_written,
        "records_removed": int(records_removed),
        "rounds_ok": int(rounds_ok),
        "final": final,
        "readers": {role: {name: {k: c.get(k) for k in ("passes", "fetches", "records", "view_checks")}
                           for name, c in r["counts"].items()} for role, r in reports.items()},
        "written": {name: {k: v for k, v in w.items() if k != "latest"}
                    for name, w in written.items()},
    }
    print("soak summary", json.dumps(summary))
