"""Legacy (magic 0/1) data: messages kept or dropped whole, wrappers re-compressed, tombstones by mtime.

A writer only appends v2 batches, so the legacy segments are written by hand (`write_raw_segment`); the
cleaner rebuilds their missing indexes when it opens the log.
"""

from __future__ import annotations

import os

import pytest

from segments.codec import format as fmt
from segments.codec.legacy import encode_legacy_message, encode_legacy_wrapper
from segments.codec.records import Record
from segments.tools.verify import verify_paths

from .builders import (
    DAY_MS,
    T0,
    batch,
    batches,
    build_log,
    clean,
    partition_dir,
    raw_batches,
    records,
    write_raw_segment,
)

MAGICS = [fmt.MAGIC_V0, fmt.MAGIC_V1]


def _message(magic: int, offset: int, key, value, timestamp: int) -> bytes:
    return encode_legacy_message(offset, key, value, magic=magic, timestamp=timestamp if magic else fmt.NO_TIMESTAMP)


def _legacy_log(tmp_path, segments: dict[int, bytes], active_base: int):
    d = partition_dir(tmp_path)
    d.mkdir(parents=True)
    for base, data in segments.items():
        write_raw_segment(d, base, data)
    write_raw_segment(d, active_base, b"")
    return d


@pytest.mark.parametrize("magic", MAGICS)
def test_uncompressed_legacy_messages_are_kept_or_dropped_whole(tmp_path, magic):
    msgs = [
        _message(magic, 0, b"a", b"a1", T0),
        _message(magic, 1, b"b", b"b1", T0 + 1),
        _message(magic, 2, b"a", b"a2", T0 + 2),
        _message(magic, 3, None, b"unkeyed", T0 + 3),
        _message(magic, 4, b"c", b"c1", T0 + 4),
    ]
    d = _legacy_log(tmp_path, {0: b"".join(msgs)}, active_base=5)
    result = clean(d, now_ms=T0 + 1000)
    after = raw_batches(d)
    assert sorted(after) == [1, 2, 4]
    assert [after[1], after[2], after[4]] == [msgs[1], msgs[2], msgs[4]]  # byte for byte
    assert result.invalid_records == 1
    assert not verify_paths([d]).problems


@pytest.mark.parametrize("magic", MAGICS)
@pytest.mark.parametrize("codec", [fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4])
def test_wrapper_losing_inner_messages_is_recompressed_in_its_own_magic_at_its_last_kept_offset(
    tmp_path, magic, codec
):
    ts = (lambda t: t) if magic else (lambda t: fmt.NO_TIMESTAMP)
    inner = [
        Record(2, ts(T0 + 20), b"a", b"a-old"),
        Record(3, ts(T0 + 30), b"b", b"b1"),
        Record(5, ts(T0 + 10), b"c", b"c1"),  # an offset gap inside the wrapper
        Record(6, ts(T0 + 60), b"d", b"d-old"),
    ]
    wrapper = encode_legacy_wrapper(inner, magic=magic, codec=codec)
    tail = _message(magic, 7, b"a", b"a-new", T0 + 70) + _message(magic, 8, b"d", b"d-new", T0 + 80)
    d = _legacy_log(tmp_path, {2: wrapper + tail}, active_base=9)
    clean(d, now_ms=T0 + 1000)
    rebuilt = batches(d)[0]
    h = rebuilt.header
    assert (h.magic, h.compression) == (magic, codec)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in rebuilt.records] == [
        (3, ts(T0 + 30), b"b", b"b1"), (5, ts(T0 + 10), b"c", b"c1")
    ]
    assert 5 in raw_batches(d)  # the outer offset is the last kept inner offset
    if magic:
        assert h.max_timestamp == T0 + 30  # the wrapper's timestamp: the largest kept (CreateTime)
    assert records(d) == [(3, b"b", b"b1"), (5, b"c", b"c1"), (7, b"a", b"a-new"), (8, b"d", b"d-new")]
    assert not verify_paths([d]).problems


def test_log_append_time_wrapper_keeps_its_timestamp_type_and_append_time(tmp_path):
    inner = [Record(0, T0 + 1, b"a", b"1"), Record(1, T0 + 2, b"b", b"1"), Record(2, T0 + 3, b"a", b"2")]
    wrapper = encode_legacy_wrapper(inner, magic=fmt.MAGIC_V1, codec=fmt.COMPRESSION_GZIP,
                                    timestamp_type=fmt.TIMESTAMP_LOG_APPEND_TIME, wrapper_timestamp=T0 + 50)
    d = _legacy_log(tmp_path, {0: wrapper + _message(1, 3, b"b", b"2", T0 + 9)}, active_base=4)
    clean(d, now_ms=T0 + 1000)
    rebuilt = batches(d)[0]
    assert rebuilt.header.attributes == fmt.COMPRESSION_GZIP | fmt.LEGACY_TIMESTAMP_TYPE_MASK
    assert rebuilt.header.max_timestamp == T0 + 50
    assert [(r.offset, r.timestamp, r.key, r.value) for r in rebuilt.records] == [(2, T0 + 50, b"a", b"2")]


def test_untouched_wrapper_is_copied_byte_for_byte(tmp_path):
    wrapper = encode_legacy_wrapper(
        [Record(0, T0, b"a", b"1"), Record(1, T0 + 1, b"b", b"1")], magic=fmt.MAGIC_V1, codec=fmt.COMPRESSION_GZIP
    )
    d = _legacy_log(tmp_path, {0: wrapper + _message(1, 2, b"c", b"1", T0 + 2)}, active_base=3)
    clean(d, now_ms=T0 + 1000)
    assert raw_batches(d)[1] == wrapper


@pytest.mark.parametrize("magic", MAGICS)
def test_legacy_tombstones_expire_by_segment_mtime_against_the_last_clean_segment(tmp_path, magic):
    retention_ms = DAY_MS
    settings = {"delete.retention.ms": retention_ms, "segment.bytes": 80}  # one group per segment
    d = _legacy_log(tmp_path, {
        0: _message(magic, 0, b"a", None, T0) + _message(magic, 1, b"b", b"b1", T0),
        2: _message(magic, 2, b"c", None, T0) + _message(magic, 3, b"d", b"d1", T0),
    }, active_base=4)
    newest_ms = T0 + 10 * DAY_MS
    mtimes_ms = {0: newest_ms - 2 * retention_ms, 2: newest_ms}

    def set_mtimes():
        for base, ms in mtimes_ms.items():
            os.utime(d / fmt.offset_file_name(base, fmt.LOG_SUFFIX), ns=(ms * 1_000_000, ms * 1_000_000))

    set_mtimes()
    clean(d, now_ms=newest_ms, settings=settings)  # no clean section yet: every tombstone stays
    assert records(d) == [(0, b"a", None), (1, b"b", b"b1"), (2, b"c", None), (3, b"d", b"d1")]

    build_log(d, [batch([(b"e", b"e1")])])  # 4: dirty data, so there is a second round
    set_mtimes()
    clean(d, now_ms=newest_ms, settings=settings)  # legacy horizon = mtime of segment 2 - retention
    assert records(d) == [(1, b"b", b"b1"), (2, b"c", None), (3, b"d", b"d1"), (4, b"e", b"e1")]


@pytest.mark.parametrize("magic", MAGICS)
def test_superseded_legacy_message_ending_a_group_is_kept_whole_so_the_group_range_stays_exact(tmp_path, magic):
    # Segment 0 ends with a message superseded in segment 3; as the group's last batch it cannot be emptied
    # (legacy), so it is kept whole: the new segment still ends where the group's old segments end.
    first = [_message(magic, 0, b"a", b"a1", T0), _message(magic, 1, b"b", b"b1", T0 + 1)]
    second = [_message(magic, 3, b"b", b"b2", T0 + 3)]
    d = _legacy_log(tmp_path, {0: b"".join(first), 3: b"".join(second)}, active_base=4)
    clean(d, now_ms=T0 + 1000, settings={"segment.bytes": len(first[0]) + len(first[1])})
    after = raw_batches(d)
    assert after[1] == first[1]  # superseded, yet kept: it ends its group
    assert after[3] == second[0]
    assert not verify_paths([d]).problems
