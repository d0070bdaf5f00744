"""Index entries of a window of batches at once (issues 19/22): `LogSegment.append_batches` through
`interval_entries` and the array appends of `OffsetIndex`/`TimeIndex` leave the bytes the per-batch loop left.

The reference here is the loop `append_batches` ran before (one `append` rule per batch, one `OffsetIndex.append`
and `TimeIndex.maybe_append` per entry), kept verbatim, over random batch streams cut into random windows.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from segments.codec import format as fmt
from segments.codec.errors import IndexAppendError
from segments.files.index import OffsetIndex, TimeIndex, interval_entries
from segments.files.segment import LogSegment

BASE = 1000


class ReferenceIndexer:
    """The per-batch loop of `LogSegment.append_batches` before issue 19/22, on its own index files."""

    def __init__(self, directory, interval: int, max_index_bytes: int) -> None:
        self.offset_index = OffsetIndex(directory / "ref.index", BASE, max_index_bytes=max_index_bytes)
        self.time_index = TimeIndex(directory / "ref.timeindex", BASE, max_index_bytes=max_index_bytes)
        self.interval = interval
        self.size_bytes = 0
        self.bytes_since = 0
        self.max_ts = fmt.NO_TIMESTAMP
        self.shallow = BASE

    def append_batches(self, data_len, positions, last_offsets, max_timestamps) -> None:
        start = self.size_bytes
        self.size_bytes += data_len
        positions = np.asarray(positions, dtype=np.int64)
        sizes = np.diff(np.append(positions, data_len))
        for pos, size, last, ts in zip(positions.tolist(), sizes.tolist(), list(last_offsets), list(max_timestamps)):
            if ts > self.max_ts:
                self.max_ts = ts
                self.shallow = last
            if self.bytes_since > self.interval:
                self.offset_index.append(last, start + pos)
                self.time_index.maybe_append(self.max_ts, self.shallow)
                self.bytes_since = 0
            self.bytes_since += size

    def finalise(self) -> None:
        if self.max_ts != fmt.NO_TIMESTAMP:
            self.time_index.maybe_append(self.max_ts, self.shallow, skip_full_check=True)
        self.offset_index.flush()
        self.time_index.flush()


def random_stream(rng: random.Random, count: int):
    """(sizes, last offsets, max timestamps) of `count` batches: sizes from an empty header to 40 KiB, timestamps
    out of order with -1s and repeats."""
    sizes, last_offsets, max_ts = [], [], []
    offset = BASE - 1
    ts = rng.randrange(0, 1000)
    for _ in range(count):
        sizes.append(rng.choice([61, 78, rng.randrange(61, 600), rng.randrange(600, 5000), rng.randrange(5000, 40_000)]))
        offset += rng.randrange(1, 50)
        last_offsets.append(offset)
        kind = rng.random()
        if kind < 0.1:
            max_ts.append(-1)
        elif kind < 0.3:
            max_ts.append(ts)  # a repeat of the last one
        else:
            ts = max(0, ts + rng.randrange(-300, 400))  # not monotonic
            max_ts.append(ts)
    return sizes, last_offsets, max_ts


@pytest.mark.parametrize("interval", [0, 1, 4096, 20_000, 2**31 - 1, 2**62])
@pytest.mark.parametrize("seed", range(6))
def test_window_entries_equal_the_per_batch_loop(tmp_path, interval, seed):
    rng = random.Random(seed * 1000 + interval % 997)
    sizes, last_offsets, max_ts = random_stream(rng, rng.randrange(1, 400))
    segment = LogSegment(tmp_path, BASE, suffix=".cleaned", writable=True, create=True, index_interval_bytes=interval)
    reference = ReferenceIndexer(tmp_path, interval, fmt.SEGMENT_INDEX_BYTES_DEFAULT)
    i = 0
    while i < len(sizes):
        # Windows of random length; sometimes data before the first batch (not counted by either).
        j = min(len(sizes), i + rng.randrange(1, 60))
        lead = rng.choice([0, 0, 0, 13])
        positions = np.cumsum([lead] + sizes[i:j - 1]).astype(np.int64) if j - i > 1 else np.array([lead], np.int64)
        data_len = int(positions[-1]) + sizes[j - 1]
        window = (positions, np.array(last_offsets[i:j], np.int64), np.array(max_ts[i:j], np.int64))
        segment.append_batches(bytes(data_len), *window)
        reference.append_batches(data_len, *window)
        assert segment.offset_index.entries == reference.offset_index.entries
        assert segment.time_index.entries == reference.time_index.entries
        assert (segment._bytes_since_last_index_entry, segment._max_timestamp_so_far,
                segment._shallow_offset_of_max_timestamp) == (reference.bytes_since, reference.max_ts, reference.shallow)
        i = j
    segment.finalise()
    reference.finalise()
    assert segment.paths.index.read_bytes() == (tmp_path / "ref.index").read_bytes()
    assert segment.paths.timeindex.read_bytes() == (tmp_path / "ref.timeindex").read_bytes()
    segment.close()


class ArrayAppends(ReferenceIndexer):
    """`LogSegment.append_batches` of the thirteenth round: `interval_entries`, then `OffsetIndex.append_many` and
    `TimeIndex.maybe_append_many` of the entries it found (each raises its own error, the offset index's first)."""

    def append_batches(self, data_len, positions, last_offsets, max_timestamps) -> None:
        start = self.size_bytes
        self.size_bytes += data_len
        indexed, timestamps, offsets, state = interval_entries(
            positions, last_offsets, max_timestamps, end=data_len, index_interval_bytes=self.interval,
            bytes_since=self.bytes_since, max_timestamp=self.max_ts, shallow_offset=self.shallow)
        if len(indexed):
            self.offset_index.append_many(last_offsets[indexed], start + positions[indexed])
            self.time_index.maybe_append_many(timestamps, offsets)
        self.bytes_since, self.max_ts, self.shallow = state


@pytest.mark.parametrize("max_index_bytes", [8 * 7, 12 * 9, 8 * 40])
@pytest.mark.parametrize("seed", range(4))
def test_a_run_that_fills_an_index_appends_and_raises_as_the_array_appends(tmp_path, max_index_bytes, seed):
    """Indexes of a few entries: the run that fills one (its checks in the compiled call fail, so its entries go
    through the array appends) takes the entries the array appends took, and raises their error."""
    rng = random.Random(seed)
    sizes, last_offsets, max_ts = random_stream(rng, 300)
    segment = LogSegment(tmp_path, BASE, suffix=".cleaned", writable=True, create=True, index_interval_bytes=0,
                         max_index_bytes=max_index_bytes)
    reference = ArrayAppends(tmp_path, 0, max_index_bytes)
    failures: list[str] = []
    i = 0
    while i < len(sizes) and not failures:
        j = min(len(sizes), i + rng.randrange(1, 30))
        positions = np.cumsum([0] + sizes[i:j - 1]).astype(np.int64)
        data_len = int(positions[-1]) + sizes[j - 1]
        window = (positions, np.array(last_offsets[i:j], np.int64), np.array(max_ts[i:j], np.int64))
        outcomes = []
        for appender, args in ((segment.append_batches, (bytes(data_len), *window)),
                               (reference.append_batches, (data_len, *window))):
            try:
                appender(*args)
                outcomes.append("")
            except IndexAppendError as exc:  # the same message, but for the files' names
                outcomes.append(str(exc).split(": ", 1)[1] + type(exc).__name__)
        assert outcomes[0] == outcomes[1]
        failures = [o for o in outcomes if o]
        assert segment.offset_index.entries == reference.offset_index.entries
        assert segment.time_index.entries == reference.time_index.entries
        i = j
    assert failures  # an index filled


def test_interval_entries_continue_across_windows_like_one_run():
    rng = random.Random(7)
    sizes, last_offsets, max_ts = random_stream(rng, 300)
    positions = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    end = int(positions[-1]) + sizes[-1]
    whole = interval_entries(positions, np.array(last_offsets), np.array(max_ts), end=end, index_interval_bytes=4096)
    state = (0, fmt.NO_TIMESTAMP, BASE)
    parts: list[list[np.ndarray]] = [[], [], []]
    for lo, hi in [(0, 1), (1, 120), (120, 121), (121, 300)]:
        stop = int(positions[hi]) if hi < len(positions) else end
        batch, ts, off, state = interval_entries(
            positions[lo:hi], np.array(last_offsets[lo:hi]), np.array(max_ts[lo:hi]), end=stop,
            index_interval_bytes=4096, bytes_since=state[0], max_timestamp=state[1], shallow_offset=state[2],
        )
        for part, values in zip(parts, (batch + lo, ts, off)):
            part.append(values)
    for part, expected in zip(parts, whole[:3]):
        assert np.concatenate(part).tolist() == expected.tolist()
    assert state == whole[3]


# ---- the array appends check what the entry-by-entry ones check ---------------------------------------------


def _dir(tmp_path, name: str):
    (tmp_path / name).mkdir()
    return tmp_path / name


def _outcome(index, calls):
    try:
        result = calls()
    except (IndexAppendError, ValueError, TypeError) as exc:  # the same exception, message and partial state
        result = (type(exc), str(exc).replace("/bulk/", "/loop/"))
    return result, index.to_arrays()[0].tolist(), index.to_arrays()[1].tolist()


def _append_each(index: OffsetIndex, entries: list[tuple[int, int]]) -> None:
    for offset, position in entries:
        index.append(offset, position)


@pytest.mark.parametrize("seed", range(200))
def test_append_many_equals_a_loop_of_append(tmp_path, seed):
    rng = random.Random(seed)
    max_index_bytes = rng.choice([8 * 5, 8 * 40, fmt.SEGMENT_INDEX_BYTES_DEFAULT])
    bulk = OffsetIndex(_dir(tmp_path, "bulk") / "a.index", BASE, max_index_bytes=max_index_bytes)
    loop = OffsetIndex(_dir(tmp_path, "loop") / "a.index", BASE, max_index_bytes=max_index_bytes)
    offset, position = BASE + rng.randrange(0, 3), 0
    for _ in range(rng.randrange(0, 4)):
        rounds = []
        for _ in range(rng.randrange(0, 12)):
            offset += rng.choice([1, 1, 5, 0 if rng.random() < 0.05 else 1, -2 if rng.random() < 0.03 else 1])
            position += rng.choice([0, 100, 4000, -1 if rng.random() < 0.03 else 10])
            rounds.append((offset, position))
        if rng.random() < 0.03:
            rounds.append((BASE + 2**31, position))  # past the relative range
        offsets = np.array([o for o, _ in rounds], np.int64)
        positions = np.array([p for _, p in rounds], np.int64)
        got = _outcome(bulk, lambda: bulk.append_many(offsets, positions))
        want = _outcome(loop, lambda: _append_each(loop, rounds))
        assert got == want
        if isinstance(got[0], tuple):
            break


@pytest.mark.parametrize("seed", range(200))
def test_maybe_append_many_equals_a_loop_of_maybe_append(tmp_path, seed):
    rng = random.Random(seed)
    max_index_bytes = rng.choice([12 * 4, 12 * 30, fmt.SEGMENT_INDEX_BYTES_DEFAULT])
    bulk = TimeIndex(_dir(tmp_path, "bulk") / "a.timeindex", BASE, max_index_bytes=max_index_bytes)
    loop = TimeIndex(_dir(tmp_path, "loop") / "a.timeindex", BASE, max_index_bytes=max_index_bytes)
    ts, offset = rng.choice([-1, 0, 50]), BASE
    for _ in range(rng.randrange(0, 4)):
        candidates = []
        for _ in range(rng.randrange(0, 12)):
            ts += rng.choice([0, 0, 1, 30, -5 if rng.random() < 0.05 else 0])
            offset += rng.choice([0, 1, 7, -3 if rng.random() < 0.05 else 0])
            candidates.append((ts, offset))
        if rng.random() < 0.03:
            candidates.append((ts + 1, BASE - 1))  # below the base
        timestamps = np.array([t for t, _ in candidates], np.int64)
        offsets = np.array([o for _, o in candidates], np.int64)
        got = _outcome(bulk, lambda: bulk.maybe_append_many(timestamps, offsets))
        want = _outcome(loop, lambda: sum(loop.maybe_append(t, o) for t, o in candidates))
        assert got == want
        if isinstance(got[0], tuple):
            break


def test_array_appends_take_lists_and_refuse_what_append_refuses(tmp_path):
    index = OffsetIndex(tmp_path / "a.index", BASE)
    index.append_many([], [])
    index.append_many([BASE + 1, BASE + 3], [0, 10])
    with pytest.raises(IndexAppendError, match="above the last entry's offset"):
        index.append_many([BASE + 4, BASE + 4], [20, 30])
    assert index.to_arrays()[0].tolist() == [BASE + 1, BASE + 3, BASE + 4]
    with pytest.raises(TypeError):
        index.append_many([1.5], [0])  # not an int: append's own TypeError
    times = TimeIndex(tmp_path / "a.timeindex", BASE)
    assert times.maybe_append_many([5, 5, 9], [BASE, BASE + 1, BASE + 2]) == 2
    with pytest.raises(IndexAppendError, match="below the last entry's timestamp"):
        times.maybe_append_many([9, 8], [BASE + 2, BASE + 2])
    with pytest.raises(ValueError):
        times.maybe_append_many([1, 2], [BASE])
