"""Transaction index: lazy creation, round trips, Kafka's collect semantics, truncation and corruption."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segments.codec import format as fmt
from segments.codec.errors import CorruptIndexError, IndexAppendError, LogStateError
from segments.files.fileio import FileOps
from segments.files.txnindex import AbortedTxn, AbortedTxns, TransactionIndex, TxnIndexSearchResult

BASE = 1000


class RecordingFileOps(FileOps):
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


def txn(producer_id: int, first: int, last: int, lso: int) -> AbortedTxn:
    return AbortedTxn(fmt.TXN_INDEX_VERSION, producer_id, first, last, lso)


def encoded(txns) -> bytes:
    return b"".join(
        fmt.TXN_INDEX_ENTRY.pack(t.version, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
        for t in txns
    )


def naive_collect(txns, fetch_offset, upper_bound_offset):
    """Kafka's TransactionIndex.collectAbortedTxns, line by line."""
    found = []
    for t in txns:
        if t.last_offset >= fetch_offset and t.first_offset < upper_bound_offset:
            found.append(t)
        if t.last_stable_offset >= upper_bound_offset:
            return tuple(found), True
    return tuple(found), False


@st.composite
def txn_lists(draw, max_size=25):
    """Entries with strictly increasing ABORT-marker offsets at or above BASE (first offsets may be earlier)."""
    count = draw(st.integers(0, max_size))
    last = BASE - 1
    result = []
    for _ in range(count):
        last += draw(st.integers(1, 30))
        first = last - draw(st.integers(0, 60))
        lso = draw(st.integers(first - 10, last + 40))
        result.append(txn(draw(st.integers(-1, 2**40)), first, last, lso))
    return result


# ---- lazy creation and round trips ---------------------------------------------------------------------------


def test_file_does_not_exist_until_the_first_entry_is_flushed(tmp_path):
    path = tmp_path / "00000000000000001000.txnindex"
    index = TransactionIndex(path, BASE)
    assert not path.exists()
    assert index.entries == 0 and index.all_aborted() == () and index.last_offset is None
    index.sanity_check()
    index.flush()
    index.fsync()
    assert not path.exists()
    index.append(txn(7, 990, 1005, 980))
    assert not path.exists()  # deferred until flush
    index.flush()
    assert path.read_bytes() == encoded([txn(7, 990, 1005, 980)])
    assert path.stat().st_size == 34


def test_entry_bytes_follow_the_spec_layout(tmp_path):
    path = tmp_path / "x.txnindex"
    index = TransactionIndex(path, 0)
    index.append(AbortedTxn(0, 0x0102030405060708, 0x10, 0x20, 0x18))
    index.close()
    assert path.read_bytes() == bytes.fromhex(
        "0000" "0102030405060708" "0000000000000010" "0000000000000020" "0000000000000018"
    )


def test_reopened_index_serves_the_same_entries(tmp_path):
    path = tmp_path / "x.txnindex"
    entries = [txn(1, 900, 1001, 950), txn(2, 1001, 1010, 1002), txn(1, 1011, 1020, 1011)]
    index = TransactionIndex(path, BASE)
    for t in entries:
        index.append(t)
    index.close()
    reopened = TransactionIndex(path, BASE)
    assert reopened.all_aborted() == tuple(entries)
    assert reopened.entry(1) == entries[1]
    with pytest.raises(IndexAppendError):
        reopened.append(txn(3, 1015, 1020, 1015))  # the order is checked against entries read from the file


@settings(max_examples=100, deadline=None)
@given(txns=txn_lists())
def test_write_entries_round_trips(txns):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.txnindex"
        TransactionIndex.write_entries(path, txns, base_offset=BASE)
        if not txns:
            assert not path.exists()
            return
        assert path.read_bytes() == encoded(txns)
        index = TransactionIndex(path, BASE)
        index.sanity_check()
        assert index.all_aborted() == tuple(txns)


def test_write_entries_fsyncs_through_file_ops_and_removes_the_file_when_empty(tmp_path):
    ops = RecordingFileOps()
    path = tmp_path / "x.txnindex"
    TransactionIndex.write_entries(path, [txn(1, 5, 10, 5)], file_ops=ops)
    assert ops.calls == [("fsync_fd", "")]
    TransactionIndex.write_entries(path, [], file_ops=ops)
    assert not path.exists()


def test_write_entries_rejects_out_of_order_entries_before_touching_the_file(tmp_path):
    path = tmp_path / "x.txnindex"
    path.write_bytes(b"old")
    with pytest.raises(IndexAppendError):
        TransactionIndex.write_entries(path, [txn(1, 5, 10, 5), txn(2, 6, 10, 6)])
    assert path.read_bytes() == b"old"


# ---- append rules ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, words",
    [
        (txn(2, 1000, 1010, 1000), "above the last entry's 1010"),
        (txn(2, 1000, 1009, 1000), "above the last entry's 1010"),
        (AbortedTxn(1, 2, 1011, 1011, 1011), "version"),
        (txn(2, 1030, 1020, 1020), "first offset"),
        (txn(2, 2**63, 2**63, 0), "int64"),
    ],
)
def test_appends_that_break_the_order_are_rejected(tmp_path, bad, words):
    index = TransactionIndex(tmp_path / "x.txnindex", BASE)
    index.append(txn(1, 990, 1010, 990))
    with pytest.raises(IndexAppendError, match=words) as info:
        index.append(bad)
    assert isinstance(info.value, ValueError)
    assert index.entries == 1


def test_abort_marker_below_the_segment_base_is_rejected(tmp_path):
    index = TransactionIndex(tmp_path / "x.txnindex", BASE)
    with pytest.raises(IndexAppendError, match="below the segment base"):
        index.append(txn(1, 900, 999, 900))


@st.composite
def appended_batches(draw):
    """Entries already in an index, then a batch to append: valid, or with one entry broken in one way."""
    entries = draw(txn_lists(max_size=40))
    split = draw(st.integers(0, len(entries)))
    batch = entries[split:]
    if batch and draw(st.booleans()):
        i = draw(st.integers(0, len(batch) - 1))
        t = batch[i]
        broken = draw(st.sampled_from([
            AbortedTxn(1, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset),  # version
            txn(t.producer_id, t.first_offset, BASE - 1, t.last_stable_offset),  # below the base
            txn(t.producer_id, t.last_offset + 1, t.last_offset, t.last_stable_offset),  # first above last
            txn(t.producer_id, t.first_offset - 60, t.last_offset - draw(st.integers(1, 60)), t.last_stable_offset),
        ]))
        batch = [*batch[:i], broken, *batch[i + 1:]]
    return entries[:split], batch


@settings(max_examples=300, deadline=None)
@given(case=appended_batches())
def test_append_many_is_append_one_by_one_or_the_same_refusal_with_nothing_appended(case):
    """The whole-batch check of `append_many` against `append`, entry by entry: the same entries where every
    entry is accepted; otherwise the same message for the first refused entry, and none of the batch kept."""
    before, batch = case
    with tempfile.TemporaryDirectory() as d:
        one_by_one = TransactionIndex(Path(d) / "a.txnindex", BASE)
        many = TransactionIndex(Path(d) / "b.txnindex", BASE)
        for t in before:
            one_by_one.append(t)
            many.append(t)
        refused = None
        try:
            for t in batch:
                one_by_one.append(t)
        except IndexAppendError as exc:
            refused = str(exc).replace("a.txnindex", "b.txnindex")
        columns = AbortedTxns(*(np.array([getattr(t, name) for t in batch], dtype=np.int64)
                                for name in AbortedTxn.__slots__))
        if refused is None:
            many.append_many(columns)
            assert many.all_aborted() == one_by_one.all_aborted() == tuple(before + batch)
            assert many.columns().same_as(one_by_one.columns())
        else:
            with pytest.raises(IndexAppendError) as info:
                many.append_many(columns)
            assert str(info.value) == refused
            assert many.all_aborted() == tuple(before)


# ---- collect semantics ------------------------------------------------------------------------------------------


def test_collect_takes_overlapping_transactions_and_stops_at_the_first_lso_past_the_upper_bound(tmp_path):
    index = TransactionIndex(tmp_path / "x.txnindex", BASE)
    a = txn(1, 990, 1005, 980)  # overlaps [1000, 1050)
    b = txn(2, 1010, 1020, 1060)  # overlaps, and its LSO >= 1050: the search is complete here
    c = txn(3, 1030, 1040, 1030)  # would overlap, but lies after the stop
    for t in (a, b, c):
        index.append(t)
    assert index.collect_aborted_txns(1000, 1050) == TxnIndexSearchResult((a, b), True)
    assert index.collect_aborted_txns(1006, 1050) == TxnIndexSearchResult((b,), True)  # a ended before the fetch
    assert index.collect_aborted_txns(1000, 1010) == TxnIndexSearchResult((a,), True)  # b starts at the bound
    assert index.collect_aborted_txns(1041, 2000) == TxnIndexSearchResult((), False)


@settings(max_examples=200, deadline=None)
@given(txns=txn_lists(), fetch=st.integers(BASE - 50, BASE + 800), span=st.integers(0, 300))
def test_collect_equals_kafkas_loop(txns, fetch, span):
    with tempfile.TemporaryDirectory() as d:
        index = TransactionIndex.from_entries(Path(d) / "x.txnindex", BASE, txns)
        result = index.collect_aborted_txns(fetch, fetch + span)
        assert (result.aborted_txns, result.is_complete) == naive_collect(txns, fetch, fetch + span)


# ---- truncation -------------------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(txns=txn_lists(), cut=st.integers(BASE - 5, BASE + 800))
def test_truncate_to_drops_entries_whose_abort_marker_is_at_or_after_the_offset(txns, cut):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.txnindex"
        index = TransactionIndex.from_entries(path, BASE, txns)
        index.truncate_to(cut)
        kept = tuple(t for t in txns if t.last_offset < cut)
        assert index.all_aborted() == kept
        index.close()
        if txns:
            assert path.read_bytes() == encoded(kept)


def test_reset_empties_the_file_but_keeps_it(tmp_path):
    path = tmp_path / "x.txnindex"
    index = TransactionIndex.from_entries(path, BASE, [txn(1, 1000, 1001, 1000)])
    index.reset()
    index.flush()
    assert path.exists() and path.stat().st_size == 0


# ---- files, renames, read-only -----------------------------------------------------------------------------------


def test_rename_of_an_index_without_a_file_only_moves_where_it_will_be_written(tmp_path):
    ops = RecordingFileOps()
    old, new = tmp_path / "a.txnindex.cleaned", tmp_path / "a.txnindex.swap"
    index = TransactionIndex(old, BASE, file_ops=ops)
    index.rename_to(new)
    assert ops.calls == [] and index.path == new
    index.append(txn(1, 1000, 1000, 1000))
    index.fsync()
    assert new.exists() and not old.exists()
    assert ops.calls == [("fsync_file", str(new))]
    index.rename_to(old)
    assert ops.calls[-1] == ("rename", f"{new} -> {old}") and old.exists()


def test_read_only_index_is_never_created(tmp_path):
    path = tmp_path / "x.txnindex"
    index = TransactionIndex(path, BASE, read_only=True)
    index.append(txn(1, 1000, 1000, 1000))
    with pytest.raises(LogStateError):
        index.flush()
    index.close()
    assert not path.exists()


def test_delete_removes_the_file(tmp_path):
    path = tmp_path / "x.txnindex"
    index = TransactionIndex.from_entries(path, BASE, [txn(1, 1000, 1000, 1000)])
    index.delete()
    assert not path.exists()


# ---- sanity check -------------------------------------------------------------------------------------------------


def _file(tmp_path, data: bytes) -> Path:
    path = tmp_path / "00000000000000001000.txnindex"
    path.write_bytes(data)
    return path


def test_torn_txn_index_fails_sanity_check_at_the_partial_entry(tmp_path):
    path = _file(tmp_path, encoded([txn(1, 1000, 1001, 1000)]) + b"\x00" * 10)
    with pytest.raises(CorruptIndexError) as info:
        TransactionIndex(path, BASE).sanity_check()
    assert info.value.position == 34 and "multiple of the 34-byte" in info.value.reason


@pytest.mark.parametrize(
    "entries, position, words",
    [
        ([txn(1, 1000, 1001, 1000), AbortedTxn(1, 1, 1000, 1002, 1000)], 34, "expected version 0, found 1"),
        ([txn(1, 900, 999, 900)], 0, "below the segment base 1000"),
        ([txn(1, 1000, 1005, 1000), txn(1, 1000, 1006, 1000), txn(1, 1000, 1006, 1000)], 68, "above 1006"),
    ],
)
def test_txn_index_invariant_violations_are_reported_at_their_entry(tmp_path, entries, position, words):
    path = _file(tmp_path, encoded(entries))
    with pytest.raises(CorruptIndexError) as info:
        TransactionIndex(path, BASE).sanity_check()
    assert info.value.position == position
    assert words in info.value.reason
    assert info.value.path == str(path)
