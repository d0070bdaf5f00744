"""Tombstone rules (KIP-534 delete horizon): kept and stamped on the first pass, removed after the horizon.

The clock is the `now_ms` of each round; new dirty data is appended between rounds so that each round
has a dirty section to clean (a round with nothing dirty does no recopy).
"""

from __future__ import annotations

from segments.codec import format as fmt

from .builders import T0, batch, batches, build_log, clean, partition_dir, raw_batches, records

RETENTION_MS = 1_000
SETTINGS = {"delete.retention.ms": RETENTION_MS}


def _by_base(directory):
    return {b.header.base_offset: b for b in batches(directory)}


def test_first_pass_keeps_the_latest_tombstone_and_stamps_its_batch_with_the_delete_horizon(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1", T0)]),
        batch([(b"a", None, T0 + 30), (b"b", b"b1", T0 + 10)]),  # 1-2: the tombstone of a, and b
        batch([(b"z", b"z1", T0 + 50)]),
    ])
    now = T0 + 5_000
    clean(d, now_ms=now, settings=SETTINGS)
    assert records(d) == [(1, b"a", None), (2, b"b", b"b1"), (3, b"z", b"z1")]
    stamped = _by_base(d)[1]
    h = stamped.header
    assert h.attributes & fmt.DELETE_HORIZON_FLAG
    assert h.delete_horizon_ms == h.base_timestamp == now + RETENTION_MS
    assert h.max_timestamp == T0 + 30
    assert [(r.offset, r.timestamp) for r in stamped.records] == [(1, T0 + 30), (2, T0 + 10)]
    assert not _by_base(d)[3].header.has_delete_horizon  # a batch without tombstones is not stamped


def test_superseded_tombstone_goes_at_once(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", None)]), batch([(b"a", b"back")]), batch([(b"z", b"z")])])
    clean(d, now_ms=T0 + 5_000, settings=SETTINGS)
    assert records(d) == [(1, b"a", b"back"), (2, b"z", b"z")]


def test_tombstone_survives_a_pass_before_its_horizon_and_goes_after_it(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1")]),
        batch([(b"a", None, T0 + 1)]),  # 1: the tombstone, alone in its batch
        batch([(b"b", b"b1")]),
    ])
    now1 = T0 + 10_000
    clean(d, now_ms=now1, settings=SETTINGS)
    horizon = now1 + RETENTION_MS
    assert _by_base(d)[1].header.delete_horizon_ms == horizon
    stamped = raw_batches(d)[1]

    build_log(d, [batch([(b"c", b"c1")])])  # 3: new dirty data
    clean(d, now_ms=horizon - 1, settings=SETTINGS)
    assert raw_batches(d)[1] == stamped  # still there, unchanged (its horizon is not restamped)
    assert records(d) == [(1, b"a", None), (2, b"b", b"b1"), (3, b"c", b"c1")]

    build_log(d, [batch([(b"e", b"e1")])])  # 4
    clean(d, now_ms=horizon, settings=SETTINGS)
    assert records(d) == [(2, b"b", b"b1"), (3, b"c", b"c1"), (4, b"e", b"e1")]
    assert 1 not in _by_base(d)  # the batch left empty is dropped (it is no group's last batch)


def test_expired_tombstone_leaves_its_other_records_in_a_rebuilt_batch_without_a_horizon(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", None, T0), (b"b", b"b1", T0 + 4)]), batch([(b"z", b"z1")])])
    now1 = T0 + 10_000
    clean(d, now_ms=now1, settings=SETTINGS)
    build_log(d, [batch([(b"c", b"c1")])])
    clean(d, now_ms=now1 + RETENTION_MS + 1, settings=SETTINGS)
    kept = _by_base(d)[0]
    assert [(r.offset, r.key, r.value, r.timestamp) for r in kept.records] == [(1, b"b", b"b1", T0 + 4)]
    assert (kept.header.last_offset_delta, kept.header.records_count) == (1, 1)
    # It keeps no tombstone any more, so no horizon (Kafka's filterTo keeps it, and with it a horizon that has
    # passed on a batch no pass can change: a log that would be due for a pass for ever).
    assert not kept.header.has_delete_horizon
    assert kept.header.base_timestamp == T0 + 4


def test_existing_horizon_is_preserved_when_the_batch_is_rewritten_later(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", None, T0), (b"c", b"c1", T0 + 2)]), batch([(b"z", b"z1")])])
    now1 = T0 + 10_000
    clean(d, now_ms=now1, settings=SETTINGS)
    build_log(d, [batch([(b"c", b"c2")])])  # supersedes c1: the stamped batch must be rebuilt
    now2 = now1 + 500  # before the horizon, with a later clock
    clean(d, now_ms=now2, settings=SETTINGS)
    rebuilt = _by_base(d)[0]
    assert [(r.offset, r.value) for r in rebuilt.records] == [(0, None)]
    assert rebuilt.header.has_delete_horizon
    assert rebuilt.header.base_timestamp == now1 + RETENTION_MS  # not now2 + retention
    assert rebuilt.records[0].timestamp == T0


def test_batch_emptied_by_an_expired_tombstone_stays_as_an_empty_header_when_it_is_the_groups_last(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"a1")]), batch([(b"a", None, T0 + 3)])])  # the tombstone is the last batch
    now1 = T0 + 10_000
    clean(d, now_ms=now1, settings=SETTINGS)
    build_log(d, [batch([(b"c", b"c1")])])  # dirty data in a new segment (its own group)
    clean(d, now_ms=now1 + RETENTION_MS, settings={**SETTINGS, "segment.bytes": 100})
    assert records(d) == [(2, b"c", b"c1")]
    empty = _by_base(d)[1]
    assert empty.header.records_count == 0
    assert empty.header.size_bytes == fmt.RECORD_BATCH_OVERHEAD
    assert (empty.header.base_offset, empty.header.last_offset) == (1, 1)
    assert not empty.header.has_delete_horizon and empty.header.base_timestamp == fmt.NO_TIMESTAMP
    assert empty.header.max_timestamp == T0 + 3


def test_log_append_time_batch_stamped_with_a_horizon_keeps_its_append_time(tmp_path):
    d = partition_dir(tmp_path)
    append_time = T0 + 777
    build_log(d, [
        batch([(b"a", None, T0 + 1), (b"b", b"b1", T0 + 2)],
              timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME, max_timestamp=append_time),
        batch([(b"z", b"z1")]),
    ])
    now = T0 + 10_000
    clean(d, now_ms=now, settings=SETTINGS)
    stamped = _by_base(d)[0]
    h = stamped.header
    assert h.delete_horizon_ms == now + RETENTION_MS
    assert (h.timestamp_type, h.max_timestamp) == (fmt.TIMESTAMP_LOG_APPEND_TIME, append_time)
    assert [(r.timestamp, r.timestamp_delta) for r in stamped.records] == [
        (append_time, append_time - h.base_timestamp)
    ] * 2
