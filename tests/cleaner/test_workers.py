"""`cleaner.workers`: a real worker process, driven through its pipe protocol with the job functions of
`tests/cleaner/worker_jobs.py`: results and exceptions come back with their types (one whose constructor pickle
cannot call, rebuilt without it; one whose class pickle cannot name, as a `CleanerError` naming it); log records
are logged by the parent; the parent's I/O budget is charged for every byte the worker asks for; an abort of
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
    from tests.cleaner.worker_jobs import KeywordOnly

    with pytest.raises(KeywordOnly, match="x/y") as caught:
        worker.call(f"{JOBS}:fail_keyword_only", {})
    assert caught.value.b == "y"
    with pytest.raises(CleanerError, match="Local: made here"):
        worker.call(f"{JOBS}:fail_unpicklably", {})
    assert worker.call(f"{JOBS}:echo", {"value": 1})["value"] == 1  # still serving


def test_every_byte_the_worker_moves_is_charged_to_the_parents_budget(worker):
    throttle = Throttle(50_000_000)
    counted = []
    assert worker.call(f"{JOBS}:charge", {"sizes": [1000, 2000, 3000]}, throttle=throttle,
                       on_bytes=lambda n, d: counted.append((n, d))) == 6000
    assert throttle.total_bytes == 6000
    assert counted == [(1000, "read"), (2000, "read"), (3000, "read")]
    unlimited = Throttle(UNLIMITED)  # no budget: counted all the same (the daemon's /status), no answer waited for
    worker.call(f"{JOBS}:charge", {"sizes": [10, 20]}, throttle=unlimited)
    assert unlimited.total_bytes == 30


def test_a_budget_set_while_a_job_runs_applies_to_its_next_windows(worker):
    """SIGHUP sets `log.cleaner.io.max.bytes.per.second` on the parent's budget during a worker's round: the
    round's later windows wait for it (here: 1 kB/s for 100 windows of 1 kB, which only the abort ends)."""
    import threading

    throttle = Throttle(UNLIMITED)
    threading.Timer(0.3, throttle.set_rate, (1000,)).start()
    with pytest.raises(CleaningAbortedError):
        worker.call(f"{JOBS}:charge", {"sizes": [1000] * 100, "pause_s": 0.01}, throttle=throttle,
                    check_abort=_abort_after(2.0))
    assert 0 < throttle.total_bytes < 100_000


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


@pytest.mark.parametrize("kind", ["corrupt", "owned", "lock", "disk full"])
def test_the_errors_the_pool_tells_apart_come_back_with_their_type_message_and_attributes(worker, kind):
    """Most of `segments`' errors take keyword-only arguments, which pickle cannot pass again: they are rebuilt
    from their class, arguments and attributes, so the daemon's `except` clauses see what a thread would."""
    import errno

    from segments.codec.errors import CorruptRecordError, LockTimeoutError, LogDirOwnedError

    with pytest.raises(Exception) as caught:
        worker.call(f"{JOBS}:fail_with", {"kind": kind})
    exc = caught.value
    if kind == "corrupt":
        assert type(exc) is CorruptRecordError and exc.position == 4096 and "CRC mismatch" in str(exc)
    elif kind == "owned":
        assert type(exc) is LogDirOwnedError and "a Kafka broker" in str(exc)
    elif kind == "lock":
        assert type(exc) is LockTimeoutError and str(exc) == "/logs/t-0/.cleaner.lock: held by another process"
    else:
        assert type(exc) is OSError and exc.errno == errno.ENOSPC and exc.filename.endswith(".cleaned")


def test_a_workers_log_records_are_logged_by_the_parent_as_the_calling_threads(worker, caplog):
    import logging
    import threading

    caplog.set_level(logging.INFO)
    assert worker.call(f"{JOBS}:log_something", {"message": "hello"})
    records = [r for r in caplog.records if r.name == "cleaner.round"]
    assert [r.getMessage() for r in records] == ["round says hello", "with its traceback"]
    assert all(r.threadName == threading.current_thread().name for r in records)
    assert "ValueError: inner" in records[1].exc_text
    assert records[0].process == worker.pid


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_worker_alone_aborts_its_job_ends_it_and_says_so(worker, signame, capfd):
    """systemd stopping the unit's cgroup, an operator's `kill`: the worker's job aborts as at the parent's abort,
    naming the signal, without a traceback; the worker exits, and the parent knows it at once (so the next job
    goes to a new worker, not to one that is ending)."""
    import os
    import signal
    import threading

    threading.Timer(0.5, os.kill, (worker.pid, getattr(signal, signame))).start()
    with pytest.raises(CleaningAbortedError, match=f"the worker process {worker.pid} was sent {signame}"):
        worker.call(f"{JOBS}:spin_until_aborted", {"limit_s": HANG_GUARD_S})
    assert worker.ended_by == signame and not worker.alive()
    assert worker._proc.returncode == 0
    assert "Traceback" not in capfd.readouterr().err


def test_a_worker_signalled_between_jobs_is_known_to_be_ending(worker):
    import os
    import signal

    assert worker.call(f"{JOBS}:echo", {"value": 1})["value"] == 1
    os.kill(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + HANG_GUARD_S
    while worker.alive():
        assert time.monotonic() < deadline, "the parent never saw the worker end"
        time.sleep(0.01)
    assert worker.ended_by == "SIGTERM"


def test_a_worker_that_does_not_stop_at_an_abort_is_killed(worker):
    """SIGSTOPped, or stuck in the kernel: the parent does not wait for it beyond the bound (10 s; the daemon
    makes it shorter than its shutdown deadline)."""
    import os
    import signal

    worker.abort_wait_s = 0.5
    assert worker.call(f"{JOBS}:echo", {"value": 1})  # started and serving
    os.kill(worker.pid, signal.SIGSTOP)
    with pytest.raises(CleaningAbortedError, match="did not stop within"):
        worker.call(f"{JOBS}:spin_until_aborted", {"limit_s": HANG_GUARD_S}, check_abort=_abort_after(0.1))
    assert not worker.alive()


# A fork is made only by a single-threaded process: this script is one (pytest's own process may not be).
_FORKING_PARENT = """
import fcntl, json, os, signal, sys, threading
from cleaner.workers import WorkerDiedError, WorkerProcess

ECHO = "tests.cleaner.worker_jobs:echo"
cmdline = lambda pid: open(f"/proc/{pid}/cmdline", "rb").read()
sys.stdout.write("written-before-the-fork;")  # stdout is a pipe: this stays in the buffer until flushed
held = open(sys.argv[1], "w")
fcntl.flock(held, fcntl.LOCK_EX)
worker = WorkerProcess(fork=True)
got = worker.call(ECHO, {"value": 7})  # the worker has started
held.close()  # the parent's lock ends here, though the worker inherited its descriptor...
again = open(sys.argv[1], "w")
fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ...or this raises
out = {"forked": worker.forked, "value": got["value"], "job_pid": got["pid"], "worker": worker.pid,
       "parent": os.getpid(), "worker_pgid": os.getpgid(worker.pid), "same_cmdline": cmdline(worker.pid) == cmdline(os.getpid())}
worker.close()
out["exit"] = worker._proc.returncode
killed = WorkerProcess(fork=True)
os.kill(killed.pid, signal.SIGKILL)
try:
    killed.call(ECHO, {"value": 1})
except WorkerDiedError as exc:
    out["killed"] = str(exc)
release = threading.Event()
thread = threading.Thread(target=release.wait)
thread.start()
exec_d = WorkerProcess(fork=True)  # a thread runs: a new interpreter instead
out["forked_beside_a_thread"] = exec_d.forked
out["exec_d_value"] = exec_d.call(ECHO, {"value": 3})["value"]  # first: a worker that answers has exec'd
out["exec_d_cmdline"] = cmdline(exec_d.pid).split(b"\\0")[1:3] == [b"-m", b"cleaner.workers"]
exec_d.close()
release.set()
thread.join()
sys.stdout.write(json.dumps(out))
"""


def test_a_single_threaded_parent_forks_its_worker_which_keeps_none_of_its_files_or_output(tmp_path):
    """`logcleaner clean` forks its workers before it starts a thread (ready at once, its modules imported): the
    fork must serve jobs, die as an exec'd worker dies, hold no lock the parent closed, write nothing of the
    parent's buffered output again, and be made only while the parent has no other thread."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", _FORKING_PARENT, str(tmp_path / "lock")], cwd=root,
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert run.returncode == 0, run.stderr
    before, _, report = run.stdout.partition(";")
    assert before == "written-before-the-fork" and "written-before-the-fork" not in report  # once, not twice
    out = json.loads(report)
    assert out["forked"] and out["same_cmdline"]
    assert out["value"] == 7 and out["job_pid"] == out["worker"] != out["parent"]
    assert out["worker_pgid"] == out["worker"]  # a process group of its own: a terminal's Ctrl-C is the parent's
    assert out["exit"] == 0
    assert "was ended by SIGKILL" in out["killed"]
    assert not out["forked_beside_a_thread"] and out["exec_d_cmdline"] and out["exec_d_value"] == 3
