"""One round-launch path: the daemon's threads (`cleaner.pool`) and `logcleaner clean` (`cleaner.oneshot`) both
set up and run their rounds through `cleaner.launch` — the thread's offset map, `launch_round` with the
broker-level settings, the device's throttle and the clock.

Each caller runs for real with `launch_round` wrapped: every round it makes must have gone through it, with
the settings, offset map and throttle the caller holds. A static check keeps a second path from growing
back beside it (neither caller imports `clean_round`, the map sizing or the survivorship record itself).
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import cleaner
from cleaner import launch
from cleaner.cli import main
from cleaner.manager import CleanerManager
from cleaner.metrics import CleanerMetrics
from cleaner.oneshot import clean_partition
from cleaner.pool import CleanerPool
from cleaner.settings import Settings
from cleaner.throttle import DeviceThrottles, Throttle
from segments.tools.generate import WorkloadSpec, generate_partition

T_DATA = 1_700_000_000_000  # the generated records' timestamps start here (ms)
NOW = T_DATA + 10_000
SPEC = WorkloadSpec(records=2000, keys=200, segment_bytes=16 * 1024, tombstone_fraction=0.1)
SMALL_MAP = {"log.cleaner.dedupe.buffer.size": str(24 * 120)}  # 120 slots against 200 keys: several rounds


@pytest.fixture
def launched(monkeypatch):
    """Every call of `launch.launch_round` and `launch.thread_offset_map`, each then run for real."""
    calls: dict[str, list] = {"rounds": [], "maps": []}
    real_round, real_map = launch.launch_round, launch.thread_offset_map

    def launch_round(log_, topic, settings, offset_map, throttle, clock_ms, **kwargs):
        result = real_round(log_, topic, settings, offset_map, throttle, clock_ms, **kwargs)
        calls["rounds"].append({"directory": log_.directory, "settings": settings, "offset_map": offset_map,
                                "throttle": throttle, "now_ms": clock_ms(), "result": result, **kwargs})
        return result

    def thread_offset_map(settings):
        offset_map = real_map(settings)
        calls["maps"].append(offset_map)
        return offset_map

    monkeypatch.setattr(launch, "launch_round", launch_round)
    monkeypatch.setattr(launch, "thread_offset_map", thread_offset_map)
    return calls


def test_clean_launches_every_round_through_the_launch_path(tmp_path, launched):
    directory = tmp_path / "t-0"
    generate_partition(directory, SPEC)
    settings = Settings.from_mappings({"cleanup.policy": "compact", **SMALL_MAP})
    throttle = Throttle(settings.cleaner.io_max_bytes_per_second)
    outcome = clean_partition(directory, settings, now_ms=NOW, throttle=throttle)
    assert outcome.ok, outcome.error
    assert len(outcome.rounds) >= 2
    assert [c["result"] for c in launched["rounds"]] == outcome.rounds
    assert len(launched["maps"]) == 1  # one map for the partition's rounds
    for call in launched["rounds"]:
        assert call["directory"] == directory and call["settings"] is settings.cleaner
        assert call["offset_map"] is launched["maps"][0] and call["throttle"] is throttle
        assert call["now_ms"] == NOW and call["horizon_pass"] is True


def test_the_clean_command_launches_every_round_through_the_launch_path(tmp_path, launched):
    generate_partition(tmp_path / "logs" / "t-0", SPEC)
    sets = [a for k, v in {"cleanup.policy": "compact", **SMALL_MAP}.items() for a in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(main, ["clean", "--json", "--now-ms", str(NOW), *sets, str(tmp_path / "logs")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.splitlines()[-1])
    assert summary["rounds"] >= 2 and len(launched["rounds"]) == summary["rounds"]


def test_the_daemons_threads_launch_every_round_through_the_launch_path(tmp_path, launched):
    log_dir = tmp_path / "logs"
    generate_partition(log_dir / "t-0", SPEC)
    settings = Settings.from_mappings({"cleanup.policy": "compact", "log.cleaner.backoff.ms": 10, **SMALL_MAP})
    manager = CleanerManager([log_dir], settings, clock_ms=lambda: NOW)
    throttles = DeviceThrottles(settings.cleaner.io_max_bytes_per_second)
    pool = CleanerPool(manager, throttles, CleanerMetrics(lambda: {}), threads=1, clock_ms=lambda: NOW)
    manager.discover()
    pool.start()
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while not manager.snapshot()[0].rounds:
            assert time.monotonic() < deadline, "the pool cleaned nothing"
            time.sleep(0.01)
    finally:
        assert pool.stop(timeout_s=30)
    rounds = manager.snapshot()[0].rounds
    assert rounds >= 1 and len(launched["rounds"]) >= rounds  # a round aborted by the stop is not counted
    assert launched["maps"], "the thread's offset map comes from the launch path"
    for call in launched["rounds"]:
        assert call["directory"] == log_dir / "t-0" and call["settings"] is settings.cleaner
        assert call["offset_map"] is launched["maps"][0] and call["throttle"] is throttles.for_path(log_dir)
        assert call["now_ms"] == NOW and callable(call["check_abort"])


@pytest.mark.parametrize("module", ["pool", "oneshot"])
def test_no_caller_sets_up_a_round_beside_the_launch_path(module):
    path = Path(cleaner.__file__).parent / f"{module}.py"
    tree = ast.parse(path.read_text(), str(path))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert "launch" in imported
    assert not imported & {"clean_round", "per_thread_memory_bytes", "survivorship"}, \
        "a round is set up and run by cleaner.launch only"
    made = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "OffsetMap"]
    assert made == [], f"an offset map made outside cleaner.launch: {path.name} lines {made}"


def _clean_four_partitions_on_four_threads(tmp_path) -> None:
    """`clean LOGDIR` of four generated partitions with `log.cleaner.threads=4`: every one cleaned."""
    logs = tmp_path / "logs"
    for p in range(4):
        generate_partition(logs / f"t-{p}", SPEC)
    result = CliRunner().invoke(main, ["clean", "--json", "--set", "cleanup.policy=compact", "--set",
                                       "log.cleaner.threads=4", "--now-ms", str(NOW), str(logs)])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["status"] for line in result.output.splitlines()] == ["ok"] * 4


@pytest.mark.parametrize("cores", [1, 2])
def test_no_more_rounds_run_at_once_than_the_process_has_cores(tmp_path, monkeypatch, cores):
    """`clean LOGDIR` on 4 threads: at most `cores` rounds in flight at any moment (`launch.CORES`), and with
    two cores two of them do overlap; every partition is still cleaned. In one process (`LOGCLEANER_WORKERS=threads`,
    as the daemon's threads run): the semaphore is per process."""
    import threading

    monkeypatch.setenv("LOGCLEANER_WORKERS", "threads")
    monkeypatch.setattr(launch, "CORES", threading.BoundedSemaphore(cores))
    in_flight, most = [0], [0]
    lock = threading.Lock()
    real_round = launch.clean_round

    def counted_round(*args, **kwargs):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            time.sleep(0.2)  # long enough for the other threads to try
            return real_round(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(launch, "clean_round", counted_round)
    _clean_four_partitions_on_four_threads(tmp_path)
    assert most[0] == cores


@pytest.mark.parametrize("cores", [1, 2])
def test_threads_past_the_cores_do_not_open_partitions_beside_the_rounds(tmp_path, monkeypatch, cores):
    """`clean LOGDIR` on 4 threads: a thread holds its core over all of a partition's work (`launch.core`),
    opening it included, so at most `cores` partitions are open at any moment (threads in one process)."""
    import contextlib
    import threading

    from cleaner import oneshot

    monkeypatch.setenv("LOGCLEANER_WORKERS", "threads")
    monkeypatch.setattr(launch, "CORES", threading.BoundedSemaphore(cores))
    open_now, most = [0], [0]
    lock = threading.Lock()
    real_open = oneshot.PartitionLog.open

    @contextlib.contextmanager
    def counted_open(*args, **kwargs):
        with lock:
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
        try:
            time.sleep(0.1)  # long enough for the other threads to try
            with real_open(*args, **kwargs) as plog:
                yield plog
        finally:
            with lock:
                open_now[0] -= 1

    monkeypatch.setattr(oneshot.PartitionLog, "open", counted_open)
    _clean_four_partitions_on_four_threads(tmp_path)
    assert most[0] == cores


def test_a_daemon_round_takes_the_cores_of_threads_with_nothing_to_clean(tmp_path, launched, monkeypatch):
    """Two threads on two cores, nothing dirty at first: once both found nothing, the round of a partition that
    then gets dirty recopies its groups on two threads (`launch.spare_cores`: the idle thread's core)."""
    import threading

    monkeypatch.setenv("LOGCLEANER_WORKERS", "threads")
    monkeypatch.setattr(launch, "CORES", threading.BoundedSemaphore(2))
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    settings = Settings.from_mappings({"cleanup.policy": "compact", "log.cleaner.backoff.ms": 10,
                                       "log.cleaner.threads": 2})
    manager = CleanerManager([log_dir], settings, clock_ms=lambda: NOW)
    throttles = DeviceThrottles(settings.cleaner.io_max_bytes_per_second)
    pool = CleanerPool(manager, throttles, CleanerMetrics(lambda: {}), threads=2, clock_ms=lambda: NOW)
    pool.start()
    try:
        deadline = time.monotonic() + 60  # a hang guard, not a measurement
        while pool._idle != {0, 1}:
            assert time.monotonic() < deadline, "the threads never found nothing to do"
            time.sleep(0.01)
        generate_partition(log_dir / "t-0", SPEC)
        manager.discover()
        while not launched["rounds"]:
            assert time.monotonic() < deadline, "the pool cleaned nothing"
            time.sleep(0.01)
    finally:
        assert pool.stop(timeout_s=30)
    assert launched["rounds"][0]["recopy_threads"] == 2
    assert launch.CORES.acquire(blocking=False) and launch.CORES.acquire(blocking=False)  # both given back
