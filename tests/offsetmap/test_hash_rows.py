"""`hash_key_rows`: some spans of two buffers hashed in one compiled call, as `hash_key_spans` hashes each span in
its own buffer (random spans, null and empty keys, every length up to past 16 bytes); rows and spans outside
their buffers are refused before anything is returned."""

from __future__ import annotations

import random

import numpy as np
import pytest

from offsetmap import KeySpanError, OffsetMapInputError, hash_key, hash_key_rows, hash_key_spans


def _spans(rng: random.Random, buffers: list[np.ndarray], n: int):
    key_pos = np.empty(n, dtype=np.int64)
    key_len = np.empty(n, dtype=np.int32)
    where = np.empty(n, dtype=np.bool_)
    for i in range(n):
        b = rng.random() < 0.5
        size = len(buffers[b])
        length = -1 if rng.random() < 0.1 else rng.randrange(0, min(size, 40) + 1)
        where[i] = b
        key_len[i] = length
        key_pos[i] = rng.randrange(0, size - max(length, 0) + 1)
    return key_pos, key_len, where


@pytest.mark.parametrize("seed", range(20))
def test_rows_hash_as_each_span_in_its_own_buffer(seed):
    rng = random.Random(seed)
    a = np.frombuffer(rng.randbytes(rng.randrange(50, 300)), dtype=np.uint8)
    b = np.frombuffer(rng.randbytes(rng.randrange(50, 300)), dtype=np.uint8)
    key_pos, key_len, where = _spans(rng, [a, b], 200)
    rows = np.array(sorted(rng.sample(range(200), rng.randrange(0, 200))), dtype=np.int64)
    in_b = where[rows]
    h1, h2 = hash_key_rows(a, b, key_pos, key_len, rows, in_b, seed)
    for j, r in enumerate(rows.tolist()):
        buf = b if in_b[j] else a
        e1, e2 = hash_key_spans(buf, key_pos[r : r + 1], key_len[r : r + 1], seed)
        assert (h1[j], h2[j]) == (e1[0], e2[0])
        if key_len[r] >= 0:
            assert (int(h1[j]), int(h2[j])) == hash_key(bytes(buf[key_pos[r] : key_pos[r] + key_len[r]]), seed)


def test_a_span_outside_its_buffer_or_a_bad_row_is_refused():
    a = np.zeros(10, dtype=np.uint8)
    b = np.zeros(100, dtype=np.uint8)
    key_pos = np.array([0, 50], dtype=np.int64)
    key_len = np.array([5, 20], dtype=np.int32)
    hash_key_rows(a, b, key_pos, key_len, np.array([0, 1], dtype=np.int64), np.array([False, True]))
    with pytest.raises(KeySpanError) as info:
        hash_key_rows(a, b, key_pos, key_len, np.array([0, 1], dtype=np.int64), np.array([False, False]))
    assert (info.value.index, info.value.buffer_bytes) == (1, 10)
    with pytest.raises(OffsetMapInputError):
        hash_key_rows(a, b, key_pos, key_len, np.array([2], dtype=np.int64), np.array([False]))
    with pytest.raises(OffsetMapInputError):
        hash_key_rows(a, b, key_pos, key_len, np.array([0], dtype=np.int32), np.array([False]))
    with pytest.raises(OffsetMapInputError):
        hash_key_rows(a, b, key_pos, key_len, np.array([0, 1], dtype=np.int64), np.array([False]))
