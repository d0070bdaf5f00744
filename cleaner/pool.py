"""The cleaner thread pool: the only code that starts cleaner threads and the only code that catches everything.

Owns `log.cleaner.threads` threads, each with its own offset map, looping: ask the manager for the
filthiest log, open it in cleaner mode, run one round under the shared per-device I/O throttle, report the
outcome (`round_and_retention`; the first thread runs it in this process, each other one in a worker process
of its own, `cleaner.workers`, so that no GIL is shared: `round_job`); the thread's offset map and the round
itself (under the throttle, its survivorship recorded after it) are `cleaner.launch`'s, the path
`logcleaner clean` takes too. Before each selection, once per
`log.retention.check.interval.ms` across the threads, a thread runs the retention pass over every log
(`cleaner.retention`: the `delete` policy, and segments below the log start); a `compact,delete` log also
gets it right after each of its rounds, as in Kafka. A thread with nothing to clean does the idle-log
maintenance (`cleaner.idle`) and waits `log.cleaner.backoff.ms`, lending its core meanwhile: a round started
while threads are idle takes their free cores (`launch.spare_cores`) to survey and recopy its log on them. With
`log.cleaner.enable` false the threads only run retention, as Kafka's log manager does without a cleaner. Every read and write of a round is
charged, before it is done, to the budget of the log dir's device (`cleaner.throttle`); a thread waiting
there wakes at once when the pool stops. Outcomes:

* success → the manager records it (the round wrote the checkpoint);
* an abort (shutdown, pause) at a window boundary → the round removed its `.cleaned` files; nothing else;
* the partition's cleaner lock is held by another process → skipped, not a failure;
* an I/O error of the disk itself (EIO, EROFS) → that log dir goes offline, the others go on;
* the thread's worker process died (the OOM killer, SIGBUS) → what its round left is recovered and the
  partition is retried as after an abort; a second death in a row in the same partition marks it uncleanable,
  as below; the thread's next round starts a new worker;
* anything else → the partition is marked uncleanable (retried later, see `cleaner.manager`); the thread
  carries on. A thread that dies anyway is replaced by `supervise()` and counted.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from offsetmap import OffsetMap
from segments.codec.errors import LockTimeoutError, LogDirOwnedError, SegmentError
from segments.files.fileio import BackgroundRemover
from segments.files.readahead import WindowRing
from segments.partition.log import PartitionLog

from . import kernel_cache, launch
from .errors import CleanerError
from .idle import maintain_idle_logs
from .manager import Candidate, CleanerManager
from .metrics import CleanerMetrics
from .retention import RetentionResult, apply_retention
from .round import CleaningAbortedError, RoundResult
from .settings import CleanerSettings, TopicSettings
from .survey import WINDOW_BYTES, SurveyMemo
from .throttle import DeviceThrottles, Throttle
from .workers import WorkerContext, WorkerDiedError, WorkerProcess, recover_partition, use_processes

__all__ = ["CleanerPool", "round_and_retention", "round_job"]

log = logging.getLogger(__name__)

_DISK_ERRNOS = frozenset({errno.EIO, errno.EROFS})
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_LOCK_WAIT_S = 1.0
_BUSY_BACKOFF_MS = 30_000  # a partition another process is cleaning is passed over this long
_WORKER_DEATHS_MAX = 2  # a partition whose worker died this many times in a row is marked uncleanable



class _Stopped(CleanerError):
    """The pool is stopping: a cleaner thread leaves what it waits for."""

class CleanerPool:
    """`threads` cleaner threads sharing one manager, throttles and metrics."""

    def __init__(
        self,
        manager: CleanerManager,
        throttles: DeviceThrottles,
        metrics: CleanerMetrics,
        *,
        threads: int,
        clock_ms: Callable[[], int],
    ) -> None:
        self.manager = manager
        self.throttles = throttles
        self.metrics = metrics
        self.clock_ms = clock_ms
        self.threads_wanted = threads
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: dict[int, threading.Thread] = {}
        self._busy: dict[int, int] = {}  # thread index -> device being cleaned
        self._idle: set[int] = set()  # threads whose last selection found nothing to clean
        self._next_retention_ms = 0
        self.dead_threads = 0
        self.remover = BackgroundRemover()  # the swaps' `.deleted` files, removed off the cleaner threads
        self._workers: dict[int, WorkerProcess] = {}  # thread index -> its worker process (threads past the first)
        self._worker_deaths: dict[Path, int] = {}  # partition -> worker deaths in it in a row

    # ---- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            for i in range(self.threads_wanted):
                self._spawn(i)

    def _raise_if_stopping(self) -> None:
        if self._stopping.is_set():
            raise _Stopped

    def _spawn(self, index: int) -> None:
        thread = threading.Thread(target=self._run, args=(index,), name=f"logcleaner-cleaner-thread-{index}", daemon=True)
        self._threads[index] = thread
        thread.start()

    def supervise(self) -> None:
        """Replace threads that died (counted in `dead_threads`); match the wanted thread count."""
        if self._stopping.is_set():
            return
        with self._lock:
            for index, thread in list(self._threads.items()):
                if thread.is_alive():
                    continue
                if index >= self.threads_wanted:
                    del self._threads[index]  # ended on purpose after the pool was made smaller
                    continue
                self.dead_threads += 1
                log.error("cleaner thread died; replacing it thread=%s", thread.name)
                self._spawn(index)
            for index in range(self.threads_wanted):
                if index not in self._threads:
                    self._spawn(index)

    def resize(self, threads: int) -> None:
        """Change the thread count (config reload); extra threads stop after their current round."""
        with self._lock:
            self.threads_wanted = threads
        self.supervise()

    @property
    def threads_alive(self) -> int:
        with self._lock:
            return sum(1 for t in self._threads.values() if t.is_alive())

    def stop(self, timeout_s: float) -> bool:
        """Abort running rounds at their next window and wait for the threads; True if all stopped."""
        with self._lock:
            for worker in self._workers.values():  # a worker not stopping at the abort is killed within the deadline
                worker.abort_wait_s = min(worker.abort_wait_s, timeout_s / 2)
        self._stopping.set()
        self.manager.abort_all()
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout_s)
        stopped = not any(t.is_alive() for t in threads)
        if stopped:
            self.remover.drain()
        return stopped

    def wait_stopping(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking at once when the pool stops (the throttle's sleep)."""
        return self._stopping.wait(seconds)

    def busy_devices(self) -> list[int]:
        with self._lock:
            return list(self._busy.values())

    # ---- the thread -------------------------------------------------------------------------------------

    def _run(self, index: int) -> None:
        try:
            self._loop(index)
        finally:
            with self._lock:
                worker = self._workers.pop(index, None)
                self._idle.discard(index)
            if worker is not None:
                worker.close(stopping=self._stopping.is_set())  # it removes its swaps' old segments first

    def _worker(self, index: int) -> WorkerProcess | None:
        """The worker process of thread `index` (each thread past the first drives one, `cleaner.workers`), a
        new one if the last died; None for the first thread, with `LOGCLEANER_WORKERS=threads`, or when no
        process can start (that thread then cleans in this process)."""
        if index == 0 or not use_processes():
            return None
        with self._lock:
            worker = self._workers.get(index)
        if worker is not None and worker.alive():
            return worker
        if worker is not None:
            log.info("the worker process of thread %d ended; starting another (was pid %d)", index, worker.pid)
        try:
            worker = WorkerProcess()
        except OSError as exc:
            log.warning("could not start a worker process, cleaning on a thread instead: %s", exc)
            return None
        with self._lock:
            self._workers[index] = worker
        return worker

    def _recover_if_worker_died(self, index: int, directory: str | Path, topic: TopicSettings) -> None:
        """A worker that died or was killed in a round left its files as a crash does: recover them now."""
        with self._lock:
            worker = self._workers.get(index)
        if worker is not None and not worker.alive():
            if (problem := recover_partition(Path(directory), topic.log_config())) is not None:
                log.warning("recovering after the worker process failed dir=%s error=%s", directory, problem)

    def _loop(self, index: int) -> None:
        offset_map = None
        map_memory = 0
        ring = WindowRing(WINDOW_BYTES)  # this thread's read buffers, reused round after round like its map
        survey_memo = SurveyMemo()  # the survey's figures of the last partition it cleaned, for its next round
        # Before the first selection, whose header walks run kernels: the first start after an install builds the
        # kernels' module in a child (the other threads wait), so this process loads it instead of numba. A stop
        # meanwhile stops the child.
        try:
            kernel_cache.ensure_compiled(self._raise_if_stopping)
        except _Stopped:
            return
        while not self._stopping.is_set():
            if index >= self.threads_wanted:
                return
            cleaner = self.manager.settings.cleaner
            memory = launch.thread_map_bytes(cleaner)
            if offset_map is None or memory != map_memory:
                offset_map = launch.thread_offset_map(cleaner)
                map_memory = memory
            try:
                # due or not, whatever there is to clean: a busy cleaner must not starve the delete policy
                self._retention_if_due(cleaner.log_retention_check_interval_ms)
            except Exception:  # a failed pass must not kill the thread; the next one retries
                log.exception("retention pass failed")
            if not cleaner.enable:  # Kafka's meaning: no compaction, retention still runs
                self._stopping.wait(cleaner.backoff_ms / 1000.0)
                continue
            try:
                candidate = self.manager.grab_filthiest(busy_devices=self.busy_devices())
            except Exception:  # a failed selection must not kill the thread (KAFKA-8725)
                log.exception("selecting a log to clean failed")
                candidate = None
            with self._lock:  # a thread that found nothing lends its core to the rounds that run (`_clean`)
                (self._idle.add if candidate is None else self._idle.discard)(index)
            if candidate is None:
                try:
                    maintain_idle_logs(self.manager, self.clock_ms())
                except Exception:  # maintenance is best effort
                    log.exception("idle-log maintenance failed")
                self._stopping.wait(cleaner.backoff_ms / 1000.0)
                continue
            self._clean(index, candidate, offset_map, ring, survey_memo)

    def _retention_if_due(self, interval_ms: int) -> None:
        """The retention pass over every log (`delete`, `compact,delete`, and compacted logs' segments below
        the log start offset), at most once per `log.retention.check.interval.ms` across the threads."""
        now = self.clock_ms()
        with self._lock:
            if now < self._next_retention_ms:
                return
            self._next_retention_ms = now + interval_ms
        for status in self.manager.retention_candidates():
            if self._stopping.is_set():
                return
            if not self.manager.begin_maintenance(status.directory):
                continue  # being cleaned (a compact,delete round applies retention itself), paused, offline
            try:
                topic = self.manager.topic_settings(status.topic, status.log_dir)
                with PartitionLog.open(status.directory, mode="cleaner", config=topic.log_config(),
                                       lock_timeout_s=_LOCK_WAIT_S) as plog:
                    self._apply_retention(status.directory, plog, topic, now)
            except LockTimeoutError:
                pass  # another process is cleaning it; next time
            except LogDirOwnedError as exc:
                self.manager.broker_owns(status.log_dir, exc)
            except Exception as exc:  # one partition's failure must not stop the others
                log.exception("retention failed dir=%s", status.directory)
                self.manager.mark_uncleanable(status.directory, f"retention: {type(exc).__name__}: {exc}")
            finally:
                self.manager.end_maintenance(status.directory)

    def _apply_retention(self, directory: Path, plog: PartitionLog, topic: TopicSettings, now_ms: int) -> None:
        self._record_retention(directory, apply_retention(plog, topic, now_ms))

    def _record_retention(self, directory: Path, result: RetentionResult | None) -> None:
        if result is not None:
            self.metrics.record_retention(result.segments_deleted, result.bytes_deleted)
            self.manager.retained(directory, result)

    def _clean(self, index: int, candidate: Candidate, offset_map: OffsetMap, ring: WindowRing,
               survey_memo: SurveyMemo) -> None:
        directory = candidate.directory
        device = self.throttles.device_of(candidate.log_dir)
        throttle = self.throttles.for_path(candidate.log_dir)
        with self._lock:
            self._busy[index] = device

        def check_abort() -> None:
            if self._stopping.is_set() or self.manager.is_aborted(directory):
                raise CleaningAbortedError(f"{directory}: cleaning aborted")

        def on_bytes(n: int, direction: str) -> None:
            self.metrics.record_io(n, direction)

        topic = self.manager.topic_settings(candidate.topic, candidate.log_dir)
        cleaner = self.manager.settings.cleaner
        try:
            log.info("cleaning dir=%s reason=%s dirty_ratio=%.3f", directory, candidate.reason, candidate.dirty_ratio)
            worker = self._worker(index)
            with self._lock:
                lenders = len(self._idle)  # threads that found nothing to clean: their cores recopy this round's groups
            # one of this process's cores held for it (`launch.core`): threads past the cores wait here too; and
            # the free cores of the threads with nothing to do
            with launch.core(check_abort), launch.spare_cores(lenders) as spare:
                if spare:
                    log.info("cleaning dir=%s on %d threads: %d idle thread(s) lent their cores", directory, 1 + spare,
                             spare)
                if worker is not None:  # the same, in this thread's worker process; its errors raised here
                    result, retention = worker.call(
                        "cleaner.pool:round_job",
                        dict(directory=Path(directory), topic=topic, cleaner=cleaner, now_ms=self.clock_ms(),
                             force_recopy=candidate.force_recopy, recopy_threads=1 + spare),
                        throttle=throttle, on_bytes=on_bytes, check_abort=check_abort,
                    )
                else:
                    result, retention = round_and_retention(
                        Path(directory), topic, cleaner, offset_map, throttle, self.clock_ms, ring=ring,
                        survey_memo=survey_memo, check_abort=check_abort, on_bytes=on_bytes,
                        force_recopy=candidate.force_recopy, remover=self.remover, recopy_threads=1 + spare,
                    )
            self._record_retention(directory, retention)
            with self._lock:
                self._worker_deaths.pop(directory, None)
            self.manager.done_cleaning(directory, result, result.next_delete_horizon_ms)
            self.metrics.record_round(index, result)
        except CleaningAbortedError:
            log.info("cleaning aborted dir=%s", directory)
            self._recover_if_worker_died(index, directory, topic)
            self.manager.aborted(directory)
            self.metrics.record_outcome("aborted")
        except WorkerDiedError as exc:  # the OOM killer, a SIGBUS: the thread's next worker goes on
            self._recover_if_worker_died(index, directory, topic)
            with self._lock:
                deaths = self._worker_deaths[directory] = self._worker_deaths.get(directory, 0) + 1
            if self._stopping.is_set() or deaths < _WORKER_DEATHS_MAX:
                # stopping (a SIGTERM to every process of the unit), or a first death: not the partition's fault
                # as far as is known, so it is retried as after an abort
                log.warning("cleaning stopped dir=%s reason=%s; it is retried", directory, exc)
                self.manager.aborted(directory)
                self.metrics.record_outcome("aborted")
            else:  # its worker died again and again in it (SIGBUS, memory): uncleanable, retried after the backoff
                self.manager.failed(directory, exc)
                self.metrics.record_outcome("failed")
        except LockTimeoutError as exc:
            log.info("partition busy; skipped dir=%s reason=%s", directory, exc)
            self.manager.busy_elsewhere(directory, _BUSY_BACKOFF_MS)
        except LogDirOwnedError as exc:
            self.manager.broker_owns(candidate.log_dir, exc)
            self.manager.aborted(directory)
        except OSError as exc:
            if exc.errno in _DISK_FULL_ERRNOS:
                self.manager.disk_full(directory, exc)
            elif exc.errno in _DISK_ERRNOS:
                self.manager.mark_log_dir_offline(candidate.log_dir, str(exc))
                self.manager.aborted(directory)
            else:
                self.manager.failed(directory, exc)
            self.metrics.record_outcome("failed")
        except (SegmentError, CleanerError) as exc:  # the data or its settings: the manager logs it, in one line
            self.manager.failed(directory, exc)
            self.metrics.record_outcome("failed")
        except Exception as exc:  # one partition's failure must not stop the others; a bug: with its traceback
            log.exception("cleaning failed dir=%s", directory)
            self.manager.failed(directory, exc)
            self.metrics.record_outcome("failed")
        finally:
            with self._lock:
                self._busy.pop(index, None)


def round_and_retention(
    directory: Path, topic: TopicSettings, cleaner: CleanerSettings, offset_map: OffsetMap, throttle: Throttle,
    clock_ms: Callable[[], int], *, ring: WindowRing, survey_memo: SurveyMemo, check_abort: Callable[[], None],
    on_bytes: Callable[[int, str], None], force_recopy: bool, remover: BackgroundRemover, recopy_threads: int = 1,
) -> tuple[RoundResult, RetentionResult | None]:
    """A daemon thread's work on the log it was handed, in its process or its worker's: open it in cleaner mode
    (its lock waited for `_LOCK_WAIT_S`), one round (`launch.launch_round`), then, for a `compact,delete` log,
    retention, as Kafka's cleaner thread deletes its old segments after cleaning it; the round's groups recopied on
    `recopy_threads` threads (the cores the caller holds for it). The round's result and the
    retention's (None: none, or it failed: logged, the next pass retries). Raises what the round raises."""
    # one of the process's cores held over the partition's work, its round included (`launch.core`)
    with launch.core(check_abort), PartitionLog.open(directory, mode="cleaner", config=topic.log_config(),
                                                     lock_timeout_s=_LOCK_WAIT_S, remover=remover,
                                                     check_abort=check_abort) as plog:
        result = launch.launch_round(plog, topic, cleaner, offset_map, throttle, clock_ms, ring=ring,
                                     survey_memo=survey_memo, check_abort=check_abort, on_bytes=on_bytes,
                                     force_recopy=force_recopy, recopy_threads=recopy_threads)
        retention = None
        if "delete" in topic.cleanup_policy and not result.dry_run:
            try:
                retention = apply_retention(plog, topic, clock_ms())
            except Exception:  # the round itself succeeded; the next pass retries
                log.exception("retention after cleaning failed dir=%s", directory)
    return result, retention


def round_job(context: WorkerContext, *, directory: Path, topic: TopicSettings, cleaner: CleanerSettings,
              now_ms: int, force_recopy: bool, recopy_threads: int = 1) -> tuple[RoundResult, RetentionResult | None]:
    """`round_and_retention` in a worker process (`cleaner.workers`) with the worker's map, buffers, survey memo
    and remover, the parent's budget and abort, and the parent's clock read when the log was handed over."""
    return round_and_retention(
        directory, topic, cleaner, context.offset_map(cleaner), context.throttle, lambda: now_ms, ring=context.ring,
        survey_memo=context.survey_memo, check_abort=context.check_abort, on_bytes=context.on_bytes,
        force_recopy=force_recopy, remover=context.remover, recopy_threads=recopy_threads,
    )
