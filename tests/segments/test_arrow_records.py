"""Arrow columns ↔ v2 records: the columnar encoder checked by kafka-python's reader, the columnar reader
checked against the record-at-a-time decoder on generated logs and on real Kafka segment files."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from segments.codec import format as fmt
from segments.codec.batches import iter_batches
from segments.codec.records import Header, Record, encode_batch, encode_control_batch
from segments.partition.checkpoint import LOG_START_OFFSET_CHECKPOINT
from segments.partition.log import LogConfig, PartitionLog, update_log_dir_checkpoint
from segments.spark.arrow_records import (
    HEADER_TYPE,
    RECORD_COLUMNS,
    BatchEncoder,
    binary_column,
    encode_table,
    read_arrow_batches,
)

from .helpers import copy_fixture

TS0 = 1_700_000_000_000

rows_strategy = st.lists(
    st.tuples(
        st.binary(max_size=20),  # key
        st.one_of(st.none(), st.binary(max_size=300)),  # value
        st.integers(0, 2**41),  # timestamp
        st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
        st.integers(0, 3),  # partition
    ),
    min_size=1,
    max_size=60,
)


def _columns(rows):
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    ts = np.array([r[2] for r in rows], dtype=np.int64)
    headers = pa.array([[{"key": k, "value": v} for k, v in r[3]] for r in rows], HEADER_TYPE)
    parts = np.array([r[4] for r in rows], dtype=np.int32)
    return keys, values, ts, headers, parts


def _kafka_python_records(data: bytes):
    """(offset, timestamp, key, value, headers) of every record, read by kafka-python, batch offsets continuing."""
    out, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        batch = DefaultRecordBatch(data[pos : pos + size])
        assert batch.validate_crc()
        out.extend((r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch)
        pos += size
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, codec=st.sampled_from([0, 1, 2, 3, 4]), per_batch=st.integers(1, 7))
def test_encoded_batches_read_back_by_kafka_python_in_input_order_per_partition(rows, codec, per_batch):
    keys, values, ts, headers, parts = _columns(rows)
    encoded = encode_table(keys, values, ts, parts, headers=headers, compression=codec, records_per_batch=per_batch)
    for p in range(4):
        expected = [(k, v, t, [(hk, hv) for hk, hv in h]) for k, v, t, h, q in rows if q == p]
        if not expected:
            assert p not in encoded.data
            continue
        got = _kafka_python_records(encoded.data[p])
        assert [o for o, *_ in got] == list(range(len(expected)))  # offsets count from 0 across the batches
        assert [(k, v, t, h) for _, t, k, v, h in got] == expected
        assert encoded.records[p] == len(expected)
        batches = [b for _, b in iter_batches(encoded.data[p])]
        assert all(b.header.records_count <= per_batch for b in batches)
        assert all(b.header.compression == codec for b in batches)
        assert all(b.header.max_timestamp == max(r.timestamp for r in b.records) for b in batches)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, per_batch=st.integers(1, 7), batch_bytes=st.integers(1, 2000))
def test_uncompressed_batches_are_byte_for_byte_the_object_encoders(rows, per_batch, batch_bytes):
    keys, values, ts, headers, parts = _columns(rows)
    encoded = encode_table(keys, values, ts, parts, headers=headers, records_per_batch=per_batch, batch_bytes=batch_bytes)
    for p, data in encoded.data.items():
        batches = list(iter_batches(data))
        assert sum(b.header.records_count for _, b in batches) == encoded.records[p]
        rebuilt = b"".join(encode_batch(b.records, base_offset=b.header.base_offset) for _, b in batches)
        assert data == rebuilt  # every header field and record byte as segments.codec.records writes them


def test_an_encoder_reused_across_calls_gives_each_call_its_own_batches():
    encoder = BatchEncoder(records_per_batch=5)
    big = [(b"k%d" % i, b"v" * (i % 90), TS0 + i, [], i % 3) for i in range(400)]
    small = [(b"s%d" % i, b"w%d" % i, TS0, [("h", b"x")], 1) for i in range(7)]
    first = {p: bytes(d) for p, d in encoder.encode(*_columns(big)[:3], _columns(big)[4], headers=_columns(big)[3]).data.items()}
    second = encoder.encode(*_columns(small)[:3], _columns(small)[4], headers=_columns(small)[3])
    assert {p: bytes(d) for p, d in second.data.items()} == encode_table(
        *_columns(small)[:3], _columns(small)[4], headers=_columns(small)[3], records_per_batch=5).data
    assert first == encode_table(*_columns(big)[:3], _columns(big)[4], headers=_columns(big)[3], records_per_batch=5).data
    assert second.records == {1: 7}
    with pytest.raises(ValueError, match="at least 0"):
        encoder.encode(pa.array([b"k"]), pa.array([b"v"]), np.array([TS0]), np.array([-2], np.int32))
    left_out = encoder.encode(*_columns(small)[:3], np.array([1, -1, 1, -1, -1, 1, 1], np.int32))
    assert [r.key for _, b in iter_batches(left_out.data[1]) for r in b.records] == [b"s0", b"s2", b"s5", b"s6"]
    assert encoder.encode(*_columns(small)[:3], np.full(7, -1, np.int32)).data == {}


def test_batches_are_cut_at_the_byte_limit_but_never_empty():
    n = 50
    keys = pa.array([b"k%d" % i for i in range(n)])
    values = pa.array([b"x" * 300] * n)
    encoded = encode_table(keys, values, np.full(n, TS0), np.zeros(n, np.int32), records_per_batch=1000, batch_bytes=1000)
    batches = [b for _, b in iter_batches(encoded.data[0])]
    assert sum(b.header.records_count for b in batches) == n
    assert all(1 <= b.header.records_count <= 3 for b in batches)  # 3 records of ~310 bytes fit 1000 bytes
    big = encode_table(pa.array([b"k"]), pa.array([b"y" * 5000]), np.array([TS0]), np.zeros(1, np.int32), batch_bytes=100)
    assert [b.header.records_count for _, b in iter_batches(big.data[0])] == [1]


def test_sliced_and_string_columns_encode_their_own_rows():
    keys = pa.array(["a", "bb", "ccc", "dddd"]).slice(1, 2)
    values = pa.array([b"0", None, b"2", b"3"]).slice(1, 2)
    headers = pa.array([[{"key": "h0", "value": b"0"}], [], [{"key": "h2", "value": None}], []], HEADER_TYPE).slice(1, 2)
    encoded = encode_table(binary_column(keys, "key"), values, np.array([5, 6]), np.zeros(2, np.int32), headers=headers)
    got = _kafka_python_records(encoded.data[0])
    assert [(k, v, h) for _, _, k, v, h in got] == [(b"bb", None, []), (b"ccc", b"2", [("h2", None)])]


def test_timestamps_before_1970_are_refused_as_a_broker_refuses_them_and_nulls_are_none():
    from segments.spark.arrow_records import timestamps_ms

    assert timestamps_ms(pa.array([5, None, 0], pa.int64()), 3, 9, "when").tolist() == [5, -1, 0]
    with pytest.raises(ValueError, match=r"'when' holds -5 ms \(before 1970\) in 2 row"):
        timestamps_ms(pa.array([1, -5, -7], pa.int64()), 3, 9, "when")
    with pytest.raises(ValueError, match="'ts' holds -1000000 ms"):
        timestamps_ms(pa.array([-1000], pa.timestamp("s")).cast(pa.timestamp("ms")), 1, 9, "ts")


def test_non_binary_columns_are_refused_with_their_name():
    with pytest.raises(TypeError, match="'price' is int64"):
        binary_column(pa.array([1, 2]), "price")


# ---- reading ---------------------------------------------------------------------------------------------------


def _rows_from_batches(directory, **kwargs):
    out = []
    for batch in read_arrow_batches(directory, **kwargs):
        out.extend(batch.to_pylist())
    return out


def _rows_from_records(directory):
    """The same rows built record by record from the log reader (control batches skipped)."""
    out = []
    with PartitionLog.open(directory, mode="reader") as plog:
        start = plog.log_start_offset
        for batch in plog.iter_batches():
            h = batch.header
            if h.magic >= 2 and h.is_control:
                continue
            for r in batch.records:
                if r.offset < start:
                    continue
                out.append(
                    dict(
                        offset=r.offset,
                        timestamp=None if r.timestamp == fmt.NO_TIMESTAMP else r.timestamp,
                        timestamp_type=int(h.magic > 0 and h.timestamp_type == 1),
                        key=r.key, value=r.value, headers=[{"key": x.key, "value": x.value} for x in r.headers],
                        producer_id=h.producer_id if h.magic >= 2 else -1,
                        is_transactional=bool(h.magic >= 2 and h.is_transactional),
                    )
                )
    return out


def _comparable(rows):
    out = []
    for r in rows:
        r = dict(r)
        r.pop("topic", None)
        r.pop("partition", None)
        if r["timestamp"] is not None and not isinstance(r["timestamp"], int):
            r["timestamp"] = int(r["timestamp"].timestamp() * 1000 + 0.5) if r["timestamp"].microsecond % 1000 == 0 else r["timestamp"]
        out.append(r)
    return out


def _mixed_log(directory):
    config = LogConfig(segment_bytes=2048)
    with PartitionLog.open(directory, mode="writer", create=True, config=config) as plog:
        for i in range(40):
            records = [
                Record(offset=j, timestamp=TS0 + 7 * i + j, key=None if (i + j) % 11 == 0 else b"key-%d" % ((i * 3 + j) % 17),
                       value=None if j == 2 else b"value-%d-%d" % (i, j) * (j + 1),
                       headers=(Header("trace", b"%d" % i), Header("empty", None)) if j == 1 else ())
                for j in range(4)
            ]
            if i % 10 == 7:
                plog.append_batches(encode_batch(records, base_offset=0, compression=i % 5, is_transactional=True,
                                                 producer_id=9, producer_epoch=0, base_sequence=0))
                plog.append_batches(encode_control_batch(offset=0, control_type=fmt.CONTROL_TYPE_COMMIT,
                                                         timestamp=TS0, producer_id=9, producer_epoch=0))
            else:
                plog.append_batches(encode_batch(records, base_offset=0, compression=i % 5))
        plog.roll()


def test_read_columns_equal_the_record_reader_on_a_mixed_log(tmp_path):
    d = tmp_path / "mixed-3"
    _mixed_log(d)
    rows = _rows_from_batches(d)
    assert {(r["topic"], r["partition"]) for r in rows} == {("mixed", 3)}
    assert _comparable(rows) == _rows_from_records(d)
    assert len(rows) == 160
    assert any(r["is_transactional"] for r in rows) and any(r["key"] is None for r in rows)


def test_read_honours_the_log_start_offset_and_segment_ranges(tmp_path):
    d = tmp_path / "mixed-0"
    _mixed_log(d)
    update_log_dir_checkpoint(tmp_path, LOG_START_OFFSET_CHECKPOINT, ("mixed", 0), 50)
    offsets = [r["offset"] for r in _rows_from_batches(d, columns=["offset"])]
    assert offsets[0] == 50 and offsets == sorted(offsets)
    with PartitionLog.open(d, mode="reader") as plog:
        bases = [s.base_offset for s in plog.segments]
    assert len(bases) > 3
    pieces = [(None, bases[2]), (bases[2], bases[3]), (bases[3], None)]
    tiled = [r["offset"] for a, b in pieces for r in _rows_from_batches(d, columns=["offset"], segments_from=a, segments_below=b)]
    assert tiled == offsets


def test_a_subset_of_columns_is_built_alone_and_unknown_columns_are_refused(tmp_path):
    d = tmp_path / "mixed-1"
    _mixed_log(d)
    batch = next(read_arrow_batches(d, columns=["key", "offset"]))
    assert batch.schema.names == ["key", "offset"]
    with pytest.raises(ValueError, match="unknown record columns"):
        next(read_arrow_batches(d, columns=["offset", "colour"]))
    assert len(RECORD_COLUMNS) == 10


FIXTURE_CASES = [
    ("kafka-2.4-c2/raw", "c2-0"),
    ("kafka-2.4-c2/kafka-cleaned", "c2-0"),
    ("public/__consumer_offsets-39", "__consumer_offsets-39"),
    ("public/first-0", "first-0"),
    ("public/test-0", "test-0"),
    ("public/__cluster_metadata-0", "__cluster_metadata-0"),
]


@pytest.mark.parametrize("fixture,name", FIXTURE_CASES, ids=[c[0] for c in FIXTURE_CASES])
def test_real_kafka_segments_read_as_columns_equal_the_record_reader(tmp_path, fixture, name):
    d = copy_fixture(fixture, tmp_path)
    d = d.rename(d.parent / name)
    rows = _rows_from_batches(d)
    assert _comparable(rows) == _rows_from_records(d)
    assert rows, "every fixture has data records"
