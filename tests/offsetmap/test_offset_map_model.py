"""Model tests: the offset map against a Python dict with the same fill limit and offset rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from offsetmap import (
    OffsetMap,
    OffsetMapFullError,
    OffsetOrderError,
    hash_key,
    memory_bytes_for_keys,
)

KEYS = [b"k%d" % i for i in range(24)] + [b"", b"x" * 17, b"long-key-" * 5]
key_indexes = st.integers(0, len(KEYS) - 1)
deltas = st.integers(0, 3)


class OffsetMapVersusDict(RuleBasedStateMachine):
    """Every operation is applied to the map and to a dict model; results and all lookups must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.m: OffsetMap
        self.model: dict[bytes, int] = {}
        self.latest = -1

    @initialize(
        slots=st.integers(2, 40),
        load_factor=st.sampled_from([0.5, 0.75, 0.9, 1.0]),
        seed=st.integers(0, 2**32 - 1),
    )
    def build(self, slots, load_factor, seed):
        if not slots * load_factor > 1:
            slots = 3
        self.m = OffsetMap(slots * 24 + 23, load_factor, seed)  # the 23 spare bytes must not add a slot
        assert self.m.slots == slots
        self.capacity = int(slots * load_factor)

    # ------------------------------------------------------------------ model helpers

    def _floor(self) -> int:
        return max(self.latest, 0)

    def _model_insert(self, entries: list[tuple[bytes | None, int]]) -> int:
        for index, (key, offset) in enumerate(entries):
            if key is not None and key not in self.model and len(self.model) >= self.capacity:
                return index
            if key is not None:
                self.model[key] = offset
            self.latest = offset
        return len(entries)

    @staticmethod
    def _offsets(start: int, steps: list[int]) -> np.ndarray:
        return start + np.cumsum(np.array(steps, dtype=np.int64))

    # ------------------------------------------------------------------ rules

    @rule(key=key_indexes, delta=deltas)
    def put(self, key, delta):
        offset = self._floor() + delta
        k = KEYS[key]
        if k not in self.model and len(self.model) >= self.capacity:
            with pytest.raises(OffsetMapFullError):
                self.m.put(k, offset)
        else:
            self.m.put(k, offset)
            self.model[k] = offset
            self.latest = offset

    @rule(data=st.lists(st.tuples(key_indexes, deltas), max_size=30), back=st.integers(0, 40),
          nbytes=st.integers(0, 6))
    def insert_hashes(self, data, back, nbytes):
        """With `previous` and a bitmap of superseded offsets starting `back` below the floor (`nbytes` bytes: some
        replaced offsets fall outside it): both say what the model replaced, the bitmap only inside its range."""
        keys = [KEYS[i] for i, _ in data]
        offsets = self._offsets(self._floor(), [d for _, d in data])
        pairs = [hash_key(k, self.m.seed) for k in keys]
        h1 = np.array([p[0] for p in pairs], dtype=np.uint64)
        h2 = np.array([p[1] for p in pairs], dtype=np.uint64)
        start = max(self._floor() - back, 0)
        bits = np.zeros(nbytes, dtype=np.uint8)
        previous = np.full(len(keys), -2, dtype=np.int64)
        held = dict(self.model)
        consumed = self.m.insert_hashes(h1, h2, offsets, previous=previous, superseded=(bits, start))
        assert consumed == self._model_insert(list(zip(keys, offsets.tolist())))
        replaced = []
        for k, offset in zip(keys[:consumed], offsets[:consumed].tolist()):
            replaced.append(held.get(k, -1))
            held[k] = offset
        assert previous[:consumed].tolist() == replaced
        expected = np.zeros(nbytes, dtype=np.uint8)
        for offset in replaced:
            if start <= offset < start + 8 * nbytes:
                expected[(offset - start) >> 3] |= 1 << ((offset - start) & 7)
        assert bits.tolist() == expected.tolist()

    @rule(data=st.lists(st.tuples(st.one_of(st.none(), key_indexes), deltas), max_size=30))
    def insert_key_spans(self, data):
        keys = [None if i is None else KEYS[i] for i, _ in data]
        buf = b"#" + b"".join(k or b"" for k in keys)  # a junk byte in front: spans are not at 0
        lengths = np.array([-1 if k is None else len(k) for k in keys], dtype=np.int32)
        ends = np.cumsum(np.maximum(lengths, 0), dtype=np.int64)
        positions = 1 + ends - np.maximum(lengths, 0)
        offsets = self._offsets(self._floor(), [d for _, d in data])
        consumed = self.m.insert_key_spans(buf, positions, lengths, offsets)
        assert consumed == self._model_insert(list(zip(keys, offsets.tolist())))

    @rule(key=key_indexes)
    def get(self, key):
        assert self.m.get(KEYS[key]) == self.model.get(KEYS[key], -1)

    @rule(delta=deltas)
    def advance_latest_offset(self, delta):
        self.m.advance_latest_offset(self._floor() + delta)
        self.latest = self._floor() + delta

    @precondition(lambda self: self.latest > 0)
    @rule()
    def offset_below_latest_is_refused_and_changes_nothing(self):
        before = dict(self.model)
        with pytest.raises(OffsetOrderError):
            self.m.put(KEYS[0], self.latest - 1)
        h1, h2 = hash_key(KEYS[1], self.m.seed)
        with pytest.raises(OffsetOrderError):
            self.m.insert_hashes(
                np.array([h1, h1], dtype=np.uint64),
                np.array([h2, h2], dtype=np.uint64),
                np.array([self.latest, self.latest - 1]),
            )
        assert self.model == before

    @rule()
    def clear(self):
        self.m.clear()
        self.model.clear()
        self.latest = -1

    @rule(seed=st.integers(0, 2**32 - 1))
    def reset_with_new_seed(self, seed):
        self.m.reset(seed)
        assert self.m.seed == seed
        self.model.clear()
        self.latest = -1

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_key_lookup_agrees_with_model(self):
        expected = np.array([self.model.get(k, -1) for k in KEYS], dtype=np.int64)
        pairs = [hash_key(k, self.m.seed) for k in KEYS]
        h1 = np.array([p[0] for p in pairs], dtype=np.uint64)
        h2 = np.array([p[1] for p in pairs], dtype=np.uint64)
        assert np.array_equal(self.m.lookup_hashes(h1, h2), expected)
        buf = b"".join(KEYS)
        lengths = np.array([len(k) for k in KEYS])
        positions = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        assert np.array_equal(self.m.lookup_key_spans(buf, positions, lengths), expected)

    @invariant()
    def counters_agree_with_model(self):
        assert self.m.size == len(self.model) == len(self.m)
        assert self.m.size <= self.m.capacity == self.capacity
        assert self.m.latest_offset == self.latest
        assert self.m.utilization == len(self.model) / self.m.slots


OffsetMapVersusDict.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_offset_map_matches_dict_model = OffsetMapVersusDict.TestCase


def test_bulk_insert_matches_dict_model_at_scale_with_repeats_and_fill_limit():
    rng = np.random.default_rng(11)
    pool = 150_000
    pool_h1 = rng.integers(0, 2**64, size=pool, dtype=np.uint64)
    pool_h2 = rng.integers(0, 2**64, size=pool, dtype=np.uint64)
    m = OffsetMap(memory_bytes_for_keys(100_000), seed=0)
    model: dict[int, int] = {}
    start = 0
    consumed_total = 0
    for _ in range(4):  # several calls, each with keys repeating inside it and across calls
        picks = rng.integers(0, pool, size=60_000)
        offsets = start + np.arange(picks.size, dtype=np.int64)
        consumed = m.insert_hashes(pool_h1[picks], pool_h2[picks], offsets)
        expected = picks.size
        for i, p in enumerate(picks.tolist()):
            if p not in model and len(model) >= m.capacity:
                expected = i
                break
            model[p] = int(offsets[i])
        assert consumed == expected
        consumed_total += consumed
        start += picks.size
        if consumed < picks.size:
            break
    assert consumed_total < 4 * 60_000, "the workload must reach the fill limit"
    assert m.size == len(model) == m.capacity
    want = np.full(pool, -1, dtype=np.int64)
    want[list(model)] = list(model.values())
    assert np.array_equal(m.lookup_hashes(pool_h1, pool_h2), want)
