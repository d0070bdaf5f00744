"""Cross-checks with kafka-python, an independent implementation of the record formats.

kafka-python reads every batch we write (every codec, v2 and legacy) and we read every batch it writes,
property-based over random records, headers, nulls and codecs. Compared: offsets, timestamps, keys,
values, headers, producer fields and the batch flags.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from segments.codec import format as fmt
from segments.codec.batches import iter_batches
from segments.codec.legacy import decode_legacy_entry, encode_legacy_message, encode_legacy_wrapper
from segments.codec.records import Header, Record, decode_batch, encode_batch, encode_control_batch

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BATCH_BYTES_MAX = 16 * 1024 * 1024  # far above anything generated: builders never refuse an append

V2_CODECS = st.sampled_from(
    [fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD]
)
LEGACY_CODECS = st.sampled_from([fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4])

nullable_bytes = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=40))
headers = st.lists(
    st.tuples(st.text(max_size=6), st.one_of(st.none(), st.just(b""), st.binary(max_size=12))), max_size=3
)


@st.composite
def record_lists(draw, *, min_size=0, max_size=12):
    """[(offset_delta, timestamp, key, value, [(header key, header value)])] with gaps and negative deltas."""
    count = draw(st.integers(min_size, max_size))
    start_ms = draw(st.integers(0, 2**42))
    delta = draw(st.integers(0, 10)) - 1
    out = []
    for _ in range(count):
        delta += draw(st.integers(1, 300))
        timestamp = start_ms + draw(st.integers(-(10**8), 10**8))
        out.append((delta, timestamp, draw(nullable_bytes), draw(nullable_bytes), draw(headers)))
    return out


@st.composite
def producer_states(draw):
    """(producer_id, producer_epoch, base_sequence, is_transactional), consistent as a producer sets them."""
    if draw(st.booleans()):
        return -1, -1, -1, False
    return (
        draw(st.integers(0, 2**62)),
        draw(st.integers(0, 2**15 - 1)),
        draw(st.integers(0, 2**31 - 1)),
        draw(st.booleans()),
    )


def _theirs(record):
    return (record.offset, record.timestamp, record.key, record.value, [tuple(h) for h in record.headers])


def _ours(record: Record):
    return (record.offset, record.timestamp, record.key, record.value, [(h.key, h.value) for h in record.headers])


# ---- v2: we write, kafka-python reads ----------------------------------------------------------------------------


@PROPERTY
@given(
    records=record_lists(),
    codec=V2_CODECS,
    producer=producer_states(),
    base_offset=st.integers(0, 2**48),
    partition_leader_epoch=st.integers(-1, 2**31 - 1),
    log_append_time=st.one_of(st.none(), st.integers(0, 2**42)),
    extra_slots=st.integers(0, 5),
)
def test_kafka_python_reads_every_v2_batch_we_write(
    records, codec, producer, base_offset, partition_leader_epoch, log_append_time, extra_slots
):
    producer_id, producer_epoch, base_sequence, is_transactional = producer
    ours = [
        Record(
            base_offset + d,
            ts if log_append_time is None else log_append_time,
            k,
            v,
            tuple(Header(hk, hv) for hk, hv in hs),
            timestamp_delta=None if log_append_time is None else ts % 1000,
        )
        for d, ts, k, v, hs in records
    ]
    last_offset_delta = (records[-1][0] if records else 0) + extra_slots
    data = encode_batch(
        ours,
        base_offset=base_offset,
        compression=codec,
        timestamp_type=fmt.TIMESTAMP_CREATE_TIME if log_append_time is None else fmt.TIMESTAMP_LOG_APPEND_TIME,
        is_transactional=is_transactional,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        last_offset_delta=last_offset_delta,
        max_timestamp=log_append_time,
    )
    batches = list(MemoryRecords(data))
    assert len(batches) == 1
    batch = batches[0]
    assert isinstance(batch, DefaultRecordBatch)
    assert batch.validate_crc()
    assert (batch.base_offset, batch.last_offset_delta, batch.records_count) == (
        base_offset,
        last_offset_delta,
        len(ours),
    )
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.is_transactional) == (
        producer_id,
        producer_epoch,
        base_sequence,
        is_transactional,
    )
    assert batch.leader_epoch == partition_leader_epoch
    assert batch.compression_type == (codec if ours else fmt.COMPRESSION_NONE)
    assert batch.timestamp_type == (0 if log_append_time is None else 1)
    assert [_theirs(r) for r in batch] == [_ours(r) for r in ours]


@PROPERTY
@given(
    offset=st.integers(0, 2**48),
    control_type=st.sampled_from([fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT]),
    producer_id=st.integers(0, 2**62),
    producer_epoch=st.integers(0, 2**15 - 1),
    coordinator_epoch=st.integers(0, 2**31 - 1),
)
def test_kafka_python_reads_our_transaction_markers(offset, control_type, producer_id, producer_epoch, coordinator_epoch):
    data = encode_control_batch(
        offset=offset,
        control_type=control_type,
        timestamp=1_700_000_000_000,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        coordinator_epoch=coordinator_epoch,
    )
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    assert batch.is_control_batch and batch.is_transactional
    (record,) = list(batch)
    assert (record.offset, record.version, record.type) == (offset, 0, control_type)
    assert record.commit == (control_type == fmt.CONTROL_TYPE_COMMIT)


# ---- v2: kafka-python writes, we read ----------------------------------------------------------------------------


@PROPERTY
@given(records=record_lists(min_size=1), codec=V2_CODECS, producer=producer_states())
def test_we_read_every_v2_batch_kafka_python_writes(records, codec, producer):
    producer_id, producer_epoch, base_sequence, is_transactional = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=is_transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=BATCH_BYTES_MAX,
    )
    for delta, ts, k, v, hs in records:
        assert builder.append(delta, ts, k, v, hs) is not None
    data = bytes(builder.build())
    batch = decode_batch(data)
    header = batch.header
    # kafka-python falls back to no compression when compressing does not pay
    assert header.compression in (codec, fmt.COMPRESSION_NONE)
    assert (header.base_offset, header.last_offset_delta, header.records_count) == (0, records[-1][0], len(records))
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.is_transactional) == (
        producer_id,
        producer_epoch,
        base_sequence,
        is_transactional,
    )
    assert (header.base_timestamp, header.max_timestamp) == (records[0][1], max(r[1] for r in records))
    assert [_ours(r) for r in batch.records] == [(d, ts, k, v, hs) for d, ts, k, v, hs in records]
    # and both readers agree record by record
    assert [_ours(r) for r in batch.records] == [_theirs(r) for r in DefaultRecordBatch(data)]


@settings(max_examples=40, deadline=None)
@given(
    magic=st.sampled_from([0, 1, 2]),
    codec=st.sampled_from([fmt.COMPRESSION_NONE, fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY]),
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    first_offset=st.integers(0, 2**20),  # kafka-python writes v2 offsets as deltas from base offset 0
)
def test_we_walk_the_message_sets_kafka_pythons_memory_records_builder_writes(magic, codec, sizes, first_offset):
    expected = []
    chunks = []
    offset = first_offset
    for batch_index, size in enumerate(sizes):
        builder = MemoryRecordsBuilder(magic, codec, BATCH_BYTES_MAX, offset=offset)
        for i in range(size):
            ts = 1_600_000_000_000 + batch_index * 100 + i
            key = b"k%d" % (i % 3) if i % 4 else None
            value = None if i == 2 else b"value-%d" % i
            assert builder.append(ts, key, value) is not None
            expected.append((offset, ts if magic else -1, key, value))
            offset += 1
        builder.close()
        chunks.append(bytes(builder.buffer()))
    data = b"".join(chunks)
    walked = [b for _, b in iter_batches(data)]
    ours = [(r.offset, r.timestamp, r.key, r.value) for b in walked for r in b.records]
    if magic == 2 or codec == fmt.COMPRESSION_NONE:
        # A v2 batch and uncompressed legacy messages carry their offsets.
        assert ours == expected
    else:
        # kafka-python, like a producer, leaves offsets to the broker: its v0/v1 wrappers have outer
        # offset 0 and inner offsets as appended, which our reader (like Kafka's) takes as they are.
        assert [o[1:] for o in ours] == [e[1:] for e in expected]
    theirs = [(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for b in MemoryRecords(data) for r in b]
    assert ours == theirs


# ---- legacy, both ways ------------------------------------------------------------------------------------------


@st.composite
def legacy_messages(draw):
    count = draw(st.integers(1, 10))
    offset = draw(st.integers(0, 2**40))
    out = []
    for _ in range(count):
        out.append((offset, draw(st.integers(0, 2**42)), draw(nullable_bytes), draw(nullable_bytes)))
        offset += draw(st.integers(1, 50))
    return out


@PROPERTY
@given(messages=legacy_messages(), magic=st.sampled_from([0, 1]))
def test_uncompressed_legacy_messages_are_byte_identical_to_kafka_pythons(messages, magic):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=BATCH_BYTES_MAX)
    for offset, ts, key, value in messages:
        assert builder.append(offset, ts, key, value) is not None
    theirs = bytes(builder.build())
    ours = b"".join(
        encode_legacy_message(offset, key, value, magic=magic, timestamp=ts if magic else -1)
        for offset, ts, key, value in messages
    )
    assert ours == theirs


@PROPERTY
@given(messages=legacy_messages(), magic=st.sampled_from([0, 1]), codec=LEGACY_CODECS)
def test_we_read_every_legacy_message_set_kafka_python_writes(messages, magic, codec):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=BATCH_BYTES_MAX)
    if magic == 1 and codec:
        # a producer writes relative inner offsets; the broker sets the outer offset to the last one
        first = messages[0][0]
        messages = [(o - first, ts, k, v) for o, ts, k, v in messages]
    for offset, ts, key, value in messages:
        assert builder.append(offset, ts, key, value) is not None
    data = bytes(builder.build())
    walked = [b for _, b in iter_batches(data)]
    assert len(walked) == (1 if codec else len(messages))
    expected = [(o, ts if magic else -1, k, v) for o, ts, k, v in messages]
    assert [(r.offset, r.timestamp, r.key, r.value) for b in walked for r in b.records] == expected


def _read_with_kafka_python(entry: bytes, magic: int):
    batch = LegacyRecordBatch(entry, magic)
    assert batch.validate_crc()
    return [(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch]


@PROPERTY
@given(messages=legacy_messages(), magic=st.sampled_from([0, 1]), codec=LEGACY_CODECS, log_append_time=st.booleans())
def test_kafka_python_reads_every_legacy_entry_we_write(messages, magic, codec, log_append_time):
    records = [Record(o, ts if magic else -1, k, v) for o, ts, k, v in messages]
    if codec == fmt.COMPRESSION_NONE:
        entries = [encode_legacy_message(r.offset, r.key, r.value, magic=magic, timestamp=r.timestamp) for r in records]
    elif magic == 1 and log_append_time:
        append_ms = 1_750_000_000_000
        entries = [
            encode_legacy_wrapper(
                records,
                magic=1,
                codec=codec,
                timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME,
                wrapper_timestamp=append_ms,
            )
        ]
        records = [Record(r.offset, append_ms, r.key, r.value) for r in records]
    else:
        entries = [encode_legacy_wrapper(records, magic=magic, codec=codec)]
    theirs = [t for entry in entries for t in _read_with_kafka_python(entry, magic)]
    assert theirs == [(r.offset, r.timestamp, r.key, r.value) for r in records]
    ours = [r for entry in entries for r in decode_legacy_entry(entry).records]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in ours] == theirs


# ---- mixed logs ----------------------------------------------------------------------------------------------------


def test_kafka_python_and_we_walk_a_mixed_magic_log_identically():
    entries = [
        encode_legacy_message(0, b"a", b"0", magic=0),
        encode_legacy_wrapper([Record(1, 10, b"b", b"1"), Record(3, 12, None, b"3")], magic=1, codec=fmt.COMPRESSION_SNAPPY),
        encode_batch([Record(4, 20, b"c", None, (Header("h", b"x"),))], base_offset=4, compression=fmt.COMPRESSION_LZ4),
        encode_batch([Record(6, 30, b"d", b"6")], base_offset=5, compression=fmt.COMPRESSION_ZSTD, last_offset_delta=2),
    ]
    data = b"".join(entries)
    theirs = [
        (b.magic, r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value, [tuple(h) for h in r.headers])
        for b in MemoryRecords(data)
        for r in b
    ]
    ours = [
        (b.header.magic, r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
        for _, b in iter_batches(data)
        for r in b.records
    ]
    assert ours == theirs
    assert [o[1] for o in ours] == [0, 1, 3, 4, 6]
