"""Kafka's default partitioner for keyed records: murmur2 of the key bytes, made positive, modulo N.

Owns the one hash that decides which partition a key lives in, bit-compatible with Java's
`org.apache.kafka.common.utils.Utils.murmur2` and `toPositive(hash) % numPartitions` (what a Kafka
producer's default partitioner does for a record with a key), so a key written here lands where a Kafka
producer would have put it. `partition_for_key` is the scalar form; `partitions_for_spans` does a whole
column of keys at once (the spans of an Arrow binary array, say) in compiled code.
"""

from __future__ import annotations

import numpy as np

from ..codec import compiled

__all__ = ["murmur2", "partition_for_key", "partitions_for_spans"]

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)


@compiled.njit(cache=True, nogil=True, inline="always")
def _murmur2(buf, pos, length):
    h = _SEED ^ np.uint32(length)
    whole = length & ~3
    for i in range(0, whole, 4):
        p = pos + i
        k = (np.uint32(buf[p]) | (np.uint32(buf[p + 1]) << np.uint32(8)) | (np.uint32(buf[p + 2]) << np.uint32(16))
             | (np.uint32(buf[p + 3]) << np.uint32(24)))
        k = np.uint32(k * _M)
        k ^= k >> np.uint32(24)
        k = np.uint32(k * _M)
        h = np.uint32(h * _M)
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= np.uint32(buf[pos + whole + 2]) << np.uint32(16)
    if rest >= 2:
        h ^= np.uint32(buf[pos + whole + 1]) << np.uint32(8)
    if rest >= 1:
        h ^= np.uint32(buf[pos + whole])
        h = np.uint32(h * _M)
    h ^= h >> np.uint32(13)
    h = np.uint32(h * _M)
    h ^= h >> np.uint32(15)
    return h


@compiled.njit(cache=True, nogil=True)
def _murmur2_one(buf):
    return _murmur2(buf, 0, buf.size)


@compiled.njit(cache=True, nogil=True)
def _partitions(buf, key_pos, key_len, n, out):
    for i in range(key_pos.size):
        if key_len[i] < 0:
            out[i] = -1
        else:
            out[i] = np.int32((_murmur2(buf, key_pos[i], key_len[i]) & np.uint32(0x7FFFFFFF)) % np.uint32(n))


def murmur2(key: bytes | bytearray | memoryview) -> int:
    """Kafka's murmur2 of `key` as Java's signed 32-bit int."""
    h = int(_murmur2_one(np.frombuffer(bytes(key), dtype=np.uint8)))
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_key(key: bytes | bytearray | memoryview, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record with this key among `partitions`."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def partitions_for_spans(buf: np.ndarray, key_pos: np.ndarray, key_len: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of every key `buf[key_pos[i] : key_pos[i] + key_len[i]]` (int32; -1 for a null key, len -1).

    Requires `buf` a 1-D uint8 array holding every span, `key_pos`/`key_len` int64 arrays of equal length.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    key_pos = np.ascontiguousarray(key_pos, dtype=np.int64)
    key_len = np.ascontiguousarray(key_len, dtype=np.int64)
    if key_pos.shape != key_len.shape:
        raise ValueError("key_pos and key_len differ in length")
    valid = key_len >= 0
    if np.any(valid) and (int((key_pos + key_len)[valid].max()) > buf.size or int(key_pos[valid].min()) < 0):
        raise ValueError("a key span lies outside the buffer")
    out = np.empty(key_pos.size, dtype=np.int32)
    _partitions(buf, key_pos, key_len, np.int64(partitions), out)
    return out
