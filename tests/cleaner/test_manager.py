"""The cleaner manager (`cleaner.manager`) on small generated log dirs with a fake clock: discovery,
selection (dirty ratio, lags, trigger), the pause/resume/abort state machine, and uncleanable retries.

Nothing here cleans: a test plays the cleaner thread by calling `grab_filthiest` and then `done_cleaning`,
`aborted` or `failed`, as `cleaner.pool` does.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from cleaner.manager import (
    UNCLEANABLE_RETRY_MS_MAX,
    CleanerManager,
    PartitionState,
    StateError,
)
from cleaner.round import RoundResult, clean_round
from cleaner.settings import Settings
from offsetmap import OffsetMap
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint, update_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog
from segments.tools.generate import WorkloadSpec, generate_partition

from .builders import BIG_MAP_BYTES, ROLL, batch, build_log, clean, records, txn_batch

T0 = 1_700_000_000_000  # generated record timestamps start here
HOUR_MS = 3_600_000
RETRY_MS = 1000


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class Env:
    """A log dir of generated partitions and a manager over it."""

    def __init__(self, tmp_path: Path) -> None:
        self.log_dir = tmp_path / "logs"
        self.log_dir.mkdir()
        self.clock = Clock(T0 + HOUR_MS)

    def partition(self, name: str, *, seed: int = 0, **spec) -> Path:
        """Ten equal inactive segments of 120 records (100 keys), then an empty active segment."""
        directory = self.log_dir / name
        generate_partition(directory, WorkloadSpec(**{"records": 1200, "keys": 100, "segment_bytes": 16 * 1024,
                                                      "seed": seed, **spec}))
        return directory

    def bases(self, directory: Path) -> list[int]:
        return sorted(int(n[:-4]) for n in os.listdir(directory) if n.endswith(".log"))

    def set_checkpoint(self, directory: Path, offset: int) -> None:
        topic, _, partition = directory.name.rpartition("-")
        update_offset_checkpoint(self.log_dir / CLEANER_OFFSET_CHECKPOINT, {(topic, int(partition)): offset})

    def checkpoint(self, directory: Path) -> int | None:
        topic, _, partition = directory.name.rpartition("-")
        return read_offset_checkpoint(self.log_dir / CLEANER_OFFSET_CHECKPOINT).get((topic, int(partition)))

    def manager(self, values: dict | None = None, topics: dict | None = None) -> CleanerManager:
        settings = Settings.from_mappings({"cleanup.policy": "compact", **(values or {})}, topics)
        manager = CleanerManager([self.log_dir], settings, clock_ms=self.clock, uncleanable_retry_ms=RETRY_MS)
        manager.discover()
        return manager


@pytest.fixture
def env(tmp_path) -> Env:
    return Env(tmp_path)


def status_of(manager: CleanerManager, directory: Path):
    return next(s for s in manager.snapshot() if s.directory == directory)


def result(end_offset: int, first_uncleanable: int | None = None, next_delete_horizon_ms: int = -1) -> RoundResult:
    """A round's result as the pool reports it (only the fields the manager reads matter)."""
    values = {f.name: 0 for f in dataclasses.fields(RoundResult)}
    values.update(topic="t", partition=0, end_offset=end_offset, bound="active segment", dry_run=False,
                  map_full=False, map_utilization=0.0, next_delete_horizon_ms=next_delete_horizon_ms,
                  first_uncleanable=end_offset if first_uncleanable is None else first_uncleanable)
    return RoundResult(**values)


def append_to_active(directory: Path, n: int = 5) -> None:
    """What a writer does: append to the active segment (no roll)."""
    with PartitionLog.open(directory, mode="writer", config=LogConfig(segment_bytes=16 * 1024)) as log:
        records = [Record(i, T0 + i, b"key-%08d" % i, b"new") for i in range(n)]
        log.append_batches(encode_batch(records, base_offset=0))


# ---- discovery -------------------------------------------------------------------------------------------


def test_discovery_finds_partition_dirs_and_ignores_everything_else(env):
    env.partition("t-0")
    env.partition("t-1")
    (env.log_dir / "t-2").write_text("a file, not a directory")
    (env.log_dir / "notapartition").mkdir()
    (env.log_dir / "t-0.abc-delete").mkdir()
    (env.log_dir / "__cluster_metadata-0").mkdir()
    manager = env.manager()
    assert sorted(s.directory.name for s in manager.snapshot()) == ["t-0", "t-1"]
    assert {(s.topic, s.partition) for s in manager.snapshot()} == {("t", 0), ("t", 1)}


def test_discovery_drops_removed_partitions_except_one_being_cleaned(env):
    a, b = env.partition("a-0"), env.partition("b-0", seed=1)
    manager = env.manager()
    candidate = manager.grab_filthiest()
    assert candidate.directory == a
    for directory in (a, b):
        os.rename(directory, directory.with_name(directory.name + ".gone"))
    manager.discover()
    assert [s.directory for s in manager.snapshot()] == [a]  # in progress: kept until its round ends


# ---- selection ------------------------------------------------------------------------------------------------


def test_the_filthiest_eligible_log_is_taken_and_marked_in_progress(env):
    low, high = env.partition("low-0"), env.partition("high-0", seed=1)
    env.set_checkpoint(low, env.bases(low)[4])  # ratio 0.6
    env.set_checkpoint(high, env.bases(high)[2])  # ratio 0.8
    manager = env.manager()
    first = manager.grab_filthiest()
    assert (first.directory, first.reason, first.force_recopy) == (high, "dirty ratio", False)
    assert first.dirty_ratio == pytest.approx(0.8)
    assert manager.max_dirty_percent == pytest.approx(80.0)
    assert status_of(manager, high).state == PartitionState.IN_PROGRESS
    second = manager.grab_filthiest()
    assert second.directory == low  # high is in progress: never handed out twice
    assert manager.max_dirty_percent == pytest.approx(60.0)  # the last selection saw only low
    assert manager.grab_filthiest() is None


def test_a_log_exactly_at_min_cleanable_dirty_ratio_is_not_eligible(env):
    directory = env.partition("t-0")
    env.set_checkpoint(directory, env.bases(directory)[5])
    manager = env.manager({"min.cleanable.dirty.ratio": 0.5})
    assert manager.grab_filthiest() is None
    status = status_of(manager, directory)
    assert status.dirty_ratio == 0.5 and status.cleanable_bytes > 0
    manager.reconfigure(Settings.from_mappings({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.49}),
                        [env.log_dir])
    assert manager.grab_filthiest().directory == directory


def test_logs_of_topics_that_are_not_compacted_are_never_selected(env):
    env.partition("plain-0")
    manager = env.manager(topics={"plain": {"cleanup.policy": "delete"}})
    assert manager.grab_filthiest() is None


def test_dirty_ratio_counts_the_segments_between_checkpoint_and_active_segment(env):
    directory = env.partition("t-0")
    bases = env.bases(directory)
    env.set_checkpoint(directory, bases[3])
    manager = env.manager({"min.cleanable.dirty.ratio": 0.99})
    manager.grab_filthiest()
    status = status_of(manager, directory)
    sizes = [(directory / fmt.offset_file_name(b, fmt.LOG_SUFFIX)).stat().st_size for b in bases]
    assert (status.first_dirty, status.first_uncleanable) == (bases[3], bases[-1])
    assert status.cleanable_bytes == sum(sizes[3:-1])
    assert status.total_bytes == sum(sizes)
    assert status.dirty_ratio == pytest.approx(0.7)


def test_min_compaction_lag_ms_ends_the_cleanable_range_at_the_first_segment_inside_the_lag(env):
    directory = env.partition("t-0", timestamp_step_ms=1000)  # record at offset o has timestamp T0 + o s
    bases = env.bases(directory)
    largest = {base: T0 + (end - 1) * 1000 for base, end in zip(bases, bases[1:])}
    manager = env.manager(topics={"t": {"min.compaction.lag.ms": HOUR_MS}})
    cutoff = (largest[bases[3]] + largest[bases[4]]) // 2  # segments 0..3 are older than now - lag, 4 is not
    env.clock.now_ms = cutoff + HOUR_MS
    candidate = manager.grab_filthiest()
    assert candidate.directory == directory
    assert status_of(manager, directory).first_uncleanable == bases[4]
    manager.aborted(directory)
    env.clock.now_ms = T0 + HOUR_MS  # nothing is older than the lag
    assert manager.grab_filthiest() is None
    status = status_of(manager, directory)
    assert status.cleanable_bytes == 0 and status.first_uncleanable == status.first_dirty == 0


def test_max_compaction_lag_ms_makes_an_overdue_log_eligible_below_its_ratio_and_ranks_it_first(env):
    overdue, dirtier = env.partition("overdue-0"), env.partition("dirty-0", seed=1)
    env.set_checkpoint(overdue, env.bases(overdue)[8])  # ratio 0.2
    manager = env.manager(topics={"overdue": {"max.compaction.lag.ms": HOUR_MS}})
    first_dirty_ts = T0 + env.bases(overdue)[8] + 19  # max timestamp of the first dirty batch
    env.clock.now_ms = first_dirty_ts + HOUR_MS - 1
    assert manager.grab_filthiest().directory == dirtier  # not yet overdue: ratio 0.2 is below 0.5
    env.clock.now_ms = first_dirty_ts + HOUR_MS + 5000
    candidate = manager.grab_filthiest()
    assert (candidate.directory, candidate.reason) == (overdue, "max.compaction.lag.ms")
    assert candidate.compaction_delay_ms == 5000
    assert manager.max_compaction_delay_ms == 5000


def test_invalid_checkpoint_is_reset_to_the_log_start_even_if_the_log_is_not_selected(env):
    directory = env.partition("t-0")
    env.set_checkpoint(directory, 999_999)  # beyond the log end
    manager = env.manager({"min.cleanable.dirty.ratio": 1.0})  # nothing is ever eligible by ratio
    assert manager.grab_filthiest() is None
    assert env.checkpoint(directory) == 0
    assert status_of(manager, directory).first_dirty == 0


def run_round(manager: CleanerManager, candidate) -> RoundResult:
    """What a cleaner thread does with a candidate (`cleaner.pool`): one round, then report it."""
    topic = manager.topic_settings(candidate.topic, candidate.log_dir)
    with PartitionLog.open(candidate.directory, mode="cleaner", config=topic.log_config()) as plog:
        done = clean_round(plog, topic, OffsetMap(BIG_MAP_BYTES), now_ms=manager.clock_ms(), seed=7,
                           force_recopy=candidate.force_recopy)
    manager.done_cleaning(candidate.directory, done, done.next_delete_horizon_ms)
    return done


def test_a_log_held_back_by_an_open_transaction_is_not_selected_for_rounds_that_clean_nothing(env):
    """Issue 18: a transaction that never ends bounds what a round may clean (Kafka's first unstable offset).
    Selection must see the same bound: once the round cleaned up to the transaction, the log is no longer
    eligible, instead of being selected on every pass for a round that finds nothing to clean."""
    directory = env.log_dir / "t-0"
    steps: list = []
    for s in range(10):
        if s == 3:
            steps.append(txn_batch([(b"open", b"never committed")], pid=7))  # no marker ever follows
        steps += [batch([(b"k%d" % (i % 5), b"v%d-%d" % (s, i)) for i in range(20)]), ROLL]
    firsts = build_log(directory, steps)
    open_at = firsts[4]  # the transactional batch (step 4: three plain batches, then it)
    bases = env.bases(directory)
    held_back = max(b for b in bases if b <= open_at)  # the segment holding it stays uncleanable
    manager = env.manager()
    rounds = []
    for _ in range(5):  # the pool's passes, each one selection and, if a log was chosen, its round
        candidate = manager.grab_filthiest()
        if candidate is None:
            break
        status = status_of(manager, directory)
        done = run_round(manager, candidate)
        rounds.append((candidate.reason, (status.first_dirty, status.first_uncleanable),
                       (done.first_dirty, done.first_uncleanable, done.bound)))
    assert rounds == [("dirty ratio", (0, held_back), (0, held_back, "open transaction"))]
    status = status_of(manager, directory)
    assert (status.first_dirty, status.first_uncleanable, status.cleanable_bytes) == (held_back, held_back, 0)
    assert status.dirty_ratio == 0.0


# ---- pause / resume / abort / trigger -----------------------------------------------------------------------------


def test_pauses_are_counted_and_each_needs_its_resume(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.abort_and_pause(directory)
    manager.abort_and_pause(directory)
    assert (status_of(manager, directory).state, status_of(manager, directory).pauses) == (PartitionState.PAUSED, 2)
    assert manager.grab_filthiest() is None  # a paused partition is not selected, however dirty
    manager.resume(directory)
    assert (status_of(manager, directory).state, status_of(manager, directory).pauses) == (PartitionState.PAUSED, 1)
    assert manager.grab_filthiest() is None
    manager.resume(directory)
    assert status_of(manager, directory).state == PartitionState.IDLE
    with pytest.raises(StateError, match="cannot resume a partition that is idle"):
        manager.resume(directory)
    assert manager.grab_filthiest().directory == directory


def test_abort_and_pause_of_a_running_round_blocks_until_the_thread_stops_then_leaves_it_paused(env):
    directory = env.partition("t-0")
    manager = env.manager()
    assert manager.grab_filthiest().directory == directory
    returned = threading.Event()
    errors = []

    def pause() -> None:
        try:
            manager.abort_and_pause(directory, timeout_s=10)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)
        returned.set()

    pauser = threading.Thread(target=pause)
    pauser.start()
    deadline = time.monotonic() + 5
    while not manager.is_aborted(directory):  # the cleaner thread sees this at its next window
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert not returned.wait(0.05), "abort_and_pause returned while the round was still running"
    assert status_of(manager, directory).state == PartitionState.ABORTED
    with pytest.raises(StateError, match="already being aborted"):
        manager.abort_and_pause(directory, timeout_s=0)
    manager.aborted(directory)  # the cleaner thread stops
    assert returned.wait(5)
    pauser.join()
    assert errors == []
    status = status_of(manager, directory)
    assert (status.state, status.pauses) == (PartitionState.PAUSED, 1)


def test_a_round_that_finishes_after_an_abort_leaves_the_partition_paused(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.grab_filthiest()
    stopper = threading.Thread(target=manager.abort_and_pause, args=(directory,), kwargs={"timeout_s": 10})
    stopper.start()
    while not manager.is_aborted(directory):
        time.sleep(0.001)
    manager.done_cleaning(directory, result(1200))
    stopper.join(5)
    assert not stopper.is_alive()
    status = status_of(manager, directory)
    assert (status.state, status.pauses, status.rounds) == (PartitionState.PAUSED, 1, 1)


def test_abort_and_pause_gives_up_with_a_state_error_when_the_round_does_not_stop(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.grab_filthiest()
    with pytest.raises(StateError, match="did not stop in time"):
        manager.abort_and_pause(directory, timeout_s=0.05)
    manager.aborted(directory)  # when it does stop, it is paused
    assert status_of(manager, directory).state == PartitionState.PAUSED


def test_abort_all_marks_every_running_round_aborted(env):
    a, b = env.partition("a-0"), env.partition("b-0", seed=1)
    manager = env.manager()
    manager.grab_filthiest()
    manager.grab_filthiest()
    manager.abort_all()
    assert manager.is_aborted(a) and manager.is_aborted(b)


def test_operations_on_an_unknown_partition_are_state_errors(env):
    env.partition("t-0")
    manager = env.manager()
    with pytest.raises(StateError, match="no such partition"):
        manager.find("nope-0")
    with pytest.raises(StateError, match="no such partition"):
        manager.trigger(env.log_dir / "nope-0")
    assert manager.find("t-0") == env.log_dir / "t-0"


def test_trigger_selects_a_log_below_its_dirty_ratio_once(env):
    lazy = env.partition("lazy-0")
    env.set_checkpoint(lazy, env.bases(lazy)[7])  # ratio 0.3
    manager = env.manager()
    assert manager.grab_filthiest() is None
    manager.trigger(lazy)
    candidate = manager.grab_filthiest()
    assert (candidate.directory, candidate.reason, candidate.force_recopy) == (lazy, "triggered", True)
    manager.done_cleaning(lazy, result(1200))
    assert manager.grab_filthiest() is None  # the trigger was used up


def test_triggered_and_overdue_logs_rank_before_dirtier_ones(env):
    dirty, lazy = env.partition("dirty-0"), env.partition("lazy-0", seed=1)
    env.set_checkpoint(lazy, env.bases(lazy)[7])
    manager = env.manager()
    manager.trigger(lazy)
    assert manager.grab_filthiest().directory == lazy
    assert manager.grab_filthiest().directory == dirty


def test_a_round_that_stopped_short_is_continued_at_once(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.grab_filthiest()
    env.set_checkpoint(directory, 600)
    manager.done_cleaning(directory, result(600, first_uncleanable=1200))  # the offset map filled
    env.set_checkpoint(directory, env.bases(directory)[-2])  # now only a sliver is dirty (ratio 0.1)
    candidate = manager.grab_filthiest()
    assert (candidate.directory, candidate.reason) == (directory, "triggered")


def test_a_log_whose_delete_horizon_has_passed_is_selected_for_a_recopy(env):
    directory = env.partition("t-0")
    env.set_checkpoint(directory, env.bases(directory)[-1])  # all clean
    manager = env.manager()
    assert manager.grab_filthiest() is None
    status = manager.partitions[directory]
    status.state = PartitionState.IN_PROGRESS
    manager.done_cleaning(directory, result(1200), next_delete_horizon_ms=env.clock.now_ms + 1000)
    assert manager.grab_filthiest() is None
    env.clock.now_ms += 1000
    candidate = manager.grab_filthiest()
    assert (candidate.reason, candidate.force_recopy) == ("delete horizon", True)


def _stamped_log(env: Env, now_ms: int, *, retention_ms: int = 1000) -> Path:
    """t-0 with a tombstone for a, cleaned once at `now_ms` (as `clean` or `demo` would): the tombstone's batch
    carries the delete horizon now_ms + retention_ms and nothing is dirty."""
    directory = env.log_dir / "t-0"
    build_log(directory, [batch([(b"a", b"1"), (b"b", b"1")]), ROLL, batch([(b"a", None), (b"b", b"2")])])
    stamped = clean(directory, now_ms=now_ms, settings={"delete.retention.ms": retention_ms})
    assert stamped.next_delete_horizon_ms == now_ms + retention_ms
    return directory


def test_a_delete_horizon_its_files_keep_is_shown_at_the_first_pass_and_selects_the_log_once_passed(env):
    # Stamped before this manager existed (a `clean`, `demo`, or the daemon before a restart): no round of its own.
    directory = _stamped_log(env, env.clock.now_ms)
    horizon = env.clock.now_ms + 1000
    manager = env.manager()
    assert manager.grab_filthiest() is None  # nothing dirty, the horizon not passed
    assert status_of(manager, directory).next_delete_horizon_ms == horizon
    env.clock.now_ms = horizon
    candidate = manager.grab_filthiest()
    assert (candidate.directory, candidate.reason, candidate.force_recopy) == (directory, "delete horizon", True)
    passed = clean(directory, now_ms=horizon, settings={"delete.retention.ms": 1000}, force_recopy=True)
    assert [k for _, k, v in records(directory) if v is None] == []  # the tombstone went
    manager.done_cleaning(directory, passed, passed.next_delete_horizon_ms)
    for later in (horizon, horizon + 30 * 86_400_000):
        env.clock.now_ms = later
        assert manager.grab_filthiest() is None
        assert status_of(manager, directory).next_delete_horizon_ms == -1


def test_a_passed_horizon_its_last_round_kept_does_not_select_the_log_again(env):
    # A COMMIT marker stamped elsewhere while its transaction keeps data: no pass removes it, and it keeps its horizon.
    directory = env.log_dir / "t-0"
    marker = encode_batch([Record(0, T0, fmt.CONTROL_KEY.pack(0, fmt.CONTROL_TYPE_COMMIT),
                                  fmt.END_TXN_MARKER_VALUE.pack(0, 0))],
                          base_offset=0, is_control=True, producer_id=2, producer_epoch=0,
                          delete_horizon_ms=T0 + 1000)
    build_log(directory, [txn_batch([(b"a", b"1")], pid=2), marker])
    env.set_checkpoint(directory, env.bases(directory)[-1])  # all clean
    env.clock.now_ms = T0 + 2 * 86_400_000
    manager = env.manager()
    candidate = manager.grab_filthiest()
    assert candidate.reason == "delete horizon"  # it cannot tell before a pass
    kept = clean(directory, now_ms=env.clock.now_ms, force_recopy=True)
    assert kept.groups_unchanged == kept.groups and kept.next_delete_horizon_ms == -1
    manager.done_cleaning(directory, kept, kept.next_delete_horizon_ms)
    for later in (0, 1, 86_400_000):
        env.clock.now_ms += later
        assert manager.grab_filthiest() is None  # not again and again
        assert status_of(manager, directory).next_delete_horizon_ms == -1
    assert env.manager().grab_filthiest().reason == "delete horizon"  # a new daemon: one pass, then the same


# ---- uncleanable partitions ---------------------------------------------------------------------------------------


def test_a_failed_round_makes_the_partition_uncleanable_with_a_backoff_that_doubles(env):
    directory = env.partition("t-0")
    manager = env.manager()
    for attempt in range(3):
        start = env.clock.now_ms
        assert manager.grab_filthiest().directory == directory
        manager.failed(directory, ValueError(f"broken {attempt}"))
        status = status_of(manager, directory)
        assert status.state == PartitionState.IDLE
        assert status.uncleanable_reason == f"ValueError: broken {attempt}"
        assert status.uncleanable_retry_at_ms == start + RETRY_MS * 2**attempt
        assert manager.uncleanable_by_log_dir()[env.log_dir] == (1, status.cleanable_bytes)
        env.clock.now_ms = status.uncleanable_retry_at_ms - 1
        assert manager.grab_filthiest() is None  # not before its time
        env.clock.now_ms += 1


def test_the_uncleanable_backoff_stops_doubling_at_the_cap(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.partitions[directory].uncleanable_failures = 40
    manager.mark_uncleanable(directory, "again")
    assert status_of(manager, directory).uncleanable_retry_at_ms == env.clock.now_ms + UNCLEANABLE_RETRY_MS_MAX


def test_an_uncleanable_partition_is_retried_as_soon_as_its_files_change(env):
    directory = env.partition("t-0")
    other = env.partition("other-0", seed=1)
    env.set_checkpoint(other, env.bases(other)[-1])
    manager = env.manager()
    manager.grab_filthiest()
    manager.failed(directory, ValueError("corrupt"))
    assert manager.grab_filthiest() is None
    segment = directory / fmt.offset_file_name(env.bases(directory)[3], fmt.LOG_SUFFIX)
    segment.write_bytes(segment.read_bytes())  # e.g. the operator restored it from a backup
    assert manager.grab_filthiest().directory == directory  # long before its backoff ends
    manager.done_cleaning(directory, result(1200))
    status = status_of(manager, directory)
    assert status.uncleanable_reason is None and status.uncleanable_failures == 0
    assert manager.uncleanable_by_log_dir()[env.log_dir] == (0, 0)


def test_an_uncleanable_partition_is_not_retried_just_because_its_writer_appended(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.grab_filthiest()
    manager.failed(directory, ValueError("corrupt"))
    append_to_active(directory)
    assert manager.grab_filthiest() is None


def test_trigger_clears_the_uncleanable_backoff(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.grab_filthiest()
    manager.failed(directory, ValueError("corrupt"))
    manager.trigger(directory)
    candidate = manager.grab_filthiest()
    assert (candidate.directory, candidate.reason) == (directory, "triggered")


def test_a_log_whose_files_cannot_be_read_at_selection_becomes_uncleanable(env):
    directory = env.partition("t-0")
    active = directory / fmt.offset_file_name(env.bases(directory)[-1], fmt.LOG_SUFFIX)
    active.write_bytes(b"\xff" * 200)  # garbage where the log end is read from
    manager = env.manager()
    assert manager.grab_filthiest() is None
    status = status_of(manager, directory)
    assert status.uncleanable_reason.startswith("cannot estimate")
    assert status.state == PartitionState.IDLE


def test_status_as_dict_is_what_the_status_endpoint_shows(env):
    directory = env.partition("t-0")
    manager = env.manager()
    manager.abort_and_pause(directory)
    shown = status_of(manager, directory).as_dict()
    assert shown["partition"] == "t-0" and shown["state"] == "paused" and shown["pauses"] == 1
    assert shown["uncleanable"] is False and shown["last_round"] is None
