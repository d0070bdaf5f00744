"""The compiled CRC-32C kernels (`segments.codec._crc_kernels`), both variants, against the `crc32c` package, and
the scan's CRC check built on them: the first bad batch of a window and its error message."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib

import crc32c
import numpy as np
import pytest

from segments.codec import _crc_kernels as ck
from segments.codec import _scan_kernels as k
from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.legacy import encode_legacy_message
from segments.codec.records import Record, encode_batch
from segments.codec.scan import _first_bad_crc, scan

AVAILABLE = [v for v in ck.VARIANTS if v == "table" or ck._has_sse42()]


@pytest.fixture(params=AVAILABLE)
def variant(request):
    """Run the test with each variant this CPU has (both on x86-64 with SSE4.2), then restore the default."""
    before = ck.variant()
    ck.use_variant(request.param)
    yield request.param
    ck.use_variant(before)


def _reference(buf: np.ndarray, starts, ends) -> list[int]:
    return [crc32c.crc32c(buf[a:b].tobytes()) for a, b in zip(starts, ends)]


def _crcs(buf: np.ndarray, starts, ends) -> list[int]:
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    out = np.empty(len(starts), dtype=np.int64)
    ck.batch_crcs(buf, starts, ends, out)
    return out.tolist()


def test_this_machine_runs_both_variants():
    """The tests are meant to cover both variants here: the CI and bench machines are x86-64 with SSE4.2."""
    if os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip("not x86-64")
    assert AVAILABLE == ["sse42", "table"]
    assert ck.variant() == (os.environ.get(ck.ENV_VARIANT) or "sse42")


def test_known_vectors(variant):
    assert ck.crc32c(np.frombuffer(b"123456789", dtype=np.uint8)) == 0xE3069283
    assert ck.crc32c(np.frombuffer(b"a", dtype=np.uint8)) == 0xC1D04330
    assert ck.crc32c(np.zeros(0, dtype=np.uint8)) == 0
    assert ck.crc32c(np.zeros(32, dtype=np.uint8)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros
    assert ck.crc32c(np.full(32, 0xFF, dtype=np.uint8)) == 0x62A8AB43  # and of ones


@pytest.mark.parametrize("readonly", [False, True])
def test_every_length_at_every_alignment(variant, readonly):
    buf = np.random.default_rng(7).integers(0, 256, 320, dtype=np.uint8)
    buf.flags.writeable = not readonly
    starts = [a for a in range(8) for _ in range(301)]
    ends = [a + n for a in range(8) for n in range(301)]
    assert _crcs(buf, starts, ends) == _reference(buf, starts, ends)


def test_random_buffers_up_to_1_mib(variant):
    rng = np.random.default_rng(11)
    for size in (1, 7, 8, 9, 4095, 16 * 1024 + 3, 1 << 20):
        buf = rng.integers(0, 256, size, dtype=np.uint8)
        starts = sorted(int(x) for x in rng.integers(0, size, 20))
        ends = [int(rng.integers(a, size + 1)) for a in starts]
        starts, ends = [0, *starts], [size, *ends]
        assert _crcs(buf, starts, ends) == _reference(buf, starts, ends)


def test_lengths_around_the_interleaved_blocks(variant):
    """The SSE4.2 variant sums blocks of 3 lanes (`_LANES`) and then a tail: lengths at and around each block."""
    buf = np.random.default_rng(13).integers(0, 256, 8 * 3 * max(ck._LANES) + 64, dtype=np.uint8)
    lengths = sorted({n + d for lane in ck._LANES for m in (1, 2, 3, 5) for n in (3 * lane * m,) for d in (-9, -1, 0, 1, 8, 9)}
                     | {3 * ck._LANES[0] + 3 * ck._LANES[1] + 7})
    starts = [a for a in (0, 3) for _ in lengths]
    ends = [a + n for a in (0, 3) for n in lengths]
    assert _crcs(buf, starts, ends) == _reference(buf, starts, ends)


def test_ranges_outside_the_buffer_raise(variant):
    buf = np.zeros(16, dtype=np.uint8)
    for start, end in ((0, 17), (-1, 4), (5, 4)):
        with pytest.raises(ValueError, match="is not inside"):
            _crcs(buf, [0, start], [16, end])
    with pytest.raises(ValueError, match="differ in length"):
        ck.batch_crcs(buf, np.zeros(2, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(2, dtype=np.int64))


def _window(n: int, *, legacy_at: tuple[int, ...] = ()) -> tuple[bytes, list[int]]:
    """`n` batches back to back (v2, or a v1 message at the indexes in `legacy_at`) and their positions."""
    parts, positions, pos = [], [], 0
    for i in range(n):
        if i in legacy_at:
            data = encode_legacy_message(10 * i, b"k%d" % i, b"v" * (100 + i), magic=fmt.MAGIC_V1, timestamp=1_700_000_000_000)
        else:
            records = [Record(offset=10 * i + r, timestamp=1_700_000_000_000, key=b"k%d" % r,
                              value=bytes([i]) * (50 + 37 * r)) for r in range(1 + i % 5)]
            data = encode_batch(records, base_offset=10 * i)
        parts.append(data)
        positions.append(pos)
        pos += len(data)
    return b"".join(parts), positions


def test_stamp_v2_crcs_writes_every_crc(variant):
    data, positions = _window(12)
    buf = np.frombuffer(bytearray(data), dtype=np.uint8)
    for p in positions:
        buf[p + fmt.CRC_OFFSET : p + fmt.CRC_OFFSET + fmt.CRC_BYTES] = 0
    chosen = np.asarray(positions[::2], dtype=np.int64)
    ck.stamp_v2_crcs(buf, chosen)
    for i, p in enumerate(positions):
        stored = buf[p + fmt.CRC_OFFSET : p + fmt.CRC_OFFSET + fmt.CRC_BYTES].tobytes()
        assert stored == (data[p + fmt.CRC_OFFSET : p + fmt.CRC_OFFSET + fmt.CRC_BYTES] if i % 2 == 0 else bytes(4))
    with pytest.raises(ValueError, match="does not fit"):
        ck.stamp_v2_crcs(buf[: len(buf) - 1], np.asarray([positions[-1]], dtype=np.int64))


def _hdr(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The scan kernels' header matrix of a window of whole batches (as the scan builds it)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    info = np.zeros(k.INFO_SIZE, dtype=np.int64)
    n = int(k.count_batches(buf, 0, len(buf), info))
    hdr = np.empty((n, k.BATCH_COLUMNS), dtype=np.int64)
    assert k.parse_headers(buf, 0, n, hdr, info) == n
    return buf, hdr


@pytest.mark.parametrize("legacy_at", [(), (0, 3, 4)])
def test_first_bad_crc_finds_a_flipped_byte_in_batch_k(variant, legacy_at):
    data, positions = _window(9, legacy_at=legacy_at)
    buf, hdr = _hdr(data)
    assert _first_bad_crc(buf, hdr) is None
    scan(data)  # every CRC good
    sizes = [*np.diff(positions).tolist(), len(data) - positions[-1]]
    for batch in range(9):
        for where in (fmt.ATTRIBUTES_OFFSET + 1, sizes[batch] - 1):  # inside the header's CRC range, the last byte
            flipped = bytearray(data)
            flipped[positions[batch] + where] ^= 0x01
            buf, hdr = _hdr(bytes(flipped))
            assert _first_bad_crc(buf, hdr) == batch
            if batch + 1 < 9:  # a later bad batch does not hide this one
                flipped[positions[-1] + sizes[-1] - 1] ^= 0x01
                assert _first_bad_crc(*_hdr(bytes(flipped))) == batch


@pytest.mark.parametrize("legacy", [False, True])
def test_the_crc_error_names_the_first_bad_batch(variant, legacy):
    data, positions = _window(6, legacy_at=(4,) if legacy else ())
    batch = 4
    p = positions[batch]
    flipped = bytearray(data)
    flipped[positions[batch + 1] - 1] ^= 0x80
    flipped[positions[5] + fmt.ATTRIBUTES_OFFSET + 2] ^= 0x80  # a later bad batch too
    base = 1_000_000
    with pytest.raises(CorruptRecordError) as err:
        scan(bytes(flipped), base_position=base)
    if legacy:
        stored = struct.unpack_from(">I", flipped, p + fmt.LEGACY_CRC_OFFSET)[0]
        actual = zlib.crc32(flipped[p + fmt.LEGACY_MAGIC_OFFSET : positions[batch + 1]])
        name, where = "CRC-32", p + fmt.LEGACY_CRC_OFFSET
    else:
        stored = struct.unpack_from(">I", flipped, p + fmt.CRC_OFFSET)[0]
        actual = crc32c.crc32c(bytes(flipped[p + fmt.ATTRIBUTES_OFFSET : positions[batch + 1]]))
        name, where = "CRC-32C", p + fmt.CRC_OFFSET
    assert str(err.value) == (
        f"byte {base + where}: {name} mismatch in the batch at byte {base + p}: stored 0x{stored:08x}, computed 0x{actual:08x}"
    )
    assert err.value.position == base + where


def test_the_variant_is_chosen_by_the_environment():
    probe = "from segments.codec import _crc_kernels as ck; print(ck.variant())"
    for name in AVAILABLE:
        env = {**os.environ, ck.ENV_VARIANT: name}
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == name
    with pytest.raises(ValueError, match="unknown CRC-32C variant"):
        ck.use_variant("crc32")
