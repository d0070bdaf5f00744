"""A full disk aborts the round cleanly: `.cleaned` files go, the log is intact, and cleaning resumes later.

Two sources of ENOSPC: the fault layer (`fileops.pwrite@n:enospc`, at every write a cleaning makes) and a
real tmpfs filled to the last byte (mounting one needs root; without it those tests are skipped and say
so). The daemon case checks that a disk-full round is retried after `disk_full_retry_ms`, not after the
hour an uncleanable partition waits, and succeeds once space is freed.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cleaner.oneshot import clean_partition
from segments.files import faults

from ..cleaner.builders import file_digests
from ..integration.daemon_helpers import DaemonProcess, FileClock, free_port, wait_until, write_config
from .scenario import (
    CLEAN_ARGS,
    CLEAN_SETTINGS,
    COMPACT_SETTINGS,
    NOW_MS,
    PARTITION_NAMES,
    TOPIC,
    build_scenario,
    check_after_crash,
    committed_records,
    copy_tree,
    snapshot,
    temp_files,
)

PARTS = PARTITION_NAMES
SETTINGS = COMPACT_SETTINGS


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("diskfull")
    template = build_scenario(root / "template")
    reference = copy_tree(template, root / "reference")
    trace = root / "trace"
    faults.trace_to(trace)
    try:
        for p in PARTS:
            clean_partition(reference / p, SETTINGS, now_ms=NOW_MS)
    finally:
        faults.disarm()
    writes = sum(1 for line in trace.read_text().splitlines() if line.startswith("fileops.pwrite "))
    return {
        "template": template, "writes": writes,
        "old": {p: snapshot(template / p) for p in PARTS},
        "new": {p: snapshot(reference / p) for p in PARTS},
        "inputs": {p: committed_records(template / p) for p in PARTS},
        "after": {p: committed_records(reference / p) for p in PARTS},
    }


@pytest.mark.parametrize("action, message", [("enospc", "No space left on device"), ("eio", "Input/output error")])
def test_a_failed_write_at_every_step_aborts_the_round_and_leaves_no_temporary_file(world, tmp_path, action, message):
    assert world["writes"] > 20
    for n in range(1, world["writes"] + 1):
        log_dir = copy_tree(world["template"], tmp_path / f"{action}-{n}")
        faults.arm("fileops.pwrite", n, action)
        try:
            outcomes = [clean_partition(log_dir / p, SETTINGS, now_ms=NOW_MS) for p in PARTS]
        finally:
            faults.disarm()
        errors = [o.error for o in outcomes if o.error]
        assert len(errors) == 1 and message in errors[0] and f"fileops.pwrite@{n}" in errors[0], errors
        assert temp_files(log_dir) == [], f"write {n}: temporary files left by the failed round (before any reopen)"
        for p, old in world["old"].items():
            check_after_crash(log_dir / p, old, world["new"][p], world["inputs"][p])
        for p in PARTS:
            assert clean_partition(log_dir / p, SETTINGS, now_ms=NOW_MS).error is None
            assert committed_records(log_dir / p) == world["after"][p]


# ---- a real full filesystem ---------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs mounted at tmp_path/small (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root; the fault-layer ENOSPC tests still run")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> Path:
    """Write a file in `path` until the filesystem has no byte left; returns it."""
    filler = path / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    while True:  # the last partial page
        try:
            with open(filler, "ab", buffering=0) as f:
                f.write(b"\0")
        except OSError:
            break
    return filler


def test_clean_on_a_full_filesystem_exits_1_changes_nothing_and_succeeds_once_space_is_freed(world, small_fs):
    log_dir = copy_tree(world["template"], small_fs / "logs")
    before = file_digests(log_dir)
    filler = fill(small_fs)
    cli = Path(sys.executable).with_name("logcleaner")
    proc = subprocess.run([str(cli), "clean", str(log_dir), *CLEAN_ARGS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert "No space left on device" in output and f"{log_dir}/{TOPIC}-0/" in output, output
    assert temp_files(log_dir) == []
    assert file_digests(log_dir) == before
    filler.unlink()
    proc = subprocess.run([str(cli), "clean", str(log_dir), *CLEAN_ARGS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for p in PARTS:
        assert committed_records(log_dir / p) == world["after"][p]


@pytest.mark.slow
def test_daemon_retries_a_disk_full_partition_soon_and_cleans_it_once_space_is_freed(world, small_fs, tmp_path):
    log_dir = copy_tree(world["template"], small_fs / "logs")
    before = file_digests(log_dir)
    filler = fill(small_fs)
    port = free_port()
    config = write_config(
        tmp_path / "logcleaner.toml", log_dirs=[log_dir], port=port,
        settings={**CLEAN_SETTINGS, "min.cleanable.dirty.ratio": 0.01},
        server={"disk_full_retry_ms": 300, "uncleanable_retry_ms": 3_600_000},
    )
    clock = FileClock(tmp_path / "clock", NOW_MS)
    ticks = iter(range(NOW_MS, NOW_MS + 30_000, 100))  # the daemon's clock runs, but stays far from any horizon

    def ticking(predicate):
        def tick_then_check():
            clock.set(next(ticks, NOW_MS + 30_000))
            return predicate()
        return tick_then_check

    daemon = DaemonProcess(config, port, tmp_path / "daemon.log", clock=clock).start()
    try:
        wait_until(ticking(lambda: all(daemon.partition(p)["disk_full_failures"] >= 2 for p in PARTS)), timeout_s=60,
                   what="both partitions retried after running out of space")
        for p in PARTS:
            status = daemon.partition(p)
            assert "disk full" in status["last_error"] and not status["uncleanable"], status
        assert temp_files(log_dir) == []
        assert file_digests(log_dir) == before
        filler.unlink()
        wait_until(ticking(lambda: all(daemon.partition(p)["rounds"] >= 1 for p in PARTS)), timeout_s=60,
                   what="both partitions cleaned once space was freed")
        daemon.send(15)
        assert daemon.wait_exit() == 0
    finally:
        daemon.close()
    for p in PARTS:
        assert committed_records(log_dir / p) == world["after"][p]
