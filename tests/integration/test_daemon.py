"""The real daemon (`logcleaner run`) as a subprocess on generated log dirs, observed from outside.

Each test writes partitions, a TOML config (quick backoff and discovery) and, where time matters, the
`LOGCLEANER_CLOCK_FILE` clock; starts the daemon; and judges it by what a user can see: the files (records
read back, checkpoints, leftovers), `/status`, `/metrics`, the exit status and the log. Negative outcomes
("not cleaned") are observed without sleeping: a single cleaner thread always takes the filthiest eligible
log first, so once a log that ranks below the one under test has been cleaned, the one under test was
passed over by the same selection.

Long throttled rounds come from one 12 MB zstd-compressed log (`big_log`), built once per session: zstd
batches are slow to clean per byte, so a throttled round lasts seconds without a large log to write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cleaner import metrics as metrics_module
from cleaner.cli import main as cli_main
from cleaner.throttle import WINDOW_S
from segments.codec import format as fmt
from segments.codec.errors import OffsetOutOfRangeError
from segments.partition.checkpoint import read_offset_checkpoint
from segments.partition.locks import CLEANER_LOCK, PartitionLock
from segments.partition.log import (
    CHECKPOINT_LOCK,  # the log dir's lock around checkpoint updates
    PartitionLog,
)
from segments.tools.generate import WorkloadSpec, generate_partition
from segments.tools.verify import verify_paths

from .daemon_helpers import (
    ADMIN_TOKEN,
    HOUR_MS,
    T0,
    DaemonProcess,
    FileClock,
    RepeatedLog,
    append_keyed,
    cleaner_checkpoint,
    dirty_ratio_from,
    free_port,
    latest_by_key,
    leftovers,
    log_end_offset,
    log_segment_sizes,
    records_of,
    run_cli,
    segment_bases,
    segment_max_timestamps,
    start_writer,
    wait_until,
    write_cleaner_checkpoint,
    write_config,
    write_token_file,
)

ROUND_TIMEOUT_S = 30.0  # a generous bound on anything the daemon is expected to do "soon"
BIG_LOG_BYTES = 12_000_000
BIG_SEGMENT_BYTES = 1_000_000
BIG_BUDGET = 6_000_000.0  # bytes/s: a round of the big log (≈ 3 × its size of I/O) takes about 6 s
TINY_BUDGET = 300_000.0  # bytes/s: each 1 MB window of the big log waits seconds for its budget
SMALL = dict(records=1200, keys=100, segment_bytes=16 * 1024)  # ten equal segments, then an empty active one


class DaemonEnv:
    """One test's log dir, config file, port, optional clock, and the daemons it started (closed at the end)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.log_dir = tmp_path / "logs"
        self.log_dir.mkdir()
        self.port = free_port()
        self.config_path = tmp_path / "logcleaner.toml"
        self.token_path = write_token_file(tmp_path / "admin-token")  # admin POSTs need it
        self.clock: FileClock | None = None
        self.daemons: list[DaemonProcess] = []

    def partition_dir(self, name: str) -> Path:
        return self.log_dir / name

    def generate(self, name: str, **spec) -> Path:
        directory = self.partition_dir(name)
        generate_partition(directory, WorkloadSpec(**{**SMALL, **spec}))
        return directory

    def use_clock(self, now_ms: int) -> FileClock:
        self.clock = FileClock(self.tmp_path / "clock-ms", now_ms)
        return self.clock

    def configure(self, *, settings=None, topics=None, server=None) -> Path:
        server = {"admin_token_file": str(self.token_path), **(server or {})}
        return write_config(self.config_path, log_dirs=[self.log_dir], port=self.port, settings=settings,
                            topics=topics, server=server)

    def start(self, *, wait: bool = True) -> DaemonProcess:
        daemon = DaemonProcess(self.config_path, self.port, self.tmp_path / f"daemon-{len(self.daemons)}.log",
                               clock=self.clock, admin_token=ADMIN_TOKEN)
        self.daemons.append(daemon)
        return daemon.start(wait=wait)

    def checkpoint(self, name: str) -> int | None:
        topic, _, partition = name.rpartition("-")
        return cleaner_checkpoint(self.log_dir, topic, int(partition))

    def set_checkpoint(self, name: str, offset: int) -> None:
        """Pretend partition `name` was cleaned up to `offset` (its clean section for the dirty ratio)."""
        topic, _, partition = name.rpartition("-")
        write_cleaner_checkpoint(self.log_dir, topic, int(partition), offset)

    def fully_cleaned(self, name: str) -> bool:
        return self.checkpoint(name) == log_end_offset(self.partition_dir(name))

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()
            # Shown by pytest only when the test failed.
            print(f"--- {daemon.log_path} (tail) ---\n{daemon.log_text()[-3000:]}")


@pytest.fixture
def env(tmp_path):
    e = DaemonEnv(tmp_path)
    try:
        yield e
    finally:
        e.close()


class BigLog:
    """The session's big log, copied into a test's log dir on demand."""

    def __init__(self, template_dir: Path, layout: RepeatedLog, end_offset: int) -> None:
        self.template_dir = template_dir
        self.layout = layout
        self.end_offset = end_offset

    def copy_to(self, env: DaemonEnv, name: str) -> Path:
        target = env.partition_dir(name)
        shutil.copytree(self.template_dir, target)
        return target


@pytest.fixture(scope="session")
def big_log(tmp_path_factory) -> BigLog:
    root = tmp_path_factory.mktemp("big-log")
    layout = RepeatedLog(compression=fmt.COMPRESSION_ZSTD, records_per_batch=200, template_bytes=200_000)
    end = layout.write(root / "big-0", log_bytes=BIG_LOG_BYTES, segment_bytes=BIG_SEGMENT_BYTES)
    return BigLog(root / "big-0", layout, end)


def corrupt_segment(directory: Path, index: int) -> tuple[Path, bytes]:
    """Flip a byte inside the records of the first batch of the `index`-th segment (its CRC no longer
    matches); returns the file and its original bytes."""
    path = directory / fmt.offset_file_name(segment_bases(directory)[index], fmt.LOG_SUFFIX)
    original = path.read_bytes()
    data = bytearray(original)
    data[fmt.RECORD_BATCH_OVERHEAD + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    return path, original


def assert_compacted_to(directory: Path, expected_latest: dict) -> None:
    """Exactly one record per key, and it is the key's latest record (same offset, same value)."""
    records = records_of(directory)
    keys = [key for _, key, _, _ in records]
    assert len(keys) == len(set(keys)), f"{directory.name}: duplicate keys remain after cleaning"
    assert latest_by_key(records) == expected_latest


def wait_sleeping_in_throttle(daemon: DaemonProcess, name: str, still_s: float = 0.5) -> None:
    """Wait until partition `name` is being cleaned and its I/O counter has stood still for `still_s`
    (its thread sleeps in the throttle)."""
    wait_until(lambda: daemon.partition(name)["state"] == "in_progress" and daemon.io_bytes_total() > 0,
               timeout_s=ROUND_TIMEOUT_S, what=f"{name} in progress")
    since, value = time.monotonic(), daemon.io_bytes_total()
    while time.monotonic() - since < still_s:
        now_value = daemon.io_bytes_total()
        if now_value != value:
            since, value = time.monotonic(), now_value
        time.sleep(0.02)
    assert daemon.partition(name)["state"] == "in_progress"


# ---- compaction, checkpoints, writer ---------------------------------------------------------------------------


@pytest.mark.slow
def test_daemon_compacts_every_partition_to_the_latest_value_per_key_while_a_writer_appends(env):
    generated = {}
    for seed, name in enumerate(["users-0", "users-1", "orders-1"]):
        generated[name] = latest_by_key(records_of(env.generate(name, records=2000, keys=150, seed=seed)))
    env.configure(settings={"log.cleaner.threads": 2}, topics={"orders": {"min.cleanable.dirty.ratio": 0.2}})
    daemon = env.start()
    written = env.tmp_path / "writer-latest.json"
    writer = start_writer(env.partition_dir("orders-0"), written, batches=150, keys=40, pause_s=0.01)
    seen_checkpoints = []
    try:
        deadline = time.monotonic() + 60
        while writer.poll() is None:
            assert time.monotonic() < deadline, "writer did not finish"
            if env.partition_dir("orders-0").exists():
                checkpoint = env.checkpoint("orders-0")
                if checkpoint is not None and (not seen_checkpoints or checkpoint != seen_checkpoints[-1]):
                    seen_checkpoints.append(checkpoint)
            time.sleep(0.02)
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    assert writer.returncode == 0, writer.stdout.read()

    names = ["users-0", "users-1", "orders-0", "orders-1"]
    wait_until(lambda: all(env.fully_cleaned(n) for n in names), timeout_s=ROUND_TIMEOUT_S,
               what="every partition cleaned up to its log end")
    wait_until(lambda: all(p["state"] == "idle" for p in daemon.partitions().values()), timeout_s=ROUND_TIMEOUT_S,
               what="every partition idle")

    assert len(seen_checkpoints) >= 2, f"orders-0 was not cleaned while the writer wrote: {seen_checkpoints}"
    assert seen_checkpoints == sorted(seen_checkpoints), f"checkpoint went backwards: {seen_checkpoints}"
    for name, latest in generated.items():
        assert_compacted_to(env.partition_dir(name), latest)
    writer_latest = {k.encode(): (offset, value.encode()) for k, (offset, value) in json.loads(written.read_text()).items()}
    assert_compacted_to(env.partition_dir("orders-0"), writer_latest)
    assert verify_paths([env.log_dir]).problems == []
    # A swap's `.deleted` files are removed on the daemon's remover thread, soon after the round.
    wait_until(lambda: all(leftovers(env.partition_dir(n)) == [] for n in names), timeout_s=ROUND_TIMEOUT_S,
               what="no .cleaned, .swap or .deleted file left")
    assert daemon.metric("logcleaner_rounds_total", result="failed") == 0


# ---- gating: dirty ratio, min and max compaction lag --------------------------------------------------------------


def test_min_cleanable_dirty_ratio_gates_selection_and_must_be_strictly_exceeded(env):
    # Ten equal segments each; a checkpoint at a segment base makes the rest dirty: ratios 0.6, 0.5, 0.4.
    checkpoints, ratios = {}, {}
    for name, clean_segments in {"strict-0": 4, "equal-0": 5, "eager-0": 6}.items():
        directory = env.generate(name)
        checkpoints[name] = segment_bases(directory)[clean_segments]
        env.set_checkpoint(name, checkpoints[name])
        ratios[name] = dirty_ratio_from(directory, checkpoints[name])
    assert ratios["strict-0"] > ratios["equal-0"] > ratios["eager-0"]
    env.configure(topics={
        "strict": {"min.cleanable.dirty.ratio": ratios["strict-0"] + 0.1},
        "equal": {"min.cleanable.dirty.ratio": ratios["equal-0"]},  # equal is not enough: it must be above
        "eager": {"min.cleanable.dirty.ratio": ratios["eager-0"] - 0.1},
    })
    daemon = env.start()
    # the round writes the checkpoint before the daemon counts it: wait for both
    wait_until(lambda: env.fully_cleaned("eager-0") and daemon.partition("eager-0")["rounds"] >= 1,
               timeout_s=ROUND_TIMEOUT_S, what="eager-0 cleaned")

    # strict-0 and equal-0 rank above eager-0: the selection that took eager-0 passed them over.
    partitions = daemon.partitions()
    for name in ("strict-0", "equal-0"):
        assert partitions[name]["rounds"] == 0
        assert partitions[name]["dirty_ratio"] == pytest.approx(ratios[name], abs=1e-5)
        assert env.checkpoint(name) == checkpoints[name]
    assert partitions["eager-0"]["rounds"] == 1


def test_min_compaction_lag_ms_keeps_segments_newer_than_the_lag_dirty_until_the_clock_passes(env):
    directory = env.generate("lagged-0", timestamp_step_ms=1000)  # the record at offset o has timestamp T0 + o s
    before = records_of(directory)
    end = log_end_offset(directory)
    env.configure(topics={"lagged": {"min.compaction.lag.ms": HOUR_MS}})
    clock = env.use_clock(T0 + HOUR_MS)  # now - lag = T0: every segment is newer
    daemon = env.start()

    status = wait_until(lambda: (p := daemon.partition("lagged-0"))["total_bytes"] > 0 and p,
                        timeout_s=ROUND_TIMEOUT_S, what="lagged-0 estimated")
    assert status["cleanable_bytes"] == 0 and status["first_uncleanable"] == status["first_dirty"] == 0
    assert status["rounds"] == 0

    cutoff = T0 + 450_000  # now - lag: segments whose largest timestamp is above it stay dirty
    bound = next(base for base, largest in segment_max_timestamps(directory) if largest > cutoff)
    assert 0 < bound < end
    clock.set(cutoff + HOUR_MS)
    wait_until(lambda: env.checkpoint("lagged-0") == bound, timeout_s=ROUND_TIMEOUT_S,
               what=f"lagged-0 cleaned up to {bound}, the first segment inside the lag")
    after = records_of(directory)
    assert [r for r in after if r[0] >= bound] == [r for r in before if r[0] >= bound]
    cleaned_keys = [key for offset, key, _, _ in after if offset < bound]
    assert len(cleaned_keys) == len(set(cleaned_keys))
    assert daemon.partition("lagged-0")["rounds"] == 1

    clock.set(T0 + SMALL["records"] * 1000 + HOUR_MS)  # now every segment is older than the lag
    wait_until(lambda: env.checkpoint("lagged-0") == end, timeout_s=ROUND_TIMEOUT_S, what="lagged-0 cleaned to its end")
    assert_compacted_to(directory, latest_by_key(before))


def test_delete_policy_runs_every_check_interval_on_the_daemon_clock_for_delete_and_compact_delete_topics(env):
    spec = dict(timestamp_step_ms=1000)  # the record at offset o has timestamp T0 + o s
    events = env.generate("events-0", **spec)  # cleanup.policy delete
    both = env.generate("both-0", seed=3, **spec)  # compact,delete
    kept = env.generate("kept-0", seed=5, **spec)  # compact: retention never touches it
    old_bases = segment_bases(events)
    newest = dict(segment_max_timestamps(events))
    events_records, kept_latest = records_of(events), latest_by_key(records_of(kept))
    env.configure(settings={"log.cleanup.interval.mins": 1},  # Kafka's old name of the check interval
                  topics={"events": {"cleanup.policy": "delete", "retention.ms": HOUR_MS},
                          "both": {"cleanup.policy": "compact,delete", "retention.ms": HOUR_MS}})
    clock = env.use_clock(T0 + SMALL["records"] * 1000)  # just after the last record: nothing has expired
    daemon = env.start()

    for name in ("both-0", "kept-0"):
        wait_until(lambda: env.fully_cleaned(name), timeout_s=ROUND_TIMEOUT_S, what=f"{name} compacted")
    assert segment_bases(events) == old_bases and records_of(events) == events_records  # never compacted

    # Segment 2's newest record is exactly retention.ms old: it stays; segments 0 and 1 are older and go.
    clock.set(newest[old_bases[2]] + HOUR_MS)
    wait_until(lambda: segment_bases(events) == old_bases[2:], timeout_s=ROUND_TIMEOUT_S,
               what="events-0's segments 0 and 1 deleted")
    status = daemon.partition("events-0")
    assert (status["cleanup_policy"], status["log_start_offset"], status["retention_segments_deleted"]) == (
        "delete", old_bases[2], 2)
    assert status["rounds"] == 0 and status["last_retention"]["reason"] == "retention.ms"
    with PartitionLog.open(events, mode="reader") as reader:
        assert reader.log_start_offset == old_bases[2]
        with pytest.raises(OffsetOutOfRangeError):
            reader.read(old_bases[0])
    assert records_of(events) == [r for r in events_records if r[0] >= old_bases[2]]

    # One check interval later (the daemon's clock), segment 2 is older than retention.ms by a minute.
    clock.set(newest[old_bases[2]] + HOUR_MS + 60_000)
    wait_until(lambda: segment_bases(events) == old_bases[3:], timeout_s=ROUND_TIMEOUT_S,
               what="events-0's segment 2 deleted at the next check")

    # Much later everything but the active segments has expired: the delete and compact,delete logs keep
    # only their active segment, the compacted-only one keeps every key.
    clock.set(T0 + SMALL["records"] * 1000 + 2 * HOUR_MS)
    wait_until(lambda: segment_bases(events) == old_bases[-1:] and len(segment_bases(both)) == 1,
               timeout_s=ROUND_TIMEOUT_S, what="all expired segments deleted")
    both_start = segment_bases(both)[0]
    assert both_start == log_end_offset(both)
    assert read_offset_checkpoint(env.log_dir / "log-start-offset-checkpoint") == {
        ("events", 0): old_bases[-1], ("both", 0): both_start}
    assert_compacted_to(kept, kept_latest)
    assert daemon.partition("kept-0")["retention_segments_deleted"] == 0
    deleted = sum(daemon.partition(n)["retention_segments_deleted"] for n in ("events-0", "both-0"))
    assert daemon.metric("logcleaner_retention_segments_deleted_total") == deleted >= len(old_bases) - 1
    assert leftovers(env.log_dir) == []


def test_max_compaction_lag_ms_forces_cleaning_of_a_log_below_its_dirty_ratio_once_overdue(env):
    overdue = env.generate("overdue-0")
    overdue_checkpoint = segment_bases(overdue)[7]
    env.set_checkpoint("overdue-0", overdue_checkpoint)  # dirty ratio 0.3
    control = env.generate("control-0", seed=7)
    env.set_checkpoint("control-0", segment_bases(control)[8])  # dirty ratio 0.2
    latest = latest_by_key(records_of(overdue))
    env.configure(topics={
        "overdue": {"min.cleanable.dirty.ratio": 0.9, "max.compaction.lag.ms": HOUR_MS},
        "control": {"min.cleanable.dirty.ratio": 0.1},
    })
    clock = env.use_clock(T0 + HOUR_MS // 2)  # the dirty records are 30 minutes old: not yet overdue
    daemon = env.start()

    wait_until(lambda: env.fully_cleaned("control-0"), timeout_s=ROUND_TIMEOUT_S, what="control-0 cleaned")
    status = daemon.partition("overdue-0")  # it outranks control-0 (ratio 0.3 > 0.2) had it been eligible
    assert status["rounds"] == 0 and env.checkpoint("overdue-0") == overdue_checkpoint
    assert status["compaction_delay_ms"] == 0

    clock.set(T0 + 2 * HOUR_MS)
    wait_until(lambda: env.fully_cleaned("overdue-0"), timeout_s=ROUND_TIMEOUT_S, what="overdue-0 cleaned")
    assert re.search(rf"cleaning dir={re.escape(str(overdue))} reason=max\.compaction\.lag\.ms", daemon.log_text())
    records = records_of(overdue)
    dirty_keys = [key for offset, key, _, _ in records if offset >= overdue_checkpoint]
    assert len(dirty_keys) == len(set(dirty_keys))
    assert latest_by_key(records) == latest


def test_idle_active_segment_with_duplicates_is_rolled_and_cleaned_once_max_lag_passes(env):
    pairs = [(b"k%02d" % (i % 10), b"value-%04d" % i) for i in range(300)]
    idle = env.partition_dir("idle-0")
    witness = env.partition_dir("idle-1")
    for directory in (idle, witness):
        end = append_keyed(directory, pairs, timestamp_ms=T0, segment_bytes=1024 * 1024, roll=False)
    assert segment_bases(idle) == [0]  # every record sits in the active segment
    # The witness's active segment was last written three hours ago; idle-0's just now.
    active = witness / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    three_hours_ago = time.time() - 3 * 3600
    os.utime(active, (three_hours_ago, three_hours_ago))
    expected = latest_by_key(records_of(idle))
    env.configure(topics={"idle": {"max.compaction.lag.ms": HOUR_MS}})
    clock = env.use_clock(int(time.time() * 1000))
    daemon = env.start()

    # The witness is rolled and cleaned; idle-0 was looked at in the same maintenance pass and left alone.
    wait_until(lambda: env.checkpoint("idle-1") == end, timeout_s=ROUND_TIMEOUT_S, what="idle-1 rolled and cleaned")
    assert segment_bases(idle) == [0]
    assert env.checkpoint("idle-0") is None

    clock.set(int(time.time() * 1000) + 2 * HOUR_MS)
    wait_until(lambda: env.checkpoint("idle-0") == end, timeout_s=ROUND_TIMEOUT_S, what="idle-0 rolled and cleaned")
    assert segment_bases(idle)[-1] == end  # a new, empty active segment
    assert_compacted_to(idle, expected)
    assert re.search(rf"rolled idle active segment dir={re.escape(str(idle))}", daemon.log_text())


# ---- failures: corruption, locks ------------------------------------------------------------------------


def test_corrupt_partition_becomes_uncleanable_while_others_are_cleaned_and_is_retried_once_restored(env):
    for seed, name in enumerate(["good-0", "good-1", "bad-0"]):
        env.generate(name, seed=seed)
    bad = env.partition_dir("bad-0")
    latest = latest_by_key(records_of(bad))
    segment, original = corrupt_segment(bad, 3)
    corrupted = segment.read_bytes()
    env.configure()
    daemon = env.start()

    wait_until(lambda: env.fully_cleaned("good-0") and env.fully_cleaned("good-1"), timeout_s=ROUND_TIMEOUT_S,
               what="the good partitions cleaned")
    status = wait_until(lambda: (p := daemon.partition("bad-0"))["uncleanable"] and p, timeout_s=ROUND_TIMEOUT_S,
                        what="bad-0 marked uncleanable")
    assert "CorruptRecordError" in status["uncleanable_reason"] and segment.name in status["uncleanable_reason"]
    log_dir = str(env.log_dir)
    assert daemon.metric("logcleaner_uncleanable_partitions", log_dir=log_dir) == 1
    assert daemon.metric("logcleaner_uncleanable_bytes", log_dir=log_dir) > 0
    assert segment.read_bytes() == corrupted  # nothing was swapped in or repaired
    assert leftovers(bad) == [] and env.checkpoint("bad-0") is None
    # a data error is one log line (file and position), not a traceback: tracebacks are for bugs
    assert "Traceback" not in daemon.log_text() and "partition uncleanable dir=" in daemon.log_text()

    segment.write_bytes(original)  # the operator restores the file: its files changed, so it is retried now
    wait_until(lambda: env.fully_cleaned("bad-0"), timeout_s=ROUND_TIMEOUT_S, what="bad-0 cleaned after the fix")
    wait_until(lambda: not daemon.partition("bad-0")["uncleanable"], timeout_s=ROUND_TIMEOUT_S,
               what="bad-0 no longer uncleanable")
    assert daemon.metric("logcleaner_uncleanable_partitions", log_dir=log_dir) == 0
    assert_compacted_to(bad, latest)




@pytest.mark.slow
def test_a_partition_locked_by_another_cleaner_is_given_up_within_seconds(env):
    env.generate("a-0")
    lock = PartitionLock(env.partition_dir("a-0"), CLEANER_LOCK).acquire(timeout_s=0)  # e.g. `logcleaner clean`
    try:
        env.configure()
        daemon = env.start()
        wait_until(lambda: "partition busy; skipped dir=" + str(env.partition_dir("a-0")) in daemon.log_text(),
                   timeout_s=4.0, what="a-0 skipped as busy")
        assert daemon.partition("a-0")["uncleanable"] is False  # busy is not a failure
    finally:
        lock.release()


@pytest.mark.slow
def test_a_partition_locked_by_another_cleaner_does_not_stall_the_others(env):
    env.generate("a-0")
    env.generate("b-0", seed=1)
    lock = PartitionLock(env.partition_dir("a-0"), CLEANER_LOCK).acquire(timeout_s=0)
    try:
        env.configure()
        env.start()
        # a-0 sorts first among equals, so the only thread tries it first.
        wait_until(lambda: env.fully_cleaned("b-0"), timeout_s=4.0, what="b-0 cleaned while a-0 is locked")
    finally:
        lock.release()


# ---- signals and the throttle -------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_mid_round_exits_0_leaving_no_cleaned_file_and_losing_no_record(env, big_log):
    directory = big_log.copy_to(env, "big-0")
    env.configure(settings={"log.cleaner.io.max.bytes.per.second": BIG_BUDGET},
                  topics={"big": {"segment.bytes": 2 * BIG_SEGMENT_BYTES}})  # several groups, swapped one by one
    daemon = env.start()
    wait_until(lambda: any(n.endswith(".cleaned") for n in os.listdir(directory))
               and daemon.partition("big-0")["state"] == "in_progress",
               timeout_s=ROUND_TIMEOUT_S, what="a .cleaned file while big-0 is in progress", interval_s=0.01)

    daemon.send(signal.SIGTERM)
    started = time.monotonic()
    assert daemon.wait_exit() == 0
    assert time.monotonic() - started < 5.0
    assert leftovers(directory) == []
    assert env.checkpoint("big-0") is None  # the round did not finish: no checkpoint
    # The last copy of the template holds every key's latest record (reading all million records is slow).
    tail = records_of(directory, start=big_log.layout.last_copy_start)
    assert all(big_log.layout.original(offset) == (key, value) for offset, key, value, _ in tail)
    assert latest_by_key(tail) == big_log.layout.latest()
    assert log_end_offset(directory) == big_log.end_offset
    assert verify_paths([env.log_dir]).problems == []
    assert "cleaning aborted" in daemon.log_text()


@pytest.mark.slow
def test_throttle_holds_measured_io_to_the_budget_over_every_interval_of_the_round(env, big_log):
    big_log.copy_to(env, "big-0")
    env.configure(settings={"log.cleaner.io.max.bytes.per.second": BIG_BUDGET})
    daemon = env.start()
    samples = []
    deadline = time.monotonic() + 60
    while True:
        m = daemon.metrics()
        now = time.monotonic()
        io = sum(m[("logcleaner_io_bytes_total", frozenset({("direction", d)}))] for d in ("read", "write"))
        samples.append((now, io))
        if m[("logcleaner_rounds_total", frozenset({("result", "ok")}))] >= 1:
            break
        assert now < deadline, "the throttled round did not finish"
        time.sleep(0.01)
    assert daemon.metric("logcleaner_io_budget_bytes_per_second") == BIG_BUDGET
    assert samples[-1][1] >= 3 * BIG_BUDGET, "too little I/O to judge the budget by"

    # Each window is charged before it is read or written, and idle time banks one window of budget
    # (`cleaner.throttle.WINDOW_S`). The counter moves after the I/O, so bytes charged just before an interval
    # can show in it: up to two read windows (the read-ahead thread's and the one being worked on) and one
    # written window, each at most a segment of the big log. Beyond that, no interval sees more than the budget.
    slack = BIG_BUDGET * WINDOW_S + 3 * BIG_SEGMENT_BYTES
    worst = None
    for i, (t1, v1) in enumerate(samples):
        for t2, v2 in samples[i + 1:]:
            if t2 - t1 >= 1.0 and v2 - v1 > BIG_BUDGET * (t2 - t1) + slack:
                worst = (t1, t2, v2 - v1)
    assert worst is None, f"{worst[2] / 1e6:.1f} MB of I/O in {worst[1] - worst[0]:.2f} s against {BIG_BUDGET:.0f} B/s"
    utilization = [v for k, v in daemon.metrics().items() if k[0] == "logcleaner_io_throttle_utilization"]
    assert len(utilization) == 1 and 0 < utilization[0]  # the device's gauge shows the budget in use


@pytest.mark.slow
def test_sigterm_during_a_long_throttle_sleep_exits_within_a_few_seconds(env, big_log):
    big_log.copy_to(env, "big-0")
    env.configure(settings={"log.cleaner.io.max.bytes.per.second": TINY_BUDGET})
    daemon = env.start()
    wait_sleeping_in_throttle(daemon, "big-0")
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit(timeout_s=3.0) == 0


def test_second_sigterm_exits_at_once_and_the_next_open_recovers(env):
    directory = env.generate("p-0")
    latest = latest_by_key(records_of(directory))
    size_before = sum(size for _, size in log_segment_sizes(directory))
    # Another process (a writer flushing, a one-shot clean) holds the log dir's checkpoint lock: the round
    # swaps its cleaned segment in, then waits to write its checkpoint, so a SIGTERM cannot stop it quickly.
    lock = PartitionLock(env.log_dir, CHECKPOINT_LOCK).acquire(timeout_s=0)
    try:
        env.configure()
        daemon = env.start()
        wait_until(lambda: sum(size for _, size in log_segment_sizes(directory)) < size_before
                   and daemon.partition("p-0")["state"] == "in_progress",
                   timeout_s=ROUND_TIMEOUT_S, what="p-0 swapped and waiting for the checkpoint lock")

        daemon.send(signal.SIGTERM)
        wait_until(lambda: "logcleaner stopping" in daemon.log_text(), timeout_s=5.0, what="the first SIGTERM handled")
        assert daemon.running()
        daemon.send(signal.SIGTERM)
        started = time.monotonic()
        assert daemon.wait_exit(timeout_s=5.0) == 1
        assert time.monotonic() - started < 2.0
        assert "second signal, exiting at once" in daemon.log_text()
    finally:
        lock.release()

    with PartitionLog.open(directory, mode="cleaner"):  # recovery of whatever the exit left
        pass
    assert leftovers(directory) == []
    assert env.checkpoint("p-0") is None  # the round never got to write it
    assert_compacted_to(directory, latest)
    assert verify_paths([env.log_dir]).problems == []


# ---- metrics, status, admin --------------------------------------------------------------------------------


def documented_metrics() -> list[tuple[str, list[str]]]:
    """(name, label names) of every metric in the table of `cleaner/metrics.py`'s docstring."""
    out = []
    for line in metrics_module.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.strip().startswith("| logcleaner_"):
            continue
        for item in cells[0].split(", "):
            m = re.fullmatch(r"(logcleaner_\w+)(?:\{([\w,]+)\})?", item.strip())
            assert m, f"cannot parse metric {item!r} in the docstring"
            out.append((m.group(1), m.group(2).split(",") if m.group(2) else []))
    return out


def test_metrics_endpoint_exposes_every_metric_named_in_the_metrics_docstring(env):
    env.generate("m-0")
    env.configure()
    daemon = env.start()
    wait_until(lambda: env.fully_cleaned("m-0"), timeout_s=ROUND_TIMEOUT_S, what="m-0 cleaned")
    wait_until(lambda: daemon.metric("logcleaner_rounds_total", result="ok") == 1, timeout_s=ROUND_TIMEOUT_S,
               what="the round counted")
    m0 = {"topic": "m", "partition": "0", "log_dir": str(env.log_dir)}
    wait_until(lambda: daemon.metric("logcleaner_partition_dirty_ratio", **m0) == 0, timeout_s=ROUND_TIMEOUT_S,
               what="m-0's dirty ratio estimated again after its round")
    documented = documented_metrics()
    assert len(documented) >= 20
    samples = daemon.metrics()
    missing = []
    for name, labels in documented:
        found = [dict(lbl) for (sample, lbl) in samples if sample in (name, name + "_count")]
        if not found or not all(set(labels) <= set(f) for f in found):
            missing.append((name, labels, found[:2]))
    assert missing == []
    assert daemon.metric("logcleaner_threads_alive") == 1
    assert daemon.metric("logcleaner_dead_thread_count") == 0
    assert daemon.metric("logcleaner_records_removed_total") > 0
    assert daemon.metric("logcleaner_io_bytes_total", direction="read") > 0
    assert daemon.metric("logcleaner_uncleanable_partitions", log_dir=str(env.log_dir)) == 0
    assert daemon.metric("logcleaner_partition_cleanable_bytes", **m0) == 0


def test_status_and_admin_commands_drive_the_running_daemon(env):
    env.generate("ops-0")
    env.generate("ops-1", seed=1)
    env.configure(topics={"ops": {"min.cleanable.dirty.ratio": 1.0}})  # never eligible by ratio alone
    daemon = env.start()
    url = ["--url", daemon.url]
    token = ["--token-file", str(env.token_path)]  # admin operations change state: they need the admin token
    wait_until(lambda: all(p["total_bytes"] > 0 for p in daemon.partitions().values()), timeout_s=ROUND_TIMEOUT_S,
               what="both partitions estimated")

    def cli(*args: str):  # the commands are HTTP clients: run them in-process (a subprocess costs 0.6 s each)
        return CliRunner().invoke(cli_main, list(args))

    text = run_cli("status", *url)  # once through the real entry point
    assert text.returncode == 0, text.stderr
    for name in ("ops-0", "ops-1"):  # (the first retention pass may hold one in progress for a moment)
        assert re.search(rf"^{name}\s+(idle|in_progress)\s+compact\s+1\.000\s", text.stdout, re.M), text.stdout
    as_json = cli("status", "--json", *url)
    assert as_json.exit_code == 0
    assert {p["partition"] for p in json.loads(as_json.stdout)["partitions"]} == {"ops-0", "ops-1"}

    outputs = [cli("admin", op, "ops-0", *url, *token) for op in ("pause", "pause", "resume", "resume")]
    assert [o.exit_code for o in outputs] == [0, 0, 0, 0], [o.output for o in outputs]
    assert [o.stdout.strip() for o in outputs] == [
        "ops-0: pause -> paused (pauses 1)", "ops-0: pause -> paused (pauses 2)",
        "ops-0: resume -> paused (pauses 1)", "ops-0: resume -> idle (pauses 0)",
    ]
    extra = cli("admin", "resume", "ops-0", *url, *token)
    assert extra.exit_code == 1 and "409" in extra.stderr and "cannot resume" in extra.stderr

    trigger = cli("admin", "trigger", "ops-1", *url, *token)
    assert trigger.exit_code == 0, trigger.output
    wait_until(lambda: env.fully_cleaned("ops-1") and daemon.partition("ops-1")["rounds"] >= 1,
               timeout_s=ROUND_TIMEOUT_S, what="triggered ops-1 cleaned")
    assert daemon.partition("ops-0")["rounds"] == 0  # same ratio, not triggered: still not eligible
    after = cli("status", *url)
    assert re.search(r"^ops-1\s+idle\s.*\s1\s+\d+ -> \d+ records", after.stdout, re.M), after.stdout

    unknown = cli("admin", "pause", "nope-0", *url, *token)
    assert unknown.exit_code == 1 and "404" in unknown.stderr and "no such partition" in unknown.stderr
    unreachable = cli("status", "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.exit_code == 1 and "cannot reach the daemon" in unreachable.stderr


def test_paused_partition_is_not_cleaned_even_when_dirty_until_resumed(env):
    held, other = env.generate("held-0"), env.generate("other-0", seed=1)
    for name, directory in (("held-0", held), ("other-0", other)):
        env.set_checkpoint(name, log_end_offset(directory))  # all clean: ratio 0
    env.configure(settings={"min.cleanable.dirty.ratio": 0.1})
    daemon = env.start()
    assert daemon.operate("held-0", "pause") == (200, {"partition": "held-0", "operation": "pause",
                                                       "state": "paused", "pauses": 1})
    # Now both get dirty; held-0 more so, so it would be taken first if it could be.
    append_keyed(held, [(b"h%03d" % i, b"x" * 100) for i in range(800)], timestamp_ms=T0)
    append_keyed(other, [(b"o%03d" % i, b"x" * 100) for i in range(200)], timestamp_ms=T0)
    wait_until(lambda: env.fully_cleaned("other-0"), timeout_s=ROUND_TIMEOUT_S, what="other-0 cleaned")
    status = daemon.partition("held-0")
    assert status["state"] == "paused" and status["rounds"] == 0 and not env.fully_cleaned("held-0")

    assert daemon.operate("held-0", "resume")[1]["state"] in ("idle", "in_progress")
    wait_until(lambda: env.fully_cleaned("held-0"), timeout_s=ROUND_TIMEOUT_S, what="held-0 cleaned after resume")


def test_trigger_cleans_a_partition_below_its_dirty_ratio(env):
    directory = env.generate("lazy-0")
    checkpoint = segment_bases(directory)[7]
    env.set_checkpoint("lazy-0", checkpoint)  # dirty ratio 0.3
    env.configure(topics={"lazy": {"min.cleanable.dirty.ratio": 0.9}})
    daemon = env.start()
    status = wait_until(lambda: (p := daemon.partition("lazy-0"))["total_bytes"] > 0 and p, timeout_s=ROUND_TIMEOUT_S,
                        what="lazy-0 estimated")
    assert status["dirty_ratio"] == pytest.approx(dirty_ratio_from(directory, checkpoint), abs=1e-5)
    assert status["rounds"] == 0
    code, body = daemon.operate("lazy-0", "trigger")
    assert code == 200 and body["state"] in ("idle", "in_progress")  # a thread may have taken it already
    wait_until(lambda: env.fully_cleaned("lazy-0"), timeout_s=ROUND_TIMEOUT_S, what="triggered lazy-0 cleaned")


# ---- configuration: start and reload -------------------------------------------------------------------------


@pytest.mark.parametrize("settings, topics, server, expected", [
    ({"log.cleaner.threads": 0}, None, None, ["'log.cleaner.threads'", "= 0", "[1, 64]"]),
    ({"log.cleaner.io.max.bytes.per.second": 0.5}, None, None,
     ["'log.cleaner.io.max.bytes.per.second'", "= 0.5", "[1.0, unbounded]"]),
    (None, {"orders": {"min.cleanable.dirty.ratio": 1.5}}, None, ["'min.cleanable.dirty.ratio'", "= 1.5", "[0.0, 1.0]"]),
    (None, {"orders": {"max.compaction.lag.ms": 0}}, None, ["'max.compaction.lag.ms'", "= 0", "[1, Long.MAX_VALUE]"]),
    (None, None, {"discovery_interval_ms": 0}, ["discovery_interval_ms", "= 0", "≥ 1"]),
], ids=["threads", "io-budget", "topic-ratio", "topic-max-lag", "server-discovery"])
def test_invalid_config_at_start_exits_2_naming_the_key_the_value_and_the_range(env, settings, topics, server, expected):
    env.configure(settings=settings, topics=topics, server=server)
    done = run_cli("run", "-c", str(env.config_path), timeout_s=30)
    assert done.returncode == 2, done.stderr
    message = done.stderr
    assert str(env.config_path) in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_sighup_reload_changes_the_throttle_budget_and_keeps_partition_state(env):
    env.generate("kept-0")
    env.generate("held-0", seed=1)
    env.generate("bad-0", seed=2)
    corrupt_segment(env.partition_dir("bad-0"), 2)
    topics = {"held": {"min.cleanable.dirty.ratio": 1.0}}  # never eligible: it is paused before anything happens
    env.configure(settings={"log.cleaner.io.max.bytes.per.second": 50_000_000.0}, topics=topics)
    daemon = env.start()
    for _ in range(2):
        assert daemon.operate("held-0", "pause")[0] == 200
    wait_until(lambda: env.fully_cleaned("kept-0") and daemon.partition("bad-0")["uncleanable"],
               timeout_s=ROUND_TIMEOUT_S, what="kept-0 cleaned and bad-0 uncleanable")
    kept_checkpoint = env.checkpoint("kept-0")
    rounds_before = daemon.metric("logcleaner_rounds_total", result="ok")
    io_before = daemon.io_bytes_total()

    env.configure(settings={"log.cleaner.io.max.bytes.per.second": 1_234_567.0}, topics=topics)
    daemon.send(signal.SIGHUP)
    wait_until(lambda: daemon.status()["daemon"]["io_budget_bytes_per_second"] == 1_234_567.0,
               timeout_s=ROUND_TIMEOUT_S, what="the new budget in /status")
    assert daemon.metric("logcleaner_io_budget_bytes_per_second") == 1_234_567.0
    partitions = daemon.partitions()
    assert (partitions["held-0"]["state"], partitions["held-0"]["pauses"]) == ("paused", 2)
    assert partitions["kept-0"]["rounds"] == 1 and env.checkpoint("kept-0") == kept_checkpoint
    assert partitions["bad-0"]["uncleanable"]
    assert daemon.metric("logcleaner_uncleanable_partitions", log_dir=str(env.log_dir)) == 1
    assert daemon.metric("logcleaner_rounds_total", result="ok") == rounds_before  # metrics survive a reload
    assert daemon.io_bytes_total() >= io_before
    assert "config reloaded" in daemon.log_text()


def test_invalid_config_on_reload_is_rejected_and_the_daemon_keeps_running(env):
    env.generate("r-0")
    env.configure(settings={"log.cleaner.io.max.bytes.per.second": 5_000_000.0})
    daemon = env.start()
    env.configure(settings={"log.cleaner.io.max.bytes.per.second": 5_000_000.0, "log.cleaner.threads": 65})
    daemon.send(signal.SIGHUP)
    line = wait_until(lambda: next((ln for ln in daemon.log_text().splitlines() if "config reload rejected" in ln), None),
                      timeout_s=ROUND_TIMEOUT_S, what="the rejected reload logged")
    assert "'log.cleaner.threads'" in line and "= 65" in line and "[1, 64]" in line
    assert daemon.running()
    assert daemon.request("GET", "/healthz")[0] == 200
    assert daemon.status()["daemon"]["io_budget_bytes_per_second"] == 5_000_000.0
    assert daemon.status()["daemon"]["threads"] == 1

    env.configure(settings={"log.cleaner.io.max.bytes.per.second": 7_000_000.0})  # a valid file is taken again
    daemon.send(signal.SIGHUP)
    wait_until(lambda: daemon.status()["daemon"]["io_budget_bytes_per_second"] == 7_000_000.0,
               timeout_s=ROUND_TIMEOUT_S, what="the next valid reload applied")
    wait_until(lambda: env.fully_cleaned("r-0"), timeout_s=ROUND_TIMEOUT_S, what="r-0 cleaned")


def test_reload_to_fewer_threads_is_not_counted_as_dead_threads(env):
    env.generate("r-0")
    env.configure(settings={"log.cleaner.threads": 2})
    daemon = env.start()
    assert daemon.metric("logcleaner_threads_alive") == 2
    env.configure(settings={"log.cleaner.threads": 1})
    daemon.send(signal.SIGHUP)
    wait_until(lambda: daemon.metric("logcleaner_threads_alive") == 1 and daemon.status()["daemon"]["threads"] == 1,
               timeout_s=ROUND_TIMEOUT_S, what="one thread left")
    time.sleep(0.5)  # a few supervision ticks (discovery_interval_ms = 200)
    assert daemon.metric("logcleaner_dead_thread_count") == 0
    assert "cleaner thread died" not in daemon.log_text()


def test_invalid_shutdown_timeout_is_rejected_at_start(env):
    env.configure(server={"shutdown_timeout_s": "soon"})
    daemon = env.start(wait=False)

    def exited_or_serving():
        if not daemon.running():
            return "exited"
        try:
            return daemon.request("GET", "/healthz", timeout_s=1.0)[0] == 200 and "serving"
        except OSError:
            return None

    assert wait_until(exited_or_serving, timeout_s=ROUND_TIMEOUT_S, what="the daemon to exit or serve") == "exited"
    assert daemon.proc.returncode == 2
    assert "shutdown_timeout_s" in daemon.log_text() and "soon" in daemon.log_text()


# ---- worker processes ---------------------------------------------------------------------------------------------


def _worker_of(daemon: DaemonProcess, log_dir: Path) -> tuple[str, int] | None:
    """The partition a worker process of `daemon` holds the cleaner lock of, and that worker's pid (from
    /proc/locks); None while no worker holds one."""
    by_inode = {lock.stat().st_ino: lock.parent.name for lock in log_dir.glob(f"*/{CLEANER_LOCK}")}
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and "->" not in fields:
            name, pid = by_inode.get(int(fields[5].rsplit(":", 1)[1])), int(fields[4])
            if name is not None and pid != daemon.proc.pid:
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except FileNotFoundError:  # it ended since /proc/locks was read
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == daemon.proc.pid:
                    return name, pid
    return None


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="worker processes need two cores to run beside")
def test_a_worker_killed_mid_round_is_recovered_retried_and_its_io_counted(env, big_log):
    """With two threads the second cleans in a worker process. SIGKILL it mid-round (the OOM killer): its
    partition's files are recovered at once, the partition is retried (one death is not the data's fault, so it
    is not marked uncleanable) by a new worker, and every byte the workers moved is in /status and the metrics."""
    for name in ("big-0", "big-1"):
        big_log.copy_to(env, name)
    env.configure(settings={"log.cleaner.threads": 2, "log.cleaner.io.max.bytes.per.second": 2 * BIG_BUDGET})
    daemon = env.start()
    found = []
    wait_until(lambda: found.append(_worker_of(daemon, env.log_dir)) or found[-1] is not None,
               timeout_s=ROUND_TIMEOUT_S, what="a worker process cleaning a partition", interval_s=0.01)
    victim, pid = found[-1]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: f"the worker process {pid} was ended by SIGKILL" in daemon.log_text(),
               timeout_s=ROUND_TIMEOUT_S, what="the worker's death logged")
    wait_until(lambda: env.fully_cleaned("big-0") and env.fully_cleaned("big-1"), timeout_s=120,
               what="both partitions cleaned, the victim by a new worker")
    assert daemon.running()
    assert leftovers(env.partition_dir(victim)) == []
    # the workers' bytes included: the budget counts what is charged, before the I/O, the metric what was done
    # (the killed round's last charge was never done); a worker's round uncounted would be ~34 MB
    charged, done = daemon.status()["daemon"]["io_bytes_total"], daemon.io_bytes_total()
    assert 0 <= charged - done < 8 * 2**20
    assert "Traceback" not in daemon.log_text()
    assert daemon.metric("logcleaner_uncleanable_partitions", log_dir=str(env.log_dir)) == 0
    assert daemon.partition(victim)["state"] != "uncleanable"
