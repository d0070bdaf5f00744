"""The cleaning I/O budget: bytes per second over reads and writes, one budget per device.

Owns the rule every cleaning byte obeys, whoever moves it (the daemon's cleaner threads, `logcleaner clean`
for every partition it cleans):
* **One budget per device.** Log dirs on one device (`st_dev` of the log dir) share one `Throttle`
  (`DeviceThrottles`); dirs on different devices each get the full budget.
* **Charged before the I/O**, on the thread that does it (for reads, the read-ahead thread): every window read
  and every output write. A charge reserves its bytes in arrival order and blocks until the budget has
  accrued them, so concurrent threads take turns.
* **No banking beyond one window** (`WINDOW_S`): over any L seconds at most rate × (L + WINDOW_S) go through.
A waiting thread wakes every `SLEEP_SLICE_S` to take a rate change and call the caller's abort check; the clock
and the sleep are injected. How it keeps the budget (a token bucket), and against Kafka's `Throttler`: see
docs/design.md, "How the throttle keeps the budget".
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

__all__ = ["DeviceThrottles", "Throttle", "UNLIMITED", "WINDOW_S", "device_label"]

UNLIMITED = 1.7976931348623157e308  # Kafka's default: Double.MaxValue, i.e. no throttling
WINDOW_S = 0.3  # idle time banks at most this much budget (Kafka's check interval)
SLEEP_SLICE_S = 0.1  # a waiting thread re-reads the rate and calls its abort check this often
RATE_WINDOW_S = 10  # the metrics' rate: bytes let through per second, averaged over this many whole seconds


def device_label(device: int) -> str:
    """`major:minor` of a device number, as `/proc/self/mountinfo` and `lsblk` show it."""
    return f"{os.major(device)}:{os.minor(device)}"


class Throttle:
    """One budget of `bytes_per_second`, shared by every thread that charges it. Thread-safe."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
        window_s: float = WINDOW_S,
        sleep_slice_s: float = SLEEP_SLICE_S,
    ) -> None:
        assert window_s > 0 and sleep_slice_s > 0
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep
        self._window_s = window_s
        self._sleep_slice_s = sleep_slice_s
        self._rate = self._valid(bytes_per_second)
        now = clock()
        self._charged = 0  # bytes charged so far (each charge's position in the queue is the total after it)
        self._accrued = self._bank_bytes()  # budget accrued so far; it starts with one window banked
        self._accrued_at = now
        self._second_bytes = [0] * (RATE_WINDOW_S + 1)  # bytes let through in each of the last seconds ...
        self._second_of = [-1] * (RATE_WINDOW_S + 1)  # ... and which second each slot holds
        self.total_bytes = 0
        self.total_sleep_s = 0.0

    @staticmethod
    def _valid(rate: float) -> float:
        if not rate > 0 or math.isnan(rate):
            raise ValueError(f"throttle rate must be > 0 bytes/s, got {rate}")
        return float(rate)

    @property
    def bytes_per_second(self) -> float:
        return self._rate

    @property
    def unlimited(self) -> bool:
        return self._rate >= UNLIMITED

    def _bank_bytes(self) -> float:
        return self._rate * self._window_s

    def _accrue(self, now: float) -> None:
        """Bring the accrued budget up to `now` (lock held); never more than one window ahead of the charges."""
        elapsed = max(0.0, now - self._accrued_at)
        self._accrued_at = max(now, self._accrued_at)
        if self.unlimited:
            self._accrued = float(self._charged)
            return
        self._accrued = min(self._accrued + self._rate * elapsed, self._charged + self._bank_bytes())

    def set_rate(self, bytes_per_second: float) -> None:
        """A new budget; waiting threads take it at their next slice. Raises `ValueError` if not > 0."""
        rate = self._valid(bytes_per_second)
        with self._lock:
            self._accrue(self._clock())  # what accrued so far accrued at the old rate
            was_unlimited = self.unlimited
            self._rate = rate
            if was_unlimited:
                self._accrued = self._charged + self._bank_bytes()  # as after a long idle time
            else:
                self._accrued = min(self._accrued, self._charged + self._bank_bytes())

    def acquire(self, n_bytes: int, *, check_abort: Callable[[], None] | None = None) -> float:
        """Charge `n_bytes` of I/O about to be done; return once the budget covers them. Returns seconds waited.

        `check_abort` is called after each slice of waiting (it raises to abort, e.g. `CleaningAbortedError`);
        an injected sleep returning True also ends the wait (the I/O then goes ahead; the caller's own abort
        check stops it at the next window).
        """
        assert n_bytes >= 0, n_bytes
        started = self._clock()
        with self._lock:
            self._accrue(started)
            self.total_bytes += n_bytes
            self._charged += n_bytes
            position = self._charged
            if self._covers(position):
                self._let_through(started, n_bytes)
                return 0.0
        while True:
            with self._lock:
                now = self._clock()
                self._accrue(now)
                if self._covers(position):
                    self._let_through(now, n_bytes)
                    waited = max(0.0, now - started)
                    self.total_sleep_s += waited
                    return waited
                wait_s = (position - self._accrued) / self._rate
            interrupted = self._sleep(min(wait_s, self._sleep_slice_s))
            if check_abort is not None:
                check_abort()
            if interrupted:
                with self._lock:
                    now = self._clock()
                    self._let_through(now, n_bytes)
                    waited = max(0.0, now - started)
                    self.total_sleep_s += waited
                return waited

    def _covers(self, position: int) -> bool:
        """True once the budget accrued reaches `position` (lock held), within a microsecond's worth: float
        arithmetic on the clock must not leave a thread sleeping for nothing, time after time."""
        return self.unlimited or self._accrued >= position - max(1.0, self._rate * 1e-6)

    def _let_through(self, now: float, n_bytes: int) -> None:
        """Count `n_bytes` let through at `now` for the rate (lock held)."""
        second = int(now)
        slot = second % len(self._second_bytes)
        if self._second_of[slot] != second:
            self._second_of[slot] = second
            self._second_bytes[slot] = 0
        self._second_bytes[slot] += n_bytes

    def recent_bytes_per_second(self) -> float:
        """Bytes let through per second over the last `RATE_WINDOW_S` whole seconds."""
        with self._lock:
            current = int(self._clock())
            total = sum(b for b, s in zip(self._second_bytes, self._second_of) if current - RATE_WINDOW_S <= s < current)
        return total / RATE_WINDOW_S

    def utilization(self) -> float:
        """`recent_bytes_per_second()` as a fraction of the budget (0 when unlimited)."""
        return 0.0 if self.unlimited else self.recent_bytes_per_second() / self._rate


class DeviceThrottles:
    """One `Throttle` per device holding log dirs, all at the same configured rate. Thread-safe.

    The daemon holds one for all its threads; `logcleaner clean` one for all the partitions it cleans; a
    Spark executor would hold one per process. `device_of` may be replaced (tests inject device ids).
    """

    def __init__(self, bytes_per_second: float, **throttle_kwargs) -> None:
        self._rate = Throttle._valid(bytes_per_second)
        self._kwargs = throttle_kwargs
        self._lock = threading.Lock()
        self._by_device: dict[int, Throttle] = {}

    @staticmethod
    def device_of(path: str | os.PathLike) -> int:
        return os.stat(path).st_dev

    @property
    def bytes_per_second(self) -> float:
        return self._rate

    def for_path(self, path: str | os.PathLike) -> Throttle:
        """The budget of the device holding `path` (a log dir), made on first use."""
        device = self.device_of(path)
        with self._lock:
            throttle = self._by_device.get(device)
            if throttle is None:
                throttle = self._by_device[device] = Throttle(self._rate, **self._kwargs)
            return throttle

    def set_rate(self, bytes_per_second: float) -> None:
        rate = Throttle._valid(bytes_per_second)
        with self._lock:
            self._rate = rate
            for throttle in self._by_device.values():
                throttle.set_rate(rate)

    def by_device(self) -> dict[int, Throttle]:
        """Device number -> its budget, for the devices used so far."""
        with self._lock:
            return dict(self._by_device)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(t.total_bytes for t in self._by_device.values())
