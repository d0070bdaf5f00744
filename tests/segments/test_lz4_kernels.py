"""lz4 frames in compiled code (`segments.codec._lz4_kernels`) against python-lz4, the Python path's codec.

Both ways byte for byte: `compress_frame` writes exactly `lz4.frame.compress`'s frame with Kafka's settings
(`compression.compress`), `decode_frames` decodes what python-lz4 decodes, frames of any settings. Corrupt and
oversized frames give the error `compression.decompress` gives: same type, position and message. A scan of
windows with lz4 batches (alone, mixed with other codecs and legacy wrappers, at the arena and decompression
limits) is the same `ScanResult` with the kernels and with them switched off (`ENABLED`), and a process where
liblz4 cannot be bound falls back to the Python path.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from pathlib import Path

import lz4.frame
import numpy as np
import pytest

from segments.codec import _lz4_kernels as lz4k
from segments.codec import _scan_kernels as k
from segments.codec import compression
from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.legacy import encode_legacy_wrapper
from segments.codec.records import Record, encode_batch
from segments.codec.scan import scan

from .helpers import fix_crc

pytestmark = pytest.mark.skipif(not lz4k.AVAILABLE, reason=f"liblz4 not bound: {lz4k.UNAVAILABLE_REASON}")

REGION_POS = 5  # where the compressed region starts in the test buffer
BASE = 1000  # its file position is BASE + REGION_POS
KIB = 1024


def kafka_frame(data: bytes) -> bytes:
    return lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                              content_checksum=False, store_size=False)


def sample(rng: random.Random, size: int) -> bytes:
    """`size` bytes, from incompressible to highly repetitive."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(size)
    if kind == 1:
        return bytes(size)
    words = [rng.randbytes(rng.randint(1, 12)) for _ in range(rng.randint(1, 40 if kind == 2 else 3))]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words)
    return bytes(out[:size])


def sizes() -> list[int]:
    rng = random.Random(19)
    edges = [0, 1, 2, 3, 15, 16, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 128 * KIB, 192 * KIB + 7, 300 * KIB]
    return edges + [rng.randint(0, 300 * KIB) for _ in range(40)] + [rng.randint(0, 4 * KIB) for _ in range(20)]


def kernel_compress(data: bytes) -> bytes:
    prefs = lz4k.kafka_preferences()
    src = np.frombuffer(b"\xee" * 3 + data, dtype=np.uint8)
    out = np.full(7 + lz4k.frame_bound(len(data), prefs), 0xAA, dtype=np.uint8)
    n = lz4k.compress_frame(src, 3, len(data), out, 7, prefs)
    assert n > 0
    assert (out[:7] == 0xAA).all()
    return out[7 : 7 + n].tobytes()


def kernel_decode(region: bytes, bytes_max: int = compression.DECOMPRESSED_BYTES_MAX_DEFAULT,
                  arena_bytes: int | None = None) -> bytes:
    """`region` decoded by `decode_frames` as the one lz4 v2 batch of a window, or its `frame_error`."""
    src = np.frombuffer(b"\x00" * REGION_POS + region + b"\x00" * 3, dtype=np.uint8)
    hdr = np.zeros((1, k.BATCH_COLUMNS), dtype=np.int64)
    hdr[0, k.COL_MAGIC] = fmt.MAGIC_V2
    hdr[0, k.COL_ATTRIBUTES] = fmt.COMPRESSION_LZ4
    hdr[0, k.COL_RECORDS_POS] = REGION_POS
    hdr[0, k.COL_RECORDS_BYTES] = len(region)
    state, work, scratch = lz4k.new_state(bytes_max, 2**40)
    arena = np.empty(arena_bytes if arena_bytes is not None else 4 * len(region) + 64, dtype=np.uint8)
    rows = np.zeros(1, dtype=np.int64)
    while True:
        done = lz4k.decode_frames(src, hdr, rows, 0, arena, state, work, scratch)
        status = int(state[lz4k.S_STATUS])
        if status == lz4k.GROW:
            arena = np.empty(int(state[lz4k.S_DETAIL]), dtype=np.uint8)
            continue
        break
    if status != lz4k.DONE:
        assert done == 0 and hdr[0, k.COL_IN_ARENA] == 0
        raise lz4k.frame_error(state, BASE + REGION_POS)
    assert done == 1 and hdr[0, k.COL_IN_ARENA] == 1 and hdr[0, k.COL_RECORDS_POS] == 0
    return arena[: hdr[0, k.COL_RECORDS_BYTES]].tobytes()


def python_decode(region: bytes, bytes_max: int = compression.DECOMPRESSED_BYTES_MAX_DEFAULT) -> bytes:
    return compression.decompress(fmt.COMPRESSION_LZ4, region, position=BASE + REGION_POS,
                                  decompressed_bytes_max=bytes_max)


def outcome(decode, region: bytes, **kwargs):
    try:
        return "ok", decode(region, **kwargs)
    except CorruptRecordError as exc:
        return type(exc), exc.position, exc.reason


# ---- both ways, byte for byte -----------------------------------------------------------------------------------


def test_the_preferences_are_python_lz4s_for_kafkas_frame():
    words = lz4k.kafka_preferences()
    assert words.dtype == np.uint64 and words.nbytes == 56  # sizeof(LZ4F_preferences_t)
    fields = words.view(np.int32)
    assert fields[0] == lz4.frame.BLOCKSIZE_MAX64KB and fields[1] == 1  # blockSizeID, blockMode independent
    assert not fields[2:].any()  # no checksums, no content size, level 0, no auto flush


def test_compress_frame_writes_python_lz4s_frame_for_every_size():
    rng = random.Random(7)
    for size in sizes():
        data = sample(rng, size)
        frame = kernel_compress(data)
        assert frame == kafka_frame(data) == compression.compress(fmt.COMPRESSION_LZ4, data), size
        assert frame.startswith(fmt.LZ4_FRAME_MAGIC + b"\x60\x40\x82")


def test_decode_frames_reads_kafkas_frames_for_every_size():
    rng = random.Random(8)
    for size in sizes():
        data = sample(rng, size)
        region = kafka_frame(data)
        assert kernel_decode(region) == data == python_decode(region), size
        assert kernel_decode(region, arena_bytes=0) == data, size  # grown from nothing


@pytest.mark.parametrize("block_size", [lz4.frame.BLOCKSIZE_MAX64KB, lz4.frame.BLOCKSIZE_MAX256KB,
                                        lz4.frame.BLOCKSIZE_MAX1MB, lz4.frame.BLOCKSIZE_MAX4MB])
@pytest.mark.parametrize("checksums", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("linked", [False, True])
@pytest.mark.parametrize("store_size", [False, True])
def test_decode_frames_reads_any_valid_frame(block_size, checksums, linked, store_size):
    rng = random.Random(block_size * 31 + linked * 7 + store_size)
    for size in (0, 1, 5000, 70 * KIB, 300 * KIB, 1100 * KIB):
        data = sample(rng, size)
        region = lz4.frame.compress(data, block_size=block_size, content_checksum=checksums[0],
                                    block_checksum=checksums[1], block_linked=linked, store_size=store_size,
                                    compression_level=rng.choice([0, 3, 9]))
        assert kernel_decode(region) == data == python_decode(region)


def test_bytes_after_the_end_mark_are_ignored_as_python_lz4_does():
    region = kafka_frame(b"abc" * 1000) + b"trailing bytes" + kafka_frame(b"second frame")
    assert outcome(kernel_decode, region) == outcome(python_decode, region) == ("ok", b"abc" * 1000)


# ---- corrupt frames: the same error -----------------------------------------------------------------------------

DATA = bytes(random.Random(3).choices(b"abcdefgh", k=150 * KIB))  # three 64 KiB blocks
FRAME = kafka_frame(DATA)
FIRST_BLOCK = 7  # magic, FLG, BD, HC: the first block's size field


def flipped(data: bytes, pos: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[pos] ^= mask
    return bytes(out)


def with_block_size(frame: bytes, size: int) -> bytes:
    return frame[:FIRST_BLOCK] + size.to_bytes(4, "little") + frame[FIRST_BLOCK + 4 :]


CORRUPT = {
    "flipped header checksum": flipped(FRAME, 6),
    "flipped FLG version": flipped(FRAME, 4, 0x80),
    "reserved BD bits": flipped(FRAME, 5, 0x01),
    "bad magic": flipped(FRAME, 0, 0x01),
    "skippable frame magic": b"\x50\x2a\x4d\x18" + FRAME[4:],
    "empty region": b"",
    "region shorter than the magic": FRAME[:3],
    "header only": FRAME[:7],
    "truncated block": FRAME[: len(FRAME) // 2],
    "truncated block size": FRAME[: FIRST_BLOCK + 2],
    "oversize block": with_block_size(FRAME, 64 * KIB + 1),
    "oversize stored block": with_block_size(FRAME, 0x80000000 | (64 * KIB + 1)),
    "block size past the region": with_block_size(FRAME, 60 * KIB),
    "missing end mark": FRAME[:-4],
    "half an end mark": FRAME[:-2],
    "zeros in a block": FRAME[:100] + bytes(50) + FRAME[150:],  # may still decode (to other bytes)
    "bad content checksum": flipped(lz4.frame.compress(DATA, content_checksum=True, block_linked=False), -1),
    "missing content checksum": lz4.frame.compress(DATA, content_checksum=True, block_linked=False)[:-4],
    "bad block checksum": flipped(lz4.frame.compress(DATA[:1000], block_checksum=True, store_size=False), -5),
    "wrong content size": (lambda f: f[:6] + (len(DATA) + 1).to_bytes(8, "little") + f[14:])(
        lz4.frame.compress(DATA, store_size=True)),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_a_corrupt_frame_gives_the_python_paths_error(name):
    region = CORRUPT[name]
    got = outcome(kernel_decode, region)
    assert got == outcome(python_decode, region)
    if name != "zeros in a block":
        assert got[0] is CorruptRecordError and got[1] == BASE + REGION_POS, got


@pytest.mark.parametrize("bytes_max", [0, 1, 64 * KIB - 1, 64 * KIB, len(DATA) - 1, len(DATA), len(DATA) + 1])
def test_the_decompression_limit_is_the_python_paths(bytes_max):
    got = outcome(kernel_decode, FRAME, bytes_max=bytes_max)
    assert got == outcome(python_decode, FRAME, bytes_max=bytes_max)
    assert (got[0] == "ok") == (bytes_max >= len(DATA))
    if got[0] != "ok":
        assert got[2] == f"decompressed size exceeds the limit of {bytes_max} bytes"


def test_a_corrupt_frame_past_the_limit_gives_the_python_paths_error():
    for name, region in sorted(CORRUPT.items()):
        for bytes_max in (10, 64 * KIB, 100 * KIB):
            assert outcome(kernel_decode, region, bytes_max=bytes_max) == outcome(
                python_decode, region, bytes_max=bytes_max), (name, bytes_max)


def test_random_damage_gives_the_python_paths_outcome():
    rng = random.Random(22)
    frames = [FRAME, kafka_frame(DATA[:3000]), lz4.frame.compress(DATA[:70000], content_checksum=True,
                                                                   block_checksum=True, block_linked=False)]
    for _ in range(600):
        region = bytearray(rng.choice(frames))
        what = rng.randrange(3)
        if what == 0:
            for _ in range(rng.randint(1, 3)):
                region[rng.randrange(len(region))] = rng.randrange(256)
        elif what == 1:
            del region[rng.randrange(len(region)) :]
        else:
            pos = rng.randrange(len(region))
            region[pos:pos] = rng.randbytes(rng.randint(1, 9))
        bytes_max = rng.choice([compression.DECOMPRESSED_BYTES_MAX_DEFAULT, 50 * KIB, 1000])
        assert outcome(kernel_decode, bytes(region), bytes_max=bytes_max) == outcome(
            python_decode, bytes(region), bytes_max=bytes_max)


# ---- whole scans: kernels on and off ----------------------------------------------------------------------------

T0 = 1_700_000_000_000


def v2_batch(base: int, n: int, codec: int, value: bytes) -> bytes:
    records = [Record(offset=base + i, timestamp=T0 + base + i, key=b"k%d" % ((base + i) % 13), value=value + b"%d" % i)
               for i in range(n)]
    return encode_batch(records, base_offset=base, compression=codec)


def mixed_window(seed: int, batches: int = 40) -> bytes:
    """lz4 v2 batches mostly, with uncompressed, gzip, snappy, zstd batches and lz4/gzip legacy wrappers."""
    rng = random.Random(seed)
    out, base = [], 0
    for _ in range(batches):
        kind = rng.random()
        n = rng.randint(1, 30)
        value = sample(rng, rng.choice([10, 200, 3000]))
        if kind < 0.15:
            inner = [Record(offset=base + i, timestamp=T0 + i, key=b"k%d" % i, value=value) for i in range(n)]
            out.append(encode_legacy_wrapper(inner, magic=rng.choice([0, 1]),
                                             codec=rng.choice([fmt.COMPRESSION_LZ4, fmt.COMPRESSION_GZIP])))
        else:
            codec = fmt.COMPRESSION_LZ4 if kind < 0.7 else rng.choice(list(fmt.COMPRESSION_NAMES))
            out.append(v2_batch(base, n, codec, value))
        base += n
    return b"".join(out)


def scan_both(monkeypatch, data: bytes, **kwargs):
    """(kernel, Python path) outcome of `scan(data, **kwargs)`: a ScanResult's fields, or the error."""
    got = []
    for enabled in (True, False):
        monkeypatch.setattr(lz4k, "ENABLED", enabled)
        try:
            result = scan(data, base_position=4096, **kwargs)
        except CorruptRecordError as exc:
            got.append((type(exc), exc.position, exc.reason))
            continue
        fields = {}
        for f in dataclasses.fields(result):
            value = getattr(result, f.name)
            fields[f.name] = value.tobytes() if isinstance(value, np.ndarray) else value
        got.append(fields)
    return got


@pytest.mark.parametrize("seed", range(6))
def test_a_mixed_window_scans_the_same_with_and_without_the_kernels(monkeypatch, seed):
    kernel, python = scan_both(monkeypatch, mixed_window(seed))
    assert kernel == python
    assert len(kernel["arena"]) > 0


def test_only_lz4_scans_the_same_and_grows_its_arena(monkeypatch):
    # zeros compress ~250:1, far past the first estimate of the arena
    data = b"".join(v2_batch(i * 10, 10, fmt.COMPRESSION_LZ4, bytes(20_000)) for i in range(30))
    kernel, python = scan_both(monkeypatch, data)
    assert kernel == python
    assert len(kernel["arena"]) > 10 * len(data)


@pytest.mark.parametrize("arena_bytes_max", [0, 1, 5_000, 20_000, 100_000])
@pytest.mark.parametrize("seed", range(3))
def test_the_arena_limit_stops_where_the_python_path_stops(monkeypatch, arena_bytes_max, seed):
    kernel, python = scan_both(monkeypatch, mixed_window(seed), arena_bytes_max=arena_bytes_max)
    assert kernel == python


@pytest.mark.parametrize("bytes_max", [100, 3_000, 40_000])
def test_the_decompression_limit_in_a_scan_is_the_python_paths(monkeypatch, bytes_max):
    for seed in range(4):
        kernel, python = scan_both(monkeypatch, mixed_window(seed), decompressed_bytes_max=bytes_max)
        assert kernel == python


def test_a_corrupt_lz4_batch_in_a_window_gives_the_python_paths_error(monkeypatch):
    batches = [v2_batch(i * 5, 5, fmt.COMPRESSION_LZ4, b"value-%d" % i * 50) for i in range(8)]
    bad_at = sum(len(b) for b in batches[:5])
    for name, damage in (("header checksum", fmt.RECORD_BATCH_OVERHEAD + 6),
                         ("block size", fmt.RECORD_BATCH_OVERHEAD + FIRST_BLOCK + 1),
                         ("end mark", len(batches[5]) - 2)):
        data = bytearray(b"".join(batches))
        data[bad_at + damage] ^= 0x5A
        fix_crc(data, bad_at)
        kernel, python = scan_both(monkeypatch, bytes(data))
        assert kernel == python, name
        assert kernel[0] is CorruptRecordError and kernel[1] == 4096 + bad_at + fmt.RECORD_BATCH_OVERHEAD, name


def test_without_liblz4_the_scan_takes_the_python_path(tmp_path):
    """A process where liblz4 cannot be bound: AVAILABLE and ENABLED are False, and scans and the recopy's
    kernels still work (every lz4 symbol is bound to a stub that is never called)."""
    data = mixed_window(1)
    (tmp_path / "window").write_bytes(data)
    probe = f"""
import ctypes, llvmlite.binding, numba  # loaded first: they open their own libraries with ctypes
RealLibrary = ctypes.CDLL
class NoLibrary(RealLibrary):  # python-lz4's extension module cannot be opened; others (the kernels' module) can
    def __init__(self, name, *args, **kwargs):
        if "lz4" in str(name):
            raise OSError("no liblz4 here")
        super().__init__(name, *args, **kwargs)
ctypes.CDLL = NoLibrary
from segments.codec import _lz4_kernels as lz4k
assert not lz4k.AVAILABLE and not lz4k.ENABLED, lz4k.UNAVAILABLE_REASON
assert "no liblz4 here" in lz4k.UNAVAILABLE_REASON
from segments.codec.scan import scan
import cleaner._kernels  # links against the stubs
result = scan(open({str(tmp_path / "window")!r}, "rb").read())
print(result.n_records, result.arena.tobytes().hex()[:64], len(result.arena))
"""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    expected = scan(data)
    assert done.stdout.split() == [str(expected.n_records), expected.arena.tobytes().hex()[:64],
                                   str(len(expected.arena))]


def test_the_environment_switch_turns_the_kernels_off(tmp_path):
    probe = "from segments.codec import _lz4_kernels as k; print(k.AVAILABLE, k.ENABLED)"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), "LOGCLEANER_LZ4_KERNELS": "0"})
    assert done.stdout.split() == ["True", "False"], done.stderr
