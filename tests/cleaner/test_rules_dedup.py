"""Deduplication rules of a cleaning round: the latest record per key survives, batches keep their shape.

Each test builds a small log with explicit keys, timestamps and batch boundaries, runs `clean_round` and
asserts the exact records and batch headers that remain (docs/format.md section 5, docs/kafka-cleaner.md
section 2.5).
"""

from __future__ import annotations

import pytest

from segments.codec import format as fmt
from segments.codec.records import Header

from .builders import (
    BIG_MAP_BYTES,
    ROLL,
    T0,
    Rec,
    batch,
    batches,
    build_log,
    clean,
    full_records,
    partition_dir,
    random_log,
    raw_batches,
    records,
)

CODECS = [fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD]


def _header_by_base(directory):
    return {b.header.base_offset: b for b in batches(directory)}


def test_latest_record_per_key_survives_and_older_ones_go(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1"), (b"b", b"b1"), (b"c", b"c1")]),
        batch([(b"a", b"a2"), (b"d", b"d1")]),
        ROLL,
        batch([(b"b", b"b2"), (b"a", b"a3")]),
        batch([(b"e", b"e1")]),
    ])
    result = clean(d, now_ms=T0 + 1000)
    assert records(d) == [(2, b"c", b"c1"), (4, b"d", b"d1"), (5, b"b", b"b2"), (6, b"a", b"a3"), (7, b"e", b"e1")]
    assert (result.records_read, result.records_written) == (8, 5)
    assert result.end_offset == 8


def test_duplicates_inside_one_batch_keep_only_the_last(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"k", b"1"), (b"k", b"2"), (b"j", b"x"), (b"k", b"3")]), batch([(b"z", b"z")])])
    clean(d, now_ms=T0 + 1000)
    assert records(d) == [(2, b"j", b"x"), (3, b"k", b"3"), (4, b"z", b"z")]


def test_batches_without_removed_records_are_copied_byte_for_byte(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1", T0), (b"b", b"1", T0 + 5)], partition_leader_epoch=4),  # 0-1: loses a
        batch([(b"c", b"1", T0 + 9), (b"d", b"1", T0 + 3)], compression=fmt.COMPRESSION_GZIP),  # 2-3: untouched
        ROLL,
        batch([(b"e", b"1", T0 + 20)], producer_id=77, producer_epoch=1, base_sequence=0),  # 4: untouched
        batch([(b"a", b"2", T0 + 30)]),  # 5: untouched
    ])
    before = raw_batches(d)
    result = clean(d, now_ms=T0 + 1000)
    after = raw_batches(d)
    assert sorted(after) == [0, 2, 4, 5]
    assert after[2] == before[2] and after[4] == before[4] and after[5] == before[5]
    assert after[0] != before[0]
    assert result.batches_rebuilt == 1


def test_rebuilt_batch_keeps_its_offsets_producer_fields_and_codec_when_its_last_record_goes(tmp_path):
    d = partition_dir(tmp_path)
    producer = dict(producer_id=42, producer_epoch=3, base_sequence=100, partition_leader_epoch=7)
    build_log(d, [
        batch(
            [Rec(b"a", b"a1", T0 + 10), Rec(b"b", b"b1", T0 + 40), Rec(b"c", b"c1", T0 + 90, delta=4)],
            compression=fmt.COMPRESSION_GZIP, **producer,
        ),  # offsets 0, 1, 4 (lastOffsetDelta 4)
        batch([(b"c", b"c2", T0 + 100)], producer_id=42, producer_epoch=3, base_sequence=105),  # 5
    ])
    clean(d, now_ms=T0 + 1000)
    rebuilt = _header_by_base(d)[0]
    h = rebuilt.header
    assert (h.base_offset, h.last_offset_delta, h.records_count) == (0, 4, 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.partition_leader_epoch) == (42, 3, 100, 7)
    assert h.compression == fmt.COMPRESSION_GZIP
    assert h.timestamp_type == fmt.TIMESTAMP_CREATE_TIME
    assert not h.has_delete_horizon and not h.is_transactional and not h.is_control
    assert h.base_timestamp == T0 + 10
    assert h.max_timestamp == T0 + 40  # the largest kept timestamp, not the dropped record's T0 + 90
    assert [(r.offset, r.timestamp, r.key, r.value) for r in rebuilt.records] == [
        (0, T0 + 10, b"a", b"a1"),
        (1, T0 + 40, b"b", b"b1"),
    ]
    assert records(d) == [(0, b"a", b"a1"), (1, b"b", b"b1"), (5, b"c", b"c2")]


def test_rebuilt_batch_base_timestamp_is_its_first_kept_record_and_record_timestamps_stay(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1", T0 + 500), (b"b", b"b1", T0 + 300), (b"c", b"c1", T0 + 20), (b"d", b"d1", T0 + 900)]),
        batch([(b"a", b"a2", T0 + 1000), (b"d", b"d2", T0 + 1001)]),
    ])
    clean(d, now_ms=T0 + 5000)
    rebuilt = _header_by_base(d)[0]
    assert rebuilt.header.base_timestamp == T0 + 300
    assert rebuilt.header.max_timestamp == T0 + 300
    assert [(r.offset, r.timestamp, r.timestamp_delta) for r in rebuilt.records] == [
        (1, T0 + 300, 0), (2, T0 + 20, -280)  # a record older than the new base gets a negative delta
    ]


def test_log_append_time_batch_keeps_its_max_timestamp_when_rebuilt(tmp_path):
    d = partition_dir(tmp_path)
    append_time = T0 + 777
    build_log(d, [
        batch(
            [(b"a", b"a1", T0 + 1), (b"b", b"b1", T0 + 2), (b"c", b"c1", T0 + 3)],
            timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME, max_timestamp=append_time,
        ),
        batch([(b"c", b"c2", T0 + 800)]),
    ])
    clean(d, now_ms=T0 + 5000)
    rebuilt = _header_by_base(d)[0]
    h = rebuilt.header
    assert h.timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    assert h.max_timestamp == append_time
    assert (h.records_count, h.last_offset_delta) == (2, 2)
    assert h.base_timestamp == append_time  # every record's timestamp is the append time, so deltas are 0
    assert [(r.offset, r.timestamp, r.key, r.timestamp_delta) for r in rebuilt.records] == [
        (0, append_time, b"a", 0), (1, append_time, b"b", 0)
    ]


@pytest.mark.parametrize("codec", CODECS, ids=[fmt.COMPRESSION_NAMES[c] for c in CODECS])
def test_rebuilt_batches_of_every_codec_decode_to_the_kept_records_with_headers(tmp_path, codec):
    d = partition_dir(tmp_path)
    hdrs = (Header("trace", b"\x00\x01"), Header("empty", b""), Header("null", None))
    kept = [
        Rec(b"k%02d" % i, (b"value-%d-" % i) * 8, T0 + 7 * i, headers=hdrs if i % 2 else ())
        for i in range(1, 20, 2)
    ]
    dropped = [Rec(b"k%02d" % i, b"old", T0 + 7 * i) for i in range(0, 20, 2)]
    interleaved = [r for pair in zip(dropped, kept) for r in pair]
    build_log(d, [
        batch(interleaved, compression=codec),
        batch([Rec(r.key, b"new", T0 + 500) for r in dropped]),
    ])
    original = {r[0]: r for r in full_records(d)}
    clean(d, now_ms=T0 + 5000)
    rebuilt = _header_by_base(d)[0]
    assert rebuilt.header.compression == codec
    assert rebuilt.header.records_count == len(kept)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rebuilt.records] == [
        original[o] for o in range(1, 20, 2)
    ]
    assert rebuilt.records[0].headers == hdrs


def test_unkeyed_records_are_dropped_and_counted_as_invalid(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(None, b"orphan-1"), (b"a", b"a1"), (None, b"orphan-2")]),
        batch([(None, b"orphan-3")]),
        batch([(b"z", b"z1")]),
    ])
    result = clean(d, now_ms=T0 + 1000)
    assert records(d) == [(1, b"a", b"a1"), (4, b"z", b"z1")]
    assert result.invalid_records == 3
    assert [b.header.base_offset for b in batches(d)] == [0, 4]  # the emptied unkeyed batch is gone


def test_records_beyond_the_indexed_range_are_kept_until_a_later_round_indexes_them(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"a1"), (b"a", b"a2"), (b"b", b"b1"), (None, b"orphan"), (b"b", b"b2")]),
        batch([(b"z", b"z1")]),
    ])
    first = clean(d, now_ms=T0 + 1000, map_bytes=48)  # room for one key: indexing stops at offset 1
    assert (first.first_dirty, first.end_offset, first.map_full) == (0, 2, True)
    assert records(d) == [(1, b"a", b"a2"), (2, b"b", b"b1"), (3, None, b"orphan"), (4, b"b", b"b2"), (5, b"z", b"z1")]
    assert first.invalid_records == 0
    second = clean(d, now_ms=T0 + 1000, map_bytes=48)
    assert second.first_dirty == 2
    assert records(d) == [(1, b"a", b"a2"), (4, b"b", b"b2"), (5, b"z", b"z1")]
    assert second.invalid_records == 1


def _model_first_pass(log_batches) -> list[int]:
    """Offsets a first pass with a map holding every key keeps (no horizon has passed, all txns decided)."""
    pending: dict[int, list[int]] = {}
    aborted: set[int] = set()
    for i, b in enumerate(log_batches):
        if b.header.is_control:
            _, control_type = fmt.CONTROL_KEY.unpack(b.records[0].key)
            if control_type == fmt.CONTROL_TYPE_ABORT:
                aborted.update(pending.get(b.header.producer_id, []))
            pending.pop(b.header.producer_id, None)
        elif b.header.is_transactional:
            pending.setdefault(b.header.producer_id, []).append(i)
    latest = {}
    for i, b in enumerate(log_batches):
        if not b.header.is_control and i not in aborted:
            latest.update((r.key, r.offset) for r in b.records if r.key is not None)
    return [
        r.offset
        for i, b in enumerate(log_batches)
        for r in b.records
        if b.header.is_control or (i not in aborted and r.key is not None and latest[r.key] == r.offset)
    ]


# The second shape: 10 slots admit 9 keys (7 are used), so the superseded bitmap covers 72 offsets; with 30
# unused offsets after every record the dirty section spans thousands, and past the bitmap records are looked
# up in the map instead.
@pytest.mark.parametrize(("seed", "offset_gap", "map_bytes"), [*((s, 0, BIG_MAP_BYTES) for s in range(8)),
                                                                *((s, 30, 24 * 10) for s in range(4))])
def test_first_round_keeps_exactly_what_a_model_of_the_rules_keeps(tmp_path, seed, offset_gap, map_bytes):
    d = partition_dir(tmp_path)
    random_log(d, seed, offset_gap=offset_gap)
    expected = _model_first_pass(batches(d))
    original = {r[0]: r for r in full_records(d)}
    assert offset_gap == 0 or max(original) > 1000
    result = clean(d, now_ms=T0 + 1000, map_bytes=map_bytes)
    assert result.done
    assert full_records(d) == [original[o] for o in expected]


@pytest.mark.parametrize("seed", range(4))
def test_later_rounds_look_up_the_clean_section_and_keep_what_the_model_keeps(tmp_path, seed):
    # A map of 3 keys over 7: several rounds, each recopying the clean section against a new dirty head.
    d = partition_dir(tmp_path)
    random_log(d, seed, batches_max=60)
    expected = _model_first_pass(batches(d))
    original = {r[0]: r for r in full_records(d)}
    for _ in range(200):
        if clean(d, now_ms=T0 + 1000, map_bytes=24 * 4).done:
            break
    else:
        pytest.fail("cleaning never finished")
    assert full_records(d) == [original[o] for o in expected]
