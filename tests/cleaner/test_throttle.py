"""The I/O budget (`cleaner.throttle`) on simulated time: charges paid before the I/O, one budget shared by
threads in arrival order, idle time banked for one window only, rate changes and aborts while waiting, the
per-device budgets and the rate the metrics show. No real sleeps: one thread runs on a fake clock that moves
when it sleeps; several real threads run on `VirtualTime`, which moves only when all of them wait."""

from __future__ import annotations

import heapq
import math
import threading

import pytest

from cleaner.throttle import SLEEP_SLICE_S, UNLIMITED, WINDOW_S, DeviceThrottles, Throttle, device_label


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


class VirtualTime:
    """Simulated time shared by real threads: it stands still while any worker runs and, once every worker
    sleeps (or has finished), jumps to the earliest wake-up. Deterministic whatever the machine's speed."""

    def __init__(self, workers: int, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self._cond = threading.Condition()
        self._running = workers
        self._wakeups: list[float] = []

    def clock(self) -> float:
        with self._cond:
            return self.now_s

    def sleep(self, seconds: float) -> None:
        with self._cond:
            wake = self.now_s + seconds
            heapq.heappush(self._wakeups, wake)
            self._running -= 1
            self._advance_if_all_wait()
            while self.now_s < wake:
                assert self._cond.wait(timeout=60), "the simulation is stuck"

    def finished(self) -> None:
        with self._cond:
            self._running -= 1
            self._advance_if_all_wait()

    def _advance_if_all_wait(self) -> None:
        if self._running > 0 or not self._wakeups:
            return
        self.now_s = max(self.now_s, heapq.heappop(self._wakeups))
        woken = 1
        while self._wakeups and self._wakeups[0] <= self.now_s:
            heapq.heappop(self._wakeups)
            woken += 1
        self._running += woken  # counted here, so a woken thread that sleeps again cannot move time early
        self._cond.notify_all()


def make(rate: float, fake: FakeTime, **kwargs) -> Throttle:
    return Throttle(rate, clock=fake.clock, sleep=fake.sleep, **kwargs)


def max_over_any_interval(admitted: list[tuple[float, int]], rate: float) -> float:
    """The largest excess, over all intervals between two admissions, of the bytes admitted in it over
    rate × its length (what the budget allows beyond its rate: at most one window banked)."""
    admitted = sorted(admitted)
    worst = 0.0
    for i, (t_start, _) in enumerate(admitted):
        total = 0
        for t_end, n in admitted[i:]:
            total += n
            worst = max(worst, total - rate * (t_end - t_start))
    return worst


# ---- one thread on a fake clock ------------------------------------------------------------------------


def test_io_below_the_budget_never_waits():
    fake = FakeTime()
    throttle = make(1000, fake)
    for _ in range(20):
        fake.advance(0.5)
        assert throttle.acquire(250) == 0.0  # 500 B/s against 1000, each charge within the window banked
    assert fake.sleeps == []
    assert throttle.total_bytes == 20 * 250


def test_a_charge_is_paid_before_it_returns_so_the_io_after_it_is_within_the_budget():
    fake = FakeTime()
    throttle = make(1000, fake)
    bank = 1000 * WINDOW_S
    assert throttle.acquire(int(bank)) == 0.0  # the one window a new budget starts with
    start = fake.now_s
    waited = throttle.acquire(1000)  # nothing banked any more: one second's budget takes one second
    assert waited == pytest.approx(1.0)
    assert fake.now_s - start == pytest.approx(1.0)
    assert throttle.total_sleep_s == pytest.approx(1.0)


def test_idle_time_is_banked_for_one_window_only():
    fake = FakeTime()
    throttle = make(1000, fake)
    throttle.acquire(300)
    fake.advance(100.0)  # 100 s idle: still only one window (300 bytes) may go at once
    assert throttle.acquire(int(1000 * WINDOW_S)) == 0.0
    assert throttle.acquire(100) == pytest.approx(0.1)


def test_a_fast_worker_is_held_to_the_budget_over_a_long_run_and_over_every_interval():
    fake = FakeTime()
    throttle = make(100_000, fake)
    start = fake.now_s
    admitted = []
    while fake.now_s - start < 60:
        fake.advance(0.01)  # the I/O itself: 10 kB in 10 ms, 1 MB/s unthrottled
        throttle.acquire(10_000)
        admitted.append((fake.now_s, 10_000))
    moved = sum(n for _, n in admitted)
    assert moved / (fake.now_s - start) <= 100_000 * (1 + WINDOW_S / 60) + 1
    assert max_over_any_interval(admitted, 100_000) <= 100_000 * WINDOW_S + 10_000  # one window, one chunk


def test_a_long_wait_is_slept_in_slices():
    fake = FakeTime()
    throttle = make(1000, fake)
    waited = throttle.acquire(10_300)  # 10 s owed beyond the bank
    assert waited == pytest.approx(10.0)
    assert max(fake.sleeps) <= SLEEP_SLICE_S + 1e-9
    assert sum(fake.sleeps) == pytest.approx(10.0)


def test_the_abort_check_is_called_while_waiting_and_ends_the_wait():
    fake = FakeTime()
    throttle = make(1000, fake)

    class Aborted(Exception):
        pass

    calls = []

    def check_abort():
        calls.append(fake.now_s)
        if len(calls) == 3:
            raise Aborted

    with pytest.raises(Aborted):
        throttle.acquire(100_300, check_abort=check_abort)  # 100 s owed
    assert len(fake.sleeps) == 3 and sum(fake.sleeps) == pytest.approx(3 * SLEEP_SLICE_S)


def test_a_sleep_that_reports_stopping_ends_the_wait_at_once():
    fake = FakeTime()
    slept = []

    def stopping_sleep(seconds: float) -> bool:
        slept.append(seconds)
        return True  # the pool is stopping: Event.wait returned at once

    throttle = Throttle(1000, clock=fake.clock, sleep=stopping_sleep)
    assert throttle.acquire(100_300) == 0.0
    assert len(slept) == 1


def test_a_rate_change_reaches_a_thread_already_waiting():
    fake = FakeTime()
    throttle = make(1000, fake)
    throttle.acquire(300)

    def sleep_then_reload(seconds: float) -> None:
        fake.sleep(seconds)
        if len(fake.sleeps) == 2:
            throttle.set_rate(1_000_000)  # SIGHUP with a budget 1000 times larger

    throttle._sleep = sleep_then_reload
    waited = throttle.acquire(10_000)  # 10 s at the old rate
    assert waited == pytest.approx(2 * SLEEP_SLICE_S + (10_000 - 2 * SLEEP_SLICE_S * 1000) / 1_000_000)
    assert throttle.bytes_per_second == 1_000_000


def test_set_rate_to_unlimited_releases_a_waiting_thread():
    fake = FakeTime()
    throttle = make(1000, fake)
    throttle.acquire(300)

    def sleep_then_unlimit(seconds: float) -> None:
        fake.sleep(seconds)
        throttle.set_rate(UNLIMITED)

    throttle._sleep = sleep_then_unlimit
    assert throttle.acquire(1_000_000) == pytest.approx(SLEEP_SLICE_S)


def test_from_unlimited_to_a_budget_starts_with_one_window_banked():
    fake = FakeTime()
    throttle = make(UNLIMITED, fake)
    assert throttle.acquire(10**12) == 0.0
    throttle.set_rate(1000)
    assert throttle.acquire(300) == 0.0
    assert throttle.acquire(1000) == pytest.approx(1.0)


def test_an_unlimited_budget_never_waits_but_still_counts_bytes():
    fake = FakeTime()
    throttle = make(UNLIMITED, fake)
    for _ in range(10):
        fake.advance(1.0)
        assert throttle.acquire(10**15) == 0.0
    assert fake.sleeps == [] and throttle.total_bytes == 10 * 10**15
    assert throttle.utilization() == 0.0


@pytest.mark.parametrize("rate", [0, -1, math.nan])
def test_a_budget_that_is_not_positive_is_rejected(rate):
    fake = FakeTime()
    with pytest.raises(ValueError, match="throttle rate must be > 0"):
        make(rate, fake)
    throttle = make(1000, fake)
    with pytest.raises(ValueError, match="throttle rate must be > 0"):
        throttle.set_rate(rate)
    assert throttle.bytes_per_second == 1000  # the running rate is kept
    with pytest.raises(ValueError, match="throttle rate must be > 0"):
        DeviceThrottles(rate)


def test_the_rate_the_metrics_show_is_what_went_through_over_the_last_seconds():
    fake = FakeTime()
    throttle = make(1000, fake)
    start = fake.now_s
    while fake.now_s - start < 30:
        fake.advance(0.01)
        throttle.acquire(100)  # 10 kB/s wanted against 1 kB/s
    assert throttle.recent_bytes_per_second() == pytest.approx(1000, rel=0.05)
    assert throttle.utilization() == pytest.approx(1.0, rel=0.05)
    fake.advance(30)
    assert throttle.recent_bytes_per_second() == 0.0


# ---- several real threads on virtual time --------------------------------------------------------------


def _charge_from_threads(throttle: Throttle, vt: VirtualTime, *, threads: int, chunks: int, chunk_bytes: int):
    """Each thread charges `chunks` chunks back to back; returns per thread the (time, bytes) admitted."""
    admitted: list[list[tuple[float, int]]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(chunks):
                throttle.acquire(chunk_bytes)
                admitted[i].append((vt.clock(), chunk_bytes))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
        finally:
            vt.finished()

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in workers), "a worker hung"
    assert not errors, errors
    return admitted


@pytest.mark.parametrize("threads", [2, 4])
def test_threads_share_one_budget_charged_before_each_chunk(threads):
    vt = VirtualTime(threads)
    rate = 1_000_000
    throttle = Throttle(rate, clock=vt.clock, sleep=vt.sleep)
    start = vt.clock()
    admitted = _charge_from_threads(throttle, vt, threads=threads, chunks=40, chunk_bytes=100_000)
    everything = [a for per_thread in admitted for a in per_thread]
    total = sum(n for _, n in everything)
    assert total == threads * 40 * 100_000 == throttle.total_bytes
    # together, not each: the whole run takes the time of all the bytes at one budget, less one window
    assert vt.clock() - start >= (total - rate * WINDOW_S) / rate - 1e-6
    assert max_over_any_interval(everything, rate) <= rate * WINDOW_S + 1
    # and they take turns: no thread is done before every other one has started
    first_done = min(max(t for t, _ in per_thread) for per_thread in admitted)
    last_started = max(min(t for t, _ in per_thread) for per_thread in admitted)
    assert last_started < first_done


def test_a_thread_that_waits_does_not_let_another_one_run_free():
    # The bug this replaces: one thread slept off the whole debt while the others' checks saw a period that
    # had not started yet and let them through unthrottled.
    vt = VirtualTime(2)
    rate = 1_000_000
    throttle = Throttle(rate, clock=vt.clock, sleep=vt.sleep)
    admitted = _charge_from_threads(throttle, vt, threads=2, chunks=100, chunk_bytes=50_000)
    for per_thread in admitted:
        assert max_over_any_interval(per_thread, rate) <= rate * WINDOW_S + 1


def test_threads_sharing_an_unlimited_budget_count_every_byte():
    fake = FakeTime()
    throttle = make(UNLIMITED, fake)
    threads = [threading.Thread(target=lambda: [throttle.acquire(3) for _ in range(5000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert throttle.total_bytes == 4 * 5000 * 3


# ---- per-device budgets --------------------------------------------------------------------------------


def test_log_dirs_on_one_device_share_one_budget_and_other_devices_get_their_own():
    fake = FakeTime()
    throttles = DeviceThrottles(1000, clock=fake.clock, sleep=fake.sleep)
    devices = {"/a": 1, "/b": 1, "/c": 2}
    throttles.device_of = devices.__getitem__
    assert throttles.for_path("/a") is throttles.for_path("/b")
    assert throttles.for_path("/c") is not throttles.for_path("/a")
    assert throttles.for_path("/a").acquire(1300) == pytest.approx(1.0)
    assert throttles.for_path("/b").acquire(500) == pytest.approx(0.5)  # /b is on /a's device: it pays too
    assert throttles.for_path("/c").acquire(300) == 0.0  # the other device's budget is untouched
    assert throttles.total_bytes == 2100
    assert set(throttles.by_device()) == {1, 2}


def test_set_rate_reaches_existing_and_future_device_budgets():
    fake = FakeTime()
    throttles = DeviceThrottles(1000, clock=fake.clock, sleep=fake.sleep)
    throttles.device_of = {"/a": 1, "/c": 2}.__getitem__
    first = throttles.for_path("/a")
    throttles.set_rate(5000)
    assert first.bytes_per_second == 5000 == throttles.bytes_per_second
    assert throttles.for_path("/c").bytes_per_second == 5000


def test_device_of_is_the_st_dev_of_the_path_and_its_label_is_major_minor(tmp_path):
    device = DeviceThrottles.device_of(tmp_path)
    assert device == tmp_path.stat().st_dev
    assert device_label(device) == f"{(device >> 8) & 0xfff}:{(device & 0xff) | ((device >> 12) & 0xfff00)}"
