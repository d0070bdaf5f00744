"""`logcleaner clean` killed with SIGKILL at every step of its rounds: nothing is lost, half-applied or left over.

The scenario (`scenario.build_scenario`) is cleaned once unarmed with `LOGCLEANER_FAULT_TRACE` set, which
lists every fault point the run passes, in order (`<point> <n>`). Then, for each of those steps, a fresh
copy is cleaned by a child process armed with `LOGCLEANER_FAULT=<point>@<n>`, which kills itself there;
the copy must then satisfy `scenario.check_after_crash` for both partitions, and a second, unarmed
`logcleaner clean` must finish the job keeping exactly the records the uncrashed run keeps. (Not the same
bytes: a group swapped in before the crash is cleaned a second time, which may stamp a delete horizon on
a marker the single run would stamp one round later.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from segments.codec.errors import OffsetOutOfRangeError
from segments.files import faults
from segments.partition.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog

from ..integration.daemon_helpers import DaemonProcess, FileClock, free_port, wait_until, write_config
from ..segments.helpers import keyed_batch, read_all
from .scenario import (
    CLEAN_ARGS,
    CLEAN_SETTINGS,
    NOW_MS,
    PARTITION_NAMES,
    PARTITIONS,
    TOPIC,
    build_scenario,
    check_after_crash,
    committed_records,
    copy_tree,
    snapshot,
    temp_files,
)

HARNESS = Path(__file__).with_name("crash_harness.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


class Harness:
    """The fork server of `crash_harness.py`, one per test module."""

    def __init__(self, warmup: Path, clean_args: list[str] = CLEAN_ARGS) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HARNESS), str(warmup), *clean_args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def run(self, log_dir: Path, fault: str | None = None, trace: Path | None = None) -> dict:
        request = {"log_dir": str(log_dir), "fault": fault, "trace": str(trace) if trace else None}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    template = build_scenario(root / "template")
    harness = Harness(copy_tree(template, root / "warmup"))
    reference = copy_tree(template, root / "reference")
    trace = root / "trace"
    assert harness.run(reference, trace=trace) == {"exit_code": 0, "signal": None}
    steps = [tuple(line.split()) for line in trace.read_text().splitlines()]
    parts = PARTITION_NAMES
    old = {p: snapshot(template / p) for p in parts}
    new = {p: snapshot(reference / p) for p in parts}
    inputs = {p: committed_records(template / p) for p in parts}
    committed_after = {p: committed_records(reference / p) for p in parts}
    yield {"root": root, "template": template, "harness": harness, "steps": steps,
           "old": old, "new": new, "inputs": inputs, "committed_after": committed_after}
    harness.close()


RETENTION_POINTS = {p for p in faults.POINTS if p.startswith("retention.")}  # the retention world's


def test_the_unarmed_run_passes_every_named_point_of_a_multi_group_round(world):
    names = {point for point, _ in world["steps"]}
    wanted = set(faults.POINTS) - RETENTION_POINTS
    assert names == wanted, f"points never reached: {wanted - names}"
    counts = {point: max(int(n) for p, n in world["steps"] if p == point) for point in names}
    assert counts["swap.renamed_live"] >= 2 * PARTITIONS, "the scenario must swap several groups per partition"
    assert counts["round.after_index"] == PARTITIONS


def _crash_and_check(world, harness: Harness, case_dir: Path, point: str, n: str) -> None:
    log_dir = copy_tree(world["template"], case_dir)
    answer = harness.run(log_dir, fault=f"{point}@{n}")
    assert answer == {"exit_code": None, "signal": signal.SIGKILL}, f"{point}@{n} did not kill the cleaner: {answer}"
    for p, old in world["old"].items():
        check_after_crash(log_dir / p, old, world["new"][p], world["inputs"][p])
    assert temp_files(log_dir) == [], f"{point}@{n}: temporary files left"
    assert harness.run(log_dir) == {"exit_code": 0, "signal": None}
    for p in world["new"]:
        assert committed_records(log_dir / p) == world["committed_after"][p], (
            f"{point}@{n}: the rerun after the crash keeps other records than the uncrashed run"
        )


def test_sigkill_at_every_step_leaves_each_group_old_or_new_and_a_rerun_finishes(world, tmp_path):
    """Every step, on two fork servers at once (every other step each: the cases are independent copies), so
    that the suite's longest test takes about half as long on two cores."""
    steps = world["steps"]
    assert len(steps) > 200
    second = Harness(copy_tree(world["template"], tmp_path / "warmup-2"))
    failed = threading.Event()

    def cases(harness: Harness, first: int) -> None:
        for i in range(first, len(steps), 2):
            if failed.is_set():
                return
            try:
                _crash_and_check(world, harness, tmp_path / f"case-{i}", *steps[i])
            except BaseException:
                failed.set()
                raise

    try:
        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(cases, world["harness"], 0), pool.submit(cases, second, 1)]:
                future.result()
    finally:
        second.close()


def test_environment_variable_arms_a_fresh_process(world, tmp_path):
    """The same arming reaches a real `logcleaner` started from scratch (no fork server)."""
    log_dir = copy_tree(world["template"], tmp_path / "logs")
    env = dict(os.environ, **{faults.ENV_FAULT: "swap.renamed_to_deleted@2"})
    cli = Path(sys.executable).with_name("logcleaner")
    proc = subprocess.run([str(cli), "clean", str(log_dir), *CLEAN_ARGS], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    names = os.listdir(log_dir / f"{TOPIC}-0")
    assert any(n.endswith(".deleted") for n in names) and any(n.endswith(".swap") for n in names)
    for p, old in world["old"].items():
        check_after_crash(log_dir / p, old, world["new"][p], world["inputs"][p])


def test_a_bad_fault_spec_is_refused_at_start(tmp_path):
    env = dict(os.environ, **{faults.ENV_FAULT: "swap.no_such_point"})
    cli = Path(sys.executable).with_name("logcleaner")
    proc = subprocess.run([str(cli), "clean", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown fault point 'swap.no_such_point'" in proc.stderr


@pytest.mark.parametrize("fault", ["recopy.mid_group@2", "swap.renamed_live@1", "checkpoint.before_write@2"])
def test_daemon_killed_at_a_fault_point_recovers_and_finishes_after_a_restart(world, tmp_path, monkeypatch, fault):
    log_dir = copy_tree(world["template"], tmp_path / "logs")
    port = free_port()
    config = write_config(tmp_path / "logcleaner.toml", log_dirs=[log_dir], port=port,
                          settings={**CLEAN_SETTINGS, "min.cleanable.dirty.ratio": 0.01})
    clock = FileClock(tmp_path / "clock", NOW_MS)
    monkeypatch.setenv(faults.ENV_FAULT, fault)
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log", clock=clock)
    try:
        daemon.start(wait=False)
        assert daemon.wait_exit(timeout_s=60) == -signal.SIGKILL, f"{fault} did not kill the daemon"
    finally:
        daemon.close()
    monkeypatch.delenv(faults.ENV_FAULT)
    daemon = DaemonProcess(config, port, tmp_path / "daemon-restarted.log", clock=clock).start()
    try:
        def all_clean() -> bool:
            states = [daemon.partition(p) for p in world["old"]]
            return sum(s["rounds"] for s in states) >= 1 and all(s["dirty_ratio"] == 0 for s in states)

        wait_until(all_clean, timeout_s=60, what="both partitions clean after the restart")
        daemon.send(signal.SIGTERM)
        assert daemon.wait_exit() == 0
    finally:
        daemon.close()
    assert temp_files(log_dir) == []
    for p in world["old"]:
        assert committed_records(log_dir / p) == world["committed_after"][p]
        verify = subprocess.run([str(Path(sys.executable).with_name("logcleaner")), "verify", str(log_dir / p)],
                                capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0, verify.stdout + verify.stderr


# ---- retention: the delete policy's deletion of expired segments ---------------------------------------------

RETENTION_MS = 10_000
RETENTION_SEGMENTS = 8
RETENTION_NOW_MS = NOW_MS
RETENTION_ARGS = ["--now-ms", str(RETENTION_NOW_MS), "--set", "cleanup.policy=delete",
                  "--set", f"retention.ms={RETENTION_MS}"]


def _build_retention_log(directory: Path) -> None:
    """Eight segments of 4 records; segment i's newest record is (8 - i) × 2 s + 1 ms older than the clock's
    expiry point, so that the first five are expired (more than retention.ms old) and the rest are not."""
    with PartitionLog.open(directory, mode="writer", create=True, config=LogConfig()) as log:
        for i in range(RETENTION_SEGMENTS):
            newest = RETENTION_NOW_MS - RETENTION_MS + (i - 5) * 2_000 + 1
            log.append_batches(keyed_batch([(b"k%d" % j, b"v%d-%d" % (i, j)) for j in range(4)],
                                           timestamp_ms=newest - 3))
            log.roll()


@pytest.fixture(scope="module")
def retention_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("retention-crash")
    template = root / "template"
    _build_retention_log(template / "r-0")
    _build_retention_log(root / "warmup" / "r-0")
    harness = Harness(root / "warmup", RETENTION_ARGS)
    reference = copy_tree(template, root / "reference")
    trace = root / "trace"
    assert harness.run(reference, trace=trace) == {"exit_code": 0, "signal": None}
    with PartitionLog.open(template / "r-0", mode="reader") as log:
        old_bases = [s.base_offset for s in log.segments]
    yield {"template": template, "harness": harness, "old_bases": old_bases, "records": read_all(template / "r-0"),
           "steps": [tuple(line.split()) for line in trace.read_text().splitlines()], "reference": reference}
    harness.close()


def test_the_uncrashed_retention_run_deletes_the_expired_segments_and_passes_its_points(retention_world):
    names = {point for point, _ in retention_world["steps"]}
    assert RETENTION_POINTS <= names
    old_bases = retention_world["old_bases"]
    with PartitionLog.open(retention_world["reference"] / "r-0", mode="reader") as log:
        assert [s.base_offset for s in log.segments] == old_bases[5:]
        assert log.log_start_offset == old_bases[5]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(old_bases[0])
    assert read_offset_checkpoint(retention_world["reference"] / LOG_START_OFFSET_CHECKPOINT) == {("r", 0): old_bases[5]}


def test_sigkill_at_every_retention_step_leaves_a_consistent_prefix_deleted_and_a_rerun_finishes(
    retention_world, tmp_path
):
    old_bases, records = retention_world["old_bases"], retention_world["records"]
    steps = retention_world["steps"]
    assert len(steps) >= 10
    for i, (point, n) in enumerate(steps):
        log_dir = copy_tree(retention_world["template"], tmp_path / f"case-{i}")
        answer = retention_world["harness"].run(log_dir, fault=f"{point}@{n}")
        assert answer == {"exit_code": None, "signal": signal.SIGKILL}, f"{point}@{n}: {answer}"
        with PartitionLog.open(log_dir / "r-0", mode="cleaner") as log:  # reopening recovers
            bases = [s.base_offset for s in log.segments]
            start = log.log_start_offset
        assert temp_files(log_dir) == [], f"{point}@{n}: temporary files after reopen"
        # Expired segments go oldest first: whatever the crash left, a prefix of them is gone, no more.
        assert bases in [old_bases[j:] for j in range(6)], f"{point}@{n}: bases {bases}"
        assert start == bases[0], f"{point}@{n}: log start {start} is not the first segment's base {bases[0]}"
        assert read_all(log_dir / "r-0") == [r for r in records if r[0] >= start], f"{point}@{n}"
        assert retention_world["harness"].run(log_dir) == {"exit_code": 0, "signal": None}
        with PartitionLog.open(log_dir / "r-0", mode="reader") as log:
            assert [s.base_offset for s in log.segments] == old_bases[5:], f"{point}@{n}: the rerun"
            assert log.log_start_offset == old_bases[5]
        # (a crash after the renames but before the checkpoint leaves no entry: the first segment's base is the
        # log start then, the same offset)
        recorded = read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT).get(("r", 0))
        assert recorded in (None, old_bases[5]), f"{point}@{n}: log start checkpoint {recorded}"
