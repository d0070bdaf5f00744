"""Transaction rules: aborted data goes at once, markers outlive their data, open transactions bound a round.

A marker is stamped with its delete horizon by the pass that removes its transaction's last data batch (Kafka
waits for the pass after that one, which an idle log never gets; see `cleaner/recopy.py`), and goes at the
first pass after the horizon.

Producers here expire quickly (`producer_expiration_ms`), so that "the producer's last batch" retention
(test_rules_producers.py) does not keep the batches these tests expect to go.
"""

from __future__ import annotations

from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from segments.files.txnindex import AbortedTxn, TransactionIndex
from segments.partition.log import PartitionLog

from .builders import (
    ROLL,
    T0,
    abort,
    batch,
    batches,
    build_log,
    clean,
    commit,
    partition_dir,
    raw_batches,
    records,
    set_high_watermark,
    txn_batch,
)

RETENTION_MS = 1_000
EXPIRED = dict(settings={"delete.retention.ms": RETENTION_MS}, producer_expiration_ms=1_000)


def _by_base(directory):
    return {b.header.base_offset: b for b in batches(directory)}


def _aborted_index(directory) -> dict[int, list[AbortedTxn]]:
    with PartitionLog.open(directory, mode="reader") as log:
        return {
            s.base_offset: list(s.txn_index.all_aborted()) for s in log.segments if s.paths.txnindex.exists()
        }


def test_aborted_data_is_dropped_at_once_and_never_shadows_committed_values(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"k", b"committed"), (b"u", b"committed-u")], pid=1),  # 0-1
        txn_batch([(b"k", b"aborted"), (b"only-aborted", b"x")], pid=2),  # 2-3
        commit(1),  # 4
        txn_batch([(b"u", b"aborted-u")], pid=2, seq=2),  # 5
        abort(2),  # 6
        batch([(b"z", b"z1")]),  # 7
    ])
    now = T0 + 10_000
    clean(d, now_ms=now, **EXPIRED)
    assert records(d) == [
        (0, b"k", b"committed"),
        (1, b"u", b"committed-u"),
        (4, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00"),  # the COMMIT marker
        (6, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00"),  # the ABORT marker, stamped (its data just went)
        (7, b"z", b"z1"),
    ]


def test_abort_marker_is_kept_as_it_is_while_an_empty_header_of_its_data_stays_for_the_producer(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"x", b"1"), (b"y", b"1")], pid=2),  # 0-1: the producer's last data batch
        abort(2),  # 2
        batch([(b"z", b"z1")]),  # 3
    ])
    marker = raw_batches(d)[2]
    for i in range(2):  # the producer has not expired: its last batch stays, as an empty header
        build_log(d, [batch([(b"n%d" % i, b"v")])])
        clean(d, now_ms=T0 + 10_000 + i * 10 * RETENTION_MS, settings={"delete.retention.ms": RETENTION_MS})
        assert _by_base(d)[0].header.records_count == 0
        assert raw_batches(d)[2] == marker  # without it the empty batch would read as an open transaction


def test_abort_marker_is_stamped_by_the_pass_that_removes_its_data_and_removed_after_the_horizon(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"x", b"1"), (b"y", b"1")], pid=2),  # 0-1
        abort(2),  # 2
        batch([(b"z", b"z1")]),  # 3
    ])
    now1 = T0 + 10_000
    clean(d, now_ms=now1, **EXPIRED)
    assert sorted(raw_batches(d)) == [2, 3]
    stamped = _by_base(d)[2]
    assert stamped.header.is_control and stamped.header.records_count == 1
    assert stamped.header.delete_horizon_ms == now1 + RETENTION_MS
    assert stamped.records[0].timestamp == T0

    build_log(d, [batch([(b"c", b"c1")])])
    clean(d, now_ms=now1 + 100, **EXPIRED)
    assert _by_base(d)[2].header.delete_horizon_ms == now1 + RETENTION_MS  # not stamped again

    build_log(d, [batch([(b"e", b"e1")])])
    clean(d, now_ms=now1 + RETENTION_MS - 1, **EXPIRED)
    assert 2 in _by_base(d)  # before the horizon

    build_log(d, [batch([(b"f", b"f1")])])
    clean(d, now_ms=now1 + RETENTION_MS, **EXPIRED)
    assert 2 not in _by_base(d)
    assert [o for o, _, _ in records(d)] == [3, 4, 5, 6]


def test_commit_marker_is_kept_while_its_committed_data_remains(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [txn_batch([(b"a", b"1")], pid=1), commit(1), batch([(b"z", b"z1")])])
    marker = raw_batches(d)[1]
    for i in range(3):
        build_log(d, [batch([(b"n%d" % i, b"v")])])
        clean(d, now_ms=T0 + 10_000 + i * 10 * RETENTION_MS, **EXPIRED)
        assert raw_batches(d)[1] == marker  # never stamped, never removed


def test_commit_marker_is_stamped_once_its_data_is_gone_and_removed_after_the_horizon(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"a", b"1")], pid=1),  # 0
        commit(1),  # 1
        batch([(b"a", b"2")]),  # 2: supersedes the committed value
        batch([(b"z", b"z1")]),  # 3
    ])
    now1 = T0 + 10_000
    clean(d, now_ms=now1, **EXPIRED)
    assert 0 not in raw_batches(d)
    assert _by_base(d)[1].header.delete_horizon_ms == now1 + RETENTION_MS  # stamped as its data went

    build_log(d, [batch([(b"c", b"c1")])])
    clean(d, now_ms=now1 + RETENTION_MS - 1, **EXPIRED)
    assert _by_base(d)[1].header.delete_horizon_ms == now1 + RETENTION_MS  # kept before the horizon

    build_log(d, [batch([(b"e", b"e1")])])
    clean(d, now_ms=now1 + RETENTION_MS, **EXPIRED)
    assert 1 not in _by_base(d)
    assert records(d) == [(2, b"a", b"2"), (3, b"z", b"z1"), (4, b"c", b"c1"), (5, b"e", b"e1")]


def test_open_transaction_bounds_the_cleanable_range(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")]),  # 0
        batch([(b"a", b"a2")]),  # 1
        ROLL,
        batch([(b"b", b"b1")]),  # 2
        txn_batch([(b"c", b"c1")], pid=5),  # 3: never committed nor aborted
        batch([(b"b", b"b2"), (b"a", b"a3")]),  # 4-5
        ROLL,
        batch([(b"b", b"b3")]),  # 6
    ])
    before = raw_batches(d)
    result = clean(d, now_ms=T0 + 10_000, **EXPIRED)
    assert (result.bound, result.first_uncleanable, result.end_offset) == ("open transaction", 2, 2)
    after = raw_batches(d)
    assert 0 not in after
    assert {o: after[o] for o in (2, 3, 4, 6)} == {o: before[o] for o in (2, 3, 4, 6)}
    assert [o for o, _, _ in records(d)] == [1, 2, 3, 4, 5, 6]


def test_transaction_whose_marker_is_not_below_the_high_watermark_is_still_unstable(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")]),  # 0
        txn_batch([(b"x", b"1")], pid=2),  # 1
        ROLL,
        batch([(b"b", b"b1")]),  # 2
        abort(2),  # 3: written, not yet replicated
        batch([(b"z", b"z1")]),  # 4
    ])
    set_high_watermark(d, 3)
    before = raw_batches(d)
    result = clean(d, now_ms=T0 + 10_000, **EXPIRED)
    assert result.first_uncleanable <= 1
    assert raw_batches(d) == before


def test_cleaned_txnindex_lists_aborted_transactions_whose_marker_is_kept_while_data_remains(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"x", b"1")], pid=2),  # 0
        batch([(b"a", b"a1")]),  # 1
        ROLL,
        txn_batch([(b"y", b"1")], pid=2, seq=1),  # 2
        abort(2),  # 3
        batch([(b"b", b"b1")]),  # 4
    ])
    now1 = T0 + 10_000
    settings = {"delete.retention.ms": RETENTION_MS, "segment.bytes": 200}  # one group per segment
    clean(d, now_ms=now1, settings=settings, producer_expiration_ms=1_000)
    assert records(d)[0] == (1, b"a", b"a1")
    assert [o for o, _, _ in records(d)] == [1, 3, 4]
    assert _aborted_index(d) == {2: [AbortedTxn(0, 2, 0, 3, 4)]}  # first offset in the earlier segment

    build_log(d, [batch([(b"c", b"c1")])])
    clean(d, now_ms=now1 + 1, settings=settings, producer_expiration_ms=1_000)
    assert _by_base(d)[3].header.has_delete_horizon  # stamped when its data went
    assert all(not entries for entries in _aborted_index(d).values())


def test_cleaned_txnindex_keeps_the_last_stable_offset_of_the_original_entry(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"x", b"1")], pid=2),  # 0
        txn_batch([(b"y", b"1")], pid=5),  # 1: still open when pid 2 aborted, so the LSO then was 1
        abort(2),  # 2
        commit(5),  # 3
        batch([(b"z", b"z1")]),  # 4
    ])
    TransactionIndex.write_entries(
        d / fmt.offset_file_name(0, fmt.TXN_INDEX_SUFFIX), [AbortedTxn(0, 2, 0, 2, 1)], base_offset=0
    )
    clean(d, now_ms=T0 + 10_000, **EXPIRED)
    assert [o for o, _, _ in records(d)] == [1, 2, 3, 4]
    assert _aborted_index(d) == {0: [AbortedTxn(0, 2, 0, 2, 1)]}


def test_markers_are_never_deduplicated_even_when_a_data_key_equals_the_control_key(tmp_path):
    d = partition_dir(tmp_path)
    commit_key = fmt.CONTROL_KEY.pack(0, fmt.CONTROL_TYPE_COMMIT)
    abort_key = fmt.CONTROL_KEY.pack(0, fmt.CONTROL_TYPE_ABORT)
    build_log(d, [
        txn_batch([(b"t", b"1")], pid=1),  # 0
        commit(1),  # 1
        txn_batch([(b"u", b"1")], pid=2),  # 2
        abort(2),  # 3
        batch([(commit_key, b"data-1"), (abort_key, b"data-1")]),  # 4-5
        batch([(commit_key, b"data-2"), (abort_key, b"data-2")]),  # 6-7
        batch([(b"z", b"z1")]),  # 8
    ])
    before = raw_batches(d)
    clean(d, now_ms=T0 + 10_000, **EXPIRED)
    after = raw_batches(d)
    assert after[1] == before[1]  # its data stays
    assert (3, abort_key, b"\x00\x00\x00\x00\x00\x00") in records(d)  # its data went: stamped, still there
    assert [(o, k, v) for o, k, v in records(d) if o >= 4] == [
        (6, commit_key, b"data-2"), (7, abort_key, b"data-2"), (8, b"z", b"z1")
    ]
    assert (0, b"t", b"1") in records(d)


def test_control_records_that_are_not_transaction_markers_are_kept_as_they_are(tmp_path):
    d = partition_dir(tmp_path)
    leader_change = encode_batch(
        [Record(0, T0, fmt.CONTROL_KEY.pack(0, 2), b"\x00\x00\x00\x00\x00\x00")], base_offset=0, is_control=True
    )
    build_log(d, [batch([(b"a", b"1")]), leader_change, batch([(b"z", b"1")])])
    before = raw_batches(d)[1]
    now = T0 + 10_000
    clean(d, now_ms=now, **EXPIRED)
    assert raw_batches(d)[1] == before
    build_log(d, [batch([(b"y", b"1")])])
    clean(d, now_ms=now + 10 * RETENTION_MS, **EXPIRED)
    assert raw_batches(d)[1] == before
