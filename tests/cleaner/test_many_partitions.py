"""Selection over many partitions (issue 19; docs/design.md, "Many partitions"): a pass works out again only the
partitions that may have changed, without re-reading the files of the others, and still notices every change.

The files are made older than `segments.partition.facts.RACY_NS` first (`age`), as a host's logs are: a read of a
file changed within the last timestamp tick is not trusted, and the partition is read again. The counts are of
the file-system calls `segments.partition.facts` and the manager make (`CountingOs`), never of times.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cleaner import manager as manager_module
from cleaner.manager import CleanerManager, PartitionState
from cleaner.retention import may_delete_below_log_start
from cleaner.settings import Settings
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from segments.partition import facts as facts_module
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, encode_offset_checkpoint, update_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000
OLD_NS = (T0 - 3_600_000) * 1_000_000  # an hour before the records: nothing is racy


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class CountingOs:
    """`os` as the module under test sees it, counting the calls that touch the file system."""

    COUNTED = ("listdir", "scandir", "lstat", "stat", "open")

    def __init__(self) -> None:
        self.calls: dict[str, int] = dict.fromkeys(self.COUNTED, 0)
        self.listed: list[str] = []  # the paths given to listdir and scandir

    def __getattr__(self, name):
        real = getattr(os, name)
        if name not in self.COUNTED:
            return real

        def counted(*args, **kwargs):
            self.calls[name] += 1
            if name in ("listdir", "scandir"):
                self.listed.append(os.fspath(args[0]))
            return real(*args, **kwargs)

        return counted

    def reset(self) -> dict[str, int]:
        calls, self.calls = self.calls, dict.fromkeys(self.COUNTED, 0)
        return calls


def write(directory: Path, records: int, *, roll: bool = True) -> None:
    """What a writer does: append `records` records (one batch each) and, with `roll`, roll."""
    with PartitionLog.open(directory, mode="writer", create=True, config=LogConfig()) as log:
        for i in range(records):
            log.append_batches(encode_batch([Record(0, T0 + i, b"key-%d" % (i % 3), b"value-%d" % i)], base_offset=0))
        if roll:
            log.roll()


def age(root: Path) -> None:
    """Every file and directory under `root` (and `root`) last modified an hour ago."""
    for path in [*root.rglob("*"), root]:
        os.utime(path, ns=(OLD_NS, OLD_NS), follow_symlinks=False)


def clean_partition(log_dir: Path, directory: Path) -> None:
    """The partition's cleaner checkpoint at its active segment: nothing dirty."""
    bases = sorted(int(n[:-4]) for n in os.listdir(directory) if n.endswith(fmt.LOG_SUFFIX))
    topic, _, partition = directory.name.rpartition("-")
    update_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT, {(topic, int(partition)): bases[-1]})


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """Five clean partitions, files aged."""
    root = tmp_path / "logs"
    root.mkdir()
    for p in range(5):
        write(root / f"t-{p}", 7)
        clean_partition(root, root / f"t-{p}")
    age(root)
    return root


def make_manager(log_dir: Path, *, probe_interval_ms: int = 0) -> CleanerManager:
    settings = Settings.from_mappings({"cleanup.policy": "compact"})
    manager = CleanerManager([log_dir], settings, clock_ms=Clock(T0 + 3_600_000), probe_interval_ms=probe_interval_ms)
    manager.discover()
    return manager


@pytest.fixture
def counting(monkeypatch) -> CountingOs:
    fake = CountingOs()
    monkeypatch.setattr(facts_module, "os", fake)
    monkeypatch.setattr(manager_module, "os", fake)
    return fake


def walks(monkeypatch) -> list[int]:
    """The segments walked (opened and read) by the facts cache, by base offset."""
    walked: list[int] = []
    real = facts_module._walk

    def counted(directory, base, seen, *, active):
        walked.append(base)
        return real(directory, base, seen, active=active)

    monkeypatch.setattr(facts_module, "_walk", counted)
    return walked


def test_a_pass_reads_no_file_of_a_partition_that_did_not_change_it_probes_two(log_dir, counting, monkeypatch):
    manager = make_manager(log_dir)
    walked = walks(monkeypatch)
    assert manager.grab_filthiest() is None  # the first pass reads every partition
    assert sorted(walked) == sorted([0, 7] * 5)
    counting.reset()
    walked.clear()
    for _ in range(3):
        assert manager.grab_filthiest() is None
        # probed every pass (interval 0): the directory and the active segment, two lstats, nothing listed or opened
        assert counting.reset() == {"listdir": 0, "scandir": 0, "lstat": 2 * 5, "stat": 0, "open": 0}
    assert walked == []


def test_within_the_probe_interval_an_idle_pass_touches_no_file_at_all(log_dir, counting, monkeypatch):
    manager = make_manager(log_dir, probe_interval_ms=60_000)
    assert manager.grab_filthiest() is None
    counting.reset()
    for _ in range(3):
        assert manager.grab_filthiest() is None
        assert sum(counting.reset().values()) == 0
    # once the interval has passed, each partition is probed once (the monotonic clock is the probes')
    later = time.monotonic() + 61
    monkeypatch.setattr(manager_module.time, "monotonic", lambda: later)
    assert manager.grab_filthiest() is None
    assert counting.reset()["lstat"] == 2 * 5


def test_appended_records_are_noticed_and_a_roll_makes_the_partition_dirty(log_dir, monkeypatch):
    manager = make_manager(log_dir)
    assert manager.grab_filthiest() is None
    directory = log_dir / "t-3"
    size = next(s for s in manager.snapshot() if s.directory == directory).total_bytes
    walked = walks(monkeypatch)
    write(directory, 5, roll=False)  # appended to the active segment: not cleanable yet, but read again
    assert manager.grab_filthiest() is None
    assert walked == [7]  # only the active segment, and only this partition's
    status = next(s for s in manager.snapshot() if s.directory == directory)
    assert status.total_bytes > size
    write(directory, 20)  # more, then a roll: the grown segment is now inactive, and dirtier than the rest
    candidate = manager.grab_filthiest()
    assert candidate is not None and candidate.directory == directory and candidate.reason == "dirty ratio"


def test_a_removed_segment_is_seen(log_dir):
    manager = make_manager(log_dir)
    assert manager.grab_filthiest() is None
    directory = log_dir / "t-1"
    before = next(s for s in manager.snapshot() if s.directory == directory).total_bytes
    for name in os.listdir(directory):
        if name.startswith(fmt.offset_file_name(0, "")):
            os.remove(directory / name)  # another program deleted the oldest segment
    assert manager.grab_filthiest() is None
    status = next(s for s in manager.snapshot() if s.directory == directory)
    assert status.total_bytes < before and status.state == PartitionState.IDLE


def test_a_checkpoint_rewritten_by_someone_else_is_read_again(log_dir):
    manager = make_manager(log_dir, probe_interval_ms=60_000)
    assert manager.grab_filthiest() is None
    # Another process (an operator, another tool) sets t-2's checkpoint back to 0: t-2 is dirty again.
    entries = {("t", p): 7 for p in range(5)}
    entries[("t", 2)] = 0
    (log_dir / CLEANER_OFFSET_CHECKPOINT).write_bytes(encode_offset_checkpoint(entries))
    candidate = manager.grab_filthiest()
    assert candidate is not None and candidate.directory == log_dir / "t-2"


def test_discovery_does_not_list_an_unchanged_log_dir_again(log_dir, counting):
    manager = make_manager(log_dir)
    counting.listed.clear()
    manager.discover()
    assert str(log_dir) not in counting.listed  # (the metadata log's directories are looked for, as before)
    write(log_dir / "t-9", 3)  # a new partition: the log dir changed
    manager.discover()
    assert counting.listed.count(str(log_dir)) == 1
    assert log_dir / "t-9" in {s.directory for s in manager.snapshot()}


def test_retention_opens_no_compacted_log_with_nothing_below_its_log_start(log_dir):
    manager = make_manager(log_dir)
    assert manager.grab_filthiest() is None
    assert manager.retention_candidates() == []
    assert may_delete_below_log_start([0, 7], 7) and not may_delete_below_log_start([0, 7], 6)


def test_idle_maintenance_looks_only_at_topics_with_a_finite_max_compaction_lag(log_dir):
    manager = make_manager(log_dir)
    assert manager.idle_roll_candidates() == []  # Kafka's default: no lag, nothing to roll, nothing looked at
    manager.reconfigure(Settings.from_mappings({"cleanup.policy": "compact"}, {"t": {"max.compaction.lag.ms": 1000}}),
                        [log_dir])
    assert sorted(s.directory.name for s in manager.idle_roll_candidates()) == [f"t-{p}" for p in range(5)]


def test_the_clock_alone_makes_a_partition_eligible_when_its_range_changes_without_a_probe(tmp_path):
    """A segment leaving min.compaction.lag.ms changes nothing on disk: the pass that reaches the time
    `cleanable_range` gave (`changes_at_ms`) works the partition out again, probes or not."""
    root = tmp_path / "logs"
    root.mkdir()
    write(root / "t-0", 7)  # one inactive segment of records at T0 .. T0 + 6, all dirty
    age(root)
    settings = Settings.from_mappings({"cleanup.policy": "compact"}, {"t": {"min.compaction.lag.ms": 60_000}})
    clock = Clock(T0 + 1_000)
    manager = CleanerManager([root], settings, clock_ms=clock, probe_interval_ms=3_600_000)
    manager.discover()
    assert manager.grab_filthiest() is None  # every segment is inside the lag
    clock.now_ms = T0 + 6 + 60_000 - 1
    assert manager.grab_filthiest() is None
    clock.now_ms = T0 + 6 + 60_000  # the segment's largest timestamp (T0 + 6) leaves the lag
    candidate = manager.grab_filthiest()
    assert candidate is not None and candidate.directory == root / "t-0"
