"""Launching one cleaning round: the one path by which the daemon's threads (`cleaner.pool`) and
`logcleaner clean` (`cleaner.oneshot`) run a round.

Owns what a round takes from the broker-level settings (`Settings.cleaner`) and what follows every round, the
same for both callers:

* the offset map of a cleaner thread (`thread_offset_map`): `log.cleaner.dedupe.buffer.size` shared by
  `log.cleaner.threads` (`offsetmap.per_thread_memory_bytes`), filled up to `log.cleaner.io.buffer.load.factor`;
* `launch_round`: at most one round a core at once in the process (`CORES`: further threads wait for one;
  `core()` lets a caller hold its core over the partition's other work too: opening it, retention;
  `spare_cores()` the free ones besides, on which a round alone surveys and recopies its log);
  the clock read once, at the start; one `cleaner.round.clean_round` with
  `producer.id.expiration.ms` and `log.cleaner.verify`, every read and write charged beforehand to the I/O
  throttle of the partition's device (whose wait ends with the caller's abort check); then the round's
  survivorship folded into its log dir's record (`log.cleaner.survivorship.alpha`).

What differs stays with the callers: the daemon's pool picks the log, opens it for each round, aborts at
shutdown, applies retention after a `compact,delete` round and reports to the manager and the metrics;
`clean` opens a partition once for all its rounds, applies retention around them, decides whether another
round is due and reports the partition's outcome. `tests/cleaner/test_launch.py` checks that both go through
`launch_round`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from offsetmap import OffsetMap, per_thread_memory_bytes
from segments.files.readahead import WindowRing
from segments.partition.log import PartitionLog

from . import kernel_cache, survivorship
from .round import RoundResult, clean_round
from .settings import CleanerSettings, TopicSettings
from .survey import SurveyMemo
from .throttle import Throttle

__all__ = ["core", "cores", "launch_round", "spare_cores", "thread_map_bytes", "thread_offset_map"]


def thread_map_bytes(cleaner: CleanerSettings) -> int:
    """The offset-map memory of one cleaner thread: `log.cleaner.dedupe.buffer.size` / `log.cleaner.threads`."""
    return per_thread_memory_bytes(cleaner.dedupe_buffer_size, cleaner.threads)


def thread_offset_map(cleaner: CleanerSettings) -> OffsetMap:
    """A cleaner thread's offset map (`thread_map_bytes`), filled up to `log.cleaner.io.buffer.load.factor`;
    a thread reuses it round after round."""
    return OffsetMap(thread_map_bytes(cleaner), cleaner.io_buffer_load_factor)


def _never_aborted() -> None:
    return None


def launch_round(
    log_: PartitionLog,
    topic: TopicSettings,
    cleaner: CleanerSettings,
    offset_map: OffsetMap,
    throttle: Throttle,
    clock_ms: Callable[[], int],
    *,
    ring: WindowRing,
    survey_memo: SurveyMemo | None = None,
    check_abort: Callable[[], None] | None = None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    forced_from: int | None = None,
    forced_to: int | None = None,
    dry_run: bool = False,
    force_recopy: bool = False,
    horizon_pass: bool = False,
    recopy_threads: int = 1,
) -> RoundResult:
    """One round of `log_` (open in cleaner mode, or as a reader for a `dry_run`) with `topic`'s settings and
    the broker-level `cleaner` settings; see the module docstring. The keyword arguments are
    `cleaner.round.clean_round`'s. Raises what `clean_round` raises; the survivorship is recorded only after
    a round that succeeded (and never for a dry run)."""

    def charge_io(n: int) -> None:  # every read and write, before it is done
        throttle.acquire(n, check_abort=check_abort)

    kernel_cache.ensure_compiled(check_abort)  # the first round after an install compiles in a child
    with core(check_abort):
        result = clean_round(
            log_,
            topic,
            offset_map,
            now_ms=clock_ms(),
            producer_expiration_ms=cleaner.producer_id_expiration_ms,
            forced_from=forced_from,
            forced_to=forced_to,
            dry_run=dry_run,
            force_recopy=force_recopy,
            horizon_pass=horizon_pass,
            check_abort=check_abort or _never_aborted,
            on_bytes=on_bytes,
            ring=ring,
            survey_memo=survey_memo,
            verify=cleaner.verify,
            direct_writes=cleaner.io_direct,
            charge_io=charge_io,
            recopy_threads=recopy_threads,
        )
    survivorship.record_round(log_.directory, result, cleaner.survivorship_alpha)
    return result


def cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# Rounds running at once in this process: at most one a core. A thread past that waits for one (checking its
# abort): more rounds than cores only hand the GIL around (bench/RESULTS.md, "Threads": 4 threads on 2 cores
# were 0.89-0.96x of 2).
CORES = threading.BoundedSemaphore(cores())


_holding = threading.local()  # per thread: how deep in `core()` it is


@contextmanager
def core(check_abort: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold one of `CORES` for the block, waiting for one first (calling `check_abort`, which may raise, every
    `_CORE_WAIT_S`). Reentrant within a thread: a round launched inside the block runs on the core held. A
    thread holds it over all of a partition's work (opening it: recovery, index checks; retention; its rounds),
    so that threads past the cores do not open partitions beside the rounds that run."""
    depth = getattr(_holding, "depth", 0)
    if depth == 0:
        while not CORES.acquire(timeout=_CORE_WAIT_S):
            (check_abort or _never_aborted)()
    _holding.depth = depth + 1
    try:
        yield
    finally:
        _holding.depth = depth
        if depth == 0:
            CORES.release()


_CORE_WAIT_S = 0.1


@contextmanager
def spare_cores(wanted: int) -> Iterator[int]:
    """Up to `wanted` more of `CORES`, taken without waiting, held for the block; yields how many were free. A
    round with nothing else to run beside it surveys and recopies its log on them (`clean_round`'s
    `recopy_threads`), and a thread that wants a core meanwhile waits for the round's end."""
    taken = 0
    try:
        while taken < wanted and CORES.acquire(blocking=False):
            taken += 1
        yield taken
    finally:
        for _ in range(taken):
            CORES.release()
