"""Offset and time index files: model tests against bisect, golden bytes, Kafka-written fixtures, corruption."""

from __future__ import annotations

import bisect
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from segments.codec import format as fmt
from segments.codec.errors import CorruptIndexError, IndexAppendError, IndexOffsetOverflowError, LogStateError
from segments.codec.records import decode_batch_header
from segments.files.fileio import FileOps
from segments.files.index import OffsetIndex, TimeIndex, build_offset_index_entries, build_time_index_entries

from ..kafka_fixtures import KAFKA_FIXTURES, copy_kafka_fixture

RAW = KAFKA_FIXTURES / "kafka-2.4-c2" / "raw"
INACTIVE_BASES = [0, 288, 576, 862, 1147, 1430, 1713]
ACTIVE_BASE = 1996


# ---- helpers ----------------------------------------------------------------------------------------------


class RecordingFileOps(FileOps):
    """Real file operations that also record what was called, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def fsync_file(self, path):
        self.calls.append(("fsync_file", os.fspath(path)))
        super().fsync_file(path)

    def fsync_fd(self, fd):
        self.calls.append(("fsync_fd", ""))
        super().fsync_fd(fd)

    def rename(self, src, dst):
        self.calls.append(("rename", f"{os.fspath(src)} -> {os.fspath(dst)}"))
        super().rename(src, dst)

    def remove(self, path):
        self.calls.append(("remove", os.fspath(path)))
        super().remove(path)


def offset_index_bytes(base: int, entries) -> bytes:
    return b"".join(fmt.OFFSET_INDEX_ENTRY.pack(o - base, p) for o, p in entries)


def time_index_bytes(base: int, entries) -> bytes:
    return b"".join(fmt.TIME_INDEX_ENTRY.pack(t, o - base) for t, o in entries)


def fixture_batches(base: int) -> list[tuple[int, int, int, int]]:
    """(position, base offset, last offset, max timestamp) of each batch of a raw fixture segment."""
    data = (RAW / fmt.offset_file_name(base, fmt.LOG_SUFFIX)).read_bytes()
    rows, pos = [], 0
    while pos < len(data):
        header = decode_batch_header(data, pos)
        rows.append((pos, header.base_offset, header.last_offset, header.max_timestamp))
        pos += header.size_bytes
    assert pos == len(data)
    return rows


def naive_build(positions, last_offsets, max_timestamps, interval):
    """Kafka's LogSegment.recover loop plus the final time-index entry, written the obvious way."""
    offset_entries, time_entries = [], []
    last_indexed, max_so_far, shallow = 0, -1, None

    def maybe_append(ts, offset):
        if ts > (time_entries[-1][0] if time_entries else -1):
            time_entries.append((ts, offset))

    for pos, last, ts in zip(positions, last_offsets, max_timestamps):
        if ts > max_so_far:
            max_so_far, shallow = ts, last
        if pos - last_indexed > interval:
            offset_entries.append((last, pos))
            maybe_append(max_so_far, shallow)
            last_indexed = pos
    if len(positions):
        maybe_append(max_so_far, shallow)
    return offset_entries, time_entries


# ---- golden bytes (docs/format.md 6.7) -------------------------------------------------------------------------


def test_offset_index_entry_matches_spec_golden_bytes(tmp_path):
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100)
    index.append(155, 4127)
    index.flush()
    assert path.read_bytes() == bytes.fromhex("00000037 0000101f")


def test_time_index_entry_matches_spec_golden_bytes(tmp_path):
    path = tmp_path / "00000000000000000100.timeindex"
    index = TimeIndex(path, 100)
    assert index.maybe_append(1_700_000_000_000, 155)
    index.flush()
    assert path.read_bytes() == bytes.fromhex("0000018bcfe56800 00000037")


def test_golden_bytes_decode_to_the_spec_entries(tmp_path):
    (tmp_path / "a.index").write_bytes(bytes.fromhex("000000370000101f"))
    (tmp_path / "a.timeindex").write_bytes(bytes.fromhex("0000018bcfe5680000000037"))
    assert OffsetIndex(tmp_path / "a.index", 100).entry(0) == (155, 4127)
    assert TimeIndex(tmp_path / "a.timeindex", 100).entry(0) == (1_700_000_000_000, 155)


# ---- offset index: model test against bisect ---------------------------------------------------------------

MODEL_BASE = 1000
MODEL_ENTRIES_MAX = 40


def near(data, keys: list[int], low: int, high: int) -> int:
    """A target in [low, high], half the time one of `keys` or a neighbour (where off-by-one bugs live)."""
    if keys and data.draw(st.booleans()):
        return data.draw(st.sampled_from(keys)) + data.draw(st.integers(-1, 1))
    return data.draw(st.integers(low, high))


class OffsetIndexModel(RuleBasedStateMachine):
    """The index against a list of (offset, position) searched with bisect, across flushes and reopens."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "00000000000000001000.index"
        self.index = self._open()
        self.model: list[tuple[int, int]] = []

    def _open(self) -> OffsetIndex:
        return OffsetIndex(self.path, MODEL_BASE, max_index_bytes=MODEL_ENTRIES_MAX * 8 + 5)

    def _last(self) -> tuple[int, int]:
        return self.model[-1] if self.model else (MODEL_BASE - 1, 0)

    @rule(offset_gap=st.integers(1, 60), position_gap=st.integers(0, 9000))
    def append(self, offset_gap, position_gap):
        last_offset, last_position = self._last()
        offset, position = last_offset + offset_gap, last_position + position_gap
        if len(self.model) >= MODEL_ENTRIES_MAX:
            with pytest.raises(IndexAppendError):
                self.index.append(offset, position)
            return
        self.index.append(offset, position)
        self.model.append((offset, position))

    @rule(offset_back=st.integers(0, 3))
    def append_of_an_offset_not_above_the_last_is_rejected(self, offset_back):
        if not self.model:
            return
        last_offset, last_position = self.model[-1]
        with pytest.raises(IndexAppendError):
            self.index.append(last_offset - offset_back, last_position)

    @rule(data=st.data())
    def lookup(self, data):
        keys = [o for o, _ in self.model]
        target = near(data, keys, MODEL_BASE - 20, self._last()[0] + 80)
        i = bisect.bisect_right(keys, target) - 1
        expected = self.model[i] if i >= 0 else (MODEL_BASE, 0)
        assert self.index.lookup(target) == expected

    @rule(data=st.data())
    def truncate_to(self, data):
        target = near(data, [o for o, _ in self.model], MODEL_BASE - 5, self._last()[0] + 5)
        self.index.truncate_to(target)
        self.model = [(o, p) for o, p in self.model if o < target]

    @rule(data=st.data())
    def truncate_to_entries(self, data):
        keep = data.draw(st.integers(0, len(self.model) + 2))
        self.index.truncate_to_entries(keep)
        self.model = self.model[:keep]

    @rule()
    def flush_writes_exactly_the_entries(self):
        self.index.flush()
        assert self.path.read_bytes() == offset_index_bytes(MODEL_BASE, self.model)

    @rule()
    def reopen(self):
        self.index.close()
        self.index = self._open()

    @invariant()
    def counts_agree(self):
        assert self.index.entries == len(self.model)
        assert self.index.last_offset == (self.model[-1][0] if self.model else MODEL_BASE)
        assert self.index.is_full == (len(self.model) >= MODEL_ENTRIES_MAX)
        for i in (0, len(self.model) - 1):
            if 0 <= i < len(self.model):
                assert self.index.entry(i) == self.model[i]

    def teardown(self):
        self.index.sanity_check()
        self.index.close()
        shutil.rmtree(self.dir)


TestOffsetIndexAgreesWithBisectModel = OffsetIndexModel.TestCase
TestOffsetIndexAgreesWithBisectModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---- time index: model test against bisect -----------------------------------------------------------------

TIME_ENTRIES_MAX = 30  # full at 29: one slot reserved


class TimeIndexModel(RuleBasedStateMachine):
    """The time index against a list of (timestamp, offset) with Kafka's maybeAppend rules, searched with bisect."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "00000000000000001000.timeindex"
        self.index = self._open()
        self.model: list[tuple[int, int]] = []

    def _open(self) -> TimeIndex:
        return TimeIndex(self.path, MODEL_BASE, max_index_bytes=TIME_ENTRIES_MAX * 12 + 7)

    def _last(self) -> tuple[int, int]:
        return self.model[-1] if self.model else (-1, MODEL_BASE)

    @rule(ts_step=st.integers(-3, 40), offset_step=st.integers(-2, 30), final=st.booleans())
    def maybe_append(self, ts_step, offset_step, final):
        last_ts, last_offset = self._last()
        ts, offset = last_ts + ts_step, last_offset + offset_step
        limit = TIME_ENTRIES_MAX if final else TIME_ENTRIES_MAX - 1
        if self.model and (offset < last_offset or ts < last_ts):
            expected_error = IndexAppendError
        elif ts <= last_ts:
            assert self.index.maybe_append(ts, offset, skip_full_check=final) is False
            return
        elif len(self.model) >= limit:
            expected_error = IndexAppendError
        elif offset < MODEL_BASE:
            expected_error = IndexOffsetOverflowError
        else:
            assert self.index.maybe_append(ts, offset, skip_full_check=final) is True
            self.model.append((ts, offset))
            return
        with pytest.raises(expected_error):
            self.index.maybe_append(ts, offset, skip_full_check=final)

    @rule(data=st.data())
    def lookup(self, data):
        keys = [t for t, _ in self.model]
        target = near(data, keys, -5, self._last()[0] + 50)
        i = bisect.bisect_right(keys, target) - 1
        expected = self.model[i] if i >= 0 else (-1, MODEL_BASE)
        assert self.index.lookup(target) == expected

    @rule(data=st.data())
    def truncate_to(self, data):
        target = near(data, [o for _, o in self.model], MODEL_BASE - 5, self._last()[1] + 5)
        self.index.truncate_to(target)
        self.model = [(t, o) for t, o in self.model if o < target]

    @rule()
    def flush_writes_exactly_the_entries(self):
        self.index.flush()
        assert self.path.read_bytes() == time_index_bytes(MODEL_BASE, self.model)

    @rule()
    def reopen(self):
        self.index.close()
        self.index = self._open()

    @invariant()
    def counts_agree(self):
        assert self.index.entries == len(self.model)
        assert self.index.last_entry == self._last()
        assert self.index.is_full == (len(self.model) >= TIME_ENTRIES_MAX - 1)

    def teardown(self):
        self.index.sanity_check()
        self.index.close()
        shutil.rmtree(self.dir)


TestTimeIndexAgreesWithBisectModel = TimeIndexModel.TestCase
TestTimeIndexAgreesWithBisectModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---- appends and limits --------------------------------------------------------------------------------------


def test_new_index_file_is_created_empty_and_never_preallocated(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex(path, 0)
    assert path.exists() and path.stat().st_size == 0
    for i in range(1, 4):
        index.append(i * 10, i * 5000)
    index.flush()
    assert path.stat().st_size == 3 * 8


def test_rejected_appends_raise_value_errors_and_change_nothing(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 100)
    index.append(110, 5000)
    cases = [
        (110, 6000, IndexAppendError),  # offset not above the last
        (105, 6000, IndexAppendError),
        (120, 4999, IndexAppendError),  # position going backwards
        (120, -1, IndexAppendError),
        (99, 6000, IndexOffsetOverflowError),  # below the base: relative offset negative
        (100 + 2**31, 6000, IndexOffsetOverflowError),  # relative offset above 2^31-1
    ]
    for offset, position, error in cases:
        with pytest.raises(error) as info:
            index.append(offset, position)
        assert isinstance(info.value, ValueError)
        assert info.value.path == str(tmp_path / "x.index")
    assert index.entries == 1 and index.entry(0) == (110, 5000)
    index.append(100 + 2**31 - 1, 6000)  # the largest relative offset fits
    assert index.last_offset == 100 + 2**31 - 1


def test_offset_index_is_full_at_max_index_bytes_over_entry_size(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 0, max_index_bytes=8 * 3 + 7)
    assert index.entries_max == 3
    for i in range(3):
        assert not index.is_full
        index.append(i + 1, i * 100)
    assert index.is_full
    with pytest.raises(IndexAppendError, match="full"):
        index.append(10, 1000)


def test_time_index_keeps_one_slot_for_the_final_entry(tmp_path):
    index = TimeIndex(tmp_path / "x.timeindex", 0, max_index_bytes=12 * 4)
    assert index.entries_max == 4
    for i in range(3):
        assert not index.is_full
        assert index.maybe_append(1000 + i, i)
    assert index.is_full
    with pytest.raises(IndexAppendError, match="full"):
        index.maybe_append(2000, 10)
    assert index.maybe_append(1002, 10) is False  # nothing to append: not an error even when full
    assert index.maybe_append(2000, 10, skip_full_check=True)
    with pytest.raises(IndexAppendError, match="full"):
        index.maybe_append(3000, 11, skip_full_check=True)


def test_default_limits_match_kafka_slot_counts(tmp_path):
    assert OffsetIndex(tmp_path / "a.index", 0).entries_max == 1_310_720
    assert TimeIndex(tmp_path / "a.timeindex", 0).entries_max == 873_813


def test_time_index_ignores_equal_timestamps_and_rejects_going_backwards(tmp_path):
    index = TimeIndex(tmp_path / "x.timeindex", 50)
    assert index.last_entry == (-1, 50)
    assert index.maybe_append(-1, 60) is False  # not above the initial -1: v0 data yields no entries
    assert index.maybe_append(100, 60)
    assert index.maybe_append(100, 70) is False
    with pytest.raises(IndexAppendError):
        index.maybe_append(99, 70)  # timestamp below the last entry's
    with pytest.raises(IndexAppendError):
        index.maybe_append(200, 59)  # offset below the last entry's
    assert index.to_arrays()[0].tolist() == [100]


def test_reopened_index_serves_the_same_entries_and_appends_after_them(tmp_path):
    path = tmp_path / "00000000000000000500.index"
    index = OffsetIndex(path, 500)
    for i in range(1, 101):
        index.append(500 + 3 * i, 4100 * i)
    index.close()
    reopened = OffsetIndex(path, 500)
    assert reopened.entries == 100
    assert reopened.lookup(500 + 3 * 50 + 1) == (500 + 3 * 50, 4100 * 50)
    reopened.append(1000, 10**6)
    reopened.close()
    expected = [(500 + 3 * i, 4100 * i) for i in range(1, 101)] + [(1000, 10**6)]
    assert path.read_bytes() == offset_index_bytes(500, expected)


def test_lookups_outside_the_int32_range_are_clamped_not_errors(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 10)
    index.append(20, 100)
    assert index.lookup(2**63 - 1) == (20, 100)
    assert index.lookup(-(2**63)) == (10, 0)
    index.truncate_to(2**62)
    assert index.entries == 1
    times = TimeIndex(tmp_path / "x.timeindex", 10)
    times.maybe_append(5, 20)
    assert times.lookup(2**70) == (5, 20)
    assert times.lookup(-(2**70)) == (-1, 10)


def test_appends_reach_the_file_by_themselves_once_enough_are_pending(tmp_path):
    path = tmp_path / "x.index"
    index = OffsetIndex(path, 0)
    for i in range(1, 20_001):
        index.append(i, i)
    assert path.stat().st_size > 0  # written without flush()
    index.flush()
    assert path.stat().st_size == 20_000 * 8


def test_truncation_shrinks_the_file_at_flush(tmp_path):
    path = tmp_path / "x.timeindex"
    index = TimeIndex(path, 0)
    for i in range(10):
        index.maybe_append(100 + i, i * 2)
    index.flush()
    index.truncate_to(7)  # drops offsets 8, 10, ...
    assert path.stat().st_size == 10 * 12  # deferred
    index.flush()
    assert path.read_bytes() == time_index_bytes(0, [(100 + i, i * 2) for i in range(4)])
    index.reset()
    index.flush()
    assert path.stat().st_size == 0


def test_fsync_goes_through_file_ops(tmp_path):
    ops = RecordingFileOps()
    path = tmp_path / "x.index"
    index = OffsetIndex(path, 0, file_ops=ops)
    index.append(5, 0)
    index.fsync()
    assert ops.calls == [("fsync_file", str(path))]
    assert path.stat().st_size == 8


def test_rename_to_moves_the_file_and_later_writes_follow_it(tmp_path):
    ops = RecordingFileOps()
    old, new = tmp_path / "00000000000000000000.index.cleaned", tmp_path / "00000000000000000000.index.swap"
    index = OffsetIndex(old, 0, file_ops=ops)
    index.append(3, 100)
    index.flush()
    index.append(4, 200)
    index.rename_to(new)
    assert ops.calls == [("rename", f"{old} -> {new}")]
    assert index.path == new and not old.exists()
    index.close()
    assert new.read_bytes() == offset_index_bytes(0, [(3, 100), (4, 200)])


def test_rename_and_delete_work_after_close(tmp_path):
    path = tmp_path / "x.index"
    index = OffsetIndex(path, 0)
    index.close()
    index.rename_to(tmp_path / "x.index.deleted")
    assert (tmp_path / "x.index.deleted").exists()
    index.delete()
    assert not (tmp_path / "x.index.deleted").exists()


def test_a_closed_index_refuses_reads_and_writes(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 0)
    index.close()
    index.close()  # idempotent
    for call in (lambda: index.entries, lambda: index.lookup(1), lambda: index.append(1, 1), index.flush):
        with pytest.raises(LogStateError):
            call()


def test_read_only_index_never_touches_the_file(tmp_path):
    missing = tmp_path / "missing.index"
    index = OffsetIndex(missing, 0, read_only=True)
    assert not missing.exists() and index.entries == 0
    path = tmp_path / "x.index"
    path.write_bytes(offset_index_bytes(0, [(1, 0), (2, 10)]))
    index = OffsetIndex(path, 0, read_only=True)
    index.truncate_to_entries(1)
    index.append(7, 70)  # memory only, e.g. an index rebuilt for a segment opened read-only
    assert index.lookup(9) == (7, 70)
    with pytest.raises(LogStateError):
        index.flush()
    index.close()
    assert path.read_bytes() == offset_index_bytes(0, [(1, 0), (2, 10)])


def test_delete_removes_the_file(tmp_path):
    path = tmp_path / "x.timeindex"
    index = TimeIndex(path, 0)
    index.maybe_append(1, 0)
    index.delete()
    assert not path.exists()


# ---- whole-index writes --------------------------------------------------------------------------------------


def test_write_entries_writes_once_and_fsyncs_through_file_ops(tmp_path):
    ops = RecordingFileOps()
    path = tmp_path / "00000000000000000100.index.cleaned"
    OffsetIndex.write_entries(path, 100, [155, 300], [4127, 9000], file_ops=ops)
    assert path.read_bytes() == bytes.fromhex("000000370000101f") + offset_index_bytes(100, [(300, 9000)])
    assert ops.calls == [("fsync_fd", "")]


def test_from_entries_returns_an_open_index_equal_to_a_reopened_one(tmp_path):
    path = tmp_path / "x.timeindex"
    index = TimeIndex.from_entries(path, 10, [5, 9, 12], [10, 10, 40])
    assert index.to_arrays()[1].tolist() == [10, 10, 40]
    index.maybe_append(20, 41)
    index.close()
    assert TimeIndex(path, 10).to_arrays()[0].tolist() == [5, 9, 12, 20]


@pytest.mark.parametrize(
    "offsets, positions",
    [([5, 5], [0, 10]), ([5, 6], [10, 0]), ([99, 120], [0, 10]), ([120, 100 + 2**31], [0, 10])],
)
def test_write_entries_rejects_invalid_entries_before_touching_the_file(tmp_path, offsets, positions):
    path = tmp_path / "x.index"
    path.write_bytes(b"old content!")
    with pytest.raises(IndexAppendError):
        OffsetIndex.write_entries(path, 100, offsets, positions)
    assert path.read_bytes() == b"old content!"


def test_write_entries_refuses_more_entries_than_fit(tmp_path):
    with pytest.raises(IndexAppendError, match="fit"):
        OffsetIndex.write_entries(tmp_path / "x.index", 0, [1, 2, 3], [0, 1, 2], max_index_bytes=16)
    with pytest.raises(IndexAppendError):
        TimeIndex.write_entries(tmp_path / "x.timeindex", 0, [3, 2], [1, 2])  # timestamps must increase


# ---- sanity check ------------------------------------------------------------------------------------------


def _index_file(tmp_path, data: bytes, suffix=".index") -> Path:
    path = tmp_path / ("00000000000000000100" + suffix)
    path.write_bytes(data)
    return path


def test_torn_append_fails_sanity_check_at_the_partial_entry(tmp_path):
    good = offset_index_bytes(100, [(110, 4200), (120, 8400)])
    path = _index_file(tmp_path, good + good[:5])
    with pytest.raises(CorruptIndexError) as info:
        OffsetIndex(path, 100).sanity_check()
    assert info.value.position == 16 and info.value.path == str(path)
    assert "not a multiple of the 8-byte entry size" in info.value.reason


def test_truncated_index_fails_sanity_check_and_rebuilding_repairs_it(tmp_path):
    path = _index_file(tmp_path, offset_index_bytes(100, [(110, 4200), (120, 8400)])[:-3])
    index = OffsetIndex(path, 100)
    with pytest.raises(CorruptIndexError) as info:
        index.sanity_check()
    assert info.value.position == 8
    assert index.entries == 1  # the whole entries are served meanwhile, as Kafka does
    index.reset()
    index.append(110, 4200)
    index.append(120, 8400)
    index.flush()
    index.sanity_check()
    assert path.read_bytes() == offset_index_bytes(100, [(110, 4200), (120, 8400)])


def test_untrimmed_preallocated_index_fails_sanity_check_at_the_first_zero_slot(tmp_path):
    path = _index_file(tmp_path, offset_index_bytes(100, [(110, 4200), (120, 8400)]) + bytes(8 * 5))
    with pytest.raises(CorruptIndexError) as info:
        OffsetIndex(path, 100).sanity_check()
    assert info.value.position == 16
    assert "preallocated" in info.value.reason


def test_untrimmed_time_index_fails_sanity_check_at_the_first_zero_slot(tmp_path):
    path = _index_file(tmp_path, time_index_bytes(100, [(1000, 110)]) + bytes(12 * 3), ".timeindex")
    with pytest.raises(CorruptIndexError) as info:
        TimeIndex(path, 100).sanity_check()
    assert info.value.position == 12


@pytest.mark.parametrize(
    "entries, log_size, position, words",
    [
        ([(110, 10), (110, 20)], None, 8, "expected an offset above 110"),
        ([(110, 10), (120, 20), (115, 30)], None, 16, "expected an offset above 120"),
        ([(110, 30), (120, 20)], None, 8, "below the previous"),
        ([(99, 10), (110, 20)], None, 0, "below the segment base 100"),
        ([(110, 10), (120, 2000)], 2000, 8, "not inside the log"),
        ([(110, 10), (120, 20), (130, 30), (125, 10)], None, 24, "entry 3"),  # first problem in file order
    ],
)
def test_offset_index_invariant_violations_are_reported_at_their_entry(tmp_path, entries, log_size, position, words):
    path = _index_file(tmp_path, offset_index_bytes(100, entries))
    with pytest.raises(CorruptIndexError) as info:
        OffsetIndex(path, 100).sanity_check(log_size)
    assert info.value.position == position
    assert words in info.value.reason
    assert str(path) in str(info.value) and f"byte {position}" in str(info.value)


@pytest.mark.parametrize(
    "entries, position, words",
    [
        ([(5, 110), (5, 120)], 12, "expected a timestamp above 5"),
        ([(5, 110), (4, 120)], 12, "expected a timestamp above 5"),
        ([(-1, 110)], 0, "above -1"),
        ([(5, 110), (6, 105)], 12, "below the previous entry's offset"),
        ([(5, 99)], 0, "below the segment base 100"),
    ],
)
def test_time_index_invariant_violations_are_reported_at_their_entry(tmp_path, entries, position, words):
    path = _index_file(tmp_path, time_index_bytes(100, entries), ".timeindex")
    with pytest.raises(CorruptIndexError) as info:
        TimeIndex(path, 100).sanity_check()
    assert info.value.position == position
    assert words in info.value.reason


def test_torn_time_index_fails_sanity_check_at_the_partial_entry(tmp_path):
    path = _index_file(tmp_path, time_index_bytes(100, [(5, 110), (6, 120)]) + b"\x00" * 11, ".timeindex")
    with pytest.raises(CorruptIndexError) as info:
        TimeIndex(path, 100).sanity_check()
    assert info.value.position == 24


def test_empty_and_valid_indexes_pass_sanity_check(tmp_path):
    OffsetIndex(tmp_path / "a.index", 0).sanity_check(0)
    TimeIndex(tmp_path / "a.timeindex", 0).sanity_check()
    path = _index_file(tmp_path, offset_index_bytes(100, [(100, 0), (101, 0), (150, 4000)]))
    OffsetIndex(path, 100).sanity_check(4001)  # an entry at the base and equal positions are legal


# ---- Kafka's build rule ----------------------------------------------------------------------------------------


def test_build_rule_never_indexes_position_zero_and_indexes_past_the_interval():
    positions = [0, 3000, 5000, 9000, 9096, 9097, 14000]
    last_offsets = [9, 19, 29, 39, 49, 54, 59]
    offsets, idx_positions = build_offset_index_entries(positions, last_offsets, 4096)
    # 5000 - 0 > 4096; 9096 - 5000 is not more than 4096 but 9097 - 5000 is; 14000 - 9097 > 4096.
    assert list(zip(offsets.tolist(), idx_positions.tolist())) == [(29, 5000), (54, 9097), (59, 14000)]
    offsets, _ = build_offset_index_entries(positions, last_offsets, 0)
    assert offsets.tolist() == [19, 29, 39, 49, 54, 59]


def test_build_time_entries_use_the_earliest_batch_holding_the_max_and_end_with_the_segment_max():
    positions = [0, 5000, 10000, 15000]
    last_offsets = [9, 19, 29, 39]
    max_ts = [100, 300, 300, 200]
    timestamps, offsets = build_time_index_entries(positions, last_offsets, max_ts, 4096)
    # Indexed batches 1, 2, 3 carry (300, 19) three times; kept once. Final (300, 19) is not larger.
    assert list(zip(timestamps.tolist(), offsets.tolist())) == [(300, 19)]
    timestamps, offsets = build_time_index_entries([0, 100], [4, 9], [7, 8], 4096)
    assert list(zip(timestamps.tolist(), offsets.tolist())) == [(8, 9)]  # only the final entry
    timestamps, _ = build_time_index_entries([0, 5000], [4, 9], [-1, -1], 10)
    assert len(timestamps) == 0  # v0 data: no timestamps, no entries


def test_builders_reject_batch_positions_out_of_order():
    with pytest.raises(ValueError):
        build_offset_index_entries([0, 10, 10], [1, 2, 3])
    with pytest.raises(ValueError):
        build_time_index_entries([0, 10], [1, 2], [5])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(
        st.tuples(st.integers(61, 6000), st.integers(0, 10), st.integers(-1, 40)), max_size=60
    ),
    interval=st.sampled_from([0, 1, 100, 4096, 10_000]),
)
def test_vectorised_builders_equal_the_naive_recover_loop(batches, interval):
    positions, last_offsets, max_ts = [], [], []
    pos, offset = 0, 999
    for size, offset_step, ts in batches:
        offset += offset_step + 1
        positions.append(pos)
        last_offsets.append(offset)
        max_ts.append(ts)
        pos += size
    expected_offsets, expected_times = naive_build(positions, last_offsets, max_ts, interval)
    offsets, idx_positions = build_offset_index_entries(positions, last_offsets, interval)
    timestamps, ts_offsets = build_time_index_entries(positions, last_offsets, max_ts, interval)
    assert list(zip(offsets.tolist(), idx_positions.tolist())) == expected_offsets
    assert list(zip(timestamps.tolist(), ts_offsets.tolist())) == expected_times
    # Whatever the builders produce, the index classes accept and the sanity check passes.
    with tempfile.TemporaryDirectory() as d:
        OffsetIndex.from_entries(Path(d) / "a.index", 1000, offsets, idx_positions).sanity_check(max(pos, 1))
        TimeIndex.from_entries(Path(d) / "a.timeindex", 1000, timestamps, ts_offsets).sanity_check()


# ---- Kafka-written fixtures ----------------------------------------------------------------------------------


@pytest.mark.parametrize("base", INACTIVE_BASES)
def test_kafka_written_offset_index_passes_sanity_and_matches_the_build_rule(base):
    batches = fixture_batches(base)
    log_size = (RAW / fmt.offset_file_name(base, fmt.LOG_SUFFIX)).stat().st_size
    index = OffsetIndex(RAW / fmt.offset_file_name(base, fmt.INDEX_SUFFIX), base, read_only=True)
    index.sanity_check(log_size)
    offsets, positions = build_offset_index_entries([b[0] for b in batches], [b[2] for b in batches])
    # Kafka 2.4 appended one batch per append here, so its append-time index equals the recovery rule.
    assert index.to_arrays()[0].tolist() == offsets.tolist()
    assert index.to_arrays()[1].tolist() == positions.tolist()


@pytest.mark.parametrize("base", INACTIVE_BASES)
def test_kafka_written_offset_index_lookups_find_the_batch_of_every_offset(base):
    batches = fixture_batches(base)
    starts = {pos: i for i, (pos, *_) in enumerate(batches)}
    index = OffsetIndex(RAW / fmt.offset_file_name(base, fmt.INDEX_SUFFIX), base, read_only=True)
    for target in range(base, batches[-1][2] + 1):
        entry_offset, position = index.lookup(target)
        assert entry_offset <= target
        i = starts[position]  # every entry points at a batch start
        if i > 0:
            assert batches[i - 1][2] < entry_offset  # the batch before the entry ends below its offset
        # Scanning forward from the position reaches the batch holding the target.
        holder = next(b for b in batches[i:] if b[2] >= target)
        assert holder[1] <= target <= holder[2]


@pytest.mark.parametrize("base", INACTIVE_BASES)
def test_kafka_written_time_index_passes_sanity_and_has_the_build_rule_timestamps(base):
    batches = fixture_batches(base)
    index = TimeIndex(RAW / fmt.offset_file_name(base, fmt.TIME_INDEX_SUFFIX), base, read_only=True)
    index.sanity_check()
    timestamps, offsets = build_time_index_entries(
        [b[0] for b in batches], [b[2] for b in batches], [b[3] for b in batches]
    )
    kafka_timestamps, kafka_offsets = index.to_arrays()
    assert kafka_timestamps.tolist() == timestamps.tolist()
    # Kafka 2.4 stored the offset of the record holding the max timestamp, not the batch's last offset:
    # the same batch as the rule's shallow offset.
    for kafka_offset, shallow in zip(kafka_offsets.tolist(), offsets.tolist()):
        holder = next(b for b in batches if b[2] == shallow)
        assert holder[1] <= kafka_offset <= holder[2]
    assert index.last_entry[0] == max(b[3] for b in batches)  # the final entry is the segment max


def test_kafka_preallocated_active_indexes_fail_sanity_check(tmp_path):
    raw = copy_kafka_fixture("kafka-2.4-c2/raw", tmp_path / "c2-0")  # with the broker's zero-filled active indexes
    index = OffsetIndex(raw / fmt.offset_file_name(ACTIVE_BASE, fmt.INDEX_SUFFIX), ACTIVE_BASE, read_only=True)
    assert index.entries == 1_310_720  # every slot counts, as when Kafka opens the file
    with pytest.raises(CorruptIndexError) as info:
        index.sanity_check()
    assert info.value.position == 8
    times = TimeIndex(raw / fmt.offset_file_name(ACTIVE_BASE, fmt.TIME_INDEX_SUFFIX), ACTIVE_BASE, read_only=True)
    with pytest.raises(CorruptIndexError) as info:
        times.sanity_check()
    assert info.value.position == 12


def test_rebuilt_fixture_index_equals_the_kafka_written_file(tmp_path):
    base = 288
    batches = fixture_batches(base)
    offsets, positions = build_offset_index_entries([b[0] for b in batches], [b[2] for b in batches])
    path = tmp_path / fmt.offset_file_name(base, fmt.INDEX_SUFFIX)
    OffsetIndex.write_entries(path, base, offsets, positions)
    assert path.read_bytes() == (RAW / fmt.offset_file_name(base, fmt.INDEX_SUFFIX)).read_bytes()


def test_index_arrays_are_copies(tmp_path):
    index = OffsetIndex.from_entries(tmp_path / "a.index", 0, [1, 2], [0, 10])
    offsets, positions = index.to_arrays()
    offsets[:] = 0
    positions[:] = 0
    assert index.entry(1) == (2, 10)
    assert np.array_equal(index.to_arrays()[0], [1, 2])


def test_numpy_integers_are_accepted_where_ints_are(tmp_path):
    index = OffsetIndex(tmp_path / "a.index", np.int64(100))
    index.append(np.int64(150), np.int32(4096))
    assert index.lookup(np.int64(151)) == (150, 4096)
    times = TimeIndex(tmp_path / "a.timeindex", np.int64(100))
    assert times.maybe_append(np.int64(7), np.int64(150))


def test_rename_after_the_file_vanished_rewrites_every_entry_at_the_next_flush(tmp_path):
    index = OffsetIndex(tmp_path / "a.index", 0)
    index.append(1, 0)
    index.flush()
    (tmp_path / "a.index").unlink()
    index.append(2, 10)
    index.rename_to(tmp_path / "b.index")
    index.flush()
    assert (tmp_path / "b.index").read_bytes() == offset_index_bytes(0, [(1, 0), (2, 10)])
