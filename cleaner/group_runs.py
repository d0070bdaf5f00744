"""A round's recopy of its segment groups, on one thread or several, each group swapped in in log order.

Owns which groups may be recopied at once and the order of their swaps. The groups of a round are independent
but for one figure carried from group to group: per producer, the data batches of its current transaction
written so far (`RecopyContext.txn_data_written`), by which a COMMIT/ABORT marker may go only when its
transaction keeps none. A group boundary that some closed transaction spans (first data below it, marker at or
above it) therefore joins its two groups into one *run*, recopied in order on one thread; runs start with no
transaction open in the carried figure, as the sequential recopy finds them (`independent_runs`). Given
`threads` read buffers (rings) and two runs or more, runs are recopied on that many threads, one ring each (the
kernels release the GIL for a window's work), at most `threads` groups ahead of the last swap (bounding the
disk a round holds in `.cleaned` files); the round's thread swaps each group in as soon as it and every group
before it are written, so the log goes from old to new group by group in log order exactly as with one thread,
and the output is byte for byte the same. A group that fails stops the others at their next window: the groups
before it stay swapped, every later group's `.cleaned` files are removed, and its error is raised.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from segments.files.readahead import WindowRing
from segments.files.segment import LogSegment
from segments.partition.log import PartitionLog

from .errors import CleanerError
from .recopy import RecopyContext, RecopyStats, clean_group
from .survey import LogSurvey

__all__ = ["independent_runs", "recopy_groups"]


class _Stopped(CleanerError):
    """Raised inside a recopy thread once an earlier group failed: its group is abandoned, its files removed."""


def independent_runs(groups: list[list[LogSegment]], survey: LogSurvey, carried: bool) -> list[list[int]]:
    """The groups (indices) as runs of consecutive groups that share a transaction (see the module docstring);
    every group on its own when nothing is `carried` (a partial round decides markers by the survey alone)."""
    if not groups:
        return []
    table = survey.transaction_table
    closed = table.marker_offset >= 0
    first, marker = table.first_offset[closed], table.marker_offset[closed]
    runs = [[0]]
    for k in range(1, len(groups)):
        boundary = groups[k][0].base_offset
        if carried and bool(np.any((first < boundary) & (marker >= boundary))):
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def recopy_groups(
    log_: PartitionLog,
    groups: list[list[LogSegment]],
    ctx: RecopyContext,
    stats: RecopyStats,
    swap: Callable[[list[LogSegment], LogSegment | None], None],
    *,
    rings: Sequence[WindowRing],
    check_abort: Callable[[], None] = lambda: None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    charge_io: Callable[[int], None] = lambda n: None,
) -> None:
    """Recopy every group (`cleaner.recopy.clean_group`) and call `swap(group, cleaned)` for each, in log order,
    on this thread (`cleaned` is None when there is nothing to swap: a dry run, a group unchanged). `stats`
    collects every group's counters. Each of `rings` (read buffers) serves one thread: with more than one,
    independent runs of groups are recopied at once (module docstring), `rings[0]` on one thread alone. Raises the
    first error in log order, after every other recopy thread has stopped and removed its files; the groups
    before it are swapped."""
    runs = independent_runs(groups, ctx.survey, ctx.txn_data_written is not None) if len(rings) > 1 else []
    if len(runs) < 2:
        for group in groups:
            swap(group, clean_group(log_, group, ctx, stats, check_abort=check_abort, on_bytes=on_bytes,
                                    ring=rings[0], charge_io=charge_io))
        return
    _Parallel(log_, groups, runs, ctx, rings[: len(runs)], check_abort, on_bytes, charge_io).run(stats, swap)


class _Parallel:
    """The state of one parallel recopy: the runs to take, each group's outcome, how far the swaps are."""

    def __init__(self, log_, groups, runs, ctx, rings, check_abort, on_bytes, charge_io) -> None:
        self.log, self.groups, self.ctx, self.rings, self.threads = log_, groups, ctx, rings, len(rings)
        self.check_abort, self.on_bytes, self.charge_io = check_abort, on_bytes, charge_io
        self.pending = list(reversed(runs))  # popped from the end: in log order
        self.changed = threading.Condition()
        # per group: (cleaned or None, its stats) once written, or the exception that ended it
        self.done: dict[int, tuple[LogSegment | None, RecopyStats] | BaseException] = {}
        self.swapped = 0  # groups swapped (or found unchanged) so far, in log order
        self.failed = False

    def _stop_check(self) -> None:
        if self.failed:
            raise _Stopped("an earlier group of the round failed")
        self.check_abort()

    def _work(self, k: int) -> None:
        ring = self.rings[k]
        while True:
            with self.changed:
                if self.failed or not self.pending:
                    return
                run = self.pending.pop()
            carried: dict[int, int] | None = {} if self.ctx.txn_data_written is not None else None
            ctx = dataclasses.replace(self.ctx, txn_data_written=carried)  # each run starts with none open
            for g in run:
                with self.changed:  # at most `threads` groups written ahead of the swaps: bounded disk
                    while not self.failed and g - self.swapped > self.threads:
                        self.changed.wait(0.1)
                outcome: tuple[LogSegment | None, RecopyStats] | BaseException
                try:
                    self._stop_check()
                    group_stats = RecopyStats()
                    cleaned = clean_group(self.log, self.groups[g], ctx, group_stats, check_abort=self._stop_check,
                                          on_bytes=self.on_bytes, ring=ring, charge_io=self.charge_io)
                    outcome = (cleaned, group_stats)
                except BaseException as exc:  # noqa: BLE001 - raised on the round's thread, in log order
                    outcome = exc
                with self.changed:
                    self.done[g] = outcome
                    self.changed.notify_all()
                if isinstance(outcome, BaseException):
                    return

    def run(self, stats: RecopyStats, swap: Callable[[list[LogSegment], LogSegment | None], None]) -> None:
        started = time.monotonic()
        workers = [threading.Thread(target=self._work, args=(k,), name=f"logcleaner-recopy-{k}", daemon=True)
                   for k in range(self.threads)]
        failed = True
        try:
            for worker in workers:
                worker.start()
            for g, group in enumerate(self.groups):
                with self.changed:
                    while g not in self.done:
                        if not any(worker.is_alive() for worker in workers):
                            raise RuntimeError(f"group {g} of the round was left unwritten by its recopy thread")
                        self.changed.wait(0.1)
                    outcome = self.done.pop(g)
                if isinstance(outcome, BaseException):
                    raise outcome
                cleaned, group_stats = outcome
                _add(stats, group_stats)
                swap(group, cleaned)
                with self.changed:
                    self.swapped = g + 1
                    self.changed.notify_all()
            failed = False
        finally:
            with self.changed:
                self.failed = True  # the threads stop at their next window, or before their next group
                self.changed.notify_all()
            for worker in workers:
                if worker.ident is not None:
                    worker.join()
            if failed:
                for outcome in self.done.values():  # written, never to be swapped
                    if isinstance(outcome, tuple) and outcome[0] is not None:
                        outcome[0].delete_files()
            stats.elapsed_s = time.monotonic() - started


def _add(total: RecopyStats, part: RecopyStats) -> None:
    """Add one group's counters to the round's (the soonest pending horizon kept; the groups' list in order)."""
    for f in dataclasses.fields(RecopyStats):
        name = f.name
        if name in ("earliest_delete_horizon_ms", "elapsed_s"):
            continue
        if name == "groups":
            total.groups.extend(part.groups)
        else:
            setattr(total, name, getattr(total, name) + getattr(part, name))
    soonest = part.earliest_delete_horizon_ms
    if soonest >= 0 and (total.earliest_delete_horizon_ms < 0 or soonest < total.earliest_delete_horizon_ms):
        total.earliest_delete_horizon_ms = soonest
