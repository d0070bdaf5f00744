"""The I/O throttle (`cleaner.throttle`) on a simulated clock: its rate arithmetic, rate changes, the
unlimited budget, the sleep cap, and the per-device budgets. No real sleeps."""

from __future__ import annotations

import math
import threading

import pytest

from cleaner.throttle import CHECK_INTERVAL_S, SLEEP_S_MAX, UNLIMITED, DeviceThrottles, Throttle


class FakeTime:
    """A clock that only moves when the code under test sleeps or the test says so."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now_s += seconds

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def make(rate: float, fake: FakeTime, **kwargs) -> Throttle:
    return Throttle(rate, clock=fake.clock, sleep=fake.sleep, **kwargs)


def run_worker(throttle: Throttle, fake: FakeTime, *, chunk_bytes: int, chunk_s: float, duration_s: float) -> float:
    """A thread that would move `chunk_bytes` every `chunk_s` unthrottled, for `duration_s` of simulated
    time; returns the bytes it moved."""
    moved = 0
    end = fake.now_s + duration_s
    while fake.now_s < end:
        fake.advance(chunk_s)
        throttle.acquire(chunk_bytes)
        moved += chunk_bytes
    return moved


def test_io_below_the_budget_never_sleeps():
    fake = FakeTime()
    throttle = make(1000, fake)
    for _ in range(20):
        fake.advance(0.5)
        assert throttle.acquire(400) == 0.0  # 800 B/s against 1000
    assert fake.sleeps == []
    assert throttle.total_bytes == 20 * 400


def test_no_check_happens_before_the_check_interval_has_passed():
    fake = FakeTime()
    throttle = make(1000, fake)
    fake.advance(CHECK_INTERVAL_S / 2)
    assert throttle.acquire(1_000_000) == 0.0
    assert fake.sleeps == [] and throttle.total_bytes == 1_000_000


def test_sleep_brings_the_interval_average_down_to_the_budget():
    fake = FakeTime()
    throttle = make(1000, fake)
    start = fake.now_s
    fake.advance(0.4)
    slept = throttle.acquire(1000)  # one second's budget in 0.4 s
    assert slept == pytest.approx(0.6)
    assert fake.sleeps == [pytest.approx(0.6)]
    assert 1000 / (fake.now_s - start) == pytest.approx(1000)
    assert throttle.total_sleep_s == pytest.approx(0.6)


def test_a_fast_worker_is_held_to_the_budget_over_a_long_run():
    fake = FakeTime()
    throttle = make(100_000, fake)
    start = fake.now_s
    moved = run_worker(throttle, fake, chunk_bytes=10_000, chunk_s=0.01, duration_s=60)  # 1 MB/s unthrottled
    rate = moved / (fake.now_s - start)
    assert rate == pytest.approx(100_000, rel=0.02)
    assert max(fake.sleeps) < SLEEP_S_MAX


def test_set_rate_takes_effect_at_the_next_check():
    fake = FakeTime()
    throttle = make(1000, fake)
    fake.advance(0.5)
    throttle.acquire(1000)
    assert fake.sleeps == [pytest.approx(0.5)]
    throttle.set_rate(4000)
    assert throttle.bytes_per_second == 4000
    fake.advance(0.5)
    assert throttle.acquire(4000) == pytest.approx(0.5)  # 4000 bytes at 4000 B/s take 1 s
    throttle.set_rate(UNLIMITED)
    fake.advance(0.5)
    assert throttle.acquire(10**12) == 0.0


def test_an_unlimited_budget_never_sleeps_but_still_counts_bytes():
    fake = FakeTime()
    throttle = make(UNLIMITED, fake)
    for _ in range(10):
        fake.advance(1.0)
        assert throttle.acquire(10**15) == 0.0
    assert fake.sleeps == [] and throttle.total_bytes == 10 * 10**15


@pytest.mark.parametrize("rate", [0, -1, math.nan])
def test_a_budget_that_is_not_positive_is_rejected(rate):
    fake = FakeTime()
    with pytest.raises(ValueError, match="throttle rate must be > 0"):
        make(rate, fake)
    throttle = make(1000, fake)
    with pytest.raises(ValueError, match="throttle rate must be > 0"):
        throttle.set_rate(rate)
    assert throttle.bytes_per_second == 1000  # the running rate is kept


def test_one_sleep_never_exceeds_the_cap():
    fake = FakeTime()
    throttle = make(1000, fake)
    fake.advance(0.4)
    assert throttle.acquire(1_000_000) == SLEEP_S_MAX  # 1000 s owed


def test_a_burst_larger_than_the_sleep_cap_is_paid_off_by_later_sleeps():
    fake = FakeTime()
    throttle = make(1000, fake)
    start = fake.now_s
    fake.advance(0.4)
    throttle.acquire(100_000)  # 100 s of budget at once
    moved = 100_000 + run_worker(throttle, fake, chunk_bytes=100, chunk_s=0.01, duration_s=200)
    assert moved / (fake.now_s - start) <= 1000 * 1.1


def test_throttle_is_safe_to_share_between_threads():
    fake = FakeTime()
    throttle = make(UNLIMITED, fake)
    threads = [threading.Thread(target=lambda: [throttle.acquire(3) for _ in range(5000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert throttle.total_bytes == 4 * 5000 * 3


# ---- per-device budgets --------------------------------------------------------------------------------


def test_log_dirs_on_one_device_share_one_budget_and_other_devices_get_their_own(tmp_path):
    fake = FakeTime()
    throttles = DeviceThrottles(1000, clock=fake.clock, sleep=fake.sleep)
    devices = {"/a": 1, "/b": 1, "/c": 2}
    throttles.device_of = devices.__getitem__
    assert throttles.for_path("/a") is throttles.for_path("/b")
    assert throttles.for_path("/c") is not throttles.for_path("/a")
    fake.advance(0.5)
    assert throttles.for_path("/a").acquire(1000) == pytest.approx(0.5)
    assert throttles.for_path("/c").acquire(500) == 0.0  # the other device's budget is untouched
    assert throttles.total_bytes == 1500


def test_set_rate_reaches_existing_and_future_device_budgets():
    fake = FakeTime()
    throttles = DeviceThrottles(1000, clock=fake.clock, sleep=fake.sleep)
    throttles.device_of = {"/a": 1, "/c": 2}.__getitem__
    first = throttles.for_path("/a")
    throttles.set_rate(5000)
    assert first.bytes_per_second == 5000
    assert throttles.for_path("/c").bytes_per_second == 5000


def test_device_of_is_the_st_dev_of_the_path(tmp_path):
    assert DeviceThrottles.device_of(tmp_path) == tmp_path.stat().st_dev
