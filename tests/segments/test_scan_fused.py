"""The scan's common path (`window_ranges`, the CRC call, `finish_window`/`finish_records`, `fill_columns`: a few
compiled calls per window) gives what the stepwise path (`scan._scan_steps`, the stages one by one) gives, field
for field and dtype for dtype, or raises the same error at the same position: random windows of v2 batches of
every codec (lz4 frames included), control and empty batches, legacy v0/v1 messages and wrappers, torn tails,
flipped bytes (with and without a recomputed CRC), limits on records, windows inside a buffer, with and without
CRC checks, headers only, and with and without reused record buffers."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from segments.codec import _scan_kernels as k
from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.scan import ScanBuffers, _scan_steps, scan

from .test_scan import CODECS, batch_starts, fix_crc, legacy_entry, legacy_wrapper, random_batch


def _legacy_part(rng: random.Random, offset: int) -> tuple[bytes, int]:
    magic = rng.choice((0, 1))
    ts = 1_700_000_000_000 + offset if magic else -1
    if rng.random() < 0.5:
        return legacy_entry(offset, magic, rng.choice((None, b"k")), rng.choice((None, b"v" * 30)), timestamp=ts), offset + 1
    inner = b"".join(legacy_entry(j if magic else offset + j, magic, b"k%d" % j, b"w" * 20, timestamp=ts)
                     for j in range(3))
    codec = rng.choice((fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4))
    return legacy_wrapper(offset + 2, magic, codec, inner, timestamp=ts), offset + 3


def _window(seed: int) -> bytes:
    rng = random.Random(seed)
    offset = rng.randrange(2**40)
    lz4_only = seed % 4 == 1  # the lz4 frames' own path: every compressed batch an lz4 v2 batch
    legacy = seed % 4 == 2
    parts = []
    for _ in range(rng.randrange(0, 20)):
        if legacy and rng.random() < 0.4:
            part, offset = _legacy_part(rng, offset)
        else:
            part, offset = random_batch(rng, offset)
            if lz4_only and part[fmt.MAGIC_OFFSET] == fmt.MAGIC_V2:
                codec = int.from_bytes(part[fmt.ATTRIBUTES_OFFSET:fmt.ATTRIBUTES_OFFSET + 2], "big") & fmt.COMPRESSION_MASK
                if codec not in (fmt.COMPRESSION_NONE, fmt.COMPRESSION_LZ4):
                    continue
        parts.append(part)
    return b"".join(parts)


def _damaged(rng: random.Random, data: bytes) -> bytes:
    """`data` with a byte flipped (in a header, a length, the records), sometimes under a recomputed CRC, or cut."""
    roll = rng.random()
    if not data or roll < 0.3:
        return data
    if roll < 0.45:
        return data[: rng.randrange(len(data))]  # a torn tail (or a cut inside a prefix)
    out = bytearray(data)
    starts = batch_starts(data)
    at = rng.choice(starts)
    pos = at + rng.randrange(min(80, len(data) - at))
    out[pos] ^= 1 << rng.randrange(8)
    if rng.random() < 0.5 and out[at + fmt.MAGIC_OFFSET] == fmt.MAGIC_V2 and len(out) >= at + fmt.RECORD_BATCH_OVERHEAD:
        try:
            fix_crc(out, at)
        except Exception:  # noqa: BLE001 - a flipped length: the batch no longer fits
            pass
    return bytes(out)


def _outcome(fn):
    try:
        return fn()
    except CorruptRecordError as exc:  # UnsupportedFormatError included
        return (type(exc), str(exc), exc.position)


def _same(a, b) -> None:
    if isinstance(a, tuple) or isinstance(b, tuple):
        assert a == b
        return
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), field.name
        else:
            assert x == y, field.name


@pytest.mark.parametrize("seed", range(160))
def test_the_common_path_equals_the_stepwise_scan(seed):
    rng = random.Random(seed)
    data = _damaged(rng, _window(seed))
    pad = rng.choice((0, 0, 5))
    buf = np.frombuffer(b"\0" * pad + data + b"\0" * pad, dtype=np.uint8)
    start, end = pad, pad + len(data)
    buffers = ScanBuffers()
    for verify in (True, False):
        for headers_only in (False, True):
            for records_max in (16 * 1024 * 1024, rng.randrange(1, 40)):
                kwargs = dict(start=start, end=end, base_position=1000, verify_crc=verify,
                              headers_only=headers_only, records_max=records_max)
                expected = _outcome(lambda: _scan_steps(buf, start, end, 1000, verify, headers_only,
                                                        64 * 1024 * 1024, 512 * 1024 * 1024, records_max, None))
                _same(expected, _outcome(lambda: scan(buf, **kwargs)))
                _same(expected, _outcome(lambda: scan(buf, buffers=buffers, **kwargs)))  # walks into its arrays


def test_the_common_path_is_taken_and_takes_every_exit(monkeypatch):
    """Every window above goes through `finish_window`; these count the exits it took."""
    import segments.codec.scan as scan_module

    seen: dict[int, int] = {}
    finish = k.finish_window

    class Counting:
        def __getattr__(self, name):
            return getattr(k, name)

        def finish_window(self, *args):
            status = finish(*args)
            seen[status] = seen.get(status, 0) + 1
            return status

    monkeypatch.setattr(scan_module, "k", Counting())
    for seed in range(80):
        rng = random.Random(seed)
        data = _damaged(rng, _window(seed))
        for buffers in (None, ScanBuffers()):
            _outcome(lambda: scan(data, buffers=buffers))
    assert set(seen) == {k.W_DONE, k.W_ARENA, k.W_RECORDS, k.W_STEPWISE}, seen


@pytest.mark.parametrize("codec", CODECS)
def test_one_batch_and_an_empty_window(codec):
    rng = random.Random(codec)
    while True:
        data, _ = random_batch(rng, 5)
        if int.from_bytes(data[fmt.ATTRIBUTES_OFFSET:fmt.ATTRIBUTES_OFFSET + 2], "big") & fmt.COMPRESSION_MASK == codec:
            break
    for window in (data, b"", data[:7]):
        buf = np.frombuffer(window, dtype=np.uint8)
        _same(_outcome(lambda: _scan_steps(buf, 0, len(buf), 0, True, False, 1 << 26, 1 << 29, 1 << 24, None)),
              _outcome(lambda: scan(buf, buffers=ScanBuffers())))


def _reference_columns(hdr: np.ndarray, base_position: int, headers_only: bool) -> dict:
    """The batch columns as numpy made them from the header rows before `fill_columns`."""
    magic = hdr[:, k.COL_MAGIC].astype(np.int8)
    attributes = hdr[:, k.COL_ATTRIBUTES].astype(np.int16)
    base_timestamp = hdr[:, k.COL_BASE_TIMESTAMP].copy()
    horizon = (magic >= fmt.MAGIC_V2) & ((attributes & fmt.DELETE_HORIZON_FLAG) != 0)
    base_offset = hdr[:, k.COL_BASE_OFFSET].copy()
    if headers_only:
        base_offset[(magic < fmt.MAGIC_V2) & ((attributes & fmt.COMPRESSION_MASK) != 0)] = -1
    return {
        "batch_position": hdr[:, k.COL_POSITION] + base_position,
        "batch_size": hdr[:, k.COL_SIZE].copy(),
        "magic": magic,
        "attributes": attributes,
        "partition_leader_epoch": hdr[:, k.COL_LEADER_EPOCH].astype(np.int32),
        "crc": hdr[:, k.COL_CRC].astype(np.uint32),
        "base_offset": base_offset,
        "last_offset": hdr[:, k.COL_LAST_OFFSET].copy(),
        "base_timestamp": base_timestamp,
        "max_timestamp": hdr[:, k.COL_MAX_TIMESTAMP].copy(),
        "delete_horizon_ms": np.where(horizon, base_timestamp, fmt.NO_TIMESTAMP),
        "producer_id": hdr[:, k.COL_PRODUCER_ID].copy(),
        "producer_epoch": hdr[:, k.COL_PRODUCER_EPOCH].astype(np.int16),
        "base_sequence": hdr[:, k.COL_BASE_SEQUENCE].astype(np.int32),
        "records_count": hdr[:, k.COL_RECORDS_COUNT].astype(np.int32),
        "records_in_arena": hdr[:, k.COL_IN_ARENA].astype(np.bool_),
        "records_pos": hdr[:, k.COL_RECORDS_POS].copy(),
        "records_bytes": hdr[:, k.COL_RECORDS_BYTES].copy(),
        # the former properties
        "compression": (attributes & fmt.COMPRESSION_MASK).astype(np.int8),
        "is_transactional": (magic >= fmt.MAGIC_V2) & ((attributes & fmt.TRANSACTIONAL_FLAG) != 0),
        "is_control": (magic >= fmt.MAGIC_V2) & ((attributes & fmt.CONTROL_FLAG) != 0),
        "has_delete_horizon": (magic >= fmt.MAGIC_V2) & ((attributes & fmt.DELETE_HORIZON_FLAG) != 0),
        "is_legacy": magic < fmt.MAGIC_V2,
    }


@pytest.mark.parametrize("seed", range(40))
def test_fill_columns_makes_the_columns_numpy_made(seed):
    """The header rows of random windows, and rows of random words (every field at its extremes)."""
    from segments.codec.scan import _batch_columns, _result

    rng = random.Random(seed)
    data = np.frombuffer(_window(seed), dtype=np.uint8)
    info = np.zeros(k.INFO_SIZE, dtype=np.int64)
    n = int(k.count_batches(data, 0, len(data), info))
    hdr = np.empty((n, k.BATCH_COLUMNS), dtype=np.int64)
    n = int(k.parse_headers(data, 0, n, hdr, info))
    hdr = hdr[:n].copy()
    words = np.array([rng.choice((0, 1, -1, 2**31 - 1, -(2**31), 2**32 - 1, 2**62, rng.randrange(-(2**40), 2**40)))
                      for _ in range(5 * k.BATCH_COLUMNS)], dtype=np.int64).reshape(5, k.BATCH_COLUMNS)
    words[:, k.COL_MAGIC] = [rng.randrange(3) for _ in range(5)]
    words[:, k.COL_ATTRIBUTES] = [rng.randrange(2**15) for _ in range(5)]
    words[:, k.COL_IN_ARENA] = [rng.randrange(2) for _ in range(5)]
    words[:, k.COL_CRC] = [rng.randrange(2**32) for _ in range(5)]
    for rows in (hdr, words):
        for headers_only in (False, True):
            columns = _batch_columns(len(rows))
            k.fill_columns(rows, len(rows), 77, headers_only, *columns)
            args = (data, 0, len(data), 77, True, headers_only, 0, 0, 0, None)
            got = _result(args, data[:0], 0, False, -1, False, columns, len(rows), np.zeros(1, np.int64),
                          tuple(np.zeros(0) for _ in range(8)))
            for name, want in _reference_columns(rows, 77, headers_only).items():
                have = getattr(got, name)
                assert have.dtype == want.dtype and np.array_equal(have, want), name


def test_an_lz4_windows_arena_is_the_buffers_own_reused_and_kept_when_grown():
    """Windows scanned with one `ScanBuffers` decode into its arena (no fresh mapping a window); one that needs
    more than the arena holds grows it, and the grown arena is kept for the next scans. Each result is right while
    it is the latest (the contract of the record arrays)."""
    windows = [w for w in (_window(seed) for seed in range(1, 400, 4)) if w]
    buffers = ScanBuffers()
    kept = []
    for data in windows:
        buf = np.frombuffer(data, dtype=np.uint8)
        expected = scan(buf, base_position=7)
        got = scan(buf, base_position=7, buffers=buffers)
        _same(expected, got)
        if len(got.arena):
            assert np.shares_memory(got.arena, buffers.arena(0, 0))
            kept.append(buffers.arena(0, 0))
    assert len(kept) > 3
    assert all(a is b or len(b) > len(a) for a, b in zip(kept, kept[1:]))  # reused, or replaced by a larger one
    small = ScanBuffers()
    small.keep_arena(np.empty(16, dtype=np.uint8))  # too small for any window: every lz4 window grows it
    for data in windows[:8]:
        got = scan(np.frombuffer(data, dtype=np.uint8), base_position=7, buffers=small)
        _same(scan(np.frombuffer(data, dtype=np.uint8), base_position=7), got)
    assert len(small.arena(0, 0)) > 16
