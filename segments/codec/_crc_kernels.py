"""CRC-32C of many byte ranges in one compiled call, with the GIL released (issues 19 and 22).

Owns the CRC-32C (Castagnoli) of the codec layer's hot paths: a v2 batch's CRC over attributes..end
(`docs/format.md` 1.1), for every batch of a window at once: `batch_crcs` (the scan's check) and `stamp_v2_crcs`
(computes and stores the CRC field of batches written in a buffer). Two variants give the same numbers: SSE4.2's
`crc32` instruction, three streams at once (x86-64 CPUs that have it, the default there), and a portable
slicing-by-8 table kernel; `LOGCLEANER_CRC32C=sse42|table` at import, or `use_variant`, picks one (the tests run
both). Legacy v0/v1 entries use CRC-32 (IEEE): `zlib.crc32`, not here. Kernels never raise: a range outside the
buffer stops them, and the wrappers raise `ValueError`. All compiled code is in this file, so its on-disk cache
follows its edits.
"""

from __future__ import annotations

import os
import platform

import numpy as np

from . import compiled
from . import format as fmt
from ._header_kernels import put_be

__all__ = ["VARIANTS", "batch_crcs", "crc32c", "stamp_v2_crcs", "use_variant", "variant"]

VARIANTS = ("sse42", "table")
ENV_VARIANT = "LOGCLEANER_CRC32C"

# Field widths the kernels read and write by hand (`_read_be`, `_write_be`).
assert (fmt.LENGTH_BYTES, fmt.CRC_BYTES) == (4, 4)
_WORD = 8  # bytes per step of both variants (one crc32 of 64 bits; one slicing-by-8 round)
_POLY = 0x82F63B78  # Castagnoli, bit-reflected
_MASK32 = 0xFFFFFFFF


def _tables() -> np.ndarray:
    """The 8 x 256 slicing-by-8 tables of reflected CRC-32C: row 0 the byte-at-a-time table, row k a byte
    followed by k zero bytes."""
    t = np.zeros((_WORD, 256), dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        t[0, i] = c
    for k in range(1, _WORD):
        prev = t[k - 1].astype(np.int64)
        t[k] = (prev >> 8) ^ t[0, prev & 0xFF]
    return t


_TABLE = _tables()

# The SSE4.2 variant runs three streams at once (the instruction's latency is three times its issue rate): a
# block of 3 lanes is summed into one CRC by shifting the first lanes' CRCs past the later lanes' bytes, with
# these tables (`_shift_tables`). Long lanes first, then short ones for a batch's tail, then one stream.
_LANES = (8192, 256)  # bytes per lane, as Mark Adler's crc32c.c (the crc32c package's); multiples of _WORD


def _apply(op: np.ndarray, registers: np.ndarray) -> np.ndarray:
    """The GF(2)-linear map `op` (op[i]: the image of the register 1 << i) applied to each of `registers`."""
    bits = (registers[:, None] >> np.arange(32, dtype=np.int64)) & 1
    return np.bitwise_xor.reduce(np.where(bits == 1, op[None, :], 0), axis=1)


def _shift_tables(lane: int) -> np.ndarray:
    """4 x 256 tables: row k, entry b = the CRC register b << 8k after `lane` zero bytes (no inversion), so a
    register's shift is the XOR of four lookups (the shift is linear). The map of one zero byte is raised to the
    `lane`-th power by squaring."""
    basis = np.int64(1) << np.arange(32, dtype=np.int64)
    op = (basis >> 8) ^ _TABLE[0, basis & 0xFF].astype(np.int64)  # one zero byte
    shift, n = basis, lane
    while n:
        if n & 1:
            shift = _apply(op, shift)
        op, n = _apply(op, op), n >> 1
    registers = (np.arange(256, dtype=np.int64)[None, :] << (8 * np.arange(4, dtype=np.int64))[:, None]).ravel()
    return _apply(shift, registers).reshape(4, 256).astype(np.uint32)


_SHIFT = np.stack([_shift_tables(lane) for lane in _LANES])
_LANE_LONG, _LANE_SHORT = _LANES


# ---- the SSE4.2 instruction, as LLVM intrinsics ---------------------------------------------------------------


@compiled.intrinsic
def _sse42_crc_u64(typingctx, crc, buf, pos):
    """crc32 of the 8 bytes at buf[pos:pos + 8] (an unaligned little-endian load) into `crc` (uint32)."""
    from llvmlite import ir  # compile time only: the body runs when numba types a caller
    from numba import types
    from numba.core import cgutils

    sig = types.uint32(types.uint32, buf, types.intp)

    def codegen(context, builder, signature, args):
        crc_v, buf_v, pos_v = args
        i64 = ir.IntType(64)
        data = context.make_array(signature.args[1])(context, builder, buf_v).data
        word = builder.load(builder.bitcast(builder.gep(data, [pos_v]), i64.as_pointer()), align=1)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i64]),
                                            "llvm.x86.sse42.crc32.64.64")
        return builder.trunc(builder.call(fn, [builder.zext(crc_v, i64), word]), ir.IntType(32))

    return sig, codegen


@compiled.intrinsic
def _sse42_crc_u8(typingctx, crc, byte):
    """crc32 of one byte into `crc` (uint32)."""
    from llvmlite import ir  # compile time only: the body runs when numba types a caller
    from numba import types
    from numba.core import cgutils

    sig = types.uint32(types.uint32, types.uint8)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, ir.IntType(8)]),
                                            "llvm.x86.sse42.crc32.32.8")
        return builder.call(fn, list(args))

    return sig, codegen


# ---- one range, per variant (inlined into the kernels below) ------------------------------------------------


@compiled.njit(cache=True, nogil=True, inline="always")
def _shift(c, which):
    """The register `c` after the zero bytes of one lane of `_LANES[which]`."""
    s = _SHIFT
    return s[which, 0, c & 0xFF] ^ s[which, 1, (c >> 8) & 0xFF] ^ s[which, 2, (c >> 16) & 0xFF] ^ s[which, 3, c >> 24]


@compiled.njit(cache=True, nogil=True, inline="always")
def _crc_sse42(buf, start, end):
    c = np.uint32(_MASK32)
    p = start
    while p + 3 * _LANE_LONG <= end:
        a, b, d = c, np.uint32(0), np.uint32(0)
        for q in range(p, p + _LANE_LONG, _WORD):
            a = _sse42_crc_u64(a, buf, q)
            b = _sse42_crc_u64(b, buf, q + _LANE_LONG)
            d = _sse42_crc_u64(d, buf, q + 2 * _LANE_LONG)
        c = _shift(_shift(a, 0) ^ b, 0) ^ d
        p += 3 * _LANE_LONG
    while p + 3 * _LANE_SHORT <= end:
        a, b, d = c, np.uint32(0), np.uint32(0)
        for q in range(p, p + _LANE_SHORT, _WORD):
            a = _sse42_crc_u64(a, buf, q)
            b = _sse42_crc_u64(b, buf, q + _LANE_SHORT)
            d = _sse42_crc_u64(d, buf, q + 2 * _LANE_SHORT)
        c = _shift(_shift(a, 1) ^ b, 1) ^ d
        p += 3 * _LANE_SHORT
    while p + _WORD <= end:
        c = _sse42_crc_u64(c, buf, p)
        p += _WORD
    while p < end:
        c = _sse42_crc_u8(c, buf[p])
        p += 1
    return np.int64(c ^ np.uint32(_MASK32))


@compiled.njit(cache=True, nogil=True, inline="always")
def _crc_table(buf, start, end):
    t = _TABLE
    c = np.int64(_MASK32)
    p = start
    while p + _WORD <= end:
        c ^= np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8) | (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 24)
        c = (np.int64(t[7, c & 0xFF]) ^ np.int64(t[6, (c >> 8) & 0xFF]) ^ np.int64(t[5, (c >> 16) & 0xFF])
             ^ np.int64(t[4, c >> 24]) ^ np.int64(t[3, buf[p + 4]]) ^ np.int64(t[2, buf[p + 5]])
             ^ np.int64(t[1, buf[p + 6]]) ^ np.int64(t[0, buf[p + 7]]))
        p += _WORD
    while p < end:
        c = (c >> 8) ^ np.int64(t[0, (c ^ np.int64(buf[p])) & 0xFF])
        p += 1
    return c ^ _MASK32


@compiled.njit(cache=True, nogil=True, inline="always")
def _read_be(buf, pos, width):
    value = np.int64(0)
    for k in range(width):
        value = (value << 8) | np.int64(buf[pos + k])
    return value


# ---- the kernels: every range of a window in one call -------------------------------------------------------


@compiled.njit(cache=True, nogil=True)
def _batch_crcs_sse42(buf, starts, ends, out):
    for i in range(len(starts)):
        a, b = starts[i], ends[i]
        if a < 0 or b < a or b > len(buf):
            return i
        out[i] = _crc_sse42(buf, a, b)
    return len(starts)


@compiled.njit(cache=True, nogil=True)
def _batch_crcs_table(buf, starts, ends, out):
    for i in range(len(starts)):
        a, b = starts[i], ends[i]
        if a < 0 or b < a or b > len(buf):
            return i
        out[i] = _crc_table(buf, a, b)
    return len(starts)


@compiled.njit(cache=True, nogil=True)
def _stamp_sse42(buf, positions):
    for i in range(len(positions)):
        p = positions[i]
        if p < 0 or p + fmt.RECORD_BATCH_OVERHEAD > len(buf):
            return i
        end = p + fmt.LOG_OVERHEAD + _read_be(buf, p + fmt.LENGTH_OFFSET, fmt.LENGTH_BYTES)
        if end < p + fmt.RECORD_BATCH_OVERHEAD or end > len(buf):
            return i
        put_be(buf, p + fmt.CRC_OFFSET, _crc_sse42(buf, p + fmt.ATTRIBUTES_OFFSET, end), fmt.CRC_BYTES)
    return len(positions)


@compiled.njit(cache=True, nogil=True)
def _stamp_table(buf, positions):
    for i in range(len(positions)):
        p = positions[i]
        if p < 0 or p + fmt.RECORD_BATCH_OVERHEAD > len(buf):
            return i
        end = p + fmt.LOG_OVERHEAD + _read_be(buf, p + fmt.LENGTH_OFFSET, fmt.LENGTH_BYTES)
        if end < p + fmt.RECORD_BATCH_OVERHEAD or end > len(buf):
            return i
        put_be(buf, p + fmt.CRC_OFFSET, _crc_table(buf, p + fmt.ATTRIBUTES_OFFSET, end), fmt.CRC_BYTES)
    return len(positions)


_KERNELS = {"sse42": (_batch_crcs_sse42, _stamp_sse42), "table": (_batch_crcs_table, _stamp_table)}


# ---- the variant ----------------------------------------------------------------------------------------------


def _has_sse42() -> bool:
    """The CPU has SSE4.2 and numba compiles for it (not for a generic CPU named in NUMBA_CPU_NAME)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    if not compiled.numba_loaded() and compiled.aot_module() is not None:
        return compiled.cpu_has("sse4_2")  # the built module was compiled for this CPU (its fingerprint's)
    import numba
    from llvmlite import binding as llvm_binding

    cpu_name, cpu_features = getattr(numba.config, "CPU_NAME", None), getattr(numba.config, "CPU_FEATURES", None)
    if cpu_name not in (None, "host"):
        return "+sse4.2" in (cpu_features or "")
    return llvm_binding.get_host_cpu_features().get("sse4.2", False)


def use_variant(name: str | None = None) -> str:
    """Make `name` ("sse42" or "table"; None: `LOGCLEANER_CRC32C`, else the best this CPU runs) the variant the
    wrappers call; returns it. Raises `ValueError` for an unknown name or "sse42" on a CPU without it."""
    global _variant
    if name is None:
        name = os.environ.get(ENV_VARIANT) or ("sse42" if _has_sse42() else "table")
    if name not in VARIANTS:
        raise ValueError(f"unknown CRC-32C variant {name!r}: expected one of {', '.join(VARIANTS)}")
    if name == "sse42" and not _has_sse42():
        raise ValueError("the sse42 CRC-32C variant needs an x86-64 CPU with SSE4.2")
    _variant = name
    return name


def variant() -> str:
    """The variant the wrappers call."""
    return _variant


_variant = "table"
use_variant()


# ---- wrappers ---------------------------------------------------------------------------------------------------


def batch_crcs(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray) -> None:
    """out[i] = CRC-32C of buf[starts[i]:ends[i]] for every i, in one call without the GIL.

    `buf` is a 1-D uint8 array; `starts`, `ends` and `out` int64 arrays of one length. Raises `ValueError` if a
    range is not inside `buf` (entries before it are filled).
    """
    if not len(starts) == len(ends) == len(out):
        raise ValueError(f"starts, ends and out differ in length: {len(starts)}, {len(ends)}, {len(out)}")
    done = _KERNELS[_variant][0](buf, starts, ends, out)
    if done < len(starts):
        raise ValueError(f"range {done} [{int(starts[done])}, {int(ends[done])}) is not inside the {len(buf)}-byte buffer")


def stamp_v2_crcs(buf: np.ndarray, positions: np.ndarray) -> None:
    """Store in each v2 batch at `positions` (int64 indexes of `buf`, a writable 1-D uint8 array) the CRC-32C
    of its bytes from attributes to the end its length field declares, big-endian at `fmt.CRC_OFFSET`; one call
    without the GIL. Raises `ValueError` at a batch that does not fit `buf` (the ones before it are stamped).
    """
    done = _KERNELS[_variant][1](buf, positions)
    if done < len(positions):
        raise ValueError(f"the v2 batch at {int(positions[done])} does not fit the {len(buf)}-byte buffer")


def crc32c(buf: np.ndarray, start: int = 0, end: int | None = None) -> int:
    """CRC-32C of buf[start:end] (a 1-D uint8 array): for an error message or a test, not a hot loop."""
    out = np.empty(1, dtype=np.int64)
    batch_crcs(buf, np.array([start], dtype=np.int64), np.array([len(buf) if end is None else end], dtype=np.int64), out)
    return int(out[0])
