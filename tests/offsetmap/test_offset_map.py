"""Behaviour of OffsetMap: Kafka's SkimpyOffsetMap semantics, the fill limit, memory, seeds and errors."""

from __future__ import annotations

import math
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from offsetmap import (
    BYTES_PER_SLOT,
    KeySpanError,
    OffsetMap,
    OffsetMapConfigError,
    OffsetMapFullError,
    OffsetMapInputError,
    OffsetOrderError,
    hash_key,
    memory_bytes_for_keys,
)
from offsetmap.map import PARTS_MAX


def random_hashes(count: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 2**64, size=count, dtype=np.uint64),
        rng.integers(0, 2**64, size=count, dtype=np.uint64),
    )


def hashes_of(keys: list[bytes], seed: int) -> tuple[np.ndarray, np.ndarray]:
    pairs = [hash_key(k, seed) for k in keys]
    return np.array([p[0] for p in pairs], dtype=np.uint64), np.array([p[1] for p in pairs], dtype=np.uint64)


# ------------------------------------------------------------------------------------ Kafka semantics


def test_put_overwrites_known_key_and_get_returns_minus_one_for_unknown():
    m = OffsetMap(memory_bytes_for_keys(10))
    m.put(b"a", 5)
    m.put(b"b", 6)
    m.put(b"a", 9)
    assert (m.get(b"a"), m.get(b"b"), m.get(b"c")) == (9, 6, -1)
    assert m.size == 2
    assert m.latest_offset == 9


def test_bulk_insert_last_write_wins_for_repeated_key_in_one_call():
    m = OffsetMap(memory_bytes_for_keys(100))
    keys = [b"x", b"y", b"x", b"z", b"x", b"y"]
    h1, h2 = hashes_of(keys, m.seed)
    assert m.insert_hashes(h1, h2, np.array([10, 11, 12, 13, 14, 15])) == 6
    assert [m.get(k) for k in (b"x", b"y", b"z")] == [14, 15, 13]
    assert m.size == 3
    assert m.latest_offset == 15


def test_equal_offsets_are_accepted_within_and_across_calls():
    m = OffsetMap(memory_bytes_for_keys(10))
    h1, h2 = hashes_of([b"a", b"b"], m.seed)
    assert m.insert_hashes(h1, h2, np.array([4, 4])) == 2
    m.put(b"c", 4)
    assert [m.get(k) for k in (b"a", b"b", b"c")] == [4, 4, 4]


def test_identical_hashes_are_the_same_key_as_kafka_treats_digest_collisions():
    m = OffsetMap(memory_bytes_for_keys(10))
    h1 = np.array([7, 7], dtype=np.uint64)
    h2 = np.array([8, 8], dtype=np.uint64)
    m.insert_hashes(h1, h2, np.array([1, 2]))
    assert m.size == 1
    assert m.lookup_hashes(h1[:1], h2[:1]).tolist() == [2]


def test_hash_zero_zero_is_an_ordinary_key_not_the_empty_marker():
    m = OffsetMap(memory_bytes_for_keys(10))
    zero = np.zeros(1, dtype=np.uint64)
    assert m.lookup_hashes(zero, zero).tolist() == [-1]
    m.insert_hashes(zero, zero, np.array([3]))
    assert m.lookup_hashes(zero, zero).tolist() == [3]
    assert m.size == 1


def test_int64_hash_words_are_read_bit_for_bit():
    m = OffsetMap(memory_bytes_for_keys(10))
    h1, h2 = random_hashes(3)
    m.insert_hashes(h1.view(np.int64), h2.view(np.int64), np.array([1, 2, 3]))
    assert m.lookup_hashes(h1, h2).tolist() == [1, 2, 3]


def test_advance_latest_offset_moves_forward_only():
    m = OffsetMap(memory_bytes_for_keys(10))
    m.put(b"a", 3)
    m.advance_latest_offset(10)
    assert m.latest_offset == 10
    with pytest.raises(OffsetOrderError) as caught:
        m.put(b"b", 9)
    assert (caught.value.offset, caught.value.offset_min) == (9, 10)
    with pytest.raises(OffsetOrderError):
        m.advance_latest_offset(9)
    assert m.latest_offset == 10 and m.get(b"b") == -1


# ------------------------------------------------------------------------------------ fill limit


def test_bulk_insert_stops_at_fill_limit_and_reports_progress():
    m = OffsetMap(20 * BYTES_PER_SLOT, load_factor=0.5)  # 20 slots, capacity 10
    assert m.capacity == 10
    keys = [b"k%d" % i for i in range(15)]
    h1, h2 = hashes_of(keys, m.seed)
    offsets = np.arange(100, 115)
    consumed = m.insert_hashes(h1, h2, offsets)
    assert consumed == 10
    assert m.size == 10
    assert m.latest_offset == 109
    assert m.lookup_hashes(h1, h2).tolist() == list(range(100, 110)) + [-1] * 5
    # The next round, after clear(), continues from the first entry not consumed.
    m.clear()
    assert m.insert_hashes(h1[consumed:], h2[consumed:], offsets[consumed:]) == 5
    assert m.latest_offset == 114


def test_reinserting_known_key_never_counts_against_limit():
    m = OffsetMap(10 * BYTES_PER_SLOT, load_factor=0.5)  # capacity 5
    known = [b"a", b"b", b"c", b"d", b"e"]
    h1, h2 = hashes_of(known, m.seed)
    assert m.insert_hashes(h1, h2, np.arange(5)) == 5
    # Full: every entry of a known key is still consumed; the first new key stops the call.
    stream = [b"c", b"a", b"e", b"a", b"new", b"b"]
    s1, s2 = hashes_of(stream, m.seed)
    assert m.insert_hashes(s1, s2, np.arange(10, 16)) == 4
    assert [m.get(k) for k in known] == [13, 1, 10, 3, 12]
    assert m.get(b"new") == -1
    assert m.size == 5 and m.latest_offset == 13
    m.put(b"d", 20)  # a single put of a known key at the limit succeeds too
    assert m.get(b"d") == 20


def test_put_of_new_key_at_fill_limit_raises_and_changes_nothing():
    m = OffsetMap(4 * BYTES_PER_SLOT, load_factor=0.5)  # capacity 2
    m.put(b"a", 1)
    m.put(b"b", 2)
    with pytest.raises(OffsetMapFullError) as caught:
        m.put(b"c", 3)
    assert (caught.value.size, caught.value.capacity) == (2, 2)
    assert (m.size, m.latest_offset, m.get(b"c")) == (2, 2, -1)


def test_map_filled_to_every_slot_still_answers_hits_and_misses():
    slots = 37  # four whole buckets and a short tail bucket of five slots
    m = OffsetMap(slots * BYTES_PER_SLOT, load_factor=1.0)
    h1, h2 = random_hashes(slots + 5, seed=3)
    assert m.insert_hashes(h1, h2, np.arange(slots + 5)) == slots
    assert m.utilization == 1.0
    assert m.lookup_hashes(h1, h2).tolist() == list(range(slots)) + [-1] * 5


def test_keys_whose_candidate_buckets_are_full_overflow_and_stay_findable():
    m = OffsetMap(64 * BYTES_PER_SLOT, load_factor=1.0)  # 8 buckets of 8 slots
    # High 32 bits of both words zero: both candidate buckets are bucket 0 for all 30 keys, so 22 of them
    # must overflow into the following buckets.
    crowd1 = np.arange(1, 31, dtype=np.uint64)
    crowd2 = np.arange(101, 131, dtype=np.uint64)
    assert m.insert_hashes(crowd1, crowd2, np.arange(30)) == 30
    others1, others2 = random_hashes(34, seed=5)
    assert m.insert_hashes(others1, others2, np.arange(30, 64)) == 34
    assert m.lookup_hashes(crowd1, crowd2).tolist() == list(range(30))
    assert m.lookup_hashes(others1, others2).tolist() == list(range(30, 64))
    absent1 = np.arange(500, 520, dtype=np.uint64)  # also crowding bucket 0: walks the whole chain
    assert m.lookup_hashes(absent1, absent1).tolist() == [-1] * 20
    # Overwrites of overflowed keys land on the same entries.
    m.insert_hashes(crowd1[::-1], crowd2[::-1], np.arange(64, 94))
    assert m.lookup_hashes(crowd1, crowd2).tolist() == list(range(93, 63, -1))
    assert m.size == 64


def _expected_tags(m: OffsetMap) -> np.ndarray:
    """The tag of every slot from the table alone: 0 where empty, else h1's low byte (1 where that is 0)."""
    table = m.table
    low = (table[:, 0] & np.uint64(0xFF)).astype(np.uint8)
    return np.where(table[:, 2] == 0, 0, np.where(low == 0, 1, low)).astype(np.uint8)


def test_tags_mirror_the_table_through_growth_parts_overwrites_and_clear():
    m = OffsetMap(memory_bytes_for_keys(400_000))
    m.reset(5, expected_keys=400_000, parts=2)  # a region in two parts that grows, then one part
    h1, h2 = random_hashes(300_000, seed=21)
    h1[::7] &= ~np.uint64(0xFF)  # low byte 0: tag 1, as a low byte 1 gives
    bits = np.zeros(100_000, dtype=np.uint8)
    with ThreadPoolExecutor(1) as pool:
        def run(calls):
            futures = [pool.submit(call) for call in calls[1:]]
            return [calls[0](), *(f.result() for f in futures)]

        assert m.insert_hashes(h1, h2, np.arange(300_000), superseded=(bits, 0), run=run) == 300_000
    assert np.array_equal(m.tags, _expected_tags(m))
    m.put(b"one more", 300_000)  # one part from here on
    assert m.insert_hashes(h1[::-3], h2[::-3], np.arange(300_001, 300_001 + len(h1[::-3]))) == len(h1[::-3])
    assert np.count_nonzero(m.tags) == m.size == 300_001
    assert np.array_equal(m.tags, _expected_tags(m))
    m.clear()
    assert not m.tags.any()


def test_keys_sharing_a_tag_and_a_bucket_are_told_apart_by_their_hash():
    m = OffsetMap(64 * BYTES_PER_SLOT, load_factor=1.0)  # 8 buckets of 8 slots
    # High 32 bits zero (both candidate buckets are bucket 0) and low bytes 0 or 1 (tag 1): 20 keys whose tags are
    # all alike, so every slot of their chain matches the tag and only the hash words tell them apart.
    crowd1 = (np.arange(20, dtype=np.uint64) << np.uint64(8)) | (np.arange(20, dtype=np.uint64) & np.uint64(1))
    crowd2 = np.arange(1, 21, dtype=np.uint64)
    assert m.insert_hashes(crowd1, crowd2, np.arange(20)) == 20
    assert m.lookup_hashes(crowd1, crowd2).tolist() == list(range(20))
    assert m.lookup_hashes(crowd1, crowd2 + np.uint64(100)).tolist() == [-1] * 20  # same tag and h1, other h2
    m.insert_hashes(crowd1[::-1], crowd2[::-1], np.arange(20, 40))
    assert m.lookup_hashes(crowd1, crowd2).tolist() == list(range(39, 19, -1))
    assert m.size == 20
    assert set(m.tags[m.tags > 0].tolist()) == {1}
    assert np.array_equal(m.tags, _expected_tags(m))


def test_a_full_short_tail_bucket_keeps_its_tags_to_its_slots():
    slots = 37  # four whole buckets and a short tail bucket of five slots
    m = OffsetMap(slots * BYTES_PER_SLOT, load_factor=1.0)
    h1, h2 = random_hashes(slots, seed=3)
    assert m.insert_hashes(h1, h2, np.arange(slots)) == slots
    assert m.tags.all() and np.array_equal(m.tags, _expected_tags(m))
    assert m._tags.view(np.uint8)[slots:].tolist() == [0, 0, 0]  # the tail word's bytes past the last slot
    extra1, extra2 = random_hashes(3, seed=4)
    assert m.insert_hashes(extra1, extra2, np.arange(slots, slots + 3)) == 0


# ------------------------------------------------------------------------------------ spans


def test_insert_key_spans_skips_null_keys_but_consumes_them():
    m = OffsetMap(memory_bytes_for_keys(10))
    buf = b"alphabeta"
    consumed = m.insert_key_spans(buf, np.array([0, 0, 5, 0]), np.array([5, -1, 4, -1]), np.array([1, 2, 3, 4]))
    assert consumed == 4
    assert m.size == 2
    assert (m.get(b"alpha"), m.get(b"beta")) == (1, 3)
    assert m.latest_offset == 4  # the trailing null-key record was scanned
    assert m.lookup_key_spans(buf, np.array([0, 0]), np.array([-1, 5])).tolist() == [-1, 1]


def test_insert_key_spans_and_insert_hashes_store_the_same_keys():
    rng = np.random.default_rng(9)
    lengths = rng.integers(0, 50, size=2000).astype(np.int32)
    ends = np.cumsum(lengths, dtype=np.int64)
    buf = np.frombuffer(rng.bytes(int(ends[-1])), dtype=np.uint8)
    positions = ends - lengths
    by_spans = OffsetMap(memory_bytes_for_keys(2000), seed=77)
    by_hashes = OffsetMap(memory_bytes_for_keys(2000), seed=77)
    offsets = np.arange(2000)
    assert by_spans.insert_key_spans(buf, positions, lengths, offsets) == 2000
    keys = [bytes(buf[p : p + n]) for p, n in zip(positions, lengths)]
    h1, h2 = hashes_of(keys, 77)
    assert by_hashes.insert_hashes(h1, h2, offsets) == 2000
    assert np.array_equal(by_spans.table, by_hashes.table)
    assert np.array_equal(by_hashes.lookup_key_spans(buf, positions, lengths), by_spans.lookup_hashes(h1, h2))


def test_insert_key_spans_stops_at_fill_limit_like_insert_hashes():
    m = OffsetMap(4 * BYTES_PER_SLOT, load_factor=0.5)  # capacity 2
    buf = b"abc"
    positions = np.array([0, 1, 0, 2, 0])
    lengths = np.array([1, 1, -1, 1, 1])
    assert m.insert_key_spans(buf, positions, lengths, np.arange(5)) == 3  # b"c" at index 3 does not fit
    assert (m.get(b"a"), m.get(b"b"), m.get(b"c"), m.latest_offset) == (0, 1, -1, 2)


def test_bad_span_or_offset_is_rejected_before_anything_is_written():
    m = OffsetMap(memory_bytes_for_keys(10))
    with pytest.raises(KeySpanError) as caught:
        m.insert_key_spans(b"abcdef", np.array([0, 4]), np.array([2, 3]), np.array([1, 2]))
    assert caught.value.index == 1
    with pytest.raises(OffsetOrderError) as order:
        m.insert_key_spans(b"abcdef", np.array([0, 2]), np.array([2, 2]), np.array([5, 4]))
    assert (order.value.index, order.value.offset, order.value.offset_min) == (1, 4, 5)
    with pytest.raises(OffsetOrderError):
        m.insert_hashes(np.ones(1, np.uint64), np.ones(1, np.uint64), np.array([-1]))
    assert m.size == 0 and m.latest_offset == -1 and m.get(b"ab") == -1


def test_bulk_inputs_of_wrong_shape_or_dtype_are_rejected():
    m = OffsetMap(memory_bytes_for_keys(10))
    one = np.ones(1, dtype=np.uint64)
    with pytest.raises(OffsetMapInputError):
        m.insert_hashes(one, np.ones(2, np.uint64), np.array([1]))
    with pytest.raises(OffsetMapInputError):
        m.insert_hashes(one.astype(np.float64), one, np.array([1]))
    with pytest.raises(OffsetMapInputError):
        m.insert_hashes(one, one, np.array([1], dtype=np.uint64))  # uint64 offsets may not fit int64
    with pytest.raises(OffsetMapInputError):
        m.lookup_hashes(one, one, out=np.empty(2, np.int64))
    with pytest.raises(OffsetMapInputError):
        m.insert_key_spans(np.zeros((2, 2), np.uint8), np.array([0]), np.array([1]), np.array([1]))
    for bits, start in ((np.zeros(2, np.int8), 0), (np.zeros(4, np.uint8)[::2], 0),
                        (np.zeros(2, np.uint8).reshape(1, 2), 0), (np.zeros(2, np.uint8), 1.5)):
        with pytest.raises(OffsetMapInputError):
            m.insert_hashes(one, one, np.array([1]), superseded=(bits, start))
    frozen = np.zeros(2, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(OffsetMapInputError):
        m.insert_hashes(one, one, np.array([1]), superseded=(frozen, 0))
    assert m.size == 0  # nothing was written


def test_lookup_writes_into_given_output_array():
    m = OffsetMap(memory_bytes_for_keys(10))
    m.put(b"a", 4)
    h1, h2 = hashes_of([b"a", b"b"], m.seed)
    out = np.full(2, 99, dtype=np.int64)
    assert m.lookup_hashes(h1, h2, out=out) is out
    assert out.tolist() == [4, -1]


# ------------------------------------------------------------------------------------ memory


def test_one_million_keys_fit_in_24mb_over_load_factor():
    memory_bytes = memory_bytes_for_keys(1_000_000, 0.9)
    # 24 bytes a key at 90% fill, rounded up to a whole slot: 1,111,112 slots.
    assert memory_bytes == 1_111_112 * 24 <= math.ceil(24_000_000 / 0.9) + BYTES_PER_SLOT
    m = OffsetMap(memory_bytes, load_factor=0.9)
    assert m.capacity >= 1_000_000
    assert m.nbytes == m.table.nbytes == m.slots * 24 == memory_bytes
    h1, h2 = random_hashes(1_000_000, seed=4)
    offsets = np.arange(1_000_000, dtype=np.int64)
    assert m.insert_hashes(h1, h2, offsets) == 1_000_000
    assert m.size == 1_000_000
    assert np.array_equal(m.lookup_hashes(h1, h2), offsets)
    # Read as 24 MiB the budget is roomier; read as exactly 24,000,000 / 0.9 bytes, Kafka's truncating
    # arithmetic (floor(1,111,111 slots x 0.9)) leaves it one key short.
    assert OffsetMap(int(24 * 2**20 / 0.9)).capacity >= 1_000_000
    assert OffsetMap(int(24_000_000 / 0.9)).capacity == 999_999


@pytest.mark.parametrize("memory_bytes", [48, 24 * 8 + 23, 1000, 24 * 1001, 134_217_728])
def test_table_nbytes_equal_slots_times_24(memory_bytes):
    m = OffsetMap(memory_bytes, load_factor=1.0)
    assert m.slots == memory_bytes // 24
    assert m.nbytes == m.table.nbytes == m.slots * 24
    assert m.table.shape == (m.slots, 3) and not m.table.flags.writeable


def test_default_dedupe_buffer_gives_kafkas_slot_and_key_counts():
    m = OffsetMap(128 * 2**20)  # log.cleaner.dedupe.buffer.size default, one thread
    assert (m.slots, m.capacity) == (5_592_405, 5_033_164)


@pytest.mark.parametrize("grows", [False, True])
def test_bulk_insert_allocates_nothing_proportional_to_keys(monkeypatch, grows):
    """Nothing, with a region that is the whole table from the start; with one that grows through a temporary
    passage (the table has no room past its active part), at most `_PASSAGE_BYTES_MAX`, freed at once."""
    from offsetmap import map as map_module

    if not grows:
        monkeypatch.setattr(map_module, "_REGION_START_SLOTS", 1 << 40)
    m = OffsetMap(memory_bytes_for_keys(300_000))
    assert (m._region_slots < m.active_slots) == grows
    h1, h2 = random_hashes(300_000, seed=8)
    offsets = np.arange(300_000, dtype=np.int64)
    rng = np.random.default_rng(8)
    lengths = rng.integers(1, 30, size=300_000).astype(np.int32)
    ends = np.cumsum(lengths, dtype=np.int64)
    positions = ends - lengths
    buf = np.frombuffer(rng.bytes(int(ends[-1])), dtype=np.uint8)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        assert m.insert_hashes(h1, h2, offsets) == 300_000
        m.clear()
        assert m.insert_key_spans(buf, positions, lengths, offsets) == 300_000
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert now - base < 64 * 1024, f"bulk insert kept {now - base} bytes"
    bound = map_module._PASSAGE_BYTES_MAX if grows else 0
    assert peak - base < bound + 64 * 1024, f"bulk insert allocated {peak - base} bytes"


def test_clear_reuses_memory():
    m = OffsetMap(memory_bytes_for_keys(1000))
    before = m.table
    h1, h2 = random_hashes(1000)
    m.insert_hashes(h1, h2, np.arange(1000))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        m.clear()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    after = m.table
    assert peak - base < 4096
    assert after.__array_interface__["data"][0] == before.__array_interface__["data"][0]
    assert np.shares_memory(before, after)
    assert (m.size, m.latest_offset, m.utilization) == (0, -1, 0.0)
    assert np.all(m.lookup_hashes(h1, h2) == -1)
    assert m.insert_hashes(h1, h2, np.arange(1000)) == 1000  # full capacity is available again


# ------------------------------------------------------------------------------------ seeds


def test_new_seed_changes_hashes():
    m = OffsetMap(memory_bytes_for_keys(10), seed=1)
    assert hash_key(b"key", 1) != hash_key(b"key", 2)
    m.put(b"key", 5)
    m.reset(seed=2)
    assert m.seed == 2
    assert (m.size, m.latest_offset, m.get(b"key")) == (0, -1, -1)
    # After the reset, get() hashes with the new seed: an entry stored under the seed-2 hash is found by key,
    # one stored under the seed-1 hash is not.
    old1, old2 = hash_key(b"key", 1)
    m.insert_hashes(np.array([old1], np.uint64), np.array([old2], np.uint64), np.array([6]))
    assert m.get(b"key") == -1
    new1, new2 = hash_key(b"key", 2)
    m.insert_hashes(np.array([new1], np.uint64), np.array([new2], np.uint64), np.array([7]))
    assert m.get(b"key") == 7
    buf = np.frombuffer(b"key", np.uint8)
    assert m.lookup_key_spans(buf, np.array([0]), np.array([3])).tolist() == [7]


def test_reset_with_bad_seed_leaves_the_map_untouched():
    m = OffsetMap(memory_bytes_for_keys(10), seed=3)
    m.put(b"a", 1)
    with pytest.raises(OffsetMapConfigError):
        m.reset(seed=2**32)
    assert (m.seed, m.get(b"a"), m.size) == (3, 1, 1)


# ------------------------------------------------------------------------------------ construction


@pytest.mark.parametrize(
    ("memory_bytes", "load_factor", "name"),
    [
        (23, 0.9, "memory_bytes"),  # not one slot
        (24, 1.0, "memory_bytes"),  # 1 slot x 1.0 is not > 1: Kafka refuses to start
        (48, 0.5, "memory_bytes"),  # 2 x 0.5 is not > 1
        (2400, 0.0, "load_factor"),
        (2400, 1.5, "load_factor"),
        (2400, float("nan"), "load_factor"),
        (2.5, 0.9, "memory_bytes"),
        (-24, 0.9, "memory_bytes"),
    ],
)
def test_invalid_sizing_is_rejected_naming_the_argument(memory_bytes, load_factor, name):
    with pytest.raises(OffsetMapConfigError) as caught:
        OffsetMap(memory_bytes, load_factor)
    assert caught.value.name == name


def test_smallest_map_kafka_accepts_holds_one_key():
    m = OffsetMap(48, load_factor=0.9)  # 2 slots x 0.9 = 1.8 > 1
    assert m.capacity == 1
    m.put(b"a", 1)
    with pytest.raises(OffsetMapFullError):
        m.put(b"b", 2)


# ------------------------------------------------------------------------------------ superseded offsets


def test_insert_reports_the_offset_each_entry_replaced():
    m = OffsetMap(memory_bytes_for_keys(100))
    h1, h2 = hashes_of([b"a", b"b", b"a", b"c", b"b", b"a"], m.seed)
    previous = np.full(6, 99, dtype=np.int64)
    assert m.insert_hashes(h1, h2, np.arange(10, 16), previous=previous) == 6
    assert previous.tolist() == [-1, -1, 10, -1, 11, 12]
    # Across calls too: the map remembers the latest offset of every key.
    more = np.empty(2, dtype=np.int64)
    h1, h2 = hashes_of([b"c", b"d"], m.seed)
    assert m.insert_hashes(h1, h2, np.array([20, 21]), previous=more) == 2
    assert more.tolist() == [13, -1]


def test_insert_reports_nothing_past_the_fill_limit():
    m = OffsetMap(24 * 4, load_factor=0.5)  # 4 slots, capacity 2
    h1, h2 = hashes_of([b"a", b"b", b"a", b"c", b"b"], m.seed)
    previous = np.full(5, 99, dtype=np.int64)
    assert m.insert_hashes(h1, h2, np.arange(5), previous=previous) == 3
    assert previous.tolist() == [-1, -1, 0, 99, 99]


def test_previous_must_match_the_entries():
    m = OffsetMap(memory_bytes_for_keys(10))
    h1, h2 = random_hashes(3)
    with pytest.raises(OffsetMapInputError):
        m.insert_hashes(h1, h2, np.arange(3), previous=np.empty(2, dtype=np.int64))
    assert m.size == 0


# ------------------------------------------------------------------------------------ active slots per round


def test_reset_with_expected_keys_narrows_the_table_but_admits_every_expected_key():
    m = OffsetMap(memory_bytes_for_keys(1_000_000), load_factor=0.9)
    m.reset(7, expected_keys=10_000)
    assert m.active_slots < m.slots // 50 and m.active_slots % 8 == 0
    assert m.active_capacity >= 10_000 and m.capacity == 1_000_000
    h1, h2 = random_hashes(10_000, seed=3)
    assert m.insert_hashes(h1, h2, np.arange(10_000)) == 10_000
    assert np.array_equal(m.lookup_hashes(h1, h2), np.arange(10_000))
    assert m.utilization == 10_000 / m.slots  # against the whole table, as operators read it
    # Only the active part of the table was written.
    assert not m.table[m.active_slots :].any() and m.table[: m.active_slots, 2].any()
    # More keys than expected: the narrowed table's own fill limit applies.
    h1, h2 = random_hashes(m.active_capacity, seed=4)
    consumed = m.insert_hashes(h1, h2, np.arange(10_000, 10_000 + len(h1)))
    assert m.size == m.active_capacity and consumed < len(h1)


def _grown_and_whole(monkeypatch, slots: int, expected_keys: int, parts: int = 1) -> tuple[OffsetMap, OffsetMap]:
    """A map whose region grows (in `parts` parts), and the same map probing its whole active part from the
    start."""
    from offsetmap import map as map_module

    grown = OffsetMap(slots * BYTES_PER_SLOT)
    grown.reset(5, expected_keys=expected_keys, parts=parts)
    with monkeypatch.context() as patch:
        patch.setattr(map_module, "_REGION_START_SLOTS", 1 << 40)  # never smaller than the active part
        whole = OffsetMap(slots * BYTES_PER_SLOT)
        whole.reset(5, expected_keys=expected_keys)
    assert whole._region_slots == whole.active_slots and grown._region_slots < grown.active_slots
    assert (grown.active_slots, grown.active_capacity) == (whole.active_slots, whole.active_capacity)
    return grown, whole


def _on_threads(pool: ThreadPoolExecutor, calls_seen: list[int]):
    """An `insert_hashes` runner: the calls at once on `pool`'s threads (their count recorded)."""

    def run(calls):
        calls_seen.append(len(calls))
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]

    return run


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("slots,expected_keys", [(400_000, 300_000), (2_000_000, 300_000), (400_000, 10**9)])
def test_a_growing_region_admits_and_stops_exactly_as_the_whole_active_part(monkeypatch, slots, expected_keys,
                                                                            parts):
    """The region doubles through its limits (and jumps to the whole part when no room is left past it); every
    call's consumed count, replaced offsets (`previous` and the bitmap), size, lookups and the full point match
    probing the whole part. Split into `parts` parts, each filled on a thread of its own while the region is below
    the active part: the same again."""
    grown, whole = _grown_and_whole(monkeypatch, slots, expected_keys, parts)
    rng = np.random.default_rng(11)
    distinct = grown.active_capacity + 20_000  # past the fill limit: the map fills up mid-call
    h1, h2 = random_hashes(distinct, seed=12)
    order = np.concatenate((rng.integers(0, 40_000, 60_000), rng.permutation(distinct)))  # repeats, then all
    offsets = np.arange(len(order), dtype=np.int64)
    regions = set()
    calls_seen: list[int] = []
    with ThreadPoolExecutor(parts) as pool:
        run = _on_threads(pool, calls_seen)
        for start in range(0, len(order), 7_919):
            part = order[start:start + 7_919]
            p1, p2 = np.empty(len(part), np.int64), np.empty(len(part), np.int64)
            b1, b2 = np.zeros(1_000, np.uint8), np.zeros(1_000, np.uint8)  # the offsets from 30,000 on
            regions.add((grown._region_slots, grown.parts))
            got = [grown.insert_hashes(h1[part], h2[part], offsets[start:start + len(part)], previous=p1,
                                       superseded=(b1, 30_000), run=run),
                   whole.insert_hashes(h1[part], h2[part], offsets[start:start + len(part)], previous=p2,
                                       superseded=(b2, 30_000))]
            assert got[0] == got[1] and np.array_equal(p1[:got[0]], p2[:got[1]]) and np.array_equal(b1, b2)
            assert (grown.size, grown.latest_offset) == (whole.size, whole.latest_offset)
            if start % (8 * 7_919) == 0:  # lookups while the region is split, too
                assert np.array_equal(grown.lookup_hashes(h1[:20_000], h2[:20_000]),
                                      whole.lookup_hashes(h1[:20_000], h2[:20_000]))
            if got[0] < len(part):
                break
    assert grown.size == grown.active_capacity  # it filled up, at the same entry as the whole part
    sizes = {size for size, _ in regions}
    assert len(sizes) >= 3 and max(sizes) == grown.active_slots  # it grew, to the whole part at last
    assert {n for size, n in regions if size < grown.active_slots} == {parts}  # split while below it
    assert grown.parts == 1 and (max(calls_seen) == parts if parts > 1 else not calls_seen)
    assert np.array_equal(grown.lookup_hashes(h1, h2), whole.lookup_hashes(h1, h2))
    assert not grown.table[grown.active_slots:].any()  # the moves' passage past the active part is empty again


def test_a_split_map_puts_its_keys_in_one_part_before_an_insert_that_is_not_split():
    """`put`, `insert_key_spans`, and an `insert_hashes` whose entries could fill the map run in input order on
    one part: the keys of a split region move there first, and every lookup still finds them."""
    h1, h2 = random_hashes(30_000, seed=21)
    for step in ("put", "spans", "filling"):
        m = OffsetMap(memory_bytes_for_keys(300_000))
        m.reset(3, expected_keys=200_000, parts=2)
        assert m.insert_hashes(h1, h2, np.arange(30_000)) == 30_000 and m.parts == 2
        if step == "put":
            m.put(b"key", 30_000)
        elif step == "spans":
            assert m.insert_key_spans(b"key", np.array([0]), np.array([3]), np.array([30_000])) == 1
        else:
            more1, more2 = random_hashes(m.active_capacity, seed=22)
            assert m.insert_hashes(more1, more2, 30_000 + np.arange(len(more1))) < len(more1)
            assert m.size == m.active_capacity
        assert m.parts == 1
        assert np.array_equal(m.lookup_hashes(h1, h2), np.arange(30_000))
        if step != "filling":
            assert m.get(b"key") == 30_000 and m.size == 30_001


def test_parts_filled_at_once_mark_every_replaced_offset_in_one_bitmap():
    """The threads of a split insert mark the bitmap's bytes at the same time (neighbouring offsets belong to
    different parts): every replaced offset's bit is set, none lost to a concurrent write of the same byte."""
    keys = 50_000
    h1, h2 = random_hashes(keys, seed=31)
    m = OffsetMap(memory_bytes_for_keys(2_000_000))
    m.reset(2, expected_keys=1_000_000, parts=4)
    total = 4_000_000  # a plain OR lost bits in each of five runs of 2,000,000 (1 to 2,707 of them)
    bits = np.zeros(total // 8, np.uint8)
    calls_seen: list[int] = []
    with ThreadPoolExecutor(4) as pool:
        run = _on_threads(pool, calls_seen)
        for start in range(0, total, 400_000):
            offsets = np.arange(start, start + 400_000, dtype=np.int64)
            index = offsets % keys  # key k at k, k + keys, ...: every offset but each key's last is replaced
            assert m.insert_hashes(h1[index], h2[index], offsets, superseded=(bits, 0), run=run) == 400_000
    assert m.parts == 4 and calls_seen and min(calls_seen) == 4
    marked = np.unpackbits(bits, bitorder="little")
    assert marked[: total - keys].all() and not marked[total - keys:].any()


def test_a_map_refuses_parts_out_of_range():
    m = OffsetMap(memory_bytes_for_keys(1_000))
    for parts in (0, PARTS_MAX + 1, True):
        with pytest.raises(OffsetMapConfigError):
            m.reset(1, parts=parts)


def test_a_region_with_no_room_past_the_active_part_passes_its_keys_through_a_bounded_array(monkeypatch):
    """The whole table active (a dirty section past the map's capacity: the default for large heads): the
    region still grows, through a temporary array, and doubles only while the next growth fits one."""
    from offsetmap import map as map_module

    monkeypatch.setattr(map_module, "_PASSAGE_BYTES_MAX", 70_000 * BYTES_PER_SLOT)
    m = OffsetMap(1_000_000 * BYTES_PER_SLOT)
    m.reset(1, expected_keys=10**9)
    assert m.active_slots == m.slots and m._region_slots == 65_536
    h1, h2 = random_hashes(200_000, seed=2)
    regions = []
    for start in range(0, 200_000, 10_000):
        assert m.insert_hashes(h1[start:start + 10_000], h2[start:start + 10_000],
                               np.arange(start, start + 10_000)) == 10_000
        regions.append(m._region_slots)
    # 65,536 → 131,072 (its growth will move 65,536 keys: they fit); 262,144's would move 131,072, more than the
    # passage holds: from 131,072 straight to the whole table
    assert sorted(set(regions)) == [65_536, 131_072, 1_000_000]
    assert np.array_equal(m.lookup_hashes(h1, h2), np.arange(200_000))


def test_a_round_with_few_keys_touches_only_its_region(monkeypatch):
    """Many records of few keys (the offset span overstates the keys): the keys sit in the first slots only."""
    m = OffsetMap(memory_bytes_for_keys(4_000_000))
    m.reset(3, expected_keys=3_000_000)
    h1, h2 = random_hashes(50_000, seed=8)
    index = np.random.default_rng(9).integers(0, 50_000, 400_000)
    assert m.insert_hashes(h1[index], h2[index], np.arange(400_000)) == 400_000
    assert m.size == len(np.unique(index)) and m.active_slots > 3_000_000
    occupied = np.flatnonzero(m.table[:, 2])
    assert occupied.max() < 4 * 65_536  # grew twice (32,768 and 65,536 keys), never to the 3.3 M slots
    last = np.full(50_000, -1)
    last[index] = np.arange(400_000)  # numpy assigns repeated indices in order: the last offset wins
    assert np.array_equal(m.lookup_hashes(h1, h2), last)


def test_put_and_key_spans_grow_the_region_too(monkeypatch):
    grown, whole = _grown_and_whole(monkeypatch, 400_000, 300_000)
    keys = [b"key-%d" % i for i in range(40_000)]  # past the first region's 32,768
    for offset, key in enumerate(keys[:35_000]):
        grown.put(key, offset)
        whole.put(key, offset)
    data = np.frombuffer(b"".join(keys[35_000:]), dtype=np.uint8)
    lengths = np.array([len(k) for k in keys[35_000:]], dtype=np.int64)
    positions = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    offsets = np.arange(35_000, 40_000, dtype=np.int64)
    assert grown.insert_key_spans(data, positions, lengths, offsets) == whole.insert_key_spans(
        data, positions, lengths, offsets) == 5_000
    assert grown._region_slots > 65_536 and grown.size == whole.size == 40_000
    assert all(grown.get(k) == whole.get(k) == i for i, k in enumerate(keys))


@pytest.mark.parametrize("expected", [None, 10**9, 1_000_000])
def test_reset_without_a_smaller_expectation_uses_the_whole_table(expected):
    m = OffsetMap(memory_bytes_for_keys(1000))
    m.reset(1, expected_keys=10)
    m.reset(2, expected_keys=expected)
    assert (m.active_slots, m.active_capacity) == (m.slots, m.capacity)


def test_reset_rejects_a_negative_expectation():
    m = OffsetMap(memory_bytes_for_keys(1000))
    with pytest.raises(OffsetMapConfigError, match="expected_keys"):
        m.reset(1, expected_keys=-1)


def test_empty_slots_are_zero_and_clear_returns_the_pages():
    m = OffsetMap(memory_bytes_for_keys(200_000))
    assert not m.table.any()
    h1, h2 = random_hashes(200_000, seed=9)
    m.insert_hashes(h1, h2, np.arange(200_000))
    assert np.count_nonzero(m.table[:, 2]) == 200_000
    assert m.table[:, 2].min(initial=2**64 - 1, where=m.table[:, 2] > 0) == 1  # offset 0 is stored as 1
    m.clear()
    assert not m.table.any()
    assert np.all(m.lookup_hashes(h1, h2) == -1)
