"""The read-ahead thread: items in order, errors at their item, no thread left behind, buffers never overwritten
while their item is in use."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from segments.files.readahead import INLINE_BYTES_MAX, WindowRing, read_ahead, read_ahead_in_order
from segments.partition.log import PartitionLog

from .helpers import write_log


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_items_arrive_in_order_and_the_thread_ends():
    assert list(read_ahead(iter(range(100)), name="t-order")) == list(range(100))
    assert "t-order" not in _threads()


def test_an_error_reaches_the_consumer_at_its_item():
    def source():
        yield 1
        yield 2
        raise ValueError("bad window at byte 42")

    seen = []
    with pytest.raises(ValueError, match="byte 42"):
        for item in read_ahead(source(), name="t-error"):
            seen.append(item)
    assert seen == [1, 2]
    assert "t-error" not in _threads()


def test_a_consumer_that_stops_early_stops_the_producer():
    produced = []

    def source():
        for i in range(1000):
            produced.append(i)
            yield i

    for item in read_ahead(source(), name="t-break"):
        if item == 3:
            break
    assert "t-break" not in _threads()
    assert len(produced) <= 5  # at most one item ahead of the one in use (plus the one being made)


def test_the_producer_never_writes_the_buffers_of_the_item_in_use():
    ring = WindowRing(1024)

    def source():
        for i in range(200):
            buf, _ = ring.next(1024)
            buf[:] = i % 256
            yield i, buf

    for i, buf in read_ahead(source(), name="t-ring"):
        before = buf.copy()
        threading.Event().wait(0.0005)  # let the producer run as far as it may
        assert np.array_equal(buf, before) and buf[0] == i % 256


def test_scan_windows_on_a_ring_give_the_same_results_as_plain_windows(tmp_path):
    d = tmp_path / "t-0"
    write_log(d, 400, segment_bytes=1 << 20, value_bytes=300)
    with PartitionLog.open(d, mode="reader") as log:
        seg = log.segments[0]
        plain = [(r.start_position, r.offset.tolist()) for _, r in seg.scan_windows(window_bytes=4096)]
        ring = WindowRing(4096)
        ahead = [
            (r.start_position, r.offset.tolist())
            for _, r in read_ahead(seg.scan_windows(window_bytes=4096, ring=ring), name="t-scan")
        ]
    assert len(plain) > 10 and ahead == plain


def test_consecutive_phases_of_a_thread_reuse_one_producer_thread():
    """Issue 19: a round of a tiny partition runs a few phases; a thread started and joined per phase cost it
    milliseconds. The producer thread is kept for the consumer thread between phases."""

    def source():
        yield threading.get_ident()

    producers = [next(iter(list(read_ahead(source(), name=f"t-reuse-{k}")))) for k in range(5)]
    assert len(set(producers)) == 1 and producers[0] != threading.get_ident()
    assert not any(name.startswith("t-reuse") for name in _threads())  # named after its phase only while in it


# ---- several sources on several threads (`read_ahead_in_order`) -------------------------------------------------

def _ring_sources(n_sources: int, items: int, rings_used: dict[int, set[int]] | None = None):
    """Sources that each fill `items` buffers of the ring they are given with (source, item) and yield them."""

    def source(s: int):
        def make(ring: WindowRing):
            if rings_used is not None:
                rings_used.setdefault(id(ring), set()).add(s)
            for j in range(items):
                buf, _ = ring.next(64)
                buf[:] = (s * 31 + j) % 256
                yield s, j, buf
        return make

    return [source(s) for s in range(n_sources)]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sources_on_several_threads_arrive_in_order_in_buffers_no_one_overwrites(threads):
    rings = [WindowRing(64) for _ in range(threads)]
    used: dict[int, set[int]] = {}
    seen = []
    for s, j, buf in read_ahead_in_order(_ring_sources(7, 20, used), rings, name="t-in-order"):
        before = buf.copy()
        threading.Event().wait(0.0002)  # let the producers run as far as they may
        assert np.array_equal(buf, before) and buf[0] == (s * 31 + j) % 256
        seen.append((s, j))
    assert seen == [(s, j) for s in range(7) for j in range(20)]
    # source i was made in ring i % threads
    assert sorted(sorted(v) for v in used.values()) == [list(range(t, 7, threads)) for t in range(threads)]
    assert not [name for name in _threads() if name.startswith("t-in-order")]


def test_an_error_of_a_later_source_reaches_the_consumer_after_every_earlier_item():
    def failing(ring):
        yield "c0"
        raise ValueError("bad window in source 2")

    sources = [lambda ring: iter(["a0", "a1"]), lambda ring: iter(["b0"]), failing, lambda ring: iter(["d0"])]
    seen = []
    with pytest.raises(ValueError, match="source 2"):
        for item in read_ahead_in_order(sources, [WindowRing(8), WindowRing(8)], name="t-in-order-error"):
            seen.append(item)
    assert seen == ["a0", "a1", "b0", "c0"]
    assert not [name for name in _threads() if name.startswith("t-in-order")]


def test_a_consumer_that_stops_early_stops_every_producer():
    made = []

    def source(s):
        def make(ring):
            for j in range(1000):
                made.append((s, j))
                yield s, j
        return make

    for s, j in read_ahead_in_order([source(s) for s in range(4)], [WindowRing(8), WindowRing(8)], name="t-in-order-b"):
        if (s, j) == (0, 3):
            break
    assert not [name for name in _threads() if name.startswith("t-in-order")]
    assert len(made) <= 5 + 3  # the consumer's thread: one item ahead; the other: two made before any was taken


def _named(items: list, log: list):
    """A source that records, per item, the thread that made it; and whether it was closed."""
    try:
        for item in items:
            log.append(threading.current_thread().ident)
            yield item
    finally:
        log.append("closed")


@pytest.mark.parametrize("total_bytes, inline", [(0, True), (INLINE_BYTES_MAX, True), (INLINE_BYTES_MAX + 1, False),
                                                 (None, False)])
def test_a_small_phase_is_read_on_the_consumers_thread_and_a_larger_one_ahead(total_bytes, inline):
    log: list = []
    items = list(read_ahead(_named(list(range(20)), log), name="t-inline", total_bytes=total_bytes))
    assert items == list(range(20))
    assert log[-1] == "closed"
    makers = set(log[:-1])
    assert (makers == {threading.get_ident()}) is inline
    assert "t-inline" not in _threads()


def test_a_small_phase_raises_at_the_item_and_closes_its_source_when_stopped_early():
    def failing():
        yield 1
        raise ValueError("bad window at byte 7")

    seen = []
    with pytest.raises(ValueError, match="byte 7"):
        for item in read_ahead(failing(), total_bytes=10):
            seen.append(item)
    assert seen == [1]
    log: list = []
    for item in read_ahead(_named(list(range(10)), log), total_bytes=10):
        if item == 3:
            break
    assert log == [threading.get_ident()] * 4 + ["closed"]


def test_small_sources_in_order_are_read_on_the_consumers_thread_whatever_the_rings():
    log: list = []
    sources = [lambda ring, k=k: _named([k * 10 + j for j in range(3)], log) for k in range(4)]
    rings = [WindowRing(1024), WindowRing(1024)]
    assert list(read_ahead_in_order(sources, rings, name="t-in-order", total_bytes=100)) == [
        k * 10 + j for k in range(4) for j in range(3)]
    assert {x for x in log if x != "closed"} == {threading.get_ident()} and log.count("closed") == 4
    log.clear()
    assert len(list(read_ahead_in_order(sources, rings, name="t-in-order", total_bytes=INLINE_BYTES_MAX + 1))) == 12
    assert threading.get_ident() not in log
