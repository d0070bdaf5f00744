"""`cleaner.workers`: a real worker process, driven through its pipe protocol with the job functions of
`tests/cleaner/worker_jobs.py`: results and exceptions come back (an exception pickle cannot rebuild, as a
`CleanerError` naming it); the parent's I/O budget is charged for every byte the worker asks for; an abort of
the parent's stops the job, whether it runs or waits for the budget, and not the next one; a worker killed
mid-job is reported as such; a worker whose parent goes exits; `close` waits for its remover. No assertion on
time: the deadlines are hang guards."""

from __future__ import annotations

import time

import pytest

from cleaner.errors import CleanerError
from cleaner.round import CleaningAbortedError
from cleaner.throttle import UNLIMITED, Throttle
from cleaner.workers import WORKERS_VARIABLE, WorkerDiedError, WorkerProcess, use_processes
from segments.codec.errors import LogStateError

JOBS = "tests.cleaner.worker_jobs"
HANG_GUARD_S = 30.0


@pytest.fixture
def worker():
    w = WorkerProcess()
    yield w
    w.kill()


def test_a_job_runs_in_the_worker_and_returns_its_value(worker):
    import os

    got = worker.call(f"{JOBS}:echo", {"value": [1, "two"]})
    assert got["value"] == [1, "two"]
    assert got["pid"] == worker.pid != os.getpid()
    assert worker.call(f"{JOBS}:echo", {"value": 3})["pid"] == worker.pid  # one process, job after job


def test_a_jobs_exception_is_raised_in_the_parent_with_its_type(worker):
    with pytest.raises(LogStateError, match="damaged at byte 7"):
        worker.call(f"{JOBS}:fail_with_log_state", {"message": "damaged at byte 7"})
    with pytest.raises(CleanerError, match="_Unpicklable: x/y"):
        worker.call(f"{JOBS}:fail_unpicklably", {})
    assert worker.call(f"{JOBS}:echo", {"value": 1})["value"] == 1  # still serving


def test_every_byte_the_worker_moves_is_charged_to_the_parents_budget(worker):
    throttle = Throttle(50_000_000)
    counted = []
    assert worker.call(f"{JOBS}:charge", {"sizes": [1000, 2000, 3000]}, throttle=throttle,
                       on_bytes=lambda n, d: counted.append((n, d))) == 6000
    assert throttle.total_bytes == 6000
    assert counted == [(1000, "read"), (2000, "read"), (3000, "read")]
    unlimited = Throttle(UNLIMITED)  # no budget: no round trip, nothing charged here
    worker.call(f"{JOBS}:charge", {"sizes": [10]}, throttle=unlimited)
    assert unlimited.total_bytes == 0


def _abort_after(seconds: float):
    deadline = time.monotonic() + seconds

    def check_abort() -> None:
        if time.monotonic() > deadline:
            raise CleaningAbortedError("stopping")
    return check_abort


def test_the_parents_abort_stops_a_running_job_and_not_the_next(worker):
    with pytest.raises(CleaningAbortedError):
        worker.call(f"{JOBS}:spin_until_aborted", {"limit_s": HANG_GUARD_S}, check_abort=_abort_after(0.2))
    assert worker.call(f"{JOBS}:spin_until_aborted", {"limit_s": 0.3}) == "not aborted"


def test_the_parents_abort_stops_a_job_waiting_for_the_budget(worker):
    throttle = Throttle(1000)  # 10 MB would take hours
    t = time.monotonic()
    with pytest.raises(CleaningAbortedError):
        worker.call(f"{JOBS}:charge", {"sizes": [300, 10_000_000]}, throttle=throttle, check_abort=_abort_after(0.3))
    assert time.monotonic() - t < HANG_GUARD_S


def test_a_worker_killed_mid_job_is_reported_and_not_alive(worker):
    with pytest.raises(WorkerDiedError, match=f"the worker process {worker.pid} was ended by SIGKILL"):
        worker.call(f"{JOBS}:die", {})
    assert not worker.alive()
    with pytest.raises(WorkerDiedError):
        worker.call(f"{JOBS}:echo", {"value": 1})


def test_a_worker_exits_when_its_parent_goes():
    worker = WorkerProcess()
    worker._close_pipes()  # what the parent's death does to the worker's end
    assert worker._proc.wait(timeout=HANG_GUARD_S) == 0


def test_close_waits_for_the_workers_remover(tmp_path, worker):
    doomed = tmp_path / "00000000000000000000.log.deleted"
    doomed.write_bytes(b"x" * 1000)
    assert worker.call(f"{JOBS}:remove_later", {"path": str(doomed)})
    worker.close(timeout_s=HANG_GUARD_S)
    assert not doomed.exists()
    assert worker._proc.returncode == 0


def test_logcleaner_workers_threads_keeps_the_threads_in_process(monkeypatch, capsys):
    monkeypatch.delenv(WORKERS_VARIABLE, raising=False)
    assert use_processes()
    monkeypatch.setenv(WORKERS_VARIABLE, "Threads")
    assert not use_processes()
    monkeypatch.setenv(WORKERS_VARIABLE, "forks")
    assert use_processes()
    assert "LOGCLEANER_WORKERS='forks' is neither 'processes' nor 'threads'; using processes" in capsys.readouterr().err
