"""The cleaner threads' shared I/O budget: bytes per second over reads and writes, per device.

Owns Kafka's `Throttler` semantics: each thread reports the bytes it read or wrote; over each check
interval (300 ms) the observed rate is compared with the budget and, if above, the reporting thread sleeps
long enough to bring the interval's average down to it. Unlike Kafka's single budget, log dirs on
different devices (`st_dev`) each get the full budget, since they do not compete for the same disk. The
rate can be changed while running (config reload). The clock and the sleep are injected for tests.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

__all__ = ["DeviceThrottles", "Throttle", "UNLIMITED"]

UNLIMITED = 1.7976931348623157e308  # Kafka's default: Double.MaxValue, i.e. no throttling
CHECK_INTERVAL_S = 0.3
SLEEP_S_MAX = 10.0  # one sleep never exceeds this (the rest is owed next time; a reload takes effect soon)


class Throttle:
    """One budget of `bytes_per_second`, shared by every thread that reports to it. Thread-safe."""

    def __init__(
        self,
        bytes_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        check_interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep
        self._check_interval_s = check_interval_s
        self._rate = self._valid(bytes_per_second)
        self._period_start = clock()
        self._period_bytes = 0
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

    def set_rate(self, bytes_per_second: float) -> None:
        with self._lock:
            self._rate = self._valid(bytes_per_second)

    def acquire(self, n_bytes: int) -> float:
        """Account `n_bytes` of I/O; sleep if the current interval runs above the budget. Returns seconds slept."""
        with self._lock:
            self.total_bytes += n_bytes
            if self._rate >= UNLIMITED:
                return 0.0
            self._period_bytes += n_bytes
            now = self._clock()
            elapsed = now - self._period_start
            if elapsed < self._check_interval_s:
                return 0.0
            wanted = self._period_bytes / self._rate  # seconds this many bytes should have taken
            debt_s = max(0.0, wanted - elapsed)
            sleep_s = min(debt_s, SLEEP_S_MAX)
            # What one capped sleep does not pay is carried into the next period, not forgiven.
            self._period_start = now + sleep_s
            self._period_bytes = int((debt_s - sleep_s) * self._rate)
            self.total_sleep_s += sleep_s
        if sleep_s > 0:
            self._sleep(sleep_s)
        return sleep_s


class DeviceThrottles:
    """One `Throttle` per device holding log dirs, all at the same configured rate."""

    def __init__(self, bytes_per_second: float, **throttle_kwargs) -> None:
        self._rate = bytes_per_second
        self._kwargs = throttle_kwargs
        self._lock = threading.Lock()
        self._by_device: dict[int, Throttle] = {}

    @staticmethod
    def device_of(path: str | os.PathLike) -> int:
        return os.stat(path).st_dev

    def for_path(self, path: str | os.PathLike) -> Throttle:
        device = self.device_of(path)
        with self._lock:
            throttle = self._by_device.get(device)
            if throttle is None:
                throttle = self._by_device[device] = Throttle(self._rate, **self._kwargs)
            return throttle

    def set_rate(self, bytes_per_second: float) -> None:
        with self._lock:
            self._rate = bytes_per_second
            for throttle in self._by_device.values():
                throttle.set_rate(bytes_per_second)

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(t.total_bytes for t in self._by_device.values())
