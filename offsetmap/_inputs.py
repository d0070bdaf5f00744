"""Argument checks shared by the public entry points of `offsetmap`.

Owns turning caller input (numpy arrays, bytes-like buffers, Python ints) into exactly the dtypes and layouts
the compiled kernels expect, and raising the typed errors from `errors.py` when that is impossible. It must not
copy data that already has the right dtype and layout, and must not touch the table.
"""

from __future__ import annotations

import operator

import numpy as np

from ._compiled import kernels
from .errors import KeySpanError, OffsetMapConfigError, OffsetMapInputError, OffsetOrderError

SEED_MAX = 2**32 - 1  # MurmurHash3 seeds are 32-bit; mmh3 accepts [0, 2**32 - 1]


def seed_value(seed: object) -> int:
    """`seed` as an int in [0, SEED_MAX]; raises OffsetMapConfigError otherwise."""
    try:
        value = operator.index(seed)  # type: ignore[arg-type]
    except TypeError:
        raise OffsetMapConfigError("seed", seed, "expected an integer") from None
    if not 0 <= value <= SEED_MAX:
        raise OffsetMapConfigError("seed", seed, f"expected 0 <= seed <= {SEED_MAX} (a 32-bit seed)")
    return value


def offset_value(offset: object) -> int:
    """`offset` as an int in [0, 2**63 - 1]; raises OffsetMapInputError otherwise (order is checked later)."""
    try:
        value = operator.index(offset)  # type: ignore[arg-type]
    except TypeError:
        raise OffsetMapInputError("offset", f"expected an integer, found {type(offset).__name__}") from None
    if value > 2**63 - 1:
        raise OffsetMapInputError("offset", f"expected a 64-bit signed offset, found {value}")
    return value


def _vector(argument: str, values: object) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise OffsetMapInputError(argument, f"expected a 1-D array, found {array.ndim} dimensions")
    return array


def hash_words(argument: str, values: object) -> np.ndarray:
    """A 1-D contiguous uint64 array; int64 input is reinterpreted bit for bit (no copy)."""
    array = _vector(argument, values)
    if array.dtype == np.int64:
        array = array.view(np.uint64)
    elif array.dtype != np.uint64:
        raise OffsetMapInputError(argument, f"expected uint64 (or int64) hash words, found {array.dtype}")
    return np.ascontiguousarray(array)


def int64_vector(argument: str, values: object) -> np.ndarray:
    """A 1-D contiguous int64 array from any integer array that converts without loss."""
    array = _vector(argument, values)
    if array.dtype != np.int64:
        if array.dtype.kind not in "iu" or not np.can_cast(array.dtype, np.int64, casting="safe"):
            raise OffsetMapInputError(argument, f"expected an integer array castable to int64, found {array.dtype}")
        array = array.astype(np.int64)
    return np.ascontiguousarray(array)


def length_vector(argument: str, values: object) -> np.ndarray:
    """Key lengths: int32 or int64 are passed through (both have compiled kernels), other ints widened."""
    array = _vector(argument, values)
    if array.dtype in (np.int32, np.int64):
        return np.ascontiguousarray(array)
    return int64_vector(argument, array)


def byte_buffer(buf: object) -> np.ndarray:
    """A 1-D contiguous uint8 view of `buf` (a uint8 ndarray or any bytes-like object); never copies."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise OffsetMapInputError("buf", f"expected a 1-D uint8 array, found {buf.ndim}-D {buf.dtype}")
        if not buf.flags.c_contiguous:
            raise OffsetMapInputError("buf", "expected a contiguous buffer (key spans are byte positions)")
        return buf
    try:
        view = memoryview(buf)  # type: ignore[arg-type]
    except TypeError:
        found = type(buf).__name__
        raise OffsetMapInputError("buf", f"expected a uint8 array or bytes-like object, found {found}") from None
    if not view.c_contiguous:
        raise OffsetMapInputError("buf", "expected a contiguous buffer (key spans are byte positions)")
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def bitmap(bits: object, start: object) -> tuple[np.ndarray, int]:
    """(bits, start) of a bitmap of offsets the map writes into: a writable C-contiguous 1-D uint8 array and an
    integer offset; raises OffsetMapInputError otherwise."""
    if not (isinstance(bits, np.ndarray) and bits.dtype == np.uint8 and bits.ndim == 1 and bits.flags.c_contiguous
            and bits.flags.writeable):
        raise OffsetMapInputError("superseded", "expected a writable contiguous 1-D uint8 array of bits")
    try:
        return bits, operator.index(start)  # type: ignore[arg-type]
    except TypeError:
        raise OffsetMapInputError("superseded", "expected an integer first offset") from None


def same_length(**arrays: np.ndarray) -> int:
    """The common length of `arrays`; raises OffsetMapInputError naming them if they differ."""
    lengths = {name: array.size for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        found = ", ".join(f"{name}={size}" for name, size in lengths.items())
        raise OffsetMapInputError("/".join(lengths), f"expected arrays of equal length, found {found}")
    return next(iter(lengths.values()))


def check_spans(buf: np.ndarray, key_pos: np.ndarray, key_len: np.ndarray) -> None:
    """Raise KeySpanError for the first span not inside `buf` (length -1, a null key, always passes)."""
    bad = kernels().check_spans(buf.size, key_pos, key_len)
    if bad >= 0:
        raise KeySpanError(bad, int(key_pos[bad]), int(key_len[bad]), buf.size)


def check_offsets(offsets: np.ndarray, offset_min: int) -> None:
    """Raise OffsetOrderError unless offsets are non-decreasing and none is below `offset_min` (>= 0)."""
    assert offset_min >= 0, "offset_min must already include the non-negative floor"
    bad = kernels().check_offsets(offsets, offset_min)
    if bad >= 0:
        floor = offset_min if bad == 0 else max(offset_min, int(offsets[bad - 1]))
        raise OffsetOrderError(bad, int(offsets[bad]), floor)
