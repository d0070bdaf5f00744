"""The key bloom filter: no false negatives, merge is union, the distinct estimate lies within its bound."""

from __future__ import annotations

import numpy as np
import pytest

from offsetmap import hash_key
from offsetmap.bloom import KeyBloomFilter


def _hashes(keys):
    pairs = [hash_key(k) for k in keys]
    return np.array([a for a, _ in pairs], dtype=np.uint64), np.array([b for _, b in pairs], dtype=np.uint64)


def _random_hashes(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**64, size=n, dtype=np.uint64), rng.integers(0, 2**64, size=n, dtype=np.uint64)


def test_added_keys_are_always_found_and_few_others_are():
    bloom = KeyBloomFilter(8 * 4096, hashes=3)
    h1, h2 = _hashes([b"key-%d" % i for i in range(2000)])
    bloom.add_hashes(h1, h2)
    assert bloom.might_contain(h1, h2).all()
    o1, o2 = _hashes([b"other-%d" % i for i in range(2000)])
    assert bloom.might_contain(o1, o2).mean() < 0.15  # (1 - e^{-3·2000/32768})^3 ≈ 0.5%; generous


@pytest.mark.parametrize("n,bits,hashes", [(1_000, 2**14, 1), (50_000, 2**20, 2), (200_000, 2**21, 3), (300_000, 2**19, 2)])
def test_distinct_estimate_is_within_its_bound(n, bits, hashes):
    h1, h2 = _random_hashes(n, seed=n)
    bloom = KeyBloomFilter(bits, hashes)
    bloom.add_hashes(h1, h2)
    bloom.add_hashes(h1[: n // 2], h2[: n // 2])  # duplicates do not count
    estimate, bound = bloom.estimate_distinct(), bloom.error_bound()
    assert abs(estimate - n) <= bound
    assert bound < 0.05 * n


def test_merge_is_the_filter_of_the_union():
    a1, a2 = _random_hashes(30_000, 1)
    b1, b2 = _random_hashes(20_000, 2)
    left, right, both = (KeyBloomFilter(2**20) for _ in range(3))
    left.add_hashes(a1, a2)
    right.add_hashes(b1, b2)
    both.add_hashes(np.concatenate([a1, b1]), np.concatenate([a2, b2]))
    left.merge(right)
    assert left.to_bytes() == both.to_bytes()
    assert KeyBloomFilter.from_bytes(left.to_bytes(), left.hashes).estimate_distinct() == left.estimate_distinct()
    with pytest.raises(ValueError, match="same size"):
        left.merge(KeyBloomFilter(2**19))


def test_sizing_for_a_target_error_and_saturation():
    bloom = KeyBloomFilter.for_error(1_000_000, 0.001)
    h1, h2 = _random_hashes(1_000_000, 3)
    bloom.add_hashes(h1, h2)
    assert bloom.error_bound() <= 0.001 * 1_000_000 * 1.01
    assert abs(bloom.estimate_distinct() - 1_000_000) <= bloom.error_bound()
    tiny = KeyBloomFilter(64, hashes=4)
    tiny.add_hashes(h1[:5000], h2[:5000])
    assert tiny.estimate_distinct() == float("inf") and tiny.error_bound() == float("inf")
    assert KeyBloomFilter.for_memory(4096).memory_bytes == 4096
    with pytest.raises(ValueError):
        KeyBloomFilter(100)
