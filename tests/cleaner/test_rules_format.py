"""Format cross-checks of cleaned logs: kafka-python reads what we wrote, and a dry run writes nothing."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from segments.codec import format as fmt
from segments.codec.legacy import encode_legacy_message, encode_legacy_wrapper
from segments.codec.records import Header, Record
from segments.partition.log import PartitionLog
from segments.tools.verify import verify_paths

from .builders import (
    ROLL,
    T0,
    TOPIC,
    Rec,
    abort,
    batch,
    build_log,
    clean,
    commit,
    file_digests,
    full_records,
    partition_dir,
    records,
    txn_batch,
    write_raw_segment,
)

RETENTION_MS = 1_000
SETTINGS = {"delete.retention.ms": RETENTION_MS}
CODECS = [fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD]


def _rich_log(tmp_path):
    """Legacy v1 data, then v2 batches of every codec, producers, transactions, tombstones and headers."""
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    legacy = (
        encode_legacy_message(0, b"k0", b"legacy-0", magic=1, timestamp=T0)
        + encode_legacy_wrapper(
            [Record(1, T0 + 1, b"k1", b"legacy-1"), Record(2, T0 + 2, b"k2", None), Record(3, T0 + 3, b"k3", b"l3")],
            magic=1, codec=fmt.COMPRESSION_GZIP,
        )
        + encode_legacy_message(4, b"k4", b"legacy-4", magic=1, timestamp=T0 + 4)
    )
    write_raw_segment(d, 0, legacy)
    write_raw_segment(d, 5, b"")
    steps = []
    for i, codec in enumerate(CODECS):
        hdrs = (Header("i", b"%d" % i), Header("n", None))
        steps.append(batch(
            [Rec(b"k%d" % (i % 4), b"v%d" % i, T0 + 10 + i, hdrs), Rec(b"t%d" % i, None, T0 + 20 + i),
             Rec(b"u%d" % i, b"x" * 50, T0 + 5 + i, delta=3)],
            compression=codec, producer_id=100 + i, producer_epoch=1, base_sequence=7,
        ))
    steps += [
        ROLL,
        txn_batch([(b"k1", b"committed", T0 + 40)], pid=7, compression=fmt.COMPRESSION_ZSTD),
        txn_batch([(b"k2", b"aborted", T0 + 41), (b"zz", b"aborted", T0 + 41)], pid=8),
        commit(7, timestamp=T0 + 42),
        abort(8, timestamp=T0 + 43),
        batch([(b"k3", None, T0 + 44), (None, b"unkeyed", T0 + 44)]),
        batch([(b"k0", b"appended", T0 + 45), (b"t0", b"back", T0 + 46)],
              timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME, max_timestamp=T0 + 99),
        ROLL,
        batch([(b"u0", b"late", T0 + 50)], compression=fmt.COMPRESSION_SNAPPY),
    ]
    build_log(d, steps)
    return d


def _ours_by_segment(directory):
    out = {}
    with PartitionLog.open(directory, mode="reader") as log:
        for seg in log.segments:
            out[seg.base_offset] = [
                (b.header.magic, b.header.base_offset if b.header.magic == 2 else None,
                 b.header.last_offset, b.header.records_count if b.header.magic == 2 else None,
                 [(r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in b.records])
                for _, b in seg.batches()
            ]
    return out


def _theirs_by_segment(directory):
    out = {}
    for path in sorted(directory.glob("*.log")):
        batches = []
        for b in MemoryRecords(path.read_bytes()):
            if isinstance(b, DefaultRecordBatch):
                assert b.validate_crc(), (path, b.base_offset)
                recs = list(b)
                batches.append((2, b.base_offset, b.last_offset, b.records_count,
                                [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in recs]))
            else:
                recs = list(b)
                assert all(r.validate_crc() for r in recs)
                batches.append((b.magic, None, recs[-1].offset, None,
                                [(r.offset, r.timestamp, r.key, r.value, []) for r in recs]))
        out[int(path.stem)] = batches
    return out


def _three_rounds(d):
    """Three rounds with appends between them; the last one runs past the first round's horizons."""
    now = T0 + 10_000
    yield clean(d, now_ms=now, settings=SETTINGS)
    build_log(d, [batch([(b"k2", b"new", T0 + 60), (b"k4", None, T0 + 61)], compression=fmt.COMPRESSION_LZ4)])
    yield clean(d, now_ms=now + 1, settings=SETTINGS)
    build_log(d, [batch([(b"u1", b"newer", T0 + 70)], producer_id=101, producer_epoch=1, base_sequence=8)])
    yield clean(d, now_ms=now + 1 + RETENTION_MS, settings=SETTINGS)


def test_every_cleaned_log_reads_the_same_with_kafka_python(tmp_path):
    d = _rich_log(tmp_path)
    assert _theirs_by_segment(d) == _ours_by_segment(d)
    changed = 0
    for result in _three_rounds(d):
        changed += result.records_read - result.records_written
        theirs = _theirs_by_segment(d)
        assert theirs == _ours_by_segment(d)
        assert not verify_paths([d]).problems
    assert changed > 10  # the rounds really removed records
    offsets = [o for o, _, _ in records(d)]
    assert offsets == sorted(offsets)


def test_dry_run_changes_no_byte_of_the_log(tmp_path):
    d = _rich_log(tmp_path)
    clean(d, now_ms=T0 + 10_000, settings=SETTINGS)  # cleaned once: indexes built, horizons stamped
    build_log(d, [batch([(b"k2", b"new", T0 + 60), (b"k4", None, T0 + 61)])])
    (d.parent / "cleaner-offset-checkpoint").write_text(f"0\n1\n{TOPIC} 0 99999\n")  # out of range: reset
    before = file_digests(d.parent)
    before_records = full_records(d)
    for now in (T0 + 10_001, T0 + 10_000 + RETENTION_MS):
        result = clean(d, now_ms=now, settings=SETTINGS, dry_run=True)
        assert result.dry_run and result.records_written < result.records_read
        assert result.size_after_bytes < result.size_before_bytes
        assert file_digests(d.parent) == before
    assert full_records(d) == before_records
    assert not any(p.suffix in (".cleaned", ".swap", ".deleted") for p in d.iterdir())


@pytest.mark.parametrize("map_bytes", [48])
def test_partial_rounds_also_read_the_same_with_kafka_python(tmp_path, map_bytes):
    d = _rich_log(tmp_path)
    for _ in range(100):
        result = clean(d, now_ms=T0 + 10_000, settings=SETTINGS, map_bytes=map_bytes)
        assert _theirs_by_segment(d) == _ours_by_segment(d)
        if result.done:
            break
    else:
        pytest.fail("partial rounds never finished")
    assert not verify_paths([d]).problems
