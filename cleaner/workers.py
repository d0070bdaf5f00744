"""Worker processes: a cleaner thread's partition work done in a process of its own, one core each, no shared GIL.

Owns the parent's handle on a worker (`WorkerProcess`), the worker's side (`serve`, run as
`python -m cleaner.workers IN_FD OUT_FD`), and the one protocol between them. Why processes: a round holds the
GIL for 14-22% of its wall time between its compiled kernels, and threads of one process hand it to each other;
two processes cleaning two partitions are measured faster than two threads (docs/design.md, "Threads and the
GIL"; bench/RESULTS.md). What a worker runs is a job function named `module:function`, called with a
`WorkerContext` and the job's keyword arguments (its home is the caller's module: `cleaner.oneshot` for
`logcleaner clean`). The rest is unchanged: the worker opens and locks the partition itself (the locks are file
locks, so they hold between processes as between threads) and swaps as any cleaner does.

The protocol: pickled tuples over two pipes.
* parent → worker: `("call", job, "module:function", kwargs, throttled, waits, log level)`;
  `("granted", request, ok)`; `("wait",)`; `("abort", job)`; `("exit",)`.
* worker → parent: `("acquire", request, n_bytes)` — the I/O budget stays the parent's (one `Throttle` per
  device, shared by every worker and thread): the worker asks before each read and write and waits for the
  answer, and a refusal (the parent is stopping) aborts its round; while the budget is unlimited it only tells
  (`("charge", n_bytes)`, counted by the budget for /status and the metrics, ~0.1 ms a round trip saved per
  window) until the parent says `("wait",)`: a budget set meanwhile (SIGHUP) applies from the next window; `("bytes", n, direction)` for the caller's progress; `("log", record)`;
  `("result", value)`; `("raise", exception)`; `("ending", signal name)`: a SIGTERM or SIGINT of the worker's
  own (not the parent's abort) ends it after its job, which aborts: the parent then waits for it to exit, so the
  next partition goes to a new worker, and the aborted partition is not taken for the parent's own abort.
* The parent's abort check runs while it waits; when it raises, the worker is told, and its round stops at its
  next window boundary (removing its `.cleaned` files) with `CleaningAbortedError`, re-raised in the parent.
* A worker runs in a process group of its own, so a terminal's Ctrl-C or a `kill -TERM -PGID` reaches only the
  parent, which decides; a SIGTERM sent to the worker itself (systemd stopping a whole cgroup) aborts its job
  as the parent's abort does, and it exits. It stops its job and exits when its parent goes (the pipe's end).
  A worker that does not stop within `_ABORT_WAIT_S` of an abort (SIGSTOP, a hung disk) is killed. A worker that
  dies mid-job (a signal, the OOM killer) fails that job with `WorkerDiedError`, naming how it ended; the caller
  then opens the partition (`recover_partition`), which removes what the round left, as after any crash.
* `("exit",)`: the worker removes the old segments its swaps left to its background remover, then exits; the
  parent's `close` waits for that, so a command returns with no `.deleted` file left.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import itertools
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import import_module
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from offsetmap import OffsetMap
from segments.codec.errors import SegmentError
from segments.files.fileio import BackgroundRemover
from segments.files.readahead import WindowRing
from segments.partition.log import LogConfig, PartitionLog

from .errors import CleanerError
from .round import CleaningAbortedError
from .settings import CleanerSettings
from .survey import WINDOW_BYTES, SurveyMemo
from .throttle import UNLIMITED, Throttle

log = logging.getLogger(__name__)

__all__ = ["WORKERS_VARIABLE", "WorkerContext", "WorkerDiedError", "WorkerProcess", "recover_partition", "serve",
           "use_processes"]

# `processes` (the default) or `threads`: how `logcleaner clean` and the daemon run their threads past the first
WORKERS_VARIABLE = "LOGCLEANER_WORKERS"

_POLL_S = 0.05  # the parent checks its abort this often while it waits on a worker
_GRANT_WAIT_S = 0.1  # a worker waiting for the budget checks its own abort this often
_EXIT_WAIT_S = 600.0  # a worker removing its old segments at exit: bounded, then killed
_ABORT_WAIT_S = 10.0  # a worker told to abort stops at its next window boundary; one that does not is killed
_RECOVER_LOCK_WAIT_S = 1.0  # recovery after a worker's death: its own locks are gone, another's is not waited out
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the directory holding cleaner/, for the worker's imports


class WorkerDiedError(CleanerError):
    """A worker process ended in the middle of a job."""


_warned: set[str] = set()  # the unknown LOGCLEANER_WORKERS values already warned about


def use_processes() -> bool:
    """Whether a caller with several cleaner threads gives each its own worker process: unless
    `LOGCLEANER_WORKERS=threads` (the in-process threads, for comparison, or where a process may not start
    another); any other value than `threads` or `processes` is warned about once and means processes."""
    value = os.environ.get(WORKERS_VARIABLE, "").strip().lower() or "processes"
    if value not in ("processes", "threads") and value not in _warned:
        _warned.add(value)
        print(f"warning: {WORKERS_VARIABLE}={value!r} is neither 'processes' nor 'threads'; using processes",
              file=sys.stderr)
    return value != "threads"



def _describe_end(returncode: int | None, pid: int) -> str:
    if returncode is None:
        return f"the worker process {pid} closed its pipe"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the worker process {pid} was ended by {name}"
    return f"the worker process {pid} exited with code {returncode}"


def recover_partition(directory: Path, config: LogConfig) -> str | None:
    """After a worker died (or was killed) cleaning `directory`: open it as its cleaner does, with its topic's
    `config`, which finishes or undoes what the worker left (a swap's renames, an unfinished round's `.cleaned`
    files), and close it; the partition is then as the round found it, or as the swap made it. None, or why it
    could not be opened (the next open recovers it then). It waits at most `_RECOVER_LOCK_WAIT_S` for the
    partition's lock: a dead worker's locks ended with it, so a lock still held is another process's (the worker
    was waiting for it), which left nothing of the worker's to recover."""
    try:
        with PartitionLog.open(directory, mode="cleaner", config=config, lock_timeout_s=_RECOVER_LOCK_WAIT_S):
            return None
    except (SegmentError, OSError) as exc:
        return str(exc)


class _Forked:
    """The parent's handle on a forked worker: what `WorkerProcess` uses of `subprocess.Popen`'s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: taken as exit 0, as `subprocess.Popen` takes it
                self.returncode = 0
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        return code

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _fork_worker(in_fd: int, out_fd: int) -> _Forked:
    """A worker forked from this single-threaded process: `serve(in_fd, out_fd)` in the child, with every module
    this process imported already there (ready in milliseconds; a new interpreter's imports take 0.2-0.3 s,
    bench/RESULTS.md). The child first closes every descriptor it inherited but its pipe ends and 0-2 (so a lock
    this process holds ends when this process closes its file, not when the worker exits), reads and writes
    nothing of this process's stdin and stdout (/dev/null), lets no object of this process's be collected (an
    inherited file object's finaliser would close a descriptor number the child has reused), and ends with
    `os._exit`: nothing of this process's is flushed, finalised or run at exit twice."""
    for stream in (sys.stdout, sys.stderr):  # None when the descriptor was closed at start
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # the parent meets the error at its own next write
                stream.flush()
    stopping_signals = {signal.SIGTERM, signal.SIGINT}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, stopping_signals)  # none runs the parent's handler in the child
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return _Forked(pid)
    code = 1
    try:
        for signum in stopping_signals:  # as a new interpreter's, until `serve` sets the worker's
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        gc.freeze()
        os.setpgid(0, 0)  # as `process_group=0` does for an exec'd worker
        # The pipe ends above 2 first: one given descriptor 0 or 1 (its standard stream closed) would be cut below.
        in_fd, out_fd = (fcntl.fcntl(fd, fcntl.F_DUPFD, 3) if fd < 3 else fd for fd in (in_fd, out_fd))
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        low = 3
        for fd in sorted((in_fd, out_fd)):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))  # `null` and this process's pipe ends too
        serve(in_fd, out_fd)
        code = 0
    finally:
        try:
            if code and sys.stderr is not None:  # what an exec'd worker's interpreter would print
                traceback.print_exc()
                sys.stderr.flush()
        finally:
            os._exit(code)


class WorkerProcess:
    """A worker process and the parent's end of its pipes. One job at a time, from one parent thread.

    With `fork`, and this process single-threaded (`logcleaner clean` before its threads start), the worker is a
    fork of this process (`_fork_worker`); else, and always in the daemon, whose threads make a fork unsafe, a
    new interpreter running `python -m cleaner.workers`."""

    def __init__(self, *, fork: bool = False) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.forked = fork and threading.active_count() == 1
        try:
            self._proc: subprocess.Popen | _Forked
            if self.forked:
                self._proc = _fork_worker(to_child_r, from_child_w)
            else:
                env = dict(os.environ)
                env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "cleaner.workers", str(to_child_r), str(from_child_w)],
                    pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    env=env, process_group=0,  # a terminal's Ctrl-C, a `kill -PGID`: the parent's to decide
                )
        except BaseException:
            for fd in (to_child_w, from_child_r):
                os.close(fd)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._out = Connection(to_child_w, readable=False)
        self._in = Connection(from_child_r, writable=False)
        self._jobs = itertools.count(1)
        self.pid = self._proc.pid
        # how long an aborted job may take to stop before the worker is killed (a caller stopping within a
        # deadline of its own, the daemon's `shutdown_timeout_s`, makes it shorter)
        self.abort_wait_s = _ABORT_WAIT_S
        self.ended_by: str | None = None  # the signal of the worker's own that ends it ("ending")

    def alive(self) -> bool:
        """Whether the worker can take a job: running, and not ending (a signal it got between jobs)."""
        if self._in.closed:
            return False
        try:
            while self.ended_by is None and self._in.poll():  # between jobs only "ending" (and its log) comes
                self._between_jobs(self._in.recv())
        except (EOFError, OSError):
            self._close_pipes()
            return False
        if self.ended_by is not None:
            self._end_within(self.abort_wait_s)
            return False
        return self._proc.poll() is None

    def _between_jobs(self, message: tuple) -> None:
        if message[0] == "ending":
            self.ended_by = message[1]
        elif message[0] == "log":
            _emit(message[1])

    def _end_within(self, timeout_s: float) -> None:
        """Wait for the worker to exit (one told to exit, or that said it is ending), kill it past `timeout_s`, and
        close its pipes."""
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def _died(self) -> WorkerDiedError:
        try:
            returncode = self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            returncode = None
        self._close_pipes()
        return WorkerDiedError(_describe_end(returncode, self.pid))

    def _send(self, message: tuple) -> None:
        try:
            self._out.send(message)
        except OSError:  # the worker is gone; its end is reported by the next receive
            pass

    def call(self, function: str, kwargs: dict[str, Any], *, throttle: Throttle | None = None,
             on_bytes: Callable[[int, str], None] = lambda n, direction: None,
             check_abort: Callable[[], None] | None = None) -> Any:
        """Run `function` ("module:name") in the worker with `kwargs`; its return value, or its exception
        raised here. Every read and write of the job is charged to `throttle` (None: no budget); `on_bytes` is
        told what it moved; `check_abort`, called while waiting, stops the job when it
        raises (the job then ends with `CleaningAbortedError`). Raises `WorkerDiedError` if the worker ends."""
        if not self.alive():
            raise self._died()
        job = next(self._jobs)
        # Charged here even when unlimited: the budget counts every byte (the daemon's /status and metrics). While
        # it is unlimited the worker does not wait for the answer ("charge"); once a budget is set (SIGHUP) it is
        # told to, and asks before each window again ("acquire").
        waits = throttle is not None and not throttle.unlimited
        self._send(("call", job, function, kwargs, throttle is not None, waits,
                    logging.getLogger().getEffectiveLevel()))
        aborted = False
        aborting_since = 0.0

        def abort_job() -> None:
            nonlocal aborted
            if not aborted:
                aborted = True
                self._send(("abort", job))

        def abort_requested() -> bool:
            if not aborted and check_abort is not None:
                try:
                    check_abort()
                except CleanerError:  # the caller's abort (`CleaningAbortedError`, a pool's stop): the job ends with it
                    abort_job()
            return aborted

        def charge(n_bytes: int) -> bool:
            """Charge the caller's budget; False if the caller aborted (while waiting for it, or before)."""
            if abort_requested():
                return False
            try:
                if throttle is not None:
                    throttle.acquire(n_bytes, check_abort=check_abort)
                return True
            except CleanerError:  # the caller's abort, raised while waiting for the budget
                abort_job()
                return False

        while True:
            try:
                ready = self._in.poll(_POLL_S)
                message = self._in.recv() if ready else None
            except (EOFError, OSError):
                if self.ended_by is not None:  # it ended before it took the job
                    self._close_pipes()
                    raise WorkerDiedError(f"the worker process {self.pid} was sent {self.ended_by} and ended before "
                                          "it took the job") from None
                raise self._died() from None
            if message is None:
                if abort_requested():
                    aborting_since = aborting_since or time.monotonic()
                    if time.monotonic() - aborting_since > self.abort_wait_s:  # SIGSTOPped, or stuck in the kernel
                        self.kill()
                        what = (f"the worker process {self.pid} did not stop within {self.abort_wait_s:g} s of the "
                                "abort and was killed")
                        log.warning("%s", what)
                        raise CleaningAbortedError(f"cleaning aborted: {what}")
                continue
            kind = message[0]
            if kind == "bytes":
                on_bytes(message[1], message[2])
            elif kind == "charge":  # done without waiting; a budget set meanwhile: wait from now on
                if not waits and throttle is not None and not throttle.unlimited:
                    waits = True
                    self._send(("wait",))
                charge(message[1])  # the windows already on their way are charged to a new budget too
            elif kind == "acquire":
                self._send(("granted", message[1], charge(message[2])))
            elif kind in ("result", "raise"):
                if self.ended_by is not None:  # the job's end is the worker's: the next job needs a new one
                    self._end_within(self.abort_wait_s)
                if kind == "raise":
                    raise message[1].exception()
                return message[1]
            elif kind == "log":
                _emit(message[1])
            elif kind == "ending":
                self.ended_by = message[1]

    def close(self, timeout_s: float | None = None, *, stopping: bool = False) -> None:
        """Ask the worker to finish (it removes its swaps' old segments first) and wait for it; kill it after
        `timeout_s` (default: `_EXIT_WAIT_S`, or `abort_wait_s` when the caller is `stopping`: a `.deleted`
        file left then is removed by the next open)."""
        if timeout_s is None:
            timeout_s = self.abort_wait_s if stopping else _EXIT_WAIT_S
        self._send(("exit",))
        self._end_within(timeout_s)

    def send_signal(self, signum: int) -> None:
        """Signal the worker unless it is known to have ended (safe from a signal handler: nothing is waited for)."""
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for conn in (self._out, self._in):
            if not conn.closed:
                conn.close()


@contextlib.contextmanager
def suspended_together(workers: Callable[[], list[WorkerProcess | None]]) -> Iterator[None]:
    """While the block runs: a terminal's Ctrl-Z (SIGTSTP, sent to the foreground process group, which holds this
    process but not its workers, each in a group of its own) stops the `workers()` too, and `fg` or `bg`
    (SIGCONT to this process) continues them, so the job is suspended as a whole: no round goes on in a
    worker meanwhile. Only in the main thread (where handlers run), and where SIGTSTP exists."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTSTP"):
        yield
        return

    def on_stop(signum, frame) -> None:
        running = [w for w in workers() if w is not None]
        for w in running:
            w.send_signal(signal.SIGSTOP)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # this process stops here, until a SIGCONT
        signal.signal(signal.SIGTSTP, on_stop)
        for w in running:
            w.send_signal(signal.SIGCONT)

    previous = signal.signal(signal.SIGTSTP, on_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, previous)


def _emit(record: logging.LogRecord) -> None:
    """A worker's log record, handled here as if this thread had logged it (the daemon's log format names the
    thread: the worker's records carry the name of the thread that drives it)."""
    record.threadName = threading.current_thread().name
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)


# ---- the worker's side ------------------------------------------------------------------------------------------


class _PipeHandler(logging.Handler):
    """Sends the worker's log records to the parent, which logs them where its own go."""

    def __init__(self, worker: "_Worker") -> None:
        super().__init__()
        self._worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.msg, record.args, record.exc_info = record.getMessage(), None, None
            self._worker.send(("log", record))
        except Exception:  # noqa: BLE001 - logging never raises into the code that logs (logging.Handler's rule)
            self.handleError(record)


class _RemoteThrottle(Throttle):
    """The parent's I/O budget, asked over the pipe before each read and write (`WorkerProcess.call`)."""

    def __init__(self, worker: "_Worker") -> None:
        super().__init__(UNLIMITED)
        self._worker = worker

    def acquire(self, n_bytes: int, *, check_abort: Callable[[], None] | None = None) -> float:
        if not self._worker.waits:
            self._worker.send(("charge", n_bytes))  # unlimited: counted by the parent, no answer waited for
            return 0.0
        granted = self._worker.ask_budget(n_bytes, check_abort)
        if not granted:
            raise CleaningAbortedError("cleaning aborted while waiting for the I/O budget: the parent is stopping")
        return 0.0


@dataclass
class WorkerContext:
    """What a job function gets besides its arguments: the worker's state, kept from job to job."""

    throttle: Throttle
    check_abort: Callable[[], None]
    on_bytes: Callable[[int, str], None]
    remover: BackgroundRemover
    _map: tuple[tuple[int, float], OffsetMap] | None = None  # (its size and load factor, the map)
    _ring: WindowRing | None = None
    _survey_memo: SurveyMemo | None = None

    @property
    def ring(self) -> WindowRing:
        """The worker's read buffers, reused round after round as a cleaner thread's (made on first use)."""
        if self._ring is None:
            self._ring = WindowRing(WINDOW_BYTES)
        return self._ring

    @property
    def survey_memo(self) -> SurveyMemo:
        """What the survey took from the last partition this worker cleaned, for its next round of it."""
        if self._survey_memo is None:
            self._survey_memo = SurveyMemo()
        return self._survey_memo

    def offset_map(self, cleaner: CleanerSettings) -> OffsetMap:
        """The offset map a cleaner thread of `cleaner`'s settings has (`launch.thread_offset_map`), made once
        and reused by every later job that asks for the same size."""
        from . import launch

        key = (launch.thread_map_bytes(cleaner), cleaner.io_buffer_load_factor)
        if self._map is None or self._map[0] != key:  # one map at a time: the thread's share of the dedupe buffer
            self._map = None  # the old one freed before the new one is made
            self._map = (key, launch.thread_offset_map(cleaner))
        return self._map[1]


class _Worker:
    """The worker's state: a reader thread takes the parent's messages (calls for the main thread, grants,
    aborts), the main thread runs one job at a time, and any thread of a job sends through `send`."""

    def __init__(self, conn_in: Connection, conn_out: Connection) -> None:
        self._in = conn_in
        self._out = conn_out
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._calls: queue.Queue[tuple | None] = queue.Queue()
        self._grants: dict[int, list] = {}  # request -> [event, ok]
        self._requests = itertools.count(1)
        self._job = 0  # the job running
        self._aborted_job = -1
        self._parent_gone = False
        self._terminated: int | None = None  # the signal that ends the worker, once one came
        self._announced = False  # the parent was told ("ending")
        self.waits = False  # the job's budget is limited: ask before each read and write, and wait for the answer

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self._out.send(message)

    def check_abort(self) -> None:
        with self._lock:
            stop = self._parent_gone or self._aborted_job == self._job
        if self._terminated is not None:
            raise CleaningAbortedError(f"cleaning aborted: the worker process {os.getpid()} was sent "
                                       f"{signal.Signals(self._terminated).name}")
        if stop:
            raise CleaningAbortedError("cleaning aborted: logcleaner is stopping")

    def terminate(self, signum, frame) -> None:
        """SIGTERM or SIGINT of its own (systemd stopping the unit's whole cgroup, an operator's `kill`): the
        running job aborts at its next window boundary, as at the parent's abort, and the worker says so and exits
        after it. A signal handler takes no lock (it may run while this thread holds one): it sets the field,
        which the loops read."""
        self._terminated = signum

    def ask_budget(self, n_bytes: int, check_abort: Callable[[], None] | None) -> bool:
        request = next(self._requests)
        grant: list = [threading.Event(), False]
        with self._lock:
            self._grants[request] = grant
        try:
            self.send(("acquire", request, n_bytes))
            while not grant[0].wait(_GRANT_WAIT_S):
                (check_abort or self.check_abort)()
            return bool(grant[1])
        finally:
            with self._lock:
                self._grants.pop(request, None)

    def read_messages(self) -> None:
        """The reader thread: calls to the main thread's queue, grants and aborts at once."""
        try:
            while True:
                message = self._in.recv()
                kind = message[0]
                if kind == "call":
                    self._calls.put(message)
                elif kind == "granted":
                    with self._lock:
                        grant = self._grants.get(message[1])
                    if grant is not None:
                        grant[1] = message[2]
                        grant[0].set()
                elif kind == "abort":
                    with self._lock:
                        self._aborted_job = message[1]
                elif kind == "wait":
                    self.waits = True
                elif kind == "exit":
                    break
        except (EOFError, OSError):
            with self._lock:
                self._parent_gone = True
        self._calls.put(None)

    def _next_call(self) -> tuple | None:
        """The next job, or None once the parent says exit, goes, or SIGTERM came."""
        while self._terminated is None:
            try:
                return self._calls.get(timeout=_GRANT_WAIT_S)
            except queue.Empty:
                continue
        return None

    def run(self) -> None:
        remover = BackgroundRemover()
        context = WorkerContext(throttle=Throttle(UNLIMITED), check_abort=self.check_abort,
                                on_bytes=lambda n, direction: self.send(("bytes", n, direction)), remover=remover)
        remote = _RemoteThrottle(self)
        unlimited = context.throttle
        threading.Thread(target=self.read_messages, name="logcleaner-worker-pipe", daemon=True).start()
        try:
            while (message := self._next_call()) is not None:
                _, job, function, kwargs, throttled, self.waits, log_level = message
                logging.getLogger().setLevel(log_level)  # the parent's: records below it are not even sent
                with self._lock:
                    self._job = job
                context.throttle = remote if throttled else unlimited
                try:
                    module, name = function.split(":")
                    value = getattr(import_module(module), name)(context, **kwargs)
                except Exception as exc:  # noqa: BLE001 - the job's error goes back to the caller, raised there
                    reply: tuple = ("raise", _SentException(exc))
                else:
                    reply = ("result", value)
                try:
                    if self._terminated is not None:  # before the reply: the parent waits for this process's end
                        self._announce_end()
                    self.send(reply)
                except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
                    if self._parent_gone:
                        break
                    self.send(("raise", WorkerDiedError(f"the worker could not send its result back: {exc}")))
            if self._terminated is not None and not self._parent_gone:  # between jobs
                with contextlib.suppress(OSError):
                    self._announce_end()
        finally:
            remover.drain()

    def _announce_end(self) -> None:
        """Tell the parent, once, that a signal of this process's own ends it (`WorkerProcess.ended_by`)."""
        if not self._announced and self._terminated is not None:
            self._announced = True
            self.send(("ending", signal.Signals(self._terminated).name))


def _rebuilt(cls: type[BaseException], args: tuple, state: dict) -> BaseException:
    """An exception of `cls` with `args` and attributes `state`, made without calling its constructor."""
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class _SentException:
    """An exception as the worker sends it: itself if it pickles both ways; else its class, arguments and
    attributes, rebuilt in the parent without its constructor (most of `segments`' errors take keyword-only
    arguments, which pickle cannot pass again), so the parent's `except` clauses see the same type and message;
    else a `CleanerError` naming its type."""

    def __init__(self, exc: BaseException) -> None:
        self.exc: BaseException | None = None
        self.parts: tuple | None = None
        try:
            pickle.loads(pickle.dumps(exc))
            self.exc = exc
            return
        except Exception:  # noqa: BLE001 - its constructor cannot be called again: sent as parts
            pass
        try:
            parts = (type(exc), exc.args, dict(getattr(exc, "__dict__", {})))
            _rebuilt(*pickle.loads(pickle.dumps(parts)))
            self.parts = parts
        except Exception:  # noqa: BLE001 - a class or attribute that does not pickle: named instead
            self.exc = CleanerError(f"{type(exc).__name__}: {exc}")

    def exception(self) -> BaseException:
        if self.parts is not None:
            return _rebuilt(*self.parts)
        assert self.exc is not None
        return self.exc


def serve(in_fd: int, out_fd: int) -> None:
    """The worker's main: the process's native settings, then jobs until the parent says exit or goes."""
    from .allocator import limit_blas_threads, tune_allocator

    limit_blas_threads()
    tune_allocator()
    worker = _Worker(Connection(in_fd, writable=False), Connection(out_fd, readable=False))
    signal.signal(signal.SIGTERM, worker.terminate)
    signal.signal(signal.SIGINT, worker.terminate)  # sent to it alone: a terminal's Ctrl-C reaches only the parent
    root = logging.getLogger()
    root.handlers[:] = [_PipeHandler(worker)]
    logging.raiseExceptions = False  # a record that cannot reach a parent gone is dropped, not printed
    worker.run()


if __name__ == "__main__":
    # the module's own copy, not this `__main__` one: what it sends must unpickle as `cleaner.workers`' classes
    from cleaner.workers import serve as _serve

    _serve(int(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: the work is done and the remover drained (as cli_support.end_process)
