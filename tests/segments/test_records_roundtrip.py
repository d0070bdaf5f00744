"""Property tests: decode(encode(x)) == x for v2 batches, and encode(decode(b)) == b.

Random records cover null/empty/binary keys and values, headers with null values, negative timestamp
deltas (a delete horizon after the records, or a first record that is not the earliest), gaps in the
offset deltas, every codec, control batches, the delete-horizon bit, empty batches and LogAppendTime.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.records import (
    Header,
    Record,
    decode_batch,
    decode_batch_header,
    decode_control_key,
    decode_end_txn_marker,
    encode_batch,
    encode_control_batch,
    make_attributes,
    with_partition_leader_epoch,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
nullable_bytes = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=40))
headers = st.lists(
    st.builds(Header, st.text(max_size=6), st.one_of(st.none(), st.just(b""), st.binary(max_size=12))),
    max_size=3,
).map(tuple)


@st.composite
def batch_specs(draw, *, compression=st.integers(fmt.COMPRESSION_NONE, fmt.COMPRESSION_ZSTD)):
    """(records, encode_batch kwargs, expected header fields) for a random v2 batch."""
    count = draw(st.integers(0, 12))
    base_offset = draw(st.integers(0, 2**48))
    gaps = draw(st.lists(st.integers(1, 1000), min_size=count, max_size=count))
    first_delta = draw(st.integers(0, 50))
    deltas = []
    delta = first_delta - 1
    for gap in gaps:
        delta += gap
        deltas.append(delta)
    timestamp_type = draw(st.sampled_from([fmt.TIMESTAMP_CREATE_TIME, fmt.TIMESTAMP_LOG_APPEND_TIME]))
    log_append_time = timestamp_type == fmt.TIMESTAMP_LOG_APPEND_TIME
    start_ms = draw(st.integers(0, 2**42))
    append_ms = draw(st.integers(0, 2**42))
    records = []
    for d in deltas:
        key, value, hdrs = draw(nullable_bytes), draw(nullable_bytes), draw(headers)
        if log_append_time:
            # Every record reads the append time; the stored deltas are arbitrary and kept as given.
            stored_delta = draw(st.integers(-(2**40), 2**40))
            records.append(Record(base_offset + d, append_ms, key, value, hdrs, timestamp_delta=stored_delta))
        else:
            records.append(Record(base_offset + d, start_ms + draw(st.integers(-(10**9), 10**9)), key, value, hdrs))
    extra_slots = draw(st.integers(0, 20))
    last_offset_delta = (deltas[-1] if deltas else draw(st.integers(0, 1000))) + extra_slots
    producer_id = draw(st.one_of(st.just(-1), st.integers(0, 2**62)))
    kwargs = dict(
        base_offset=base_offset,
        compression=draw(compression),
        timestamp_type=timestamp_type,
        is_transactional=producer_id >= 0 and draw(st.booleans()),
        partition_leader_epoch=draw(st.one_of(st.just(-1), INT32)),
        producer_id=producer_id,
        producer_epoch=draw(INT16) if producer_id >= 0 else -1,
        base_sequence=draw(st.integers(0, 2**31 - 1)) if producer_id >= 0 else -1,
        last_offset_delta=last_offset_delta,
    )
    horizon = draw(st.one_of(st.none(), st.integers(0, 2**43)))
    if horizon is not None:
        kwargs["delete_horizon_ms"] = horizon
    if log_append_time:
        kwargs["max_timestamp"] = append_ms
    if horizon is not None:
        base_timestamp = horizon
    elif records:
        base_timestamp = records[0].timestamp
    else:
        base_timestamp = -1
    if log_append_time:
        max_timestamp = append_ms
    else:
        max_timestamp = max((r.timestamp for r in records), default=-1)
    expected = dict(
        base_offset=base_offset,
        partition_leader_epoch=kwargs["partition_leader_epoch"],
        magic=fmt.MAGIC_V2,
        attributes=make_attributes(
            compression=kwargs["compression"] if records else fmt.COMPRESSION_NONE,
            timestamp_type=timestamp_type,
            is_transactional=kwargs["is_transactional"],
            has_delete_horizon=horizon is not None,
        ),
        last_offset_delta=last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=kwargs["producer_epoch"],
        base_sequence=kwargs["base_sequence"],
        records_count=len(records),
    )
    return records, kwargs, expected


def _comparable(decoded: tuple[Record, ...], log_append_time: bool) -> list[Record]:
    if log_append_time:
        return list(decoded)
    return [dataclasses.replace(r, timestamp_delta=None) for r in decoded]


def _reencode(batch) -> bytes:
    h = batch.header
    return encode_batch(
        batch.records,
        base_offset=h.base_offset,
        compression=h.compression,
        timestamp_type=h.timestamp_type,
        is_transactional=h.is_transactional,
        is_control=h.is_control,
        partition_leader_epoch=h.partition_leader_epoch,
        producer_id=h.producer_id,
        producer_epoch=h.producer_epoch,
        base_sequence=h.base_sequence,
        last_offset_delta=h.last_offset_delta,
        base_timestamp=None if h.has_delete_horizon else h.base_timestamp,
        max_timestamp=h.max_timestamp,
        delete_horizon_ms=h.delete_horizon_ms,
    )


@PROPERTY
@given(batch_specs())
def test_decode_of_encode_returns_the_records_and_header_fields(spec):
    records, kwargs, expected = spec
    data = encode_batch(records, **kwargs)
    batch = decode_batch(data)
    header = batch.header
    assert {name: getattr(header, name) for name in expected} == expected
    assert header.size_bytes == len(data)
    log_append_time = kwargs["timestamp_type"] == fmt.TIMESTAMP_LOG_APPEND_TIME
    assert _comparable(batch.records, log_append_time) == records
    if not log_append_time:
        assert all(r.timestamp_delta == r.timestamp - header.base_timestamp for r in batch.records)
    assert decode_batch_header(data) == header


@PROPERTY
@given(batch_specs())
def test_encode_of_decode_reproduces_the_bytes(spec):
    records, kwargs, _ = spec
    data = encode_batch(records, **kwargs)
    assert _reencode(decode_batch(data)) == data


@PROPERTY
@given(batch_specs(compression=st.just(fmt.COMPRESSION_NONE)), st.integers(1, 5000))
def test_records_are_unchanged_when_the_delete_horizon_is_stamped_after_them(spec, retention_ms):
    # The cleaner's horizon rewrite: base timestamp becomes the horizon, deltas go negative,
    # absolute timestamps stay.
    records, kwargs, _ = spec
    if kwargs["timestamp_type"] == fmt.TIMESTAMP_LOG_APPEND_TIME or not records:
        return
    kwargs = dict(kwargs, delete_horizon_ms=max(r.timestamp for r in records) + retention_ms)
    batch = decode_batch(encode_batch(records, **kwargs))
    assert batch.header.has_delete_horizon
    assert batch.header.delete_horizon_ms == kwargs["delete_horizon_ms"]
    assert all(r.timestamp_delta < 0 for r in batch.records)
    assert _comparable(batch.records, False) == records


@PROPERTY
@given(
    offset=st.integers(0, 2**62),
    control_type=st.sampled_from([fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT]),
    timestamp=st.integers(0, 2**42),
    producer_id=st.integers(0, 2**62),
    producer_epoch=st.integers(0, 2**15 - 1),
    coordinator_epoch=INT32,
    partition_leader_epoch=INT32,
)
def test_control_batch_round_trips_its_marker(
    offset, control_type, timestamp, producer_id, producer_epoch, coordinator_epoch, partition_leader_epoch
):
    data = encode_control_batch(
        offset=offset,
        control_type=control_type,
        timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        coordinator_epoch=coordinator_epoch,
        partition_leader_epoch=partition_leader_epoch,
    )
    batch = decode_batch(data)
    h = batch.header
    assert h.is_control and h.is_transactional and h.compression == fmt.COMPRESSION_NONE
    assert (h.base_offset, h.last_offset_delta, h.base_sequence) == (offset, 0, -1)
    assert (h.producer_id, h.producer_epoch, h.partition_leader_epoch) == (
        producer_id,
        producer_epoch,
        partition_leader_epoch,
    )
    (record,) = batch.records
    assert (record.offset, record.timestamp, record.timestamp_delta, record.headers) == (offset, timestamp, 0, ())
    assert decode_control_key(record.key) == (0, control_type)
    assert decode_end_txn_marker(record.value) == (0, coordinator_epoch)
    assert _reencode(batch) == data


@PROPERTY
@given(
    base_offset=st.integers(0, 2**62),
    last_offset_delta=st.integers(0, 2**31 - 1),
    max_timestamp=st.integers(-1, 2**42),
    is_control=st.booleans(),
    producer_id=st.integers(0, 2**62),
)
def test_empty_batch_is_a_61_byte_header_that_round_trips(base_offset, last_offset_delta, max_timestamp, is_control, producer_id):
    data = encode_batch(
        [],
        base_offset=base_offset,
        compression=fmt.COMPRESSION_ZSTD,  # cleared: an empty batch has no stream
        is_control=is_control,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        last_offset_delta=last_offset_delta,
        max_timestamp=max_timestamp,
    )
    assert len(data) == fmt.RECORD_BATCH_OVERHEAD
    batch = decode_batch(data)
    assert batch.records == ()
    h = batch.header
    assert (h.records_count, h.compression, h.base_timestamp, h.max_timestamp) == (0, 0, -1, max_timestamp)
    assert (h.base_offset, h.last_offset_delta, h.is_control) == (base_offset, last_offset_delta, is_control)
    assert h.next_offset == base_offset + last_offset_delta + 1


@PROPERTY
@given(batch_specs(), INT32)
def test_replacing_the_partition_leader_epoch_keeps_the_batch_valid(spec, epoch):
    records, kwargs, _ = spec
    data = encode_batch(records, **kwargs)
    batch = decode_batch(with_partition_leader_epoch(data, epoch))
    assert batch.header.partition_leader_epoch == epoch
    assert batch.records == decode_batch(data).records


@settings(max_examples=300, deadline=None)
@given(batch_specs(), st.data())
def test_any_single_byte_change_in_a_batch_is_either_detected_or_confined_to_the_leader_epoch(spec, data):
    records, kwargs, _ = spec
    original = encode_batch(records, **kwargs)
    position = data.draw(st.integers(0, len(original) - 1))
    mask = data.draw(st.integers(1, 255))
    mutated = bytearray(original)
    mutated[position] ^= mask
    try:
        batch = decode_batch(bytes(mutated))
    except CorruptRecordError:
        return  # detected (TruncatedBatchError and UnsupportedFormatError are subclasses)
    # Undetected changes are only possible where the CRC does not reach: the offset, the length
    # (only if still consistent, which a single change cannot be), the leader epoch, the magic.
    assert position < fmt.CRC_OFFSET
    assert batch.records == decode_batch(original).records or position < fmt.LENGTH_OFFSET
