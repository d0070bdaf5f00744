"""One-shot cleaning of partition directories: what `logcleaner clean` does, as a library.

Owns finding the partitions under the paths a user gives (a partition directory or a log directory of
them, never KRaft's `__cluster_metadata-0` nor `-delete`/`-future`/`-stray` directories), planning them
(each one's log dir view and its policy by `cleaner.policy`'s rule: `plan_partitions`; with the refusals every
clean shares, on threads or in Spark: `plan_clean`), and cleaning each one by its `cleanup.policy`: retention
(`cleaner.retention`) of expired segments and segments below the log start first, then — compacted topics —
rounds until the dirty section is done (a full offset map means several rounds) regardless of
`min.cleanable.dirty.ratio`, each launched as the daemon's threads launch theirs (`cleaner.launch`), then the
delete-horizon passes Kafka would come back for (KIP-534: a kept tombstone or marker whose horizon has passed;
`delete.retention.ms=0` makes the one the first pass stamps due at once), then `retention.bytes` on the
compacted log. A failing partition does not stop the others; its outcome says why.

Several partitions (`clean_planned`) are cleaned on `log.cleaner.threads` threads (at most one a core), each with
its own offset map — its share of `log.cleaner.dedupe.buffer.size`, as Kafka divides it — and each taking the
next partition, the largest dirty section first (`dirty_section_bytes`); the first thread cleans in this
process, each other one drives a worker process (`cleaner.workers`, `clean_partition_job`) so that no GIL is
shared; the outcomes are reported in the plan's order whatever order they finish in.
`cleaner.spark_clean` runs the same `clean_partition` in Spark tasks instead of threads; `total_summary` adds
outcomes up.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from offsetmap import OffsetMap
from segments.codec.errors import LogStateError, SegmentError, display_path
from segments.files.fileio import DEFAULT_FILE_OPS, BackgroundRemover, FileOps
from segments.files.names import parse_segment_file_name
from segments.files.pathcheck import RefusedPath, describe_os_error, find_partition_dirs, partition_dir_name_problem
from segments.files.readahead import WindowRing
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from segments.partition.locks import log_dir_owner
from segments.partition.log import Mode, PartitionLog, parse_partition_dir_name

from . import launch
from .errors import CleanerError
from .policy import (
    NEVER_TOUCHED_TOPICS,
    ClusterView,
    PolicyError,
    TopicPolicy,
    cluster_view,
    resolve_policy,
    unknown_policy_hint,
)
from .retention import RetentionResult, apply_retention
from .round import CleaningAbortedError, RoundResult
from .settings import CleanerSettings, Settings
from .survey import WINDOW_BYTES, SurveyMemo
from .throttle import Throttle
from .workers import (
    WorkerContext,
    WorkerDiedError,
    WorkerProcess,
    recover_partition,
    suspended_together,
    use_processes,
)

__all__ = [
    "CleanRefusedError", "PartitionOutcome", "PlannedPartition", "clean_partition", "clean_planned",
    "dirty_section_bytes", "dirty_section_sizes", "find_partitions", "largest_first", "plan_clean", "plan_partitions",
    "refused_summary", "total_summary",
]

log = logging.getLogger(__name__)

ROUNDS_MAX = 1_000_000  # a bound on rounds for one partition; each round makes progress, so never reached
# Horizon passes after the dirty section is done. Two suffice: the first removes what earlier rounds stamped
# and stamps the markers of transactions whose last data (tombstones) it removed; the second removes those.
HORIZON_PASSES_MAX = 3


@dataclass(slots=True)
class PartitionOutcome:
    """The rounds one partition went through, or the error that stopped it."""

    directory: str
    rounds: list[RoundResult] = field(default_factory=list)
    retention: list[RetentionResult] = field(default_factory=list)  # before and after the rounds
    error: str | None = None
    skipped: str | None = None
    policy: TopicPolicy | None = None  # the policy it was cleaned by, and where that came from

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> dict:
        out: dict = {"partition": os.path.basename(self.directory), "directory": self.directory}
        if self.skipped:
            out.update(status="skipped", reason=self.skipped)
            return out
        if self.policy is not None:
            out.update(cleanup_policy=",".join(self.policy.policy or ()), policy_source=self.policy.source)
        out["status"] = "ok" if self.ok else "failed"
        if self.error:
            out["error"] = self.error
        out["rounds"] = len(self.rounds)
        if self.retention:
            out.update(
                segments_deleted=sum(r.segments_deleted for r in self.retention),
                bytes_deleted=sum(r.bytes_deleted for r in self.retention),
                log_start_offset=self.retention[-1].log_start_offset,
                retention_reasons=sorted({r.reason for r in self.retention}),
                retention_dry_run=self.retention[-1].dry_run,
            )
        if self.rounds:
            first, last = self.rounds[0], self.rounds[-1]
            out.update(
                first_dirty=first.first_dirty,
                end_offset=last.end_offset,
                first_uncleanable=last.first_uncleanable,
                dry_run=last.dry_run,
                size_before_bytes=first.size_before_bytes,
                size_after_bytes=last.size_after_bytes,
                map_utilization=max(r.map_utilization for r in self.rounds),
            )
            for name in (
                "records_indexed", "bytes_read", "bytes_written", "records_read", "records_written",
                "batches_read", "batches_written", "invalid_records", "survey_bytes_read", "survey_s", "index_s",
                "recopy_s", "elapsed_s",
            ):
                out[name] = sum(getattr(r, name) for r in self.rounds)
            # kept tombstones and markers wait for this horizon (-1: none): a later clean removes them then
            out["next_delete_horizon_ms"] = last.next_delete_horizon_ms
        return out


TOTAL_SUMMED = ("rounds", "segments_deleted", "bytes_deleted", "records_read", "records_written", "bytes_read",
                "bytes_written", "size_before_bytes", "size_after_bytes", "invalid_records")


def total_summary(summaries: list[dict]) -> dict:
    """The total of partitions' `PartitionOutcome.summary()`s: `partitions`, how many are `ok`, `failed` and
    `skipped`, and the sums of `TOTAL_SUMMED` (a field a summary lacks counts 0)."""
    statuses = [s["status"] for s in summaries]
    out: dict = {"partitions": len(summaries), "ok": statuses.count("ok"), "failed": statuses.count("failed"),
                 "skipped": statuses.count("skipped")}
    for name in TOTAL_SUMMED:
        out[name] = sum(s.get(name, 0) for s in summaries)
    return out


def refused_summary(item: RefusedPath) -> dict:
    """The summary of a path that `find_partition_dirs` refused as a partition and that fails a clean
    (`item.failed`: a symbolic link, a file that is not a regular one, in a log dir), in `summary()`'s shape."""
    return {"partition": display_path(item.path.name), "directory": display_path(item.path), "status": "failed",
            "error": str(item)}


def find_partitions(paths: list[str | os.PathLike]) -> Iterator[Path]:
    """Partition directories named by `paths` (each one, or the children of a log directory), sorted.

    What is refused (symbolic links, invalid names: `segments.files.pathcheck.find_partition_dirs`) is left out;
    a caller that must report it calls `find_partition_dirs` itself.
    """
    yield from find_partition_dirs(paths)[0]


@dataclass(frozen=True, slots=True)
class PlannedPartition:
    """A partition to clean, the view of its log dir's cluster, and its policy (`policy.known` or not)."""

    directory: Path
    view: ClusterView
    policy: TopicPolicy


def plan_partitions(partitions: list[Path], settings: Settings, *, named: frozenset[Path] = frozenset()
                    ) -> list[PlannedPartition]:
    """Each partition with its log dir's `ClusterView` (read once per log dir) and its policy; `named`
    are the partition directories the user named one by one. Raises `cleaner.policy.PolicyError`."""
    views: dict[Path, ClusterView] = {}
    planned = []
    for directory in partitions:
        log_dir = directory.parent
        if log_dir not in views:
            views[log_dir] = cluster_view(log_dir, settings)
        parsed = parse_partition_dir_name(directory.name)
        topic = parsed[0] if parsed is not None else directory.name
        planned.append(PlannedPartition(directory, views[log_dir],
                                        resolve_policy(topic, views[log_dir], named=directory in named)))
    return planned


class CleanRefusedError(CleanerError):
    """`clean` refuses the whole request and changes nothing: the message is one line, `details` are lines that
    follow it (each unknown policy's topic and the line that decides it); `exit_code` 2 for what the request
    asks (usage), 1 for what a log dir holds (a running broker, KRaft metadata that cannot be read)."""

    def __init__(self, message: str, *, exit_code: int, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.details = details


def plan_clean(partitions: list[Path], settings: Settings, *, named: frozenset[Path] = frozenset()
               ) -> list[PlannedPartition]:
    """The plan of a clean of `partitions` (found by `segments.files.pathcheck.find_partition_dirs`), by the rules
    `logcleaner clean` and `clean --spark` (and `cleaner.spark_clean.clean_partitions`) share: a partition in two
    of the log dirs is refused (Kafka refuses to start so), a log dir a running broker owns is refused, each
    topic's policy is resolved (`plan_partitions`), and a topic whose policy is unknown refuses the whole plan.
    Raises `CleanRefusedError`."""
    names = [p.name for p in partitions]
    if twice := sorted({n for n in names if names.count(n) > 1}):  # which copy is the log would be a guess
        raise CleanRefusedError(
            f"partition {twice[0]} is in two of the given log dirs "
            f"({', '.join(str(p.parent) for p in partitions if p.name == twice[0])}); Kafka refuses to start so, "
            "and so does logcleaner: clean one log dir at a time", exit_code=2)
    for log_dir in sorted({p.parent for p in partitions}):
        if (owner := log_dir_owner(log_dir)) is not None:
            raise CleanRefusedError(str(owner), exit_code=1)
    try:
        plan = plan_partitions(partitions, settings, named=named)
    except PolicyError as exc:
        raise CleanRefusedError(str(exc), exit_code=1) from None
    unknown: dict[str, list[PlannedPartition]] = {}
    for planned in plan:
        if not planned.policy.known and not planned.policy.never:
            unknown.setdefault(planned.policy.topic, []).append(planned)
    if unknown:  # one error, its first line complete in itself; the topics follow, indented
        details = []
        for topic, items in sorted(unknown.items()):
            details += [f"  {topic} ({len(items)} partition(s)): {items[0].policy.source}",
                        f"    {unknown_policy_hint(topic)}"]
        raise CleanRefusedError(f"the cleanup policy of {len(unknown)} topic(s) is unknown (listed below), so nothing "
                                "was changed; decide each in the config file (-c) or with --set",
                                exit_code=2, details=tuple(details))
    return plan


def clean_partition(
    directory: Path,
    settings: Settings,
    *,
    now_ms: int,
    policy: TopicPolicy | None = None,
    offset_map: OffsetMap | None = None,
    forced_from: int | None = None,
    forced_to: int | None = None,
    dry_run: bool = False,
    once: bool = False,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    file_ops: FileOps = DEFAULT_FILE_OPS,
    throttle: Throttle | None = None,
    check_abort: Callable[[], None] | None = None,
    remover: BackgroundRemover | None = None,
    recopy_threads: int = 1,
) -> PartitionOutcome:
    """Clean one partition directory in rounds until done (one round with `once` or `dry_run`), each round's
    segment groups recopied on `recopy_threads` threads (`cleaner.group_runs`).

    Done with the dirty section, while the last round leaves a kept tombstone or marker whose delete horizon
    has passed at `now_ms`, another round removes it (at most `HORIZON_PASSES_MAX`), as Kafka's cleaner
    would once the horizon passed. With `once` or `dry_run` the single round is that horizon pass when
    nothing is dirty and the survey finds such a horizon passed.

    `policy`, when given, is the topic's resolved policy (`plan_partitions`), in place of the settings'
    `cleanup.policy`; an unknown one leaves the partition untouched. `file_ops` carries every durable file
    operation (a fault-injecting one in the reliability tests). Every read and write is charged beforehand
    to `throttle`, the I/O budget of the partition's device; a caller cleaning several partitions passes the
    same one per device (`DeviceThrottles.for_path` of the log dir), as `logcleaner clean` does. None: a
    budget of its own at `log.cleaner.io.max.bytes.per.second`. `check_abort`, called by every round at its
    window boundaries and while it waits for the budget, stops the partition by raising
    `CleaningAbortedError` (the round removes its `.cleaned` files): that one propagates, as no outcome."""
    outcome = PartitionOutcome(str(directory), policy=policy)
    parsed = parse_partition_dir_name(directory.name)
    if parsed is None:
        problem = partition_dir_name_problem(directory.name)
        outcome.error = f"{display_path(directory)}: not a partition directory (<topic>-<partition>): {problem}"
        return outcome
    topic_name, _ = parsed
    if topic_name in NEVER_TOUCHED_TOPICS:
        outcome.skipped = "KRaft metadata log: never cleaned"
        return outcome
    if policy is not None and not policy.known:
        outcome.skipped = policy.describe()
        return outcome
    topic = settings.topic(topic_name)
    if policy is not None and policy.policy is not None:
        topic = dataclasses.replace(topic, cleanup_policy=policy.policy)
    if offset_map is None and topic.compact:
        offset_map = launch.thread_offset_map(settings.cleaner)
    config = topic.log_config()
    ring = WindowRing(WINDOW_BYTES)  # the rounds of a partition reuse one set of read buffers
    survey_memo = SurveyMemo()  # ... and what the survey took from the segments they do not change
    if throttle is None:
        throttle = Throttle(settings.cleaner.io_max_bytes_per_second)
    try:
        # A dry run reads as a reader does: no lock file, no index rebuilt on disk, nothing written at all.
        mode: Mode = "reader" if dry_run else "cleaner"
        # one of the process's cores held over all of it (`launch.core`), the rounds included
        with launch.core(check_abort), PartitionLog.open(directory, mode=mode, config=config, file_ops=file_ops,
                                                         remover=remover if mode == "cleaner" else None,
                                                         check_abort=check_abort) as plog:
            if forced_from is not None and not plog.log_start_offset <= forced_from <= plog.log_end_offset:
                raise LogStateError(f"{display_path(directory)}: --from-offset {forced_from} is outside the log "
                                    f"[{plog.log_start_offset}, {plog.log_end_offset}]")
            # Expired segments go before cleaning (no point compacting them); retention.bytes is applied
            # after it, so it measures the compacted log. A dry run reports every rule on the log as it is.
            deleted = apply_retention(plog, topic, now_ms, by_size=dry_run, dry_run=dry_run)
            if deleted is not None:
                outcome.retention.append(deleted)
            start = forced_from
            horizon_passes = 0
            for _ in range(ROUNDS_MAX if topic.compact else 0):
                assert offset_map is not None  # allocated above for a compacted topic
                result = launch.launch_round(
                    plog, topic, settings.cleaner, offset_map, throttle, lambda: now_ms,
                    ring=ring, survey_memo=survey_memo, check_abort=check_abort, on_bytes=on_bytes, forced_from=start,
                    forced_to=forced_to,
                    dry_run=dry_run, horizon_pass=True, recopy_threads=recopy_threads,
                )
                outcome.rounds.append(result)
                if once or dry_run:
                    break
                if not result.done and result.end_offset > result.first_dirty:
                    start = result.end_offset  # the map filled: the next round goes on from there
                    continue
                if not 0 <= result.next_delete_horizon_ms <= now_ms or horizon_passes >= HORIZON_PASSES_MAX:
                    break
                horizon_passes += 1
                start = None  # from the checkpoint: the dirty section is done, the pass recopies the clean one
            if not dry_run and (deleted := apply_retention(plog, topic, now_ms)) is not None:
                outcome.retention.append(deleted)
    except CleaningAbortedError:
        raise  # stopped by the caller, not failed: the caller says what became of the partition
    except (SegmentError, OSError) as exc:
        outcome.error = describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
        log.info("cleaning failed dir=%s error=%s", display_path(directory), outcome.error)  # the outcome reports it
    except Exception as exc:  # the per-partition boundary: one partition's bug must not stop the rest
        outcome.error = f"{type(exc).__name__}: {exc}"
        log.exception("cleaning failed unexpectedly dir=%s", directory)
    return outcome


def clean_partition_job(context: WorkerContext, *, planned: PlannedPartition, cleaner: CleanerSettings, now_ms: int,
                        forced_from: int | None, forced_to: int | None, dry_run: bool, once: bool,
                        recopy_threads: int = 1) -> PartitionOutcome:
    """`clean_partition` of one planned partition in a worker process (`cleaner.workers`), as `clean_planned`'s
    threads run it in theirs: the worker's offset map (this thread's share of the dedupe buffer), its budget
    (the parent's, per device), abort check, byte counts and remover."""
    return clean_partition(
        planned.directory, planned.view.settings, now_ms=now_ms, policy=planned.policy,
        offset_map=context.offset_map(cleaner), forced_from=forced_from, forced_to=forced_to, dry_run=dry_run,
        once=once, on_bytes=context.on_bytes, throttle=context.throttle, check_abort=context.check_abort,
        remover=context.remover, recopy_threads=recopy_threads,
    )


def _recover(planned: PlannedPartition) -> str | None:
    """`workers.recover_partition` of a planned partition whose worker died, with its topic's log config."""
    parsed = parse_partition_dir_name(planned.directory.name)
    if parsed is None:
        return "not a partition directory"
    return recover_partition(planned.directory, planned.view.settings.topic(parsed[0]).log_config())


def dirty_section_bytes(directory: Path, checkpoint: int | None) -> int:
    """What `clean_planned` orders partitions by, cheaply: the bytes of the inactive `.log` files of `directory`
    that hold offsets at or above `checkpoint` (its first dirty offset; None: every inactive one). A listing and
    an `lstat` per segment; no file is opened (the exact figure, `cleaner.cleanable.cleanable_range`, needs every
    batch header read). 0 when the directory cannot be listed: the clean itself reports why."""
    try:
        with os.scandir(directory) as entries:
            found = sorted((parsed.offset, entry) for entry in entries
                           if (parsed := parse_segment_file_name(entry.name)) is not None
                           and parsed.kind == ".log" and not parsed.state)
        # the last segment is the active one, never cleaned; a segment ends where the next one begins
        return sum(entry.stat(follow_symlinks=False).st_size for (_, entry), (next_base, _) in zip(found, found[1:])
                   if checkpoint is None or next_base > checkpoint)
    except OSError:
        return 0


def dirty_section_sizes(plan: list[PlannedPartition]) -> list[int]:
    """For each planned partition, what `clean_planned` and `clean --spark` order the work by: its dirty section's
    bytes (`dirty_section_bytes`, from its log dir's cleaner checkpoint, read once per log dir) when its topic is
    compacted, else 0 (skipped, or retention only: quick)."""
    checkpoints: dict[Path, dict] = {}
    sizes = []
    for planned in plan:
        parsed = parse_partition_dir_name(planned.directory.name)
        if parsed is None or planned.policy.policy is None or "compact" not in planned.policy.policy:
            sizes.append(0)  # skipped, or retention only: quick
            continue
        log_dir = planned.directory.parent
        if log_dir not in checkpoints:
            try:
                checkpoints[log_dir] = read_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT)
            except (SegmentError, OSError):
                checkpoints[log_dir] = {}  # the round reports an unreadable checkpoint
        sizes.append(dirty_section_bytes(planned.directory, checkpoints[log_dir].get(parsed)))
    return sizes


def largest_first(sizes: list[int]) -> list[int]:
    """The indexes of `sizes`, the largest first (ties in their order)."""
    return sorted(range(len(sizes)), key=lambda i: -sizes[i])


def clean_planned(
    plan: list[PlannedPartition],
    cleaner: CleanerSettings,
    *,
    now_ms: int,
    report: Callable[[PartitionOutcome], None],
    throttle_for: Callable[[Path], Throttle],
    forced_from: int | None = None,
    forced_to: int | None = None,
    dry_run: bool = False,
    once: bool = False,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
) -> None:
    """Clean every planned partition (`clean_partition`, by its log dir's settings and its policy) on
    `cleaner.threads` threads, each with its own offset map (`launch.thread_offset_map`: its share of
    `log.cleaner.dedupe.buffer.size` among the threads that run, at most one a partition and one a core; threads
    left over recopy the partitions' groups), reused from partition to partition, each taking the next partition, the
    largest dirty section first (`dirty_section_bytes`). `throttle_for(directory)` is the I/O budget of the
    partition's device, shared by the threads. At most one thread a core (`launch.cores`); the first cleans in
    this process, each other one in its worker process (`cleaner.workers`; `LOGCLEANER_WORKERS=threads`: here
    too), whose death fails only the partition it was cleaning (`WorkerDiedError`).

    `report` is called in the calling thread with each outcome, in the plan's order, as soon as that partition
    and every one before it is finished; `on_bytes` from the threads, one call at a time and never during a
    `report`. An exception in the calling thread (KeyboardInterrupt, one a signal handler raises, one of
    `report`) stops the threads taking partitions and aborts the running rounds at their next check (the round
    removes its `.cleaned` files; such a partition is left as it was and gets no outcome); once the threads have
    ended, the outcomes finished but not yet reported are reported (in the plan's order; not after an `OSError`
    of `report`'s, such as a closed pipe) and the exception propagates.
    """
    # threads past the cores would only wait for one (`launch.CORES`); each past the first cleans in a process
    workers_wanted = min(cleaner.threads, len(plan), launch.cores())
    # threads beyond one a partition recopy the groups of a partition's rounds (`cleaner.group_runs`): fewer
    # partitions than threads still use them
    recopy_threads = max(1, min(cleaner.threads, launch.cores()) // max(1, len(plan)))
    # The dedupe buffer is shared by the threads that clean partitions at once: a thread with no partition of its
    # own indexes nothing, so its share would be lost (one partition on two threads: half the map, more rounds).
    cleaner = dataclasses.replace(cleaner, threads=max(1, workers_wanted))
    # The first thread cleans in this process; each other one in a worker process of its own (`cleaner.workers`:
    # no GIL shared with the others), started first, while this process has no other thread, as a fork of it,
    # with its modules imported (a new interpreter would take 0.2-0.3 s to start: bench/RESULTS.md).
    processes: list[WorkerProcess | None] = [None] * workers_wanted
    if use_processes():
        for k in range(1, workers_wanted):
            try:
                processes[k] = WorkerProcess(fork=True)
            except OSError as exc:  # no process could start (a limit on processes): that thread cleans in here
                log.warning("could not start a worker process, cleaning on a thread instead: %s", exc)
    stopping = threading.Event()
    remover = BackgroundRemover()  # the swaps' `.deleted` files, removed while the threads go on; drained at the end
    changed = threading.Condition()
    io_lock = threading.Lock()  # on_bytes and report: one at a time (a progress bar is not thread-safe)
    pending = collections.deque(largest_first(dirty_section_sizes(plan)))
    finished: dict[int, PartitionOutcome | None] = {}  # None: aborted

    def check_abort() -> None:
        if stopping.is_set():
            raise CleaningAbortedError("cleaning aborted: logcleaner clean is stopping")

    def counted(n: int, direction: str) -> None:
        with io_lock:
            on_bytes(n, direction)


    def work(k: int) -> None:
        offset_map = None
        worker = processes[k]
        try:
            while not stopping.is_set():
                with changed:
                    if not pending:
                        return
                    i = pending.popleft()
                planned = plan[i]
                outcome: PartitionOutcome | None
                try:
                    if worker is not None and not worker.alive():  # it died cleaning the partition before
                        try:
                            worker = processes[k] = WorkerProcess()
                        except OSError as exc:
                            log.warning("could not start a worker process, cleaning on a thread instead: %s", exc)
                            worker = processes[k] = None
                    if worker is not None:
                        outcome = worker.call(
                            "cleaner.oneshot:clean_partition_job",
                            dict(planned=planned, cleaner=cleaner, now_ms=now_ms, forced_from=forced_from,
                                 forced_to=forced_to, dry_run=dry_run, once=once, recopy_threads=recopy_threads),
                            throttle=throttle_for(planned.directory.parent), on_bytes=counted, check_abort=check_abort,
                        )
                    else:
                        if offset_map is None:
                            offset_map = launch.thread_offset_map(cleaner)
                        outcome = clean_partition(
                            planned.directory, planned.view.settings, now_ms=now_ms, policy=planned.policy,
                            offset_map=offset_map, forced_from=forced_from, forced_to=forced_to, dry_run=dry_run,
                            once=once, on_bytes=counted, throttle=throttle_for(planned.directory.parent),
                            check_abort=check_abort, remover=remover, recopy_threads=recopy_threads,
                        )
                except CleaningAbortedError as exc:
                    outcome = None
                    if worker is not None and not stopping.is_set():
                        # not the command's abort: a SIGTERM or SIGINT sent to the worker alone ended its round,
                        # which left the partition as it was; it fails, and a new worker takes the next one
                        outcome = PartitionOutcome(str(planned.directory), policy=planned.policy,
                                                   error=f"{display_path(planned.directory)}: {exc}; the partition "
                                                         "was left as it was")
                    elif worker is not None and not worker.alive():  # killed, not stopping at the abort: its leftovers
                        _recover(planned)
                except WorkerDiedError as exc:  # a signal, the OOM killer: this partition fails, a new worker goes on
                    unrecovered = _recover(planned)
                    if stopping.is_set():
                        outcome = None  # stopping anyway (a SIGTERM to every process of the command): no failure
                    else:
                        outcome = PartitionOutcome(
                            str(planned.directory), policy=planned.policy,
                            error=f"{display_path(planned.directory)}: {exc} while cleaning it; " + (
                                "what its round left was recovered" if unrecovered is None
                                else f"its leftovers are removed by the next clean ({unrecovered})"))
                except Exception as exc:  # the per-partition boundary, as in clean_partition (the map, the throttle)
                    log.exception("cleaning failed unexpectedly dir=%s", planned.directory)
                    outcome = PartitionOutcome(str(planned.directory), policy=planned.policy,
                                               error=f"{type(exc).__name__}: {exc}")
                with changed:
                    finished[i] = outcome
                    changed.notify_all()
        finally:
            if worker is not None:
                worker.close(stopping=stopping.is_set())  # it removes its swaps' old segments first

    workers = [threading.Thread(target=work, args=(k,), name=f"logcleaner-clean-{k}", daemon=True)
               for k in range(workers_wanted)]
    for worker in workers:
        worker.start()
    reported = 0
    try:
        with suspended_together(lambda: processes):  # a terminal's Ctrl-Z stops the workers with the command
            while reported < len(plan):
                with changed:
                    while reported not in finished:
                        if not any(worker.is_alive() for worker in workers):
                            raise RuntimeError(f"{plan[reported].directory}: no cleaner thread is left to clean it")
                        changed.wait(0.5)  # a signal's exception is raised here too
                    outcome = finished[reported]
                reported += 1
                if outcome is not None:
                    with io_lock:
                        report(outcome)
    except BaseException as exc:
        stopping.set()
        for worker in workers:
            worker.join()
        remover.drain()
        if not isinstance(exc, OSError):
            for i in range(reported, len(plan)):
                if (outcome := finished.get(i)) is not None:
                    report(outcome)
        raise
    for worker in workers:
        worker.join()
    remover.drain()
