"""`log.cleaner.verify`: the check before each swap that no key lost its latest record.

It must pass every correct round (random logs with transactions, tombstones past their horizon, several
groups, generational rounds) and catch a deliberately broken recopy: a test-only fault wrapped around the
recopy's decisions drops one record that is the latest of its key. With the check the round stops before
the swap and the log is left byte for byte as it was; without it, the record is lost.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from cleaner import recopy
from cleaner import round as round_module
from cleaner.cli import main
from cleaner.oneshot import clean_partition
from cleaner.safety import SafetyCheckError, check_group
from cleaner.settings import Settings
from segments.partition.log import LogConfig

from ..reliability.scenario import committed_records
from .builders import (
    DAY_MS,
    ROLL,
    T0,
    abort,
    batch,
    build_log,
    clean,
    file_digests,
    partition_dir,
    random_log,
    txn_batch,
)

SMALL_SEGMENTS = {"segment.bytes": 600}  # several groups per round


def latest_values(directory):
    """key -> latest value (None: a tombstone) as a read-committed consumer from offset 0 sees them."""
    out = {}
    for _, key, value in committed_records(directory):
        if key is not None:
            out[key] = value
    return out


@pytest.fixture
def drop_one_latest_record(monkeypatch):
    """The test-only fault: the first window that keeps a non-tombstone keyed record in a batch that keeps
    another record loses that record (its batch is rebuilt without it). Yields the dropped offsets."""
    dropped: list[int] = []
    decide = recopy._decide

    def broken(result, ctx, retain_tombstones_legacy, group_last):
        action, keep, needs_horizon, invalid = decide(result, ctx, retain_tombstones_legacy, group_last)
        if dropped:
            return action, keep, needs_horizon, invalid
        bi = result.batch_index
        kept_per_batch = np.bincount(bi, weights=keep, minlength=result.n_batches)
        victims = np.flatnonzero(keep & (result.key_len >= 0) & (result.value_len >= 0) & ~result.is_control[bi]
                                 & (kept_per_batch[bi] >= 2))
        if len(victims):
            r = int(victims[0])
            keep = keep.copy()
            keep[r] = False
            action = action.copy()
            action[bi[r]] = recopy.ACTION_REBUILD
            dropped.append(int(result.offset[r]))
        return action, keep, needs_horizon, invalid

    monkeypatch.setattr(recopy, "_decide", broken)
    return dropped


def updates_log(d):
    """Keys k0..k9, five updates each, several records per batch, so that the latest records share batches."""
    steps = []
    for round_ in range(5):
        steps.append(batch([(b"k%d" % i, b"v%d-%d" % (round_, i), T0 + round_) for i in range(10)]))
        steps.append(ROLL)
    build_log(d, steps)


@pytest.mark.parametrize("seed", range(1, 9))
def test_the_check_passes_every_correct_round_of_random_logs(tmp_path, seed):
    d = partition_dir(tmp_path)
    random_log(d, seed, batches_max=60)  # transactions committed and aborted, tombstones, unkeyed records
    before = latest_values(d)
    settings = {**SMALL_SEGMENTS, "delete.retention.ms": 0}  # tombstones go at the second round
    first = clean(d, now_ms=T0 + DAY_MS, settings=settings, verify=True)
    assert first.verified_records > 0 and first.groups >= 1
    second = clean(d, now_ms=T0 + 2 * DAY_MS, settings=settings, verify=True, force_recopy=True)
    assert second.verified_records > 0
    after = latest_values(d)
    assert {k: v for k, v in after.items() if v is not None} == {k: v for k, v in before.items() if v is not None}


def test_the_check_passes_generational_rounds(tmp_path):
    d = partition_dir(tmp_path)
    updates_log(d)
    settings = {**SMALL_SEGMENTS, "cleaner.mode": "generational"}
    for i in range(4):
        with_more = [batch([(b"k%d" % j, b"late%d-%d" % (i, j), T0 + 10 + i) for j in range(i, i + 3)])]
        build_log(d, with_more)
        result = clean(d, now_ms=T0 + DAY_MS, settings=settings, verify=True)
        assert result.verified_records > 0


def test_a_recopy_that_drops_a_latest_record_is_caught_and_the_log_is_left_untouched(tmp_path, drop_one_latest_record):
    d = partition_dir(tmp_path)
    updates_log(d)
    before = file_digests(d.parent)
    settings = Settings.from_mappings({"cleanup.policy": "compact", "log.cleaner.verify": True})
    outcome = clean_partition(d, settings, now_ms=T0 + DAY_MS)
    assert drop_one_latest_record == [40]  # k0's latest record, first of the last batch
    assert outcome.error is not None and "SafetyCheckError" in outcome.error
    assert "the record at offset 40 (key b'k0') is the latest of its key" in outcome.error
    assert "the group was not swapped in" in outcome.error
    assert file_digests(d.parent) == before  # no .cleaned file left, no checkpoint written, nothing swapped


def test_without_the_check_the_same_fault_loses_the_record(tmp_path, drop_one_latest_record):
    d = partition_dir(tmp_path)
    updates_log(d)
    expected = latest_values(d)
    outcome = clean_partition(d, Settings.from_mappings({"cleanup.policy": "compact"}), now_ms=T0 + DAY_MS)
    assert outcome.ok and drop_one_latest_record == [40]
    after = latest_values(d)
    assert b"k0" not in after and after == {k: v for k, v in expected.items() if k != b"k0"}


def test_a_later_group_failing_the_check_leaves_it_and_the_checkpoint_as_they_were(tmp_path, monkeypatch):
    d = partition_dir(tmp_path)
    updates_log(d)
    expected = latest_values(d)
    calls = []

    def fail_second(group, cleaned, offset_map, survey, partition, **kwargs):  # the second group's check fails
        calls.append(group[0].base_offset)
        if len(calls) == 2:
            raise SafetyCheckError("injected")
        return check_group(group, cleaned, offset_map, survey, partition, **kwargs)

    monkeypatch.setattr(round_module, "check_group", fail_second)
    with pytest.raises(SafetyCheckError):
        clean(d, now_ms=T0 + DAY_MS, settings={"segment.bytes": 300}, verify=True)
    assert len(calls) == 2
    assert not list(d.glob("*.cleaned")) and not (d.parent / "cleaner-offset-checkpoint").exists()
    assert latest_values(d) == expected  # the first group, swapped, lost nothing; the second is as it was
    monkeypatch.undo()
    result = clean(d, now_ms=T0 + DAY_MS, verify=True)  # a correct round afterwards finishes the job
    assert result.verified_records == 10


def test_clean_cli_reports_the_failed_check_and_exits_1(tmp_path, drop_one_latest_record):
    d = partition_dir(tmp_path)
    updates_log(d)
    before = file_digests(d.parent)
    out = CliRunner().invoke(main, ["clean", str(d), "--set", "log.cleaner.verify=true"])
    assert out.exit_code == 1
    assert "t-0: FAILED: SafetyCheckError: t-0: safety check (log.cleaner.verify) failed" in out.output
    assert file_digests(d.parent) == before


def test_aborted_records_and_tombstones_are_not_required_to_survive(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1", T0), (b"b", b"2", T0)]),
        txn_batch([(b"c", b"aborted", T0)], pid=4),
        abort(4),
        batch([(b"b", None, T0)]),
    ], config=LogConfig())
    clean(d, now_ms=T0, verify=True)  # stamps the tombstone's horizon
    result = clean(d, now_ms=T0 + 2 * DAY_MS, verify=True, force_recopy=True)  # now it, and the abort, go
    assert [(k, v) for _, k, v in committed_records(d)] == [(b"a", b"1")]
    assert result.verified_records == 1
