"""Key hashing: the compiled MurmurHash3 over byte spans must equal mmh3 for the same bytes and seed."""

from __future__ import annotations

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offsetmap import (
    SEED_MAX,
    KeySpanError,
    OffsetMapConfigError,
    OffsetMapInputError,
    hash_key,
    hash_key_spans,
)

SEEDS = (0, 1, 0x9747B28C, 2**31 - 1, 2**31, SEED_MAX)


def mmh3_pair(key: bytes, seed: int) -> tuple[int, int]:
    return mmh3.hash64(key, seed, x64arch=True, signed=False)


def test_hash_of_spans_matches_mmh3_for_every_tail_length():
    rng = np.random.default_rng(7)
    buf = np.frombuffer(rng.bytes(1024), dtype=np.uint8)
    # Lengths 0..63 cover tails 0..15 after 0, 1, 2 and 3 full 16-byte blocks; three start alignments each.
    positions, lengths = [], []
    for length in range(64):
        for start in (0, 3, 1024 - 64):
            positions.append(start)
            lengths.append(length)
    # A key that ends exactly at the end of the buffer exercises the whole-word tail loads at the edge.
    for length in range(64):
        positions.append(1024 - length)
        lengths.append(length)
    key_pos = np.array(positions, dtype=np.int64)
    key_len = np.array(lengths, dtype=np.int32)
    for seed in SEEDS:
        h1, h2 = hash_key_spans(buf, key_pos, key_len, seed)
        for i, (start, length) in enumerate(zip(positions, lengths)):
            expected = mmh3_pair(bytes(buf[start : start + length]), seed)
            assert (int(h1[i]), int(h2[i])) == expected, (seed, start, length)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.binary(max_size=80), min_size=1, max_size=20), seed=st.integers(0, SEED_MAX))
def test_hash_of_spans_matches_mmh3_for_arbitrary_keys_and_seeds(keys, seed):
    buf = b"".join(keys)
    key_len = np.array([len(k) for k in keys], dtype=np.int64)
    key_pos = np.concatenate([[0], np.cumsum(key_len)[:-1]]).astype(np.int64)
    h1, h2 = hash_key_spans(buf, key_pos, key_len, seed)
    assert [(int(a), int(b)) for a, b in zip(h1, h2)] == [mmh3_pair(k, seed) for k in keys]


def test_hash_key_matches_mmh3_digest_byte_for_byte():
    key = b"user-42"
    for seed in SEEDS:
        h1, h2 = hash_key(key, seed)
        digest = mmh3.mmh3_x64_128_digest(key, seed)
        assert h1.to_bytes(8, "little") + h2.to_bytes(8, "little") == digest
        assert h1 | (h2 << 64) == mmh3.hash128(key, seed, x64arch=True, signed=False)


def test_hash_key_and_hash_key_spans_agree_on_the_same_bytes():
    keys = [b"", b"a", b"0123456789abcdef", b"\x00" * 31, "ключ".encode()]
    buf = bytearray(b"".join(keys))
    key_len = np.array([len(k) for k in keys], dtype=np.int32)
    key_pos = np.concatenate([[0], np.cumsum(key_len)[:-1]])
    h1, h2 = hash_key_spans(memoryview(buf), key_pos, key_len, 99)
    assert [(int(a), int(b)) for a, b in zip(h1, h2)] == [hash_key(k, 99) for k in keys]


def test_int32_and_int64_key_lengths_hash_alike():
    buf = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    key_pos = np.array([0, 5, 9])
    a = hash_key_spans(buf, key_pos, np.array([5, 4, 17], dtype=np.int32), 3)
    b = hash_key_spans(buf, key_pos, np.array([5, 4, 17], dtype=np.int64), 3)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_null_key_span_hashes_to_zero_pair_and_ignores_its_position():
    buf = np.frombuffer(b"key", dtype=np.uint8)
    h1, h2 = hash_key_spans(buf, np.array([0, 10**9]), np.array([3, -1]), 5)
    assert (int(h1[0]), int(h2[0])) == mmh3_pair(b"key", 5)
    assert (int(h1[1]), int(h2[1])) == (0, 0)


@pytest.mark.parametrize(
    ("position", "length"),
    [(0, 9), (5, 4), (-1, 2), (9, 0), (0, -2)],
)
def test_key_span_outside_buffer_is_rejected_with_its_index(position, length):
    buf = np.zeros(8, dtype=np.uint8)
    with pytest.raises(KeySpanError) as caught:
        hash_key_spans(buf, np.array([0, position]), np.array([8, length]), 0)
    assert (caught.value.index, caught.value.position, caught.value.length) == (1, position, length)
    assert caught.value.buffer_bytes == 8


def test_empty_key_at_end_of_buffer_is_a_valid_span():
    h1, h2 = hash_key_spans(np.zeros(8, dtype=np.uint8), np.array([8]), np.array([0]), 0)
    assert (int(h1[0]), int(h2[0])) == mmh3_pair(b"", 0)


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1, 1.5])
def test_seed_outside_32_bits_is_rejected(seed):
    with pytest.raises(OffsetMapConfigError) as caught:
        hash_key(b"k", seed)
    assert caught.value.name == "seed"


def test_mismatched_span_arrays_and_str_keys_are_rejected():
    with pytest.raises(OffsetMapInputError):
        hash_key_spans(b"abc", np.array([0, 1]), np.array([1]), 0)
    with pytest.raises(OffsetMapInputError):
        hash_key_spans(b"abc", np.array([0.0]), np.array([1]), 0)
    with pytest.raises(OffsetMapInputError):
        hash_key("text", 0)  # type: ignore[arg-type]
