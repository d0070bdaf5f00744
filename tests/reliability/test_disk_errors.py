"""A disk error takes only its log dir offline, as Kafka does, and the daemon goes on with the others.

The real daemon with two log dirs; `LOGCLEANER_FAULT=fileops.pwrite@1:eio` makes the first write of a round
fail with EIO (a failing disk). That log dir goes offline (`/status`, `logcleaner_log_dirs_offline`), its
partition stays listed and is not marked uncleanable, its files are as they were (no `.cleaned` file left),
and the other log dir is still cleaned.
"""

from __future__ import annotations

import hashlib

from segments.tools.generate import WorkloadSpec, generate_partition
from tests.integration.daemon_helpers import DaemonProcess, free_port, leftovers, wait_until, write_config


def _segments(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*.log"))}


def test_an_io_error_takes_only_its_log_dir_offline(tmp_path, monkeypatch):
    first, second = tmp_path / "disk-a", tmp_path / "disk-b"
    generate_partition(first / "a-0", WorkloadSpec(records=2000, keys=50, segment_bytes=16 * 1024))
    port = free_port()
    config = write_config(tmp_path / "c.toml", log_dirs=[first, second], port=port)
    monkeypatch.setenv("LOGCLEANER_FAULT", "fileops.pwrite@1:eio")
    second.mkdir()
    before = _segments(first / "a-0")
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log").start()
    try:
        offline = wait_until(lambda: daemon.status()["offline_log_dirs"], timeout_s=60, what="a log dir offline")
        assert list(offline) == [str(first)] and "Input/output error" in offline[str(first)]
        assert daemon.metric("logcleaner_log_dirs_offline") == 1
        # the other disk still works: a partition that appears there is cleaned
        generate_partition(second / "b-0", WorkloadSpec(records=2000, keys=50, segment_bytes=16 * 1024, seed=1))
        wait_until(lambda: daemon.partitions().get("b-0", {}).get("rounds", 0) >= 1, timeout_s=60,
                   what="b-0 cleaned on the healthy disk")
        a = daemon.partition("a-0")  # still listed, not blamed on the partition
        assert a["rounds"] == 0 and not a["uncleanable"]
        assert _segments(first / "a-0") == before and leftovers(first) == []
    finally:
        daemon.close()
