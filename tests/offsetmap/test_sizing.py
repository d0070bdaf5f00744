"""Sizing rules: Kafka's per-thread split of the dedupe buffer, and the budget needed for a key count."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offsetmap import (
    BYTES_PER_SLOT,
    PER_THREAD_MEMORY_BYTES_MAX,
    OffsetMapConfigError,
    memory_bytes_for_keys,
    per_thread_memory_bytes,
)
from offsetmap.map import _capacity


@pytest.mark.parametrize(
    ("total", "threads", "expected"),
    [
        (134_217_728, 1, 134_217_728),
        (134_217_728, 3, 44_739_242),  # integer division, as Kafka's Long division
        (2**31 - 1, 1, 2**31 - 1),
        (0, 4, 0),
    ],
)
def test_dedupe_buffer_is_split_evenly_across_threads(total, threads, expected):
    assert per_thread_memory_bytes(total, threads) == expected


def test_per_thread_share_is_capped_at_2gib_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="offsetmap.map"):
        assert per_thread_memory_bytes(10 * 2**30, 2) == PER_THREAD_MEMORY_BYTES_MAX
    assert "capped" in caplog.text and "threads=2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="offsetmap.map"):
        per_thread_memory_bytes(2**31, 2)
    assert caplog.text == ""


@pytest.mark.parametrize(("total", "threads", "name"), [(1024, 0, "threads"), (-1, 1, "dedupe_buffer_bytes")])
def test_invalid_split_is_rejected(total, threads, name):
    with pytest.raises(OffsetMapConfigError) as caught:
        per_thread_memory_bytes(total, threads)
    assert caught.value.name == name


@settings(max_examples=300, deadline=None)
@given(keys=st.integers(1, 10**8), load_factor=st.floats(0.05, 1.0))
def test_memory_for_keys_is_the_smallest_budget_that_holds_them(keys, load_factor):
    memory_bytes = memory_bytes_for_keys(keys, load_factor)
    slots = memory_bytes // BYTES_PER_SLOT
    assert memory_bytes % BYTES_PER_SLOT == 0
    assert _capacity(slots, load_factor) >= keys and slots * load_factor > 1
    assert slots == 1 or _capacity(slots - 1, load_factor) < keys or not (slots - 1) * load_factor > 1


def test_key_count_beyond_the_slot_limit_is_rejected():
    with pytest.raises(OffsetMapConfigError) as caught:
        memory_bytes_for_keys(2**32, 1.0)
    assert caught.value.name == "keys"
