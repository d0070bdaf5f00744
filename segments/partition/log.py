"""The partition log: a `<topic>-<partition>/` directory of segments, opened, appended, read and recovered.

Owns the segment set of one partition and the rules that span segments: opening (leftover recovery,
index validation and rebuild, pass-5 recovery of unflushed segments), appending as the single writer
(offset assignment, rolling by `segment.bytes`, `segment.ms`, a full index and the 2^31 relative-offset
limit), reading with Kafka's semantics, lookup by timestamp, and replacing a run of segments with cleaned
ones through the `.cleaned → .swap → .deleted` protocol. It does not decide what to clean (that is `cleaner/`).

Modes, under the protocol of `segments.partition.locks`: "writer" holds `.writer.lock` for its life and alone
appends and rolls; "cleaner" holds `.cleaner.lock` for its life, never writes the active segment and swaps
segments below it (both under `.swap.lock`); "reader" holds only a shared `.swap.lock` while listing (if that
file exists), creates and writes nothing, and rebuilds a missing or bad index in memory only.

`replace_segments` fsyncs each step before the next, so a reopen after a crash finds each group all old or all
new (docs/format.md section 4); old files are deleted right after the swap, and a reader that opened them keeps
its descriptor. Only the writer's active segment may end in a torn batch (a crash mid-append; cut at open); any
other invalid batch raises `CorruptRecordError` naming the file and position and leaves the files as they were.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from ..codec import format as fmt
from ..codec.errors import (
    CorruptIndexError,
    CorruptRecordError,
    LockTimeoutError,
    LogStateError,
    OffsetOutOfRangeError,
    SegmentError,
)
from ..codec.records import Record, RecordBatch, encode_batch
from ..files import faults, pathcheck
from ..files.fileio import DEFAULT_FILE_OPS, BackgroundRemover, FileOps
from ..files.names import parse_segment_file_name
from ..files.segment import FetchData, LogSegment, segment_paths
from .checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    GENERATIONS_FILE,
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    SURVIVORSHIP_CHECKPOINT,
    cached_offset_checkpoint,
    update_offset_checkpoint,
)
from .locks import CLEANER_LOCK, SWAP_LOCK, WRITER_LOCK, LogDirLock, PartitionLock
from .recovery import LeftoverPlan, plan_leftover_recovery, recover_leftovers

__all__ = [
    "CHECKPOINT_LOCK", "LogConfig", "PartitionLog", "parse_partition_dir_name", "update_log_dir_checkpoint", "AppendInfo",
    "IndexRebuild",
    "Mode",
]

log = logging.getLogger(__name__)

Mode = Literal["writer", "cleaner", "reader"]

LOG_DIR_CHECKPOINTS = (
    CLEANER_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT,
    SURVIVORSHIP_CHECKPOINT,
)
CHECKPOINT_LOCK = ".logcleaner-checkpoints.lock"  # in the log dir root; guards read-modify-write of checkpoints
_LOCK_TIMEOUT_S_DEFAULT = 30.0
_FETCH_BYTES_DEFAULT = 1024 * 1024
_DIR_MTIME_TICK_NS = 20_000_000  # coarsest directory timestamp tick allowed for (a jiffy at HZ=100 is 10 ms)
_ZERO_TAIL_READ_BYTES = 1024 * 1024  # read size while checking an index's tail for preallocated zero slots


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The topic settings the log itself uses (Kafka names in comments), with Kafka's defaults."""

    segment_bytes: int = fmt.SEGMENT_BYTES_DEFAULT  # segment.bytes
    segment_ms: int = 7 * 24 * 3600 * 1000  # segment.ms
    segment_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT  # segment.index.bytes
    index_interval_bytes: int = fmt.INDEX_INTERVAL_BYTES_DEFAULT  # index.interval.bytes
    max_message_bytes: int = fmt.MAX_MESSAGE_BYTES_DEFAULT  # max.message.bytes

    def __post_init__(self) -> None:
        if self.segment_bytes < 14:
            raise ValueError(f"segment.bytes must be at least 14, got {self.segment_bytes}")
        if self.segment_ms < 1:
            raise ValueError(f"segment.ms must be at least 1, got {self.segment_ms}")
        if self.segment_index_bytes < fmt.TIME_INDEX_ENTRY.size * 2:
            raise ValueError(f"segment.index.bytes must be at least 24, got {self.segment_index_bytes}")
        if self.index_interval_bytes < 0:
            raise ValueError(f"index.interval.bytes must be ≥ 0, got {self.index_interval_bytes}")
        if self.max_message_bytes < 0:
            raise ValueError(f"max.message.bytes must be ≥ 0, got {self.max_message_bytes}")


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an append went: the offsets it was given and the segment/position it was written at."""

    first_offset: int
    last_offset: int
    segment_base_offset: int
    position: int
    batches: int


@dataclass(frozen=True, slots=True)
class IndexRebuild:
    """An index that failed its sanity check at open and was rebuilt from its log.

    Attached to the warning logged about it (`extra={"index_rebuild": ...}`, logger `segments.partition.log`), so
    that a command line can say it in words (`cleaner.cli`) while a daemon's log keeps the key=value line.
    """

    directory: Path  # the partition directory
    file: str  # the index file's name
    position: int  # the byte of its first problem
    reason: str  # what is wrong there
    untrimmed: bool  # zero bytes from the problem to the end: preallocated slots never trimmed (see index.py)
    in_memory: bool  # rebuilt in memory only (a reader); otherwise the file was rewritten


def _zero_tail(path: Path, position: int) -> bool:
    """Whether the file holds only zero bytes from `position` to its end, and at least one: the preallocated
    slots Kafka leaves in an active segment's index files (trimmed when the segment stops being active).

    A hint for the message about a rebuilt index: a file that cannot be read gives False.
    """
    try:
        fd = pathcheck.open_no_follow(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, SegmentError):  # gone, unreadable, or a link (refused)
        return False
    try:
        pathcheck.check_regular_fd(fd, path)
        size = os.fstat(fd).st_size
        if not 0 <= position < size:
            return False
        while position < size:  # at most size / _ZERO_TAIL_READ_BYTES reads
            chunk = os.pread(fd, min(_ZERO_TAIL_READ_BYTES, size - position), position)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            position += len(chunk)
        return True
    except (OSError, SegmentError):
        return False
    finally:
        os.close(fd)


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a `<topic>-<partition>` directory name, split at the last '-'; else None.

    Kafka's grammar (`segments.files.pathcheck`): a topic of 1..249 `[a-zA-Z0-9._-]`, a canonical non-negative
    int32 partition. Suffixed forms (`-delete`, `-future`, `-stray`) and every other name give None.
    """
    return pathcheck.parse_partition_dir_name(name)


def update_log_dir_checkpoint(
    log_dir: str | os.PathLike,
    name: str,
    key: tuple[str, int],
    offset: int | None,
    *,
    file_ops: FileOps = DEFAULT_FILE_OPS,
    hint: bool = False,
) -> None:
    """Set (or, with None, remove) `key`'s entry of the checkpoint file `name` in `log_dir`.

    The read-modify-write runs under the log dir's checkpoint lock (`.logcleaner-checkpoints.lock`), so
    writers and cleaners of different partitions, in any process, never lose each other's entries. `hint`:
    see `update_offset_checkpoint`.
    """
    root = Path(log_dir)
    with PartitionLock(root, CHECKPOINT_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S_DEFAULT):
        if offset is None:
            update_offset_checkpoint(root / name, {}, removals=[key], file_ops=file_ops, hint=hint)
        else:
            update_offset_checkpoint(root / name, {key: offset}, file_ops=file_ops, hint=hint)


def remove_stale_checkpoint_temps(log_dir: str | os.PathLike, *, file_ops: FileOps = DEFAULT_FILE_OPS) -> None:
    """Remove `<checkpoint>.tmp` files a crash left in `log_dir` mid-write (under the checkpoint lock, so a
    write in progress elsewhere is never disturbed); the checkpoint itself is intact (old or new)."""
    root = Path(log_dir)
    stale = [root / (name + ".tmp") for name in LOG_DIR_CHECKPOINTS]
    if not any(p.exists() for p in stale):
        return
    with PartitionLock(root, CHECKPOINT_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S_DEFAULT):
        for path in stale:
            file_ops.remove(path)


class PartitionLog:
    """One partition's segments. Use `PartitionLog.open(...)`; close with `close()` or a `with` block."""

    def __init__(self, directory: Path, mode: Mode, config: LogConfig, file_ops: FileOps, clock_ms: Callable[[], int]):
        parsed = parse_partition_dir_name(directory.name)
        if parsed is None:
            problem = pathcheck.partition_dir_name_problem(directory.name)
            raise LogStateError(f"{pathcheck.display_path(directory)}: not a partition directory name "
                                f"(<topic>-<partition>): {problem}")
        self.directory = directory
        self.topic, self.partition = parsed
        self.mode: Mode = mode
        self.config = config
        self.file_ops = file_ops
        self.clock_ms = clock_ms
        self.remover: BackgroundRemover | None = None  # where a swap's `.deleted` files go (None: removed at once)
        self._mutex = threading.RLock()
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._inodes: dict[int, int] = {}
        self.leftover_plan: LeftoverPlan | None = None  # a reader's: what recovery would do (see _list_segments)
        self._listed_mtime_ns = -1
        self._listing_trusted = False  # see refresh(): a listing made within a timestamp tick of a change
        self._log_start_offset = 0
        self._owner_lock: PartitionLock | None = None
        self._log_dir_lock: LogDirLock | None = None
        self._closed = False
        self._active_created_ms = clock_ms()
        self._rolling_timestamp = fmt.NO_TIMESTAMP
        self._lock_timeout_s = _LOCK_TIMEOUT_S_DEFAULT

    # ---- opening --------------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike,
        *,
        mode: Mode = "reader",
        config: LogConfig | None = None,
        file_ops: FileOps = DEFAULT_FILE_OPS,
        clock_ms: Callable[[], int] | None = None,
        create: bool = False,
        lock_timeout_s: float = _LOCK_TIMEOUT_S_DEFAULT,
        remover: BackgroundRemover | None = None,
        check_abort: Callable[[], None] | None = None,
    ) -> "PartitionLog":
        """Open (with `create`, make) the partition directory and recover it as far as `mode` allows.

        With `remover`, the files a swap leaves as `.deleted` are removed on its thread, not in the swap.
        `check_abort()` is called while the open waits for a busy lock; what it raises ends the wait.

        Raises `LockTimeoutError` if another writer (mode "writer") or cleaner (mode "cleaner") has it,
        `CorruptRecordError` for corruption that is not a torn tail (nothing is changed then).
        """
        directory = Path(directory)
        if create:
            if mode != "writer":
                raise ValueError("only a writer creates a partition directory")
            directory.mkdir(parents=True, exist_ok=True)
        elif not directory.is_dir():
            raise LogStateError(f"{pathcheck.display_path(directory)}: no such partition directory")
        # Nothing inside a log dir is followed: the directory and its entries are checked before any open.
        pathcheck.check_partition_dir(directory)
        self = cls(directory, mode, config or LogConfig(), file_ops, clock_ms or (lambda: int(time.time() * 1000)))
        self._lock_timeout_s = lock_timeout_s
        self.remover = remover
        try:
            self._open(check_abort)
        except BaseException:
            self.close()
            raise
        return self

    def _open(self, check_abort: Callable[[], None] | None = None) -> None:
        if self.mode != "reader":
            # No file of a log dir a running Kafka broker owns is changed (segments.partition.locks: the log dir's .lock)
            self._log_dir_lock = LogDirLock(self.directory.parent).acquire()
        if self.mode == "writer":
            self._owner_lock = PartitionLock(self.directory, WRITER_LOCK)
            try:
                self._owner_lock.acquire(timeout_s=0)
            except LockTimeoutError:
                self._owner_lock = None
                raise LockTimeoutError(f"{self.directory}: another writer has this partition open") from None
        elif self.mode == "cleaner":
            self._owner_lock = PartitionLock(self.directory, CLEANER_LOCK).acquire(timeout_s=self._lock_timeout_s,
                                                                                   check_abort=check_abort)
        if self.mode == "reader":
            with self._listing_lock():
                self._list_segments()
                self._load_log_start_offset()
                self._check_indexes(rebuild_files=False)
            return
        with PartitionLock(self.directory, SWAP_LOCK).acquire(timeout_s=self._lock_timeout_s, check_abort=check_abort):
            self._recover_leftovers()
            remove_stale_checkpoint_temps(self.directory.parent, file_ops=self.file_ops)
            for name in (LEADER_EPOCH_CHECKPOINT, GENERATIONS_FILE):
                self.file_ops.remove(self.directory / (name + ".tmp"))
            self._list_segments()
            self._load_log_start_offset()
            if self.mode == "writer":
                self._recover_unflushed()
                if not self._segments:
                    self._create_segment(self._log_start_offset)
                    self.file_ops.fsync_dir(self.directory)
                self._prepare_active_for_append()
            else:
                self._check_indexes(rebuild_files=True)

    @contextlib.contextmanager
    def _listing_lock(self) -> Iterator[None]:
        """The shared swap lock while listing segments; a reader goes without where there is no lock file.

        Without the lock a reader may list a directory mid-swap. A reader never creates the lock file:
        where it is missing, no writer or cleaner of ours has opened the partition, so none can be
        swapping or rolling (docs/design.md, "Locks", gives the argument); where nobody can write (a read-only
        directory or file), nobody swaps either.
        """
        lock = PartitionLock(self.directory, SWAP_LOCK, shared=True, create=self.mode != "reader")
        try:
            lock.acquire(timeout_s=_LOCK_TIMEOUT_S_DEFAULT)
        except OSError as exc:  # no lock file (a reader does not create it), or EACCES, EROFS
            if self.mode != "reader":
                raise
            log.debug("listing without lock dir=%s reason=%s", self.directory, exc)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def _recover_leftovers(self) -> None:
        if self.mode == "cleaner":
            recover_leftovers(self.directory, include_cleaned=True, file_ops=self.file_ops)
            return
        # A writer may delete `.cleaned` files only if no cleaner is at work on them right now.
        probe = PartitionLock(self.directory, CLEANER_LOCK)
        try:
            probe.acquire(timeout_s=0)
        except LockTimeoutError:
            recover_leftovers(self.directory, include_cleaned=False, file_ops=self.file_ops)
            return
        try:
            recover_leftovers(self.directory, include_cleaned=True, file_ops=self.file_ops)
        finally:
            probe.release()

    def _list_segments(self) -> None:
        """(Re)build the segment list from the directory, keeping open segments whose files did not change.

        A reader, which recovers nothing, lists the segments Kafka would have after recovering the leftovers
        of an interrupted swap (`recovery.plan_leftover_recovery`: a rolled-forward `.swap` segment in place of
        the old ones it replaces, `.cleaned` and `.deleted` files left out) and keeps the plan in
        `leftover_plan`; a writer or cleaner has recovered them already and lists the live `.log` files."""
        self._listed_mtime_ns = os.stat(self.directory).st_mtime_ns
        if self.mode == "reader":
            self.leftover_plan = plan_leftover_recovery(self.directory)
            wanted = {fmt.offset_file_name(base, fmt.LOG_SUFFIX) + state: (base, state)
                      for base, state in self.leftover_plan.segments}
        else:
            wanted = {}
            for name in os.listdir(self.directory):
                parsed = parse_segment_file_name(name)
                if parsed is not None and parsed.kind == fmt.LOG_SUFFIX and parsed.state == "":
                    wanted[name] = (parsed.offset, "")
        found: dict[int, int] = {}
        suffixes: dict[int, str] = {}
        for name, (base, state) in wanted.items():
            try:  # a link, or a FIFO, socket, device or directory named like a segment, is refused unopened
                found[base] = pathcheck.check_regular_file(self.directory / name).st_ino
                suffixes[base] = state
            except FileNotFoundError:
                continue
        keep = []
        for segment in self._segments:
            if (found.get(segment.base_offset) == self._inodes.get(segment.base_offset)
                    and suffixes.get(segment.base_offset) == segment.suffix):  # a .swap renamed live: new paths
                segment.refresh_size()  # it may have been the writer's active segment when listed
                keep.append(segment)
                del found[segment.base_offset]
            else:
                self._inodes.pop(segment.base_offset, None)
                segment.close()
        writable_base = self._segments[-1].base_offset if self.mode == "writer" and self._segments else None
        for base, inode in found.items():
            segment = self._new_segment_object(base, writable=False, suffix=suffixes[base])
            segment.load_indexes()  # now, under the listing lock: later the names may be a cleaned segment's
            self._inodes[base] = inode
            keep.append(segment)
        keep.sort(key=lambda s: s.base_offset)
        self._segments = keep
        self._bases = [s.base_offset for s in keep]
        if writable_base is not None and (not keep or keep[-1].base_offset != writable_base):
            raise LogStateError(f"{self.directory}: the active segment {writable_base} disappeared")

    def _new_segment_object(self, base: int, *, writable: bool, create: bool = False, suffix: str = "") -> LogSegment:
        return LogSegment(
            self.directory,
            base,
            suffix=suffix,
            writable=writable,
            create=create,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            file_ops=self.file_ops,
        )

    def _root_checkpoint(self, name: str) -> Mapping[tuple[str, int], int]:
        return cached_offset_checkpoint(self.directory.parent / name)[0]  # read, parsed only if it changed

    def _load_log_start_offset(self) -> None:
        first = self._segments[0].base_offset if self._segments else 0
        recorded = self._root_checkpoint(LOG_START_OFFSET_CHECKPOINT).get((self.topic, self.partition))
        self._log_start_offset = max(first, recorded) if recorded is not None else first

    def _check_indexes(self, *, rebuild_files: bool) -> None:
        """Sanity-check the segments' indexes; rebuild the bad or missing ones from the log.

        A cleaner leaves the active segment alone (its writer may be appending to it); a reader checks it
        too, rebuilding in memory only (a Kafka-preallocated or half-appended index must not be searched).
        """
        segments = self._segments[:-1] if self.mode == "cleaner" else self._segments
        for segment in segments:
            self._check_segment_indexes(segment, rebuild_files=rebuild_files)

    def _check_segment_indexes(self, segment: LogSegment, *, rebuild_files: bool) -> None:
        missing = not segment.paths.index.exists() or not segment.paths.timeindex.exists()
        try:
            if not missing:
                segment.offset_index.sanity_check(segment.size_bytes)
                segment.time_index.sanity_check()
                return
        except CorruptIndexError as exc:
            event = IndexRebuild(self.directory, Path(exc.path).name, exc.position, exc.reason,
                                 untrimmed=_zero_tail(Path(exc.path), exc.position), in_memory=not rebuild_files)
            log.warning("rebuilding index dir=%s file=%s position=%d untrimmed=%s in_memory=%s reason=%r",
                        pathcheck.display_path(self.directory), event.file, event.position, event.untrimmed,
                        event.in_memory, event.reason, extra={"index_rebuild": event})
        if rebuild_files:
            writable = self._reopen_writable(segment)
            writable.recover(tail_may_be_torn=False)
            writable.flush()
        else:
            self._rebuild_in_memory(segment)

    def _rebuild_in_memory(self, segment: LogSegment) -> None:
        # Reader mode writes nothing: the segment's read-only indexes are rebuilt in memory only.
        headers = list(segment.iter_headers())
        segment.rebuild_indexes(
            np.array([p for p, _ in headers], dtype=np.int64),
            np.array([h.last_offset for _, h in headers], dtype=np.int64),
            np.array([h.max_timestamp for _, h in headers], dtype=np.int64),
            write=False,
        )

    def _reopen_writable(self, segment: LogSegment) -> LogSegment:
        """Replace `segment` in the list with a writable object on the same files."""
        i = self._segments.index(segment)
        segment.close()
        writable = self._new_segment_object(segment.base_offset, writable=True)
        self._segments[i] = writable
        return writable

    def _recover_unflushed(self) -> None:
        """Kafka's pass 5: re-validate segments from the recovery point on; cut the active one's torn tail."""
        if not self._segments:
            return
        recovery_point = self._root_checkpoint(RECOVERY_POINT_CHECKPOINT).get((self.topic, self.partition), 0)
        first = max(0, bisect.bisect_right(self._bases, recovery_point) - 1)
        for segment in self._segments[:first]:
            self._check_segment_indexes(segment, rebuild_files=True)
        for i in range(first, len(self._segments)):
            segment = self._reopen_writable(self._segments[i])
            is_last = i == len(self._segments) - 1
            result = segment.recover(tail_may_be_torn=is_last)
            if result.truncated_bytes:
                log.warning(
                    "cut torn tail dir=%s segment=%d bytes=%d", self.directory, segment.base_offset, result.truncated_bytes
                )
            segment.flush()
            if not is_last:
                segment.finalise()

    def _prepare_active_for_append(self) -> None:
        active = self._segments[-1]
        if not active.writable:
            active = self._reopen_writable(active)
        active.load_append_state()
        self._rolling_timestamp = self._first_batch_max_timestamp(active)
        self._active_created_ms = self.clock_ms()

    @staticmethod
    def _first_batch_max_timestamp(segment: LogSegment) -> int:
        header = segment.header_at(0)
        return fmt.NO_TIMESTAMP if header is None else header.max_timestamp

    def _create_segment(self, base: int) -> LogSegment:
        segment = self._new_segment_object(base, writable=True, create=True)
        self._segments.append(segment)
        self._bases.append(base)
        self._inodes[base] = os.fstat(segment.fileno()).st_ino
        return segment

    # ---- state ----------------------------------------------------------------------------------------

    @property
    def segments(self) -> list[LogSegment]:
        """The current segments, oldest first (a copy of the list)."""
        with self._mutex:
            return list(self._segments)

    def reads_mapped(self, segment: LogSegment) -> bool:
        """Whether walks of `segment` may read it through a mapping (`LogSegment.scan_windows(mapped=...)`): in a
        cleaner-mode log, which holds the cleaner lock, and not the active segment, the one file a writer may
        cut. The reasons are `segments.files.mapped`'s."""
        with self._mutex:
            return self.mode == "cleaner" and bool(self._segments) and segment is not self._segments[-1]

    @property
    def active_segment(self) -> LogSegment:
        with self._mutex:
            if not self._segments:
                raise LogStateError(f"{self.directory}: the log has no segments")
            return self._segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The next offset to be assigned (the active segment's next offset)."""
        with self._mutex:
            return self._segments[-1].read_next_offset() if self._segments else self._log_start_offset

    @property
    def size_bytes(self) -> int:
        with self._mutex:
            return sum(s.size_bytes for s in self._segments)

    def _check_open(self) -> None:
        if self._closed:
            raise LogStateError(f"{self.directory}: the log is closed")

    def refresh(self, *, force: bool = False) -> None:
        """Pick up segments another process swapped in or out since the last listing, and appends to the
        active segment (a roll or a swap changes the directory; an append only grows the active file)."""
        with self._mutex:
            self._check_open()
            unchanged = os.stat(self.directory).st_mtime_ns == self._listed_mtime_ns
            if not force and unchanged and self._listing_trusted:
                if self._segments:
                    # Not under the listing lock: the indexes stay as loaded (see LogSegment.refresh_size).
                    self._segments[-1].refresh_size(reload_indexes=False)
                return
            with self._listing_lock():
                self._list_segments()
                self._load_log_start_offset()
            # File systems without fine-grained timestamps stamp a directory change with a clock that ticks
            # every few milliseconds: a change later in the tick of the one just listed leaves the mtime as
            # listed. So a listing made within a tick of the last change is redone at the next refresh (the
            # wall clock is right here: it is the one the file system stamps with, not the log's clock).
            self._listing_trusted = time.time_ns() - self._listed_mtime_ns >= _DIR_MTIME_TICK_NS

    # ---- appending ------------------------------------------------------------------------------------

    def append_batches(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        """Append v2 batches, assigning offsets from the log end (as a broker does).

        Each batch is validated (CRC, framing, records) and gets baseOffset = the next offset; its
        lastOffsetDelta is kept. The indexes get the entries of Kafka's per-append rule applied to each batch
        (`LogSegment.append_batches`, the index build rule), not one entry for the whole append: a bulk append
        of many batches is indexed as if a producer had sent them one by one. Only the writer may append.
        Raises `CorruptRecordError` for an invalid batch (nothing is written), `ValueError` for a batch over
        `max.message.bytes` or an append with more index entries than an empty index holds.
        """
        # numba (the scan's kernels) is imported only when a scan runs: start-up of the CLI stays fast
        from ..codec.scan import scan as scan_buffer

        with self._mutex:
            self._check_open()
            if self.mode != "writer":
                raise LogStateError(f"{self.directory}: only the writer appends (mode is {self.mode})")
            self.refresh()  # closes old segments a cleaner swapped out, so their disk space is freed
            buf = bytearray(data)
            result = scan_buffer(buf, verify_crc=True)
            if result.end_position != len(buf):
                raise CorruptRecordError("incomplete batch at the end of the appended data", position=result.end_position)
            if np.any(result.magic != fmt.MAGIC_V2):
                raise CorruptRecordError("only magic-2 batches can be appended", position=0)
            sizes = result.batch_size
            if len(sizes) and int(sizes.max()) > self.config.max_message_bytes:
                raise ValueError(
                    f"batch of {int(sizes.max())} bytes exceeds max.message.bytes {self.config.max_message_bytes}"
                )
            if result.n_batches == 0:
                raise ValueError("nothing to append")
            first = self.log_end_offset
            deltas = result.last_offset - result.base_offset
            last_offsets = first + np.cumsum(deltas + 1) - 1  # each batch's last offset after reassignment
            for pos, base in zip(result.batch_position.tolist(), (last_offsets - deltas).tolist()):
                fmt.PREFIX.pack_into(buf, pos, base, fmt.PREFIX.unpack_from(buf, pos)[1])
            last = int(last_offsets[-1])
            max_ts = result.max_timestamp
            max_timestamp = int(max_ts.max())
            # an entry needs more than index.interval.bytes appended since the one before it
            entries = min(result.n_batches, len(buf) // (self.config.index_interval_bytes + 1) + 1)
            if entries > (capacity := self._segments[-1].index_capacity()):
                raise ValueError(f"an append of {result.n_batches} batches may need {entries} index entries; an "
                                 f"empty index holds {capacity} (segment.index.bytes): append fewer at once")
            self._maybe_roll(len(buf), max_timestamp, last, incoming_entries=entries)
            active = self._segments[-1]
            position = active.append_batches(memoryview(buf), result.batch_position, last_offsets, max_ts)
            if self._rolling_timestamp == fmt.NO_TIMESTAMP and position == 0:
                self._rolling_timestamp = int(max_ts[0])
            return AppendInfo(first, last, active.base_offset, position, result.n_batches)

    def append_records(
        self,
        records: Sequence[tuple[bytes | None, bytes | None] | Record],
        *,
        timestamp_ms: int | None = None,
        compression: int = fmt.COMPRESSION_NONE,
        producer_id: int = fmt.NO_PRODUCER_ID,
        producer_epoch: int = fmt.NO_PRODUCER_EPOCH,
        base_sequence: int = fmt.NO_SEQUENCE,
        is_transactional: bool = False,
    ) -> AppendInfo:
        """Append one batch built from (key, value) pairs or `Record`s (offsets are assigned here)."""
        now = self.clock_ms() if timestamp_ms is None else timestamp_ms
        built = []
        for i, r in enumerate(records):
            if isinstance(r, Record):
                built.append(Record(offset=i, timestamp=r.timestamp, key=r.key, value=r.value, headers=r.headers))
            else:
                key, value = r
                built.append(Record(offset=i, timestamp=now, key=key, value=value))
        batch = encode_batch(
            built,
            base_offset=0,
            compression=compression,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            is_transactional=is_transactional,
        )
        return self.append_batches(batch)

    def _maybe_roll(self, incoming_bytes: int, incoming_max_timestamp: int, incoming_last_offset: int, *,
                    incoming_entries: int = 1) -> None:
        active = self._segments[-1]
        if active.size_bytes == 0:
            return
        if self._rolling_timestamp >= 0 and incoming_max_timestamp >= 0:
            waited_ms = incoming_max_timestamp - self._rolling_timestamp
        else:
            waited_ms = self.clock_ms() - self._active_created_ms
        reason = None
        if active.size_bytes > self.config.segment_bytes - incoming_bytes:
            reason = "segment.bytes"
        elif waited_ms > self.config.segment_ms:
            reason = "segment.ms"
        elif active.index_room() < incoming_entries:  # full, or without room for this append's entries
            reason = "index full"
        elif incoming_last_offset - active.base_offset > fmt.RELATIVE_OFFSET_MAX:
            reason = "relative offset limit"
        if reason is not None:
            self.roll(reason=reason)

    def roll(self, *, reason: str = "requested") -> LogSegment:
        """Make the active segment inactive and start a new one at the log end (writer only)."""
        with self._mutex:
            self._check_open()
            if self.mode != "writer":
                raise LogStateError(f"{self.directory}: only the writer rolls (mode is {self.mode})")
            active = self._segments[-1]
            if active.size_bytes == 0:
                return active
            new_base = active.read_next_offset()
            with PartitionLock(self.directory, SWAP_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S_DEFAULT):
                active.finalise()
                segment = self._create_segment(new_base)
                self.file_ops.fsync_dir(self.directory)
                self._listed_mtime_ns = os.stat(self.directory).st_mtime_ns
            log.info("rolled dir=%s new_base=%d reason=%s", self.directory, new_base, reason)
            self._rolling_timestamp = fmt.NO_TIMESTAMP
            self._active_created_ms = self.clock_ms()
            return segment

    def flush(self) -> None:
        """fsync the active segment and record the log end as this partition's recovery point."""
        with self._mutex:
            self._check_open()
            if self.mode != "writer":
                return
            self._segments[-1].flush()
            self._write_recovery_point(self.log_end_offset)

    def _write_recovery_point(self, offset: int) -> None:
        self.write_log_dir_checkpoint(RECOVERY_POINT_CHECKPOINT, offset)

    def read_log_dir_checkpoint(self, name: str) -> int | None:
        """This partition's entry in the log-dir checkpoint file `name` (e.g. cleaner-offset-checkpoint)."""
        return self._root_checkpoint(name).get((self.topic, self.partition))

    def write_log_dir_checkpoint(self, name: str, offset: int | None) -> None:
        """Set (or, with None, remove) this partition's entry in the log-dir checkpoint file `name`.

        The read-modify-write runs under the log dir's checkpoint lock, so partitions of one log dir
        cleaned or written by different processes do not lose each other's entries.
        """
        update_log_dir_checkpoint(
            self.directory.parent, name, (self.topic, self.partition), offset, file_ops=self.file_ops
        )

    # ---- reading --------------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int = _FETCH_BYTES_DEFAULT) -> FetchData:
        """Whole batches starting at the first batch whose last offset is ≥ `offset` (Kafka's fetch).

        An offset compacted away yields the batch holding the next surviving offset; at the log end the
        result is empty. Raises `OffsetOutOfRangeError` below the log start or past the log end.
        """
        with self._mutex:
            self._check_open()
            self.refresh()  # after another process's swap: new files in, deleted old ones closed
            end = self.log_end_offset
            if offset < self._log_start_offset or offset > end:
                raise OffsetOutOfRangeError(offset, self._log_start_offset, end, str(self.directory))
            i = max(0, bisect.bisect_right(self._bases, offset) - 1)
            for segment in self._segments[i:]:
                fetched = segment.read(offset, max_bytes)
                if fetched is not None:
                    return fetched
            active = self._segments[-1]
            return FetchData(active.base_offset, active.size_bytes, b"")

    def iter_batches(self, start_offset: int | None = None, *, verify_crc: bool = True) -> Iterator[RecordBatch]:
        """Every batch from the one holding `start_offset` (default: log start) to the end, decoded.

        The iteration works on the segments listed when it starts; batches are yielded whole (a
        consumer discards records below `start_offset`).
        """
        with self._mutex:
            self._check_open()
            self.refresh()  # after another process's swap: new files in, deleted old ones closed
            start = self._log_start_offset if start_offset is None else start_offset
            segments = list(self._segments)
            i = max(0, bisect.bisect_right(self._bases, start) - 1)
        for segment in segments[i:]:
            found = segment.translate_offset(start)
            if found is None:
                continue
            for _, batch in segment.batches(found[0], verify_crc=verify_crc):
                yield batch

    def iter_records(self, start_offset: int | None = None) -> Iterator[tuple[RecordBatch, Record]]:
        """(batch, record) for every record at or after `start_offset`, as a consumer sees them."""
        start = self._log_start_offset if start_offset is None else start_offset
        for batch in self.iter_batches(start):
            for record in batch.records:
                if record.offset >= start:
                    yield batch, record

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record whose timestamp is ≥ `timestamp_ms`, or None."""
        with self._mutex:
            self._check_open()
            segments = list(self._segments)
        for segment in segments:
            if segment.max_timestamp < timestamp_ms and segment is not segments[-1]:
                continue
            found = segment.find_offset_by_timestamp(timestamp_ms, self._log_start_offset)
            if found is not None:
                return found
        return None

    # ---- cleaning support -----------------------------------------------------------------------------

    def new_cleaned_segment(self, base_offset: int) -> LogSegment:
        """Create `<base>.log.cleaned` (removing a stale one first) for the cleaner to fill (cleaner only)."""
        if self.mode != "cleaner":
            raise LogStateError(f"{self.directory}: only the cleaner creates .cleaned segments")
        stale = self._new_segment_paths(base_offset, fmt.CLEANED_SUFFIX)
        for path in stale:
            self.file_ops.remove(path)
        return self._new_segment_object(base_offset, writable=True, create=True, suffix=fmt.CLEANED_SUFFIX)

    def _new_segment_paths(self, base: int, suffix: str) -> tuple[Path, ...]:
        return segment_paths(self.directory, base, suffix).all()

    def replace_segments(self, new_segments: Sequence[LogSegment], old_segments: Sequence[LogSegment]) -> None:
        """Swap finished `.cleaned` segments in for the run of `old_segments` they replace (cleaner only).

        Requires: every new segment is finalised (fsynced, mtime set) with suffix `.cleaned`; the old
        segments are consecutive, below the active segment, and currently part of this log. Follows
        Kafka's order: `.cleaned → .swap` in descending base order, fsync dir; old files `→ .deleted` in
        ascending order, fsync dir; `.swap → ""`, fsync dir; then delete the `.deleted` files (on the
        `remover`'s thread if the log has one). A swap that cannot start (an old segment is no longer part of
        the log, the new files' owner cannot be set) removes the new segments' files and leaves the log as it
        was; one that fails after its first rename is completed by the next open's recovery (`.swap` files).
        """
        if self.mode != "cleaner":
            raise LogStateError(f"{self.directory}: only the cleaner swaps segments")
        with self._mutex:
            self._check_open()
            with PartitionLock(self.directory, SWAP_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S_DEFAULT):
                try:  # nothing renamed yet: a swap that cannot start removes the new files, the log stays as it was
                    self._list_segments()
                    current = {s.base_offset: s for s in self._segments}
                    active_base = self._segments[-1].base_offset
                    for old in old_segments:
                        if current.get(old.base_offset) is not old:
                            raise LogStateError(f"{old.paths.log} is no longer part of the log")
                        if old.base_offset >= active_base:
                            raise LogStateError(f"{old.paths.log} is the active segment; it is never cleaned")
                    for new in new_segments:
                        assert new.suffix == fmt.CLEANED_SUFFIX, new
                        # The new files take the mode (and, as root, the owner) of the segment they replace, so
                        # the log's writer keeps the access it had (segments.files.pathcheck, "Owners").
                        reference = current.get(new.base_offset) or old_segments[0]
                        pathcheck.copy_ownership(new.paths.all(), os.fstat(reference.fileno()),
                                                 fsync_fd=self.file_ops.fsync_fd)
                except BaseException:
                    for new in new_segments:
                        with contextlib.suppress(OSError):
                            new.delete_files()
                    raise
                for new in sorted(new_segments, key=lambda s: s.base_offset, reverse=True):
                    new.change_suffix(fmt.SWAP_SUFFIX)
                    faults.hit("swap.renamed_to_swap")
                self.file_ops.fsync_dir(self.directory)
                for old in sorted(old_segments, key=lambda s: s.base_offset):
                    old.change_suffix(fmt.DELETED_SUFFIX)
                    faults.hit("swap.renamed_to_deleted")
                self.file_ops.fsync_dir(self.directory)
                for new in new_segments:
                    new.change_suffix("")
                    faults.hit("swap.renamed_live")
                self.file_ops.fsync_dir(self.directory)
                for old in old_segments:
                    # Producer snapshots of merged-away segments go too (Kafka deletes them likewise).
                    snapshot = self.directory / fmt.offset_file_name(old.base_offset, fmt.SNAPSHOT_SUFFIX)
                    merged_away = old.base_offset not in {n.base_offset for n in new_segments}
                    if self.remover is None:
                        old.delete_files()
                        faults.hit("swap.old_deleted")
                        if merged_away:
                            self.file_ops.remove(snapshot)
                    else:  # the files are no longer part of the log: removed soon, off this thread
                        old.close()
                        self.remover.remove([*old.paths.all(), *([snapshot] if merged_away else [])])
                        faults.hit("swap.old_deleted")
                old_bases = {o.base_offset for o in old_segments}
                keep = [s for s in self._segments if s.base_offset not in old_bases]
                for new in new_segments:
                    new.writable = False
                    self._inodes[new.base_offset] = os.fstat(new.fileno()).st_ino
                keep.extend(new_segments)
                keep.sort(key=lambda s: s.base_offset)
                self._segments = keep
                self._bases = [s.base_offset for s in keep]
                self._listed_mtime_ns = os.stat(self.directory).st_mtime_ns

    def delete_oldest_segments(self, count: int, *, reason: str) -> int:
        """Delete the `count` oldest segments (never the active one) and advance the log start offset.

        Cleaner mode only. Order, for crash safety: the files are renamed to `.deleted` and the directory
        fsynced, then `log-start-offset-checkpoint` records the new start (the next segment's base), then
        the files are removed. A crash before the checkpoint leaves `.deleted` files that recovery removes,
        and the log starts at its first remaining segment: the same log start either way. Returns the new
        log start offset.
        """
        if self.mode != "cleaner":
            raise LogStateError(f"{self.directory}: only the cleaner deletes segments")
        with self._mutex:
            self._check_open()
            with PartitionLock(self.directory, SWAP_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S_DEFAULT):
                self._list_segments()
                if not 0 < count < len(self._segments):
                    raise LogStateError(f"{self.directory}: cannot delete {count} of {len(self._segments)} segments")
                doomed = self._segments[:count]
                new_start = max(self._segments[count].base_offset, self._log_start_offset)
                for segment in doomed:
                    segment.change_suffix(fmt.DELETED_SUFFIX)
                    faults.hit("retention.renamed_to_deleted")
                self.file_ops.fsync_dir(self.directory)
                self.write_log_dir_checkpoint(LOG_START_OFFSET_CHECKPOINT, new_start)
                faults.hit("retention.checkpoint_written")
                for segment in doomed:
                    segment.delete_files()
                    self.file_ops.remove(self.directory / fmt.offset_file_name(segment.base_offset, fmt.SNAPSHOT_SUFFIX))
                    self._inodes.pop(segment.base_offset, None)
                self._segments = self._segments[count:]
                self._bases = [s.base_offset for s in self._segments]
                self._log_start_offset = new_start
                self._listed_mtime_ns = os.stat(self.directory).st_mtime_ns
            log.info("deleted segments dir=%s count=%d new_log_start=%d reason=%s",
                     self.directory, count, new_start, reason)
            return new_start

    # ---- closing ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush (writer: fsync and record the recovery point), close every file, release the locks."""
        with self._mutex:
            if self._closed:
                return
            try:
                if self.mode == "writer" and self._segments and self._owner_lock is not None:
                    self._segments[-1].flush()
                    self._write_recovery_point(self.log_end_offset)
            finally:
                for segment in self._segments:
                    segment.close()
                self._segments = []
                self._bases = []
                self._closed = True
                if self._owner_lock is not None:
                    self._owner_lock.release()
                    self._owner_lock = None
                if self._log_dir_lock is not None:
                    self._log_dir_lock.release()
                    self._log_dir_lock = None

    def __enter__(self) -> "PartitionLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PartitionLog({self.directory}, mode={self.mode}, segments={len(self._segments)})"
