"""A fixed-memory bloom filter over key hashes, used to estimate how many distinct keys a log holds.

Owns `KeyBloomFilter`: a numpy bit array of m bits, k positions per key by double hashing the two 64-bit halves
of the key's MurmurHash3 x64 128 hash (`(h1 + i·h2) mod m`, the same hashes the offset map uses), filters
merged by OR (so the tasks of a distributed job can each build one and the driver combines them), and the
cardinality estimate from the fraction of bits still zero:

    n̂ = −(m/k)·ln(1 − X/m),  Var(n̂) ≈ m·(e^t − t − 1)/k²  with t = k·n̂/m

(linear counting of the k·n bit throws; Whang, Vander-Zanden & Taylor 1990). `error_bound()` is three
standard deviations. The filter answers membership too (`might_contain`). Sizing: `for_memory(bytes)`, or
`for_error(max_keys, relative_error)` for the smallest filter whose bound at `max_keys` keys is below the target.
"""

from __future__ import annotations

import math

import numpy as np

from segments.codec import compiled

__all__ = ["KeyBloomFilter"]

_HASHES_DEFAULT = 2
_BITS_MIN = 1024


@compiled.njit(cache=True, nogil=True)
def _add(bits, m, k, h1, h2):
    for i in range(h1.size):
        a = h1[i]
        b = h2[i] | np.uint64(1)
        for j in range(k):
            pos = (a + np.uint64(j) * b) % m
            bits[pos >> np.uint64(3)] |= np.uint8(1) << np.uint8(pos & np.uint64(7))


@compiled.njit(cache=True, nogil=True)
def _contains(bits, m, k, h1, h2, out):
    for i in range(h1.size):
        a = h1[i]
        b = h2[i] | np.uint64(1)
        found = True
        for j in range(k):
            pos = (a + np.uint64(j) * b) % m
            if (bits[pos >> np.uint64(3)] >> np.uint8(pos & np.uint64(7))) & np.uint8(1) == 0:
                found = False
                break
        out[i] = found


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


class KeyBloomFilter:
    """m bits, k hash positions per key; see the module docstring."""

    __slots__ = ("bits", "hashes", "m")

    def __init__(self, bits: int, hashes: int = _HASHES_DEFAULT, *, data: np.ndarray | None = None) -> None:
        if bits < 8 or bits % 8:
            raise ValueError(f"a bloom filter needs a positive multiple of 8 bits, got {bits}")
        if not 1 <= hashes <= 16:
            raise ValueError(f"hashes must be in [1, 16], got {hashes}")
        self.m = bits
        self.hashes = hashes
        if data is None:
            data = np.zeros(bits // 8, dtype=np.uint8)
        elif data.dtype != np.uint8 or data.size != bits // 8:
            raise ValueError(f"filter data must be {bits // 8} uint8 bytes")
        self.bits = data

    @classmethod
    def for_memory(cls, memory_bytes: int, hashes: int = _HASHES_DEFAULT) -> KeyBloomFilter:
        """The filter that fits `memory_bytes`."""
        return cls(max(_BITS_MIN, memory_bytes * 8), hashes)

    @classmethod
    def for_error(cls, max_keys: int, relative_error: float, hashes: int = _HASHES_DEFAULT) -> KeyBloomFilter:
        """The smallest filter (a power of two bits) whose error bound at `max_keys` keys is ≤ relative_error·max_keys."""
        if not 0 < relative_error < 1:
            raise ValueError(f"relative_error must be in (0, 1), got {relative_error}")
        bits = _BITS_MIN
        while _bound(bits, hashes, max(max_keys, 1)) > relative_error * max(max_keys, 1):
            bits *= 2
        return cls(bits, hashes)

    @classmethod
    def from_bytes(cls, data: bytes, hashes: int) -> KeyBloomFilter:
        return cls(len(data) * 8, hashes, data=np.frombuffer(data, dtype=np.uint8).copy())

    def to_bytes(self) -> bytes:
        return self.bits.tobytes()

    @property
    def memory_bytes(self) -> int:
        return self.bits.nbytes

    def add_hashes(self, h1: np.ndarray, h2: np.ndarray) -> None:
        """Add the keys with these hash halves (uint64 arrays of equal length)."""
        _add(self.bits, np.uint64(self.m), self.hashes, np.ascontiguousarray(h1, np.uint64), np.ascontiguousarray(h2, np.uint64))

    def might_contain(self, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
        out = np.empty(len(h1), dtype=np.bool_)
        _contains(self.bits, np.uint64(self.m), self.hashes, np.ascontiguousarray(h1, np.uint64),
                  np.ascontiguousarray(h2, np.uint64), out)
        return out

    def merge(self, other: KeyBloomFilter) -> None:
        """OR `other` (same size and hash count) into this filter: the filter of the union of both key sets."""
        if other.m != self.m or other.hashes != self.hashes:
            raise ValueError("only filters of the same size and hash count merge")
        np.bitwise_or(self.bits, other.bits, out=self.bits)

    def bits_set(self) -> int:
        return int(_POPCOUNT[self.bits].sum(dtype=np.int64))

    def estimate_distinct(self) -> float:
        """n̂, the estimated number of distinct keys added (inf once every bit is set)."""
        zero = self.m - self.bits_set()
        if zero == 0:
            return math.inf
        return -(self.m / self.hashes) * math.log(zero / self.m)

    def error_bound(self) -> float:
        """Three standard deviations of `estimate_distinct()` (inf when the filter is saturated)."""
        n = self.estimate_distinct()
        return math.inf if math.isinf(n) else _bound(self.m, self.hashes, n)


def _bound(m: int, k: int, n: float) -> float:
    t = k * n / m
    if t > 700:
        return math.inf
    return 3.0 * math.sqrt(max(m * (math.exp(t) - t - 1.0), 0.0)) / k
