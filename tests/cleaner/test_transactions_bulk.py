"""Transactions without per-batch Python: the survey's producer and transaction tracking (compiled walks per
window: `cleaner._kernels.producer_rows` reads the markers' control types, `window_producers` the producers)
and the recopy's marker and producer decisions equal the per-batch logic they replaced, kept here as the
reference, on random logs with every kind of control batch; a malformed control record is reported as the
Python decoder reports it, with its file and byte."""

from __future__ import annotations

import bisect
import random
from types import SimpleNamespace

import numpy as np
import pytest

from cleaner import survey as survey_module
from cleaner.recopy import _markers_discardable, _producer_last_batches
from cleaner.survey import ProducerState, Transaction, survey_log
from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.records import Header, Record, batch_crc, decode_batch, decode_control_key, encode_batch
from segments.partition.log import PartitionLog

from . import builders as b
from .builders import DAY_MS, ROLL, T0, abort, batch, build_log, clean, commit, partition_dir, txn_batch

MARKER_VALUE = fmt.END_TXN_MARKER_VALUE.pack(0, 0)


def _control(pid: int, control_type: int, *, records: int = 1, **kwargs) -> bytes:
    """A control batch of `records` records of `control_type` (kwargs: compression, headers, delete_horizon_ms)."""
    headers = kwargs.pop("headers", ())
    recs = [Record(offset=k, timestamp=T0, key=fmt.CONTROL_KEY.pack(0, control_type), value=MARKER_VALUE,
                   headers=headers) for k in range(records)]
    return encode_batch(recs, base_offset=0, is_transactional=pid >= 0, is_control=True, producer_id=pid,
                        producer_epoch=0 if pid >= 0 else -1, **kwargs)


def _empty_control(pid: int) -> bytes:
    """A control batch left with no records by a cleaner."""
    return encode_batch([], base_offset=0, is_transactional=True, is_control=True, producer_id=pid, producer_epoch=0,
                        last_offset_delta=0, base_timestamp=T0, max_timestamp=T0)


def _mixed_log(directory, seed: int, *, leave_open: bool) -> None:
    """Random transactional, idempotent and plain batches, and control batches of every kind: COMMIT and ABORT
    (plain, compressed, with a record header, of two records, stamped with a delete horizon), markers of no open
    transaction, other control types, empty control batches, one without a producer; rolls; with `leave_open`
    transactions stay open and the active segment keeps what was written last."""
    rnd = random.Random(seed)
    steps: list = []
    open_txns: set[int] = set()
    for i in range(rnd.randint(20, 70)):
        recs = [(b"k%d" % rnd.randint(0, 5), None if rnd.random() < 0.2 else b"v", T0 + i)
                for _ in range(rnd.randint(1, 3))]
        kind = rnd.random()
        pid = rnd.choice([1, 2, 3, 4])
        if kind < 0.35:
            steps.append(txn_batch(recs, pid=pid, compression=rnd.choice([0, 0, 1, 3])))
            open_txns.add(pid)
        elif kind < 0.6:
            end = fmt.CONTROL_TYPE_COMMIT if rnd.random() < 0.6 else fmt.CONTROL_TYPE_ABORT
            variant = rnd.random()
            if variant < 0.5:
                steps.append((commit if end == fmt.CONTROL_TYPE_COMMIT else abort)(pid, timestamp=T0 + i))
            elif variant < 0.6:
                steps.append(_control(pid, end, compression=rnd.choice([1, 2, 3, 4])))
            elif variant < 0.7:
                steps.append(_control(pid, end, headers=(Header("h", b"x"),)))
            elif variant < 0.8:
                steps.append(_control(pid, end, records=2))
            else:
                steps.append(_control(pid, end, delete_horizon_ms=T0 + rnd.randint(-DAY_MS, 3 * DAY_MS)))
            open_txns.discard(pid)
        elif kind < 0.7:
            steps.append(_control(rnd.choice([pid, -1]), rnd.choice([2, 3, 7, -5])))  # not a transaction marker
        elif kind < 0.75:
            steps.append(_empty_control(pid))
        elif kind < 0.85:
            steps.append(batch(recs, producer_id=10 + pid, producer_epoch=0, base_sequence=0))
        else:
            steps.append(batch(recs))
        if rnd.random() < 0.15:
            steps.append(ROLL)
    if not leave_open:
        steps += [commit(pid, timestamp=T0 + 100) for pid in sorted(open_txns)]
    build_log(directory, steps, roll_at_end=not leave_open)


def _reference_survey(directory) -> tuple[dict[int, ProducerState], list[Transaction]]:
    """Producers and transactions by the per-batch logic the survey replaced (every batch decoded in Python)."""
    producers: dict[int, ProducerState] = {}
    transactions: list[Transaction] = []
    with PartitionLog.open(directory, mode="reader") as log:
        for entry in log.iter_batches():
            h = entry.header
            if h.magic != fmt.MAGIC_V2 or h.producer_id < 0:
                continue
            state = producers.setdefault(h.producer_id, ProducerState(h.producer_id))
            state.last_entry_offset = h.last_offset
            state.last_entry_is_control = h.is_control
            state.last_timestamp = max(state.last_timestamp, h.max_timestamp)
            if not h.is_control:
                state.last_data_offset = h.last_offset
                if h.is_transactional:
                    if state.open_txn_first_offset < 0:
                        state.open_txn_first_offset = h.base_offset
                        state.open_txn_data_batches = 0
                    state.open_txn_data_batches += 1
                continue
            if h.records_count == 0:
                continue
            _, control_type = decode_control_key(entry.records[0].key)
            if control_type not in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT):
                continue
            first = state.open_txn_first_offset
            transactions.append(Transaction(h.producer_id, first if first >= 0 else h.last_offset, h.last_offset,
                                            control_type, state.open_txn_data_batches))
            state.open_txn_first_offset = -1
            state.open_txn_data_batches = 0
    for state in producers.values():
        if state.open_txn_first_offset >= 0:
            transactions.append(Transaction(state.producer_id, state.open_txn_first_offset, -1, -1,
                                            state.open_txn_data_batches))
    return producers, transactions


def _survey(directory):
    with PartitionLog.open(directory, mode="reader") as log:
        return survey_log(log)


@pytest.mark.parametrize("seed", range(30))
def test_the_survey_tracks_producers_and_transactions_as_the_per_batch_logic(tmp_path, seed):
    d = partition_dir(tmp_path)
    _mixed_log(d, seed, leave_open=seed % 3 == 0)
    producers, transactions = _reference_survey(d)
    found = _survey(d)
    assert list(found.producers.items()) == list(producers.items())  # insertion order too
    assert found.transactions == transactions
    for hw in (None, 0, 5, 40, 10**6):
        firsts = [p.open_txn_first_offset for p in producers.values() if p.open_txn_first_offset >= 0]
        if hw is not None:
            firsts += [t.first_offset for t in transactions if t.marker_offset >= hw]
        assert found.first_unstable_offset(hw) == (min(firsts) if firsts else None)
    aborted = sorted((t for t in transactions if t.aborted and 3 <= t.marker_offset < 60), key=lambda t: t.marker_offset)
    assert found.transaction_table.rows(found.aborted_rows_ending_in(3, 60)) == aborted


@pytest.mark.parametrize("seed", range(8))
def test_plain_and_stamped_markers_need_no_python_decoder(tmp_path, seed, monkeypatch):
    """Markers as Kafka writes them, and as a cleaning pass stamps them (a long timestamp delta), are read by
    the kernel alone, in inactive segments (CRC checked by the scan) and in the active one (checked with them)."""
    d = partition_dir(tmp_path)
    rnd = random.Random(seed)
    steps: list = []
    for i in range(40):
        pid = rnd.choice([1, 2, 3])
        steps.append(txn_batch([(b"k%d" % (i % 4), b"v", T0 + i)], pid=pid))
        steps.append(abort(pid, timestamp=T0 + i) if rnd.random() < 0.3 else commit(pid, timestamp=T0 + i))
        if rnd.random() < 0.2:
            steps.append(ROLL)
    build_log(d, steps, roll_at_end=False)
    clean(d, now_ms=T0 + DAY_MS, settings={"delete.retention.ms": 1000})  # stamps the markers left with no data
    expected = _reference_survey(d)

    def no_python(*args):
        raise AssertionError("a plain marker was decoded in Python")

    monkeypatch.setattr(survey_module, "_decode_control_type", no_python)
    found = _survey(d)
    assert (list(found.producers.items()), found.transactions) == (list(expected[0].items()), expected[1])


def _window_results(directory, window_bytes: int):
    with PartitionLog.open(directory, mode="reader") as log:
        for seg in log.segments[:-1]:
            for _, result in seg.scan_windows(window_bytes=window_bytes, verify_crc=False):
                yield result


def _closed(survey, pid: int) -> list[Transaction]:
    return sorted((t for t in survey.transactions if t.producer_id == pid and t.marker_offset >= 0),
                  key=lambda t: t.first_offset)


def _reference_aborted(survey, result) -> np.ndarray:
    """The survey's former aborted_batches, per producer."""
    out = np.zeros(result.n_batches, dtype=bool)
    pids = result.producer_id
    candidates = np.flatnonzero(result.is_transactional & (pids >= 0))
    for pid in np.unique(pids[candidates]).tolist():
        closed = _closed(survey, pid)
        if not closed:
            continue
        firsts = np.array([t.first_offset for t in closed])
        markers = np.array([t.marker_offset for t in closed])
        aborted = np.array([t.aborted for t in closed])
        idx = candidates[pids[candidates] == pid]
        j = np.searchsorted(firsts, result.base_offset[idx], side="right") - 1
        inside = (j >= 0) & (result.base_offset[idx] <= markers[np.maximum(j, 0)])
        out[idx] = inside & aborted[np.maximum(j, 0)]
    return out


def _reference_lookup(survey, pid: int, offset: int) -> tuple[bool, bool]:
    """(is a transaction marker, discardable): the survey's former per-marker lookups."""
    closed = _closed(survey, pid)
    markers = [t.marker_offset for t in closed]
    j = bisect.bisect_left(markers, offset)
    if j < len(markers) and markers[j] == offset:
        return True, closed[j].data_batches == 0
    return False, False


def _reference_markers_discardable(result, ctx, data_written):
    out = np.zeros(result.n_batches, dtype=bool)
    written_so_far = ctx.txn_data_written
    pids = result.producer_id
    by_pid: dict[int, np.ndarray] = {}
    since: dict[int, int] = {}
    if written_so_far is not None:
        txn_written = np.flatnonzero(data_written & result.is_transactional & (pids >= 0))
        for pid in np.unique(pids[txn_written]).tolist():
            by_pid[pid] = txn_written[pids[txn_written] == pid]
    for i in np.flatnonzero(result.is_control).tolist():
        pid, offset = int(pids[i]), int(result.base_offset[i])
        is_marker, discardable = _reference_lookup(ctx.survey, pid, offset)
        if result.records_count[i] == 0:
            out[i] = True
        elif written_so_far is None:
            out[i] = discardable
        elif is_marker:
            count = written_so_far.get(pid, 0)
            if pid in by_pid:
                mine = by_pid[pid]
                count += int(np.count_nonzero((mine > since.get(pid, -1)) & (mine < i)))
            out[i] = count == 0
            written_so_far[pid] = 0
            since[pid] = i
    for pid, mine in by_pid.items():
        after = int(np.count_nonzero(mine > since.get(pid, -1)))
        if after and written_so_far is not None:
            written_so_far[pid] = written_so_far.get(pid, 0) + after
    return out


def _reference_producer_last_batches(result, ctx):
    out = np.zeros(result.n_batches, dtype=bool)
    pids = result.producer_id
    has_pid = np.nonzero((pids >= 0) & (result.magic == fmt.MAGIC_V2))[0]
    for pid in np.unique(pids[has_pid]).tolist():
        state = ctx.survey.producers.get(pid)
        if state is None:
            continue
        if ctx.now_ms - state.last_timestamp >= ctx.producer_expiration_ms and state.open_txn_first_offset < 0:
            continue
        idx = has_pid[pids[has_pid] == pid]
        last = result.last_offset[idx]
        if state.last_data_offset >= 0:
            out[idx] = last == state.last_data_offset
        else:
            out[idx] = result.is_control[idx] & (last == state.last_entry_offset)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_the_recopy_decides_markers_and_producers_last_batches_as_the_per_batch_logic(tmp_path, seed):
    """Also the survey's searches they and the aborted data rule use (compiled binary searches)."""
    d = partition_dir(tmp_path)
    _mixed_log(d, seed, leave_open=seed % 3 == 0)
    survey = _survey(d)
    rnd = random.Random(seed)
    for window_bytes in (256, 1 << 20):
        written_new: dict[int, int] = {}
        written_old: dict[int, int] = {}
        for result in _window_results(d, window_bytes):
            aborted = survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional)
            assert np.array_equal(aborted, _reference_aborted(survey, result))
            written = ~result.is_control & (np.array([rnd.random() for _ in range(result.n_batches)]) < 0.6)
            for partial in (True, False):
                new = SimpleNamespace(survey=survey, txn_data_written=None if partial else written_new)
                old = SimpleNamespace(survey=survey, txn_data_written=None if partial else written_old)
                assert np.array_equal(_markers_discardable(result, new, written),
                                      _reference_markers_discardable(result, old, written))
                assert written_new == written_old
            for now_ms, expiration_ms in ((T0, DAY_MS), (T0 + 30, 10), (T0 + 10 * DAY_MS, DAY_MS), (0, 2**62)):
                ctx = SimpleNamespace(survey=survey, now_ms=now_ms, producer_expiration_ms=expiration_ms)
                assert np.array_equal(_producer_last_batches(result, ctx), _reference_producer_last_batches(result, ctx))


# ---- malformed control records: reported as the Python decoder reports them -----------------------------------


def _resigned(data: bytes) -> bytes:
    """`data` (one v2 batch) with its CRC-32C recomputed, so that only what it covers is wrong."""
    crc = batch_crc(data, 0, len(data))
    return data[: fmt.CRC_OFFSET] + crc.to_bytes(fmt.CRC_BYTES, "big") + data[fmt.CRC_OFFSET + fmt.CRC_BYTES:]


def _short_key() -> bytes:
    recs = [Record(offset=0, timestamp=T0, key=b"\x00\x01", value=MARKER_VALUE)]
    return encode_batch(recs, base_offset=0, is_transactional=True, is_control=True, producer_id=1, producer_epoch=0)


def _negative_version() -> bytes:
    recs = [Record(offset=0, timestamp=T0, key=fmt.CONTROL_KEY.pack(-1, 1), value=MARKER_VALUE)]
    return encode_batch(recs, base_offset=0, is_transactional=True, is_control=True, producer_id=1, producer_epoch=0)


def _header_not_utf8() -> bytes:
    data = bytearray(_control(1, fmt.CONTROL_TYPE_COMMIT, headers=(Header("\x7f", b"x"),)))
    data[data.rindex(b"\x7f")] = 0xFF
    return _resigned(bytes(data))


def _count_past_records() -> bytes:
    """recordsCount 2 over one record."""
    data = bytearray(commit(1))
    data[fmt.RECORDS_COUNT_OFFSET : fmt.RECORDS_COUNT_OFFSET + fmt.RECORDS_COUNT_BYTES] = (2).to_bytes(4, "big")
    data[fmt.LAST_OFFSET_DELTA_OFFSET : fmt.LAST_OFFSET_DELTA_OFFSET + fmt.LAST_OFFSET_DELTA_BYTES] = (1).to_bytes(4, "big")
    return _resigned(bytes(data))


def _expected_error(bad: bytes, position: int) -> tuple[str, int]:
    """What the Python decoder reports for the control batch `bad` at file byte `position`."""
    try:
        batch_ = decode_batch(bad)
    except CorruptRecordError as exc:
        return exc.reason, position + exc.position
    with pytest.raises(CorruptRecordError) as info:
        decode_control_key(batch_.records[0].key)
    return info.value.reason, position


@pytest.mark.parametrize("make", [_short_key, _negative_version, _header_not_utf8, _count_past_records])
@pytest.mark.parametrize("active", [False, True])
def test_a_malformed_control_record_is_reported_with_its_file_and_byte(tmp_path, make, active):
    d = partition_dir(tmp_path)
    first = txn_batch([(b"k", b"v")], pid=1)
    build_log(d, [first, commit(1), commit(1)] + ([] if active else [ROLL, commit(2)]), roll_at_end=False)
    bad = (1).to_bytes(fmt.BASE_OFFSET_BYTES, "big") + make()[fmt.BASE_OFFSET_BYTES:]  # at offset 1 (not in the CRC)
    path = b.write_raw_segment(d, 0, first + bad)
    reason, position = _expected_error(bad, len(first))
    with pytest.raises(CorruptRecordError) as info:
        _survey(d)
    assert (info.value.reason, info.value.position, info.value.path) == (reason, position, str(path))


def test_a_window_out_of_offset_order_is_reported_before_its_malformed_control_record(tmp_path):
    """The read-ahead thread decodes a window's control batches; what they raise waits for the window's offset
    checks on the round's thread, so a window wrong both ways reports its offsets, as when one thread did both."""
    d = partition_dir(tmp_path)
    first = txn_batch([(b"k", b"v")], pid=1)
    build_log(d, [first, commit(1), commit(1), ROLL, commit(2)], roll_at_end=False)
    next_base = b.segment_bases(d)[1]
    bad = next_base.to_bytes(fmt.BASE_OFFSET_BYTES, "big") + _short_key()[fmt.BASE_OFFSET_BYTES:]  # the next one's
    path = b.write_raw_segment(d, 0, first + bad)
    assert _expected_error(bad, len(first))[0]  # malformed as well
    with pytest.raises(CorruptRecordError) as info:
        _survey(d)
    assert info.value.reason.startswith(f"batch offsets [{next_base}, {next_base}] reach past the segment's range"), \
        info.value.reason
    assert (info.value.position, info.value.path) == (len(first), str(path))


def test_a_control_batch_with_a_bad_crc_in_the_active_segment_is_reported(tmp_path):
    """The active segment's CRCs are not checked by the survey's scan; its control batches' still are."""
    d = partition_dir(tmp_path)
    first = txn_batch([(b"k", b"v")], pid=1)
    build_log(d, [first, commit(1)], roll_at_end=False)
    path = d / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the marker's coordinator epoch
    path.write_bytes(bytes(data))
    reason, position = _expected_error(bytes(data[len(first):]), len(first))
    assert reason.startswith("CRC-32C mismatch")
    with pytest.raises(CorruptRecordError) as info:
        _survey(d)
    assert (info.value.reason, info.value.position, info.value.path) == (reason, position, str(path))


@pytest.mark.parametrize("seed", range(12))
def test_a_round_cleans_to_the_same_bytes_whatever_its_window_size(tmp_path, seed, monkeypatch):
    """The round's files and figures do not depend on where its windows end: a ring of 256-byte windows (a window a
    batch or two, so every per-window step meets its state carried from the window before: producers, open
    transactions, the index taken in the survey, the recopy's output) cleans each log as the round's own window size
    does (a segment in one window)."""
    from cleaner.survey import WINDOW_BYTES
    from segments.files.readahead import WindowRing
    from segments.files.segment import LogSegment

    windows: list[int] = []
    scan_windows = LogSegment.scan_windows

    def counting(self, *args, **kwargs):
        for item in scan_windows(self, *args, **kwargs):
            windows.append(kwargs["window_bytes"])
            yield item

    monkeypatch.setattr(LogSegment, "scan_windows", counting)
    outcomes = []
    for window_bytes in (WINDOW_BYTES, 256):
        d = partition_dir(tmp_path / str(window_bytes))
        _mixed_log(d, seed, leave_open=seed % 3 == 0)
        windows.clear()
        result = clean(d, now_ms=T0 + DAY_MS, settings={"delete.retention.ms": 1000}, ring=WindowRing(window_bytes))
        files = {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}
        figures = {k: v for k, v in result.as_dict().items() if not k.endswith("_s")}
        outcomes.append((len(windows), files, figures))
    (whole, files_a, figures_a), (small, files_b, figures_b) = outcomes
    assert small > 2 * whole  # the small ring did cut the segments into many windows
    assert files_b == files_a
    assert figures_b == figures_a
