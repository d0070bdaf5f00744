"""Survivorship-aware scheduling: the measured survivorship of a round, its smoothing and persistence, and the
survivorship policy's choice between an insert-only log and an updated one (Kafka's policy as the contrast)."""

from __future__ import annotations

import pytest

from cleaner import survivorship
from cleaner.manager import CleanerManager
from cleaner.oneshot import clean_partition
from cleaner.settings import Settings
from segments.codec.records import Record, encode_batch
from segments.partition.log import LogConfig, PartitionLog

from .test_manager import result

T0 = 1_700_000_000_000


def test_smoothing_is_an_exponentially_weighted_average_and_persists_in_parts_per_million(tmp_path):
    assert survivorship.smoothed(None, 0.8, 0.5) == 0.8
    assert survivorship.smoothed(0.8, 0.2, 0.25) == pytest.approx(0.25 * 0.2 + 0.75 * 0.8)
    assert survivorship.record(tmp_path, "t", 0, 1.0, 0.5) == 1.0
    assert survivorship.record(tmp_path, "t", 0, 0.0, 0.5) == 0.5
    survivorship.record(tmp_path, "u", 3, 0.123456, 0.5)
    assert survivorship.read_all(tmp_path) == {("t", 0): 0.5, ("u", 3): 0.123456}


def test_expected_benefit_and_eligibility():
    # Kafka's assumption (s = 0): the whole dirty section goes.
    assert survivorship.expected_freed_fraction(400, 600, 0.0) == 0.6
    assert survivorship.freed_per_io_byte(400, 600, 0.0) == pytest.approx(600 / (1000 + 400))
    # Insert-only (s = 1): nothing to gain, not eligible until the backstop.
    assert survivorship.freed_per_io_byte(400, 600, 1.0) == 0.0
    assert not survivorship.eligible(400, 600, 1.0, min_ratio=0.5, backstop_ratio=0.9)
    assert survivorship.eligible(50, 950, 1.0, min_ratio=0.5, backstop_ratio=0.9)
    assert survivorship.eligible(400, 600, 0.1, min_ratio=0.5, backstop_ratio=0.9)  # 0.54 expected to go
    assert not survivorship.eligible(400, 600, 0.2, min_ratio=0.5, backstop_ratio=0.9)  # 0.48


def _append(directory, keys, *, create: bool = False) -> None:
    """One record per key in `keys` (in batches of 20), then a roll, so everything written is cleanable."""
    config = LogConfig(segment_bytes=16 * 1024)
    with PartitionLog.open(directory, mode="writer", create=create, config=config, clock_ms=lambda: T0) as log:
        for i in range(0, len(keys), 20):
            records = [Record(j, T0, k, b"value-%06d" % (i + j)) for j, k in enumerate(keys[i : i + 20])]
            log.append_batches(encode_batch(records, base_offset=0))
        log.roll()


def _insert_only(directory, records, start=0):
    _append(directory, [b"new-%06d" % i for i in range(start, start + records)], create=True)


def _updated(directory, records, keys):
    _append(directory, [b"key-%04d" % (i % keys) for i in range(records)], create=True)


def test_a_round_measures_survivorship_of_its_dirty_section(tmp_path):
    settings = Settings.from_mappings({"cleanup.policy": "compact"})
    _insert_only(tmp_path / "logs" / "ins-0", 1200)
    _updated(tmp_path / "logs" / "upd-0", 1200, 100)
    ins = clean_partition(tmp_path / "logs" / "ins-0", settings, now_ms=T0).rounds[-1]
    upd = clean_partition(tmp_path / "logs" / "upd-0", settings, now_ms=T0).rounds[-1]
    assert ins.survivorship == 1.0
    assert upd.survivorship == pytest.approx(upd.dirty_records_written / upd.dirty_records_read) and upd.survivorship < 0.2
    stored = survivorship.read_all(tmp_path / "logs")
    assert stored[("ins", 0)] == 1.0 and stored[("upd", 0)] == pytest.approx(upd.survivorship, abs=1e-6)


@pytest.mark.parametrize("policy, expected", [("dirty-ratio", "ins"), ("survivorship", "upd")])
def test_policy_chooses_between_an_insert_only_log_and_an_updated_one(tmp_path, policy, expected):
    log_dir = tmp_path / "logs"
    # Both were cleaned once before (survivorship known, kept in the log dir); now the insert-only log is
    # dirtier by Kafka's measure, while only the updated log has anything to remove.
    _insert_only(log_dir / "ins-0", 1200)
    _updated(log_dir / "upd-0", 1200, 600)
    base = Settings.from_mappings({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.2})
    for name in ("ins-0", "upd-0"):
        clean_partition(log_dir / name, base, now_ms=T0)
    _insert_only(log_dir / "ins-0", 3000, start=1200)  # inserts only: dirty ratio ~0.7
    _append(log_dir / "upd-0", [b"key-%04d" % (i % 10) for i in range(600)])  # 10 keys updated: dirty ratio ~0.5
    settings = base.with_overrides({"log.cleaner.selection.policy": policy})
    manager = CleanerManager([log_dir], settings, clock_ms=lambda: T0)
    manager.discover()
    chosen = manager.grab_filthiest()
    assert chosen is not None and chosen.topic == expected
    statuses = {s.topic: s for s in manager.partitions.values()}
    assert statuses["ins"].dirty_ratio > statuses["upd"].dirty_ratio
    if policy == "survivorship":
        assert statuses["ins"].survivorship == 1.0
        clean_partition(chosen.directory, settings, now_ms=T0)
        manager.done_cleaning(chosen.directory, result(0))
        assert manager.grab_filthiest() is None, "the insert-only log is not recleaned for nothing"


def test_the_survivorship_hint_is_written_without_fsync_and_an_unreadable_one_counts_as_no_history(tmp_path,
                                                                                                   monkeypatch):
    """Issue 19: two of a tiny round's fsyncs went to this file, which nothing depends on for safety."""
    from segments.files import fileio

    fsyncs = []
    monkeypatch.setattr(fileio.os, "fsync", lambda fd: fsyncs.append(fd))
    assert survivorship.record(tmp_path, "t", 0, 0.5, 0.5) == 0.5
    assert fsyncs == []
    assert survivorship.lookup(tmp_path, "t", 0) == 0.5
    (tmp_path / survivorship.SURVIVORSHIP_CHECKPOINT).write_bytes(b"\0" * 100)  # what a power cut may leave
    assert survivorship.lookup(tmp_path, "t", 0) is None and survivorship.read_all(tmp_path) == {}
    assert survivorship.record(tmp_path, "t", 1, 0.25, 0.5) == 0.25  # replaces it
    assert survivorship.read_all(tmp_path) == {("t", 1): 0.25}
