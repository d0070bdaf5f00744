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
* parent → worker: `("call", job, "module:function", kwargs, throttled)`; `("granted", request, ok)`;
  `("abort", job)`; `("exit",)`.
* worker → parent: `("acquire", request, n_bytes)` — the I/O budget stays the parent's (one `Throttle` per
  device, shared by every worker and thread), the worker asks before each read and write when the budget is
  limited, and a refusal (the parent is stopping) aborts its round; `("bytes", n, direction)` for the caller's
  progress; `("result", value)`; `("raise", exception)`.
* The parent's abort check runs while it waits; when it raises, the worker is told, and its round stops at its
  next window boundary (removing its `.cleaned` files) with `CleaningAbortedError`, re-raised in the parent.
* A worker ignores SIGINT (Ctrl-C reaches the whole process group; the parent decides), and stops its job and
  exits when its parent goes (the pipe's end). A worker that dies mid-job (a signal, the OOM killer) fails that
  job with `WorkerDiedError`, naming how it ended; the partition is left as the next open finds it (an
  unfinished round's `.cleaned` files are removed there, as after any crash).
* `("exit",)`: the worker removes the old segments its swaps left to its background remover, then exits; the
  parent's `close` waits for that, so a command returns with no `.deleted` file left.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from offsetmap import OffsetMap
from segments.files.fileio import BackgroundRemover

from .errors import CleanerError
from .round import CleaningAbortedError
from .settings import CleanerSettings
from .throttle import UNLIMITED, Throttle

__all__ = ["WORKERS_VARIABLE", "WorkerContext", "WorkerDiedError", "WorkerProcess", "serve", "use_processes"]

# `processes` (the default) or `threads`: how `logcleaner clean` runs its threads past the first
WORKERS_VARIABLE = "LOGCLEANER_WORKERS"

_POLL_S = 0.05  # the parent checks its abort this often while it waits on a worker
_GRANT_WAIT_S = 0.1  # a worker waiting for the budget checks its own abort this often
_EXIT_WAIT_S = 600.0  # a worker removing its old segments at exit: bounded, then killed
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])  # the directory holding cleaner/, for the worker's imports


class WorkerDiedError(CleanerError):
    """A worker process ended in the middle of a job."""


def use_processes() -> bool:
    """Whether a caller with several cleaner threads gives each its own worker process: unless
    `LOGCLEANER_WORKERS=threads` (the in-process threads, for comparison, or where a process may not start
    another); any other value than `threads` or `processes` is warned about once and means processes."""
    value = os.environ.get(WORKERS_VARIABLE, "processes").strip().lower()
    if value not in ("processes", "threads") and value not in _warned:
        _warned.add(value)
        print(f"warning: {WORKERS_VARIABLE}={value!r} is neither 'processes' nor 'threads'; using processes",
              file=sys.stderr)
    return value != "threads"


_warned: set[str] = set()


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


class WorkerProcess:
    """A worker process and the parent's end of its pipes. One job at a time, from one parent thread."""

    def __init__(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "cleaner.workers", str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env=env,
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

    def alive(self) -> bool:
        return self._proc.poll() is None and not self._in.closed

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
        raised here. Every read and write of the job is charged to `throttle` first (None or unlimited: no
        budget); `on_bytes` is told what it moved; `check_abort`, called while waiting, stops the job when it
        raises (the job then ends with `CleaningAbortedError`). Raises `WorkerDiedError` if the worker ends."""
        if not self.alive():
            raise self._died()
        job = next(self._jobs)
        throttled = throttle is not None and not throttle.unlimited
        self._send(("call", job, function, kwargs, throttled))
        aborted = False

        def abort_requested() -> bool:
            nonlocal aborted
            if not aborted and check_abort is not None:
                try:
                    check_abort()
                except CleanerError:  # the caller's abort (`CleaningAbortedError`, a pool's stop): the job ends with it
                    aborted = True
                    self._send(("abort", job))
            return aborted

        while True:
            try:
                ready = self._in.poll(_POLL_S)
                message = self._in.recv() if ready else None
            except (EOFError, OSError):
                raise self._died() from None
            if message is None:
                abort_requested()
                continue
            kind = message[0]
            if kind == "bytes":
                on_bytes(message[1], message[2])
            elif kind == "acquire":
                ok = not abort_requested()
                if ok and throttle is not None:
                    try:
                        throttle.acquire(message[2], check_abort=check_abort)
                    except CleanerError:  # the caller's abort, raised while waiting for the budget
                        ok = False
                        aborted = True
                        self._send(("abort", job))
                self._send(("granted", message[1], ok))
            elif kind == "result":
                return message[1]
            elif kind == "raise":
                raise message[1]

    def close(self, timeout_s: float = _EXIT_WAIT_S) -> None:
        """Ask the worker to finish (it removes its swaps' old segments first) and wait for it; kill it after
        `timeout_s`."""
        self._send(("exit",))
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for conn in (self._out, self._in):
            if not conn.closed:
                conn.close()


# ---- the worker's side ------------------------------------------------------------------------------------------


class _RemoteThrottle(Throttle):
    """The parent's I/O budget, asked over the pipe before each read and write (`WorkerProcess.call`)."""

    def __init__(self, worker: "_Worker") -> None:
        super().__init__(UNLIMITED)
        self._worker = worker

    def acquire(self, n_bytes: int, *, check_abort: Callable[[], None] | None = None) -> float:
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
    _maps: dict[tuple[int, float], OffsetMap] = field(default_factory=dict)

    def offset_map(self, cleaner: CleanerSettings) -> OffsetMap:
        """The offset map a cleaner thread of `cleaner`'s settings has (`launch.thread_offset_map`), made once
        and reused by every later job that asks for the same size."""
        from . import launch

        key = (launch.thread_map_bytes(cleaner), cleaner.io_buffer_load_factor)
        if key not in self._maps:
            self._maps.clear()  # one map at a time: its memory is the thread's share of the dedupe buffer
            self._maps[key] = launch.thread_offset_map(cleaner)
        return self._maps[key]


class _Worker:
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

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self._out.send(message)

    def check_abort(self) -> None:
        with self._lock:
            stop = self._parent_gone or self._aborted_job == self._job
        if stop:
            raise CleaningAbortedError("cleaning aborted: logcleaner is stopping")

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
                elif kind == "exit":
                    break
        except (EOFError, OSError):
            with self._lock:
                self._parent_gone = True
        self._calls.put(None)

    def run(self) -> None:
        remover = BackgroundRemover()
        context = WorkerContext(throttle=Throttle(UNLIMITED), check_abort=self.check_abort,
                                on_bytes=lambda n, direction: self.send(("bytes", n, direction)), remover=remover)
        remote = _RemoteThrottle(self)
        unlimited = context.throttle
        threading.Thread(target=self.read_messages, name="logcleaner-worker-pipe", daemon=True).start()
        try:
            while (message := self._calls.get()) is not None:
                _, job, function, kwargs, throttled = message
                with self._lock:
                    self._job = job
                context.throttle = remote if throttled else unlimited
                try:
                    module, name = function.split(":")
                    value = getattr(import_module(module), name)(context, **kwargs)
                except Exception as exc:  # noqa: BLE001 - the job's error goes back to the caller, raised there
                    reply: tuple = ("raise", _picklable(exc))
                else:
                    reply = ("result", value)
                try:
                    self.send(reply)
                except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
                    if self._parent_gone:
                        break
                    self.send(("raise", WorkerDiedError(f"the worker could not send its result back: {exc}")))
        finally:
            remover.drain()


def _picklable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling both ways, else a `CleanerError` with its type's name and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - an exception whose constructor pickle cannot call again: replaced
        return CleanerError(f"{type(exc).__name__}: {exc}")


def serve(in_fd: int, out_fd: int) -> None:
    """The worker's main: the process's native settings, then jobs until the parent says exit or goes."""
    from .allocator import limit_blas_threads, tune_allocator

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent decides
    limit_blas_threads()
    tune_allocator()
    worker = _Worker(Connection(in_fd, writable=False), Connection(out_fd, readable=False))
    worker.run()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: the work is done and the remover drained (as cli_support.end_process)
