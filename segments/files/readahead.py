"""Reading ahead: one window is read and scanned on a second thread while the caller works on the previous one.

Owns `WindowRing` (the buffers of the windows in flight, handed out in turn) and `read_ahead` (run an
iterator on a background thread, at most one item ahead of its consumer; `read_ahead_in_order`: several
sources on several such threads at once, their items yielded in the sources' order). Together they let a cleaning phase
use both cores: the producer thread reads a window (`os.preadv`, or a mapping: `segments.files.mapped`) and
scans it (compiled kernels), both of which release the GIL, while the consumer inserts into the offset map or
assembles and writes output batches, which release it too.

The contract is the one `LogSegment.scan_windows` already has, that an item is valid until the next one is
asked for: the producer takes a permit before making each item and the consumer gives one back when it asks
for the next item, so with two permits and a ring of two buffer sets the producer never writes into the
buffers of the item the consumer holds. Memory: two windows and their record arrays instead of one.

Errors raised by the producer reach the consumer at the item where they happened, in order. A consumer that
stops early (a `break`, an exception, an abort) stops the producer and waits for it before the generator
returns, so no producer outlives the phase that started it and no buffer is written after. The producer runs on
a thread kept for the consumer thread between phases (it ends after `_IDLE_S` unused): starting a thread per
phase cost a round of a tiny partition milliseconds (issue 19), where handing a phase to a waiting thread costs
microseconds. A phase over at most `INLINE_BYTES_MAX` bytes (its caller says how many) is read on the
consumer's own thread instead, the same items in the same order: for a log of a few KB, handing each window to
the other thread and back cost more than the read (a tiny partition's round 3.6 → 2.9 ms on tmpfs;
bench/RESULTS.md, twelfth round).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from ..codec.scan import ScanBuffers

__all__ = ["INLINE_BYTES_MAX", "WindowRing", "read_ahead", "read_ahead_in_order"]

T = TypeVar("T")

INLINE_BYTES_MAX = 256 * 1024  # a phase over at most this many bytes is read on the consumer's thread

_DONE = object()
_IDLE_S = 10.0  # a kept producer thread ends after this long without a phase
_IDLE_NAME = "read-ahead-idle"


class _Producer:
    """A thread that runs the producers of one consumer thread's phases, one at a time."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._ended = False
        threading.Thread(target=self._loop, name=_IDLE_NAME, daemon=True).start()

    def submit(self, job) -> bool:
        """Run `job` on this thread; False if the thread has ended (idle too long)."""
        with self._lock:
            if self._ended:
                return False
            self._jobs.put(job)
            return True

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=_IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._ended = True
                        return
                continue
            job()


_kept = threading.local()  # per consumer thread: its producer threads not in use


def _producer() -> _Producer:
    idle: list[_Producer] = _kept.__dict__.setdefault("idle", [])
    return idle.pop() if idle else _Producer()


class WindowRing:
    """`count` sets of (read buffer, record arrays) for windows of up to `window_bytes`, handed out in turn."""

    __slots__ = ("_next", "_sets", "window_bytes")

    def __init__(self, window_bytes: int, count: int = 2) -> None:
        if count < 1 or window_bytes < 1:
            raise ValueError("a window ring needs at least one set of at least one byte")
        self.window_bytes = window_bytes
        self._sets: list[tuple[np.ndarray, ScanBuffers] | None] = [None] * count  # made at their first window
        self._next = 0

    def next(self, size: int) -> tuple[np.ndarray, ScanBuffers]:
        """The next set in turn, its read buffer at least `size` bytes (grown once, then reused)."""
        k = self._next
        self._next = (k + 1) % len(self._sets)
        made = self._sets[k]
        if made is None:
            # numba (the scan's kernels) is imported only when a scan runs: start-up of the CLI stays fast
            from ..codec.scan import ScanBuffers

            made = self._sets[k] = (np.empty(0, dtype=np.uint8), ScanBuffers())
        read_buffer, buffers = made
        if len(read_buffer) < size:
            read_buffer = np.empty(max(size, min(self.window_bytes, 2 * len(read_buffer))), dtype=np.uint8)
            self._sets[k] = (read_buffer, buffers)
        return read_buffer, buffers


def read_ahead(source: Iterator[T], *, name: str = "read-ahead", total_bytes: int | None = None) -> Iterator[T]:
    """Yield the items of `source`, produced on a background thread at most one item ahead; on this thread
    where `total_bytes`, the bytes the phase reads, is at most `INLINE_BYTES_MAX`.

    `source` must make each item in buffers of a `WindowRing` of two sets (or allocate fresh ones); see the
    module docstring. Exceptions from `source` are raised here at the same item.
    """
    if _small(total_bytes):
        return _inline(source)
    return _threaded(source, name)


def _small(total_bytes: int | None) -> bool:
    """Whether a phase of `total_bytes` (None: not said) is read on the consumer's thread."""
    return total_bytes is not None and total_bytes <= INLINE_BYTES_MAX


def _inline(source: Iterator[T]) -> Iterator[T]:
    try:
        yield from source
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _threaded(source: Iterator[T], name: str) -> Iterator[T]:
    # The two permits are tokens in a queue: `queue.SimpleQueue` is C code that waits without the GIL, where a
    # `threading.Semaphore` or `queue.Queue` runs Python (a Condition and its locks) under the GIL for every item.
    permits: queue.SimpleQueue = queue.SimpleQueue()
    permits.put(None)
    permits.put(None)
    ready: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    finished = threading.Event()

    def produce() -> None:
        thread = threading.current_thread()
        thread.name = name
        try:
            while True:
                permits.get()
                if stop.is_set():
                    return
                item = next(source, _DONE)
                ready.put((item, None))
                if item is _DONE:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            ready.put((_DONE, exc))
        finally:
            thread.name = _IDLE_NAME
            finished.set()

    producer = _producer()
    while not producer.submit(produce):
        producer = _producer()  # that one had ended
    try:
        first = True
        while True:
            if not first:
                permits.put(None)  # the consumer is done with the previous item
            first = False
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        permits.put(None)
        finished.wait()
        _kept.__dict__.setdefault("idle", []).append(producer)
        close = getattr(source, "close", None)
        if close is not None:
            close()


def read_ahead_in_order(sources: Sequence[Callable[[WindowRing], Iterator[T]]], rings: Sequence[WindowRing], *,
                        name: str = "read-ahead", total_bytes: int | None = None) -> Iterator[T]:
    """Yield the items of `sources[0](ring)`, then of `sources[1](ring)`, and so on, produced on `len(rings)`
    threads at once: source `i` on thread `i % len(rings)`, in that thread's ring, each thread at most one item
    ahead of the consumer's use of its ring (as `read_ahead`: two permits a thread). With one ring, or a phase of
    at most `INLINE_BYTES_MAX` bytes (`total_bytes`), `read_ahead` of the sources one after the other. Exceptions
    are raised here at the item where they happened, in order; a consumer that stops early stops every producer
    and waits for them before the generator returns."""
    if len(rings) < 2 or len(sources) < 2 or _small(total_bytes):
        ring = rings[0]
        return read_ahead((item for source in sources for item in source(ring)), name=name, total_bytes=total_bytes)
    return _in_order(sources, rings, name)


_END = object()  # one source is done


def _in_order(sources: Sequence[Callable[[WindowRing], Iterator[T]]], rings: Sequence[WindowRing], name: str) -> Iterator[T]:
    k = len(rings)
    permits: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(k)]
    ready: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(k)]
    for p in permits:
        p.put(None)
        p.put(None)
    stop = threading.Event()
    finished = [threading.Event() for _ in range(k)]

    def produce(t: int) -> None:
        thread = threading.current_thread()
        thread.name = f"{name}-{t}"
        try:
            for i in range(t, len(sources), k):
                items = sources[i](rings[t])
                try:
                    while True:
                        permits[t].get()
                        if stop.is_set():
                            return
                        item = next(items, _END)
                        if item is _END:
                            permits[t].put(None)  # no buffer used: the permit goes back at once
                        ready[t].put((item, None))
                        if item is _END:
                            break
                finally:
                    close = getattr(items, "close", None)
                    if close is not None:
                        close()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there at this item
            ready[t].put((_DONE, exc))
        finally:
            thread.name = _IDLE_NAME
            finished[t].set()

    producers = []
    try:
        for t in range(k):
            producer = _producer()
            while not producer.submit(lambda t=t: produce(t)):
                producer = _producer()  # that one had ended
            producers.append(producer)
        for i in range(len(sources)):
            t = i % k
            while True:
                item, error = ready[t].get()
                if error is not None:
                    raise error
                if item is _END:
                    break
                yield item
                permits[t].put(None)  # the consumer is done with the item
    finally:
        stop.set()
        for t in range(len(producers)):
            permits[t].put(None)
            permits[t].put(None)
            finished[t].wait()
        _kept.__dict__.setdefault("idle", []).extend(producers)
