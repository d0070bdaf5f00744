"""Producer-state preservation: an active producer's last batch survives, as an empty header if need be.

The empty header keeps the producer id, epoch and base sequence and the batch's offset range, so that a
broker reloading the log still knows the producer's last sequence (docs/kafka-cleaner.md section 2.7).
"""

from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatch

from segments.codec import format as fmt

from .builders import (
    DAY_MS,
    T0,
    Rec,
    abort,
    batch,
    batches,
    build_log,
    clean,
    partition_dir,
    raw_batches,
    records,
    txn_batch,
)

RETENTION_MS = 1_000
SETTINGS = {"delete.retention.ms": RETENTION_MS}
EXPIRATION_MS = DAY_MS


def _by_base(directory):
    return {b.header.base_offset: b for b in batches(directory)}


def test_idempotent_producers_last_batch_survives_as_an_empty_61_byte_header(tmp_path):
    d = partition_dir(tmp_path)
    producer = dict(producer_id=9, producer_epoch=2, base_sequence=40, partition_leader_epoch=5)
    build_log(d, [
        batch([Rec(b"a", None, T0 + 5), Rec(b"b", b"b1", T0 + 8, delta=3)], compression=fmt.COMPRESSION_GZIP,
              **producer),  # offsets 0 and 3
        batch([(b"z", b"z1", T0 + 9)]),  # 4
    ])
    now1 = T0 + 100
    clean(d, now_ms=now1, settings=SETTINGS, producer_expiration_ms=EXPIRATION_MS)
    assert _by_base(d)[0].header.has_delete_horizon  # the tombstone stamped its (compressed) batch

    build_log(d, [batch([(b"a", b"a2", T0 + 20), (b"b", b"b2", T0 + 21)])])  # 5-6: supersede both
    clean(d, now_ms=now1 + 10, settings=SETTINGS, producer_expiration_ms=EXPIRATION_MS)
    raw = raw_batches(d)[0]
    assert len(raw) == fmt.RECORD_BATCH_OVERHEAD
    h = _by_base(d)[0].header  # decoding checks the CRC
    assert (h.base_offset, h.last_offset, h.records_count) == (0, 3, 0)
    assert h.attributes == 0  # codec bits and the delete-horizon bit cleared
    assert h.base_timestamp == fmt.NO_TIMESTAMP
    assert h.max_timestamp == T0 + 8
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.partition_leader_epoch) == (9, 2, 40, 5)
    theirs = DefaultRecordBatch(raw)
    assert theirs.validate_crc() and list(theirs) == []
    assert records(d) == [(4, b"z", b"z1"), (5, b"a", b"a2"), (6, b"b", b"b2")]


def test_expired_producers_last_batch_is_not_kept(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1", T0)], producer_id=9, producer_epoch=0, base_sequence=0),  # 0
        batch([(b"a", b"a2", T0 + 1)]),  # 1
        batch([(b"z", b"z1", T0 + 2)]),  # 2
    ])
    clean(d, now_ms=T0 + EXPIRATION_MS + 1, settings=SETTINGS, producer_expiration_ms=EXPIRATION_MS)
    assert sorted(raw_batches(d)) == [1, 2]


def test_active_producers_last_batch_is_kept_while_not_expired(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1", T0)], producer_id=9, producer_epoch=0, base_sequence=0),  # 0
        batch([(b"a", b"a2", T0 + 1)]),  # 1
        batch([(b"z", b"z1", T0 + 2)]),  # 2
    ])
    clean(d, now_ms=T0 + EXPIRATION_MS - 1, settings=SETTINGS, producer_expiration_ms=EXPIRATION_MS)
    assert sorted(raw_batches(d)) == [0, 1, 2]
    assert _by_base(d)[0].header.records_count == 0


def test_only_the_producers_last_batch_is_kept_and_a_newer_batch_releases_it(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")], producer_id=9, producer_epoch=0, base_sequence=0),  # 0
        batch([(b"b", b"b1")], producer_id=9, producer_epoch=0, base_sequence=1),  # 1
        batch([(b"a", b"a2"), (b"b", b"b2")]),  # 2-3
    ])
    now = T0 + 100
    clean(d, now_ms=now, settings=SETTINGS)
    assert sorted(raw_batches(d)) == [1, 2]  # 0 is not the producer's last batch
    assert _by_base(d)[1].header.records_count == 0

    build_log(d, [batch([(b"c", b"c1")], producer_id=9, producer_epoch=0, base_sequence=2)])  # 4
    clean(d, now_ms=now + 1, settings=SETTINGS)
    assert sorted(raw_batches(d)) == [2, 4]
    assert records(d) == [(2, b"a", b"a2"), (3, b"b", b"b2"), (4, b"c", b"c1")]


def test_aborted_last_batch_of_an_active_transactional_producer_is_kept_empty_until_released(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        txn_batch([(b"x", b"1"), (b"y", b"1")], pid=3, epoch=1, seq=10),  # 0-1
        abort(3, epoch=1),  # 2
        batch([(b"z", b"z1")]),  # 3
    ])
    now = T0 + 100
    clean(d, now_ms=now, settings=SETTINGS)
    empty = _by_base(d)[0].header
    assert (empty.records_count, empty.last_offset, empty.is_transactional) == (0, 1, True)
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (3, 1, 10)
    assert _by_base(d)[2].header.records_count == 1

    build_log(d, [batch([(b"w", b"1")], producer_id=3, producer_epoch=1, base_sequence=12)])  # 4
    clean(d, now_ms=now + 1, settings=SETTINGS)
    assert 0 not in _by_base(d)
    assert records(d)[-1] == (4, b"w", b"1")
