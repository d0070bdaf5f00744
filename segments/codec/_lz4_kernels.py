"""lz4 frames in compiled code, with the GIL released: the liblz4 that python-lz4 ships, called from numba.

Owns binding liblz4's frame API (`LZ4F_*`) from the extension module of the installed python-lz4 package, so
the compiled code runs the very library `segments.codec.compression` runs, and the kernels over it:
`decode_frames` decodes the lz4 frames of a window's v2 batches into the scan's arena in one call, with the
checks and limits of `compression.decompress` (`frame_error` turns its status into the same
`CorruptRecordError`); `frame_bound` and `compress_frame` write a records region as the frame
`compression.compress` writes (Kafka's: independent 64 KiB blocks, no checksums, no content size, level 0),
byte for byte, for the cleaner's recopy kernels.

The kernels call the symbols as external functions under names of our own (`logcleaner_LZ4F_*`), so that no
raw address is compiled in: numba's JIT registers those names with LLVM, and the module built ahead of time
(`segments.codec.compiled`) links them as trampolines (`LZ4_SHIM_C`) that this module points at liblz4 when it
is imported. When a symbol cannot be bound, `AVAILABLE` is False (`UNAVAILABLE_REASON` says why), every name is
bound to a stub so that the kernels still link, and callers keep to the Python path; `ENABLED` (False also with
`LOGCLEANER_LZ4_KERNELS=0`) is what they check, at call time. Importing this module binds the library: import it
where kernels run.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from . import _scan_kernels as k
from . import compiled
from . import format as fmt
from .compression import _LZ4_STEP_BYTES_MIN as _STEP_BYTES_MIN
from .errors import CorruptRecordError

__all__ = [
    "AVAILABLE",
    "ENABLED",
    "UNAVAILABLE_REASON",
    "compress_frame",
    "decode_frames",
    "frame_bound",
    "frame_error",
    "kafka_preferences",
    "new_state",
]

_PREFIX = "logcleaner_"
_LZ4F_VERSION = 100  # lz4frame.h's LZ4F_VERSION, the API version a context is created for
_LZ4F_MAX64KB = 4  # LZ4F_blockSizeID_t LZ4F_max64KB (BD 0x40)
_LZ4F_BLOCK_INDEPENDENT = 1  # LZ4F_blockMode_t LZ4F_blockIndependent (FLG bit 5)
_SCRATCH_BYTES = 64 * 1024  # where a frame that overflows the arena is decoded to be checked and measured


class _FrameInfo(ctypes.Structure):
    """lz4frame.h's LZ4F_frameInfo_t."""

    _fields_ = [
        ("blockSizeID", ctypes.c_int),
        ("blockMode", ctypes.c_int),
        ("contentChecksumFlag", ctypes.c_int),
        ("frameType", ctypes.c_int),
        ("contentSize", ctypes.c_ulonglong),
        ("dictID", ctypes.c_uint),
        ("blockChecksumFlag", ctypes.c_int),
    ]


class _Preferences(ctypes.Structure):
    """lz4frame.h's LZ4F_preferences_t."""

    _fields_ = [
        ("frameInfo", _FrameInfo),
        ("compressionLevel", ctypes.c_int),
        ("autoFlush", ctypes.c_uint),
        ("favorDecSpeed", ctypes.c_uint),
        ("reserved", ctypes.c_uint * 3),
    ]


def kafka_preferences() -> np.ndarray:
    """The LZ4F_preferences_t python-lz4's `lz4.frame.compress` builds for `compression.compress`'s arguments
    (`block_size=BLOCKSIZE_MAX64KB, block_linked=False, content_checksum=False, store_size=False`, level and
    block checksum by default): zeroed, then 64 KiB blocks and independent blocks; as 8-byte words."""
    prefs = _Preferences()  # ctypes zero-fills, as python-lz4's memset
    prefs.frameInfo.blockSizeID = _LZ4F_MAX64KB
    prefs.frameInfo.blockMode = _LZ4F_BLOCK_INDEPENDENT
    return np.frombuffer(bytearray(prefs), dtype=np.uint64).copy()


# The bound names, in the order of the built module's `logcleaner_bind_lz4` slots (`LZ4_SHIM_C`).
_NAMES = ("LZ4F_isError", "LZ4F_createDecompressionContext", "LZ4F_freeDecompressionContext", "LZ4F_decompress",
          "LZ4F_compressFrameBound", "LZ4F_compressFrame")
_stubs: list[object] = []  # keeps the stub callbacks alive

# What the built module (`segments.codec.compiled`) links in place of LLVM's symbol table: one trampoline per
# name, through a pointer `logcleaner_bind_lz4(slot, address)` sets; every pointer an integer (uintptr_t).
LZ4_SHIM_C = """#include <stdint.h>
typedef uintptr_t u;
static u fp[6];
void logcleaner_bind_lz4(int slot, u address) { if (slot >= 0 && slot < 6) fp[slot] = address; }
uint32_t logcleaner_LZ4F_isError(u a) { return ((uint32_t (*)(u))fp[0])(a); }
u logcleaner_LZ4F_createDecompressionContext(u a, uint32_t b) { return ((u (*)(u, uint32_t))fp[1])(a, b); }
u logcleaner_LZ4F_freeDecompressionContext(u a) { return ((u (*)(u))fp[2])(a); }
u logcleaner_LZ4F_decompress(u a, u b, u c, u d, u e, u f) { return ((u (*)(u, u, u, u, u, u))fp[3])(a, b, c, d, e, f); }
u logcleaner_LZ4F_compressFrameBound(u a, u b) { return ((u (*)(u, u))fp[4])(a, b); }
u logcleaner_LZ4F_compressFrame(u a, u b, u c, u d, u e) { return ((u (*)(u, u, u, u, u))fp[5])(a, b, c, d, e); }
"""


def _signature(name: str) -> Any:
    """`name`'s numba signature (restype(argtypes)); every pointer is passed as an integer address (uintp)."""
    from numba import types  # only when numba compiles a caller

    u = types.uintp
    return {
        "LZ4F_isError": types.uint32(u),
        "LZ4F_createDecompressionContext": u(u, types.uint32),
        "LZ4F_freeDecompressionContext": u(u),
        "LZ4F_decompress": u(u, u, u, u, u, u),
        "LZ4F_compressFrameBound": u(u, u),
        "LZ4F_compressFrame": u(u, u, u, u, u),
    }[name]


def _bind() -> tuple[ctypes.CDLL | None, str, dict[str, int]]:
    """The addresses of `_NAMES` in liblz4, or of a stub if any is missing; given to the built module when
    one serves the process (numba's JIT registers them with LLVM in `_external`)."""
    try:
        import lz4.frame._frame as frame_ext  # the extension module python-lz4 links liblz4 into

        lib = ctypes.CDLL(frame_ext.__file__)
        addresses = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0 for name in _NAMES}
        reason = ""
    except (ImportError, OSError, AttributeError) as exc:
        lib, addresses, reason = None, {}, f"{type(exc).__name__}: {exc}"
    if lib is None or not all(addresses.values()):
        reason = reason or "a symbol has no address"
        stub = ctypes.CFUNCTYPE(ctypes.c_size_t)(lambda: 0)  # never called: callers check ENABLED first
        _stubs.append(stub)
        addresses = dict.fromkeys(_NAMES, ctypes.cast(stub, ctypes.c_void_p).value or 0)
        lib = None
    built = compiled.aot_module()
    if built is not None:
        bind = ctypes.CDLL(built.__file__).logcleaner_bind_lz4
        bind.argtypes = [ctypes.c_int, ctypes.c_size_t]
        for slot, name in enumerate(_NAMES):
            bind(slot, addresses[name])
    return lib, reason, addresses


_LIB, UNAVAILABLE_REASON, _ADDRESSES = _bind()
AVAILABLE = _LIB is not None
ENABLED = AVAILABLE and os.environ.get("LOGCLEANER_LZ4_KERNELS", "1") != "0"


def _external(name: str) -> Any:
    """`name` as a function numba calls: registered with LLVM under our prefix (so that no raw address is
    compiled into a cached kernel) when numba's JIT first needs it."""

    def make() -> Any:
        import llvmlite.binding as llvm
        from numba import types

        llvm.add_symbol(_PREFIX + name, _ADDRESSES[name])
        return types.ExternalFunction(_PREFIX + name, _signature(name))

    return compiled.external(make)


_is_error = _external("LZ4F_isError")
_create_dctx = _external("LZ4F_createDecompressionContext")
_free_dctx = _external("LZ4F_freeDecompressionContext")
_decompress = _external("LZ4F_decompress")
_frame_bound = _external("LZ4F_compressFrameBound")
_compress_frame = _external("LZ4F_compressFrame")

# ---- decode_frames: state slots (int64) and statuses ----
S_USED = 0  # in/out: arena bytes used
S_BYTES_MAX = 1  # in: decompressed_bytes_max, per batch
S_ARENA_MAX = 2  # in: arena_bytes_max
S_STATUS = 3  # out: why it stopped
S_DETAIL = 4  # out: the LZ4F error code (bits of a size_t), or the arena bytes needed (GROW)
STATE_SIZE = 5

DONE = 0  # every row decoded
OTHER = 1  # the row is not an lz4 v2 batch: the caller decodes it and calls again from the next
GROW = 2  # the row's records do not fit in `arena`: S_DETAIL bytes are needed; call again from it
ARENA_LIMIT = 3  # the row's records would pass arena_bytes_max (never for batch 0): the scan stops before it
E_MAGIC = 4  # the region does not start with the frame magic
E_DECODE = 5  # LZ4F_decompress failed (S_DETAIL: its code)
E_LIMIT = 6  # decompresses to more than decompressed_bytes_max
E_ENDS_EARLY = 7  # the frame ends before its end mark
E_CONTEXT = 8  # no decompression context (S_DETAIL: the code)

# work words (uint64): LZ4F's in/out size arguments, the context, LZ4F_decompressOptions_t (zeroed: python-lz4's)
_W_DST_SIZE = 0
_W_SRC_SIZE = 1
_W_DCTX = 2
_W_OPTIONS = 3  # 16 bytes: stableDst, skipChecksums, two reserved
_WORK_WORDS = 5
_WORD_BYTES = 8

_MAGIC = tuple(fmt.LZ4_FRAME_MAGIC)
_M0, _M1, _M2, _M3 = _MAGIC
_MAGIC_BYTES = len(_MAGIC)

_RUN_END = 0  # the frame's end mark (and content checksum) read
_RUN_SRC_END = 1  # all input read, no end mark
_RUN_ERROR = 2


def new_state(decompressed_bytes_max: int, arena_bytes_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(state, work, scratch) for `decode_frames` calls over one window."""
    state = np.zeros(STATE_SIZE, dtype=np.int64)
    state[S_BYTES_MAX] = decompressed_bytes_max
    state[S_ARENA_MAX] = arena_bytes_max
    return state, np.zeros(_WORK_WORDS, dtype=np.uint64), np.empty(_SCRATCH_BYTES, dtype=np.uint8)


@compiled.njit(cache=True, nogil=True, inline="always")
def _at(arr, index):
    """The address of arr[index] (uintp)."""
    return arr.ctypes.data + np.uint64(index * arr.itemsize)


@compiled.njit(cache=True, nogil=True)
def _run_frame(dctx, src_addr, src_len, arena, dst, dst_cap, bytes_max, scratch, work):
    """Decode one frame into arena[dst:dst + dst_cap], then, when that is full and the frame goes on, into
    `scratch` (overwritten) only to check it and count its bytes. Returns (how it ended, bytes decoded, bytes
    written to the arena, LZ4F code).

    It stops where `compression._lz4_decompress` stops: that asks python-lz4 for at most `step` bytes at a time
    (`p_end`: where its current output buffer ends), up to bytes_max + 1 in all, and python-lz4 returns at the
    end of the frame, else once the input is used up, else once that buffer is full; so a frame that is cut
    short fails on its size when one of those buffers has passed the limit, else as cut short.
    """
    step = max(_STEP_BYTES_MIN, 8 * src_len)
    p_end = min(step, bytes_max + 1)
    total = np.int64(0)
    in_arena = np.int64(0)
    consumed = np.int64(0)
    spilled = False
    while True:
        room = p_end - total
        if not spilled and in_arena < dst_cap:
            cap = min(room, dst_cap - in_arena)
            out = _at(arena, dst + in_arena)
        else:
            spilled = True
            cap = min(room, scratch.size)
            out = _at(scratch, 0)
        work[_W_DST_SIZE] = np.uint64(cap)
        work[_W_SRC_SIZE] = np.uint64(src_len - consumed)
        code = _decompress(work[_W_DCTX], out, _at(work, _W_DST_SIZE), src_addr + np.uint64(consumed),
                           _at(work, _W_SRC_SIZE), _at(work, _W_OPTIONS))
        if _is_error(code):
            return _RUN_ERROR, total, in_arena, code
        got = np.int64(work[_W_DST_SIZE])
        took = np.int64(work[_W_SRC_SIZE])
        total += got
        if not spilled:
            in_arena += got
        consumed += took
        if code == 0:
            return _RUN_END, total, in_arena, code
        if got == cap and total < p_end:
            continue  # our buffer is full, python-lz4's would not be: it would go on in the same call
        if consumed == src_len or (got == 0 and took == 0):
            return _RUN_SRC_END, total, in_arena, code
        if total == p_end:
            if total > bytes_max:
                return _RUN_SRC_END, total, in_arena, code  # past the limit: E_LIMIT whatever follows
            p_end = min(total + step, bytes_max + 1)


@compiled.njit(cache=True, nogil=True)
def decode_frames(src, hdr, rows, first, arena, state, work, scratch):
    """Decode the lz4 frames of the batches `rows[first:]` (scan header rows, in order) into `arena`.

    Each lz4 v2 batch's records region `src[hdr[i, COL_RECORDS_POS]:+hdr[i, COL_RECORDS_BYTES]]` is decoded at
    `state[S_USED]`, which then advances; its row is moved to the arena (records position and bytes, in-arena
    flag). Stops at the first row it does not decode, with `state[S_STATUS]` saying why (DONE when there is
    none) and that row's index in `rows` returned. A bad row leaves its header row and the arena as they were.
    The checks are `compression.decompress`'s: the frame magic, then liblz4's LZ4F_decompress (header checksum,
    block sizes, block and content checksums when flagged, end mark), at most `decompressed_bytes_max`; bytes
    after the end mark are ignored.
    """
    used = state[S_USED]
    bytes_max = state[S_BYTES_MAX]
    arena_max = state[S_ARENA_MAX]
    state[S_STATUS] = DONE
    state[S_DETAIL] = 0
    code = _create_dctx(_at(work, _W_DCTX), _LZ4F_VERSION)
    if _is_error(code):
        state[S_STATUS] = E_CONTEXT
        state[S_DETAIL] = np.int64(code)
        return first
    j = first
    while j < rows.size:
        i = rows[j]
        if hdr[i, k.COL_MAGIC] != fmt.MAGIC_V2 or (hdr[i, k.COL_ATTRIBUTES] & fmt.COMPRESSION_MASK) != fmt.COMPRESSION_LZ4:
            state[S_STATUS] = OTHER
            break
        pos = hdr[i, k.COL_RECORDS_POS]
        size = hdr[i, k.COL_RECORDS_BYTES]
        if (size < _MAGIC_BYTES or src[pos] != _M0 or src[pos + 1] != _M1 or src[pos + 2] != _M2
                or src[pos + 3] != _M3):
            state[S_STATUS] = E_MAGIC
            break
        dst_cap = min(bytes_max + 1, arena.size - used)
        how, total, in_arena, code = _run_frame(work[_W_DCTX], _at(src, pos), size, arena, used, dst_cap, bytes_max,
                                                scratch, work)
        if how == _RUN_ERROR:
            state[S_STATUS] = E_DECODE
            state[S_DETAIL] = np.int64(code)
            break
        if total > bytes_max:
            state[S_STATUS] = E_LIMIT
            break
        if how == _RUN_SRC_END:
            state[S_STATUS] = E_ENDS_EARLY
            break
        if i > 0 and used + total > arena_max:
            state[S_STATUS] = ARENA_LIMIT
            break
        if in_arena < total:
            state[S_STATUS] = GROW
            state[S_DETAIL] = used + total
            break
        hdr[i, k.COL_RECORDS_POS] = used
        hdr[i, k.COL_RECORDS_BYTES] = total
        hdr[i, k.COL_IN_ARENA] = 1
        used += total
        j += 1
    _free_dctx(work[_W_DCTX])
    state[S_USED] = used
    return j


def frame_error(state: np.ndarray, position: int) -> CorruptRecordError:
    """The error `compression.decompress` raises for the frame `decode_frames` stopped at with an E_* status;
    `position` is the file position of the batch's compressed region."""
    status = int(state[S_STATUS])
    if status == E_MAGIC:
        reason = "lz4 stream does not start with the frame magic"
    elif status == E_DECODE:
        reason = f"lz4 stream does not decode: LZ4F_decompress failed with code: {_error_name(int(state[S_DETAIL]))}"
    elif status == E_LIMIT:
        reason = f"decompressed size exceeds the limit of {int(state[S_BYTES_MAX])} bytes"
    elif status == E_ENDS_EARLY:
        reason = "lz4 frame ends early"
    elif status == E_CONTEXT:
        reason = f"lz4 stream does not decode: LZ4F_createDecompressionContext failed with code: " \
                 f"{_error_name(int(state[S_DETAIL]))}"
    else:
        raise ValueError(f"status {status} is not an error")
    return CorruptRecordError(reason, position=position)


def _error_name(code: int) -> str:
    if _LIB is None:
        return str(code)
    get_name = _LIB.LZ4F_getErrorName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.c_size_t]
    name = get_name(code & 0xFFFFFFFFFFFFFFFF)
    return name.decode("ascii", "replace") if name else str(code)


@compiled.njit(cache=True, nogil=True)
def frame_bound(n, prefs):
    """The room `compress_frame` needs for `n` bytes (LZ4F_compressFrameBound)."""
    return np.int64(_frame_bound(np.uint64(n), _at(prefs, 0)))


@compiled.njit(cache=True, nogil=True)
def compress_frame(src, src_pos, n, out, out_pos, prefs):
    """Compress src[src_pos:src_pos + n] as one lz4 frame at out[out_pos:] with `prefs` (`kafka_preferences`);
    returns its bytes, or -1 if liblz4 fails. `out` must hold `frame_bound(n, prefs)` bytes from out_pos."""
    code = _compress_frame(_at(out, out_pos), np.uint64(out.size - out_pos), _at(src, src_pos), np.uint64(n),
                           _at(prefs, 0))
    if _is_error(code):
        return -1
    return np.int64(code)
