"""Key hashing for the offset map: MurmurHash3 x64 128 with a 32-bit seed.

Owns the one hash function the map stores: the 128-bit MurmurHash3_x64_128 of the key's bytes, split as mmh3
splits it into two unsigned 64-bit words (h1, h2) = `mmh3.hash64(key, seed, x64arch=True, signed=False)`; the
16-byte digest `mmh3.mmh3_x64_128_digest(key, seed)` is h1 then h2, each little-endian. Two entry points give the
same result for the same bytes and seed:

* `hash_key(key, seed)` for one key held as a bytes-like object (uses mmh3 directly);
* `hash_key_spans(buf, key_pos, key_len, seed)` for many keys lying at byte spans of one buffer, hashed in place
  by a compiled kernel (`_kernels.py`) so the cleaner never copies a key out of a segment buffer;
* `hash_key_rows(buf_a, buf_b, key_pos, key_len, rows, in_b, seed)` for some of those spans (`rows`), each in one
  of two buffers (a window and the records decompressed from it), in one compiled call that checks as it hashes.

A record with a null key has `key_len == -1`; `hash_key_spans` gives it the hash (0, 0). That value is *not*
reserved: a real key may hash to it, so callers must skip null keys by their length, never by their hash.
`OffsetMap.insert_key_spans` and `lookup_key_spans` do.

This module must not hold state and must not know the table layout.
"""

from __future__ import annotations

import mmh3
import numpy as np

from . import _inputs
from ._compiled import kernels
from .errors import KeySpanError, OffsetMapInputError

__all__ = ["SEED_MAX", "hash_key", "hash_key_rows", "hash_key_spans"]

SEED_MAX = _inputs.SEED_MAX


def hash_key(key: bytes | bytearray | memoryview, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3_x64_128 of `key` as two unsigned 64-bit ints (h1, h2).

    Requires a bytes-like key and 0 <= seed <= SEED_MAX. Ensures the result equals
    `mmh3.hash64(key, seed, x64arch=True, signed=False)` and `hash_key_spans` over the same bytes.
    Raises OffsetMapConfigError for a bad seed, OffsetMapInputError for a key that is not bytes-like (a `str`
    is refused: the map hashes key bytes exactly as they are stored in the log).
    """
    seed = _inputs.seed_value(seed)
    if isinstance(key, str):
        raise OffsetMapInputError("key", "expected bytes, found str (encode it first)")
    try:
        return mmh3.mmh3_x64_128_utupledigest(key, seed)
    except TypeError:
        raise OffsetMapInputError("key", f"expected a bytes-like key, found {type(key).__name__}") from None


def hash_key_spans(
    buf: np.ndarray | bytes | bytearray | memoryview,
    key_pos: np.ndarray,
    key_len: np.ndarray,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Hash the keys at `buf[key_pos[i] : key_pos[i] + key_len[i]]` without copying them.

    Requires `buf` a 1-D uint8 array or bytes-like object, `key_pos` integer positions (int64 or narrower),
    `key_len` int32 or int64 lengths of the same length as `key_pos`, each -1 (null key) or a span inside
    `buf`, and 0 <= seed <= SEED_MAX. Ensures `(h1[i], h2[i]) == hash_key(bytes(span i), seed)` for every
    non-null key and `(0, 0)` for null keys (skip those by length). Returns two new uint64 arrays.
    Raises KeySpanError naming the first span outside `buf`, OffsetMapInputError for bad shapes or dtypes,
    OffsetMapConfigError for a bad seed.
    """
    seed = _inputs.seed_value(seed)
    buffer = _inputs.byte_buffer(buf)
    positions = _inputs.int64_vector("key_pos", key_pos)
    lengths = _inputs.length_vector("key_len", key_len)
    count = _inputs.same_length(key_pos=positions, key_len=lengths)
    _inputs.check_spans(buffer, positions, lengths)
    h1 = np.empty(count, dtype=np.uint64)
    h2 = np.empty(count, dtype=np.uint64)
    kernels().hash_spans(buffer, positions, lengths, np.uint64(seed), h1, h2)
    return h1, h2


def hash_key_rows(
    buf_a: np.ndarray,
    buf_b: np.ndarray,
    key_pos: np.ndarray,
    key_len: np.ndarray,
    rows: np.ndarray,
    in_b: np.ndarray,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Hash the keys of span `rows[j]` (`key_pos`/`key_len` as for `hash_key_spans`), each in `buf_b` where
    `in_b[j]`, else in `buf_a`, without copying them.

    Requires `buf_a` and `buf_b` 1-D uint8 arrays, `key_pos` int64 and `key_len` int32 or int64 contiguous arrays of
    one length, `rows` a contiguous int64 array and `in_b` a contiguous bool or uint8 array of one length, and
    0 <= seed <= SEED_MAX. Ensures `(h1[j], h2[j]) == hash_key(bytes(span rows[j]), seed)` (`(0, 0)` for a null
    key), as `hash_key_spans` over that span's buffer gives. Returns two new uint64 arrays, one call without the GIL.
    Raises KeySpanError naming the first span outside its buffer, OffsetMapInputError for a row that is no span's
    or for bad shapes or dtypes, OffsetMapConfigError for a bad seed.
    """
    seed = _inputs.seed_value(seed)
    for name, array, kinds in (("buf_a", buf_a, (np.uint8,)), ("buf_b", buf_b, (np.uint8,)),
                               ("key_pos", key_pos, (np.int64,)), ("key_len", key_len, (np.int32, np.int64)),
                               ("rows", rows, (np.int64,)), ("in_b", in_b, (np.bool_, np.uint8))):
        if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype not in kinds or not array.flags.c_contiguous:
            raise OffsetMapInputError(name, f"expected a contiguous 1-D array of {'/'.join(np.dtype(t).name for t in kinds)}")
    _inputs.same_length(key_pos=key_pos, key_len=key_len)
    count = _inputs.same_length(rows=rows, in_b=in_b)
    h1 = np.empty(count, dtype=np.uint64)
    h2 = np.empty(count, dtype=np.uint64)
    bad = kernels().hash_rows(buf_a, buf_b, key_pos, key_len, rows, in_b, np.uint64(seed), h1, h2)
    if bad >= 0:
        r = int(rows[bad])
        if not 0 <= r < len(key_pos):
            raise OffsetMapInputError("rows", f"row {r} at {bad} is not an index of the {len(key_pos)} spans")
        buffer = buf_b if in_b[bad] else buf_a
        raise KeySpanError(r, int(key_pos[r]), int(key_len[r]), buffer.size)
    return h1, h2
