"""Bulk writes of a topic into a log dir from many independent tasks: staged pieces, then one ordered commit.

Owns the protocol the Spark data source's writer follows (and anything else that writes a topic in parallel):
1. Every task attempt writes, per partition it has rows for, one *piece* of v2 batches under
   `<log dir>/.logsegments-staging-<job>.tmp/<task>-<attempt>/`, and nothing else. Pieces are not fsynced: the
   commit reads them back from the page cache (and checks every batch's framing and CRC), makes what it writes
   durable before anyone sees it, and a crash before that loses the job in any case; most staged bytes are so
   deleted before they ever reach the disk.
2. The commit (one process; Spark's driver) appends each partition's pieces in task order through a
   `PartitionLog` writer, then rolls, so what the job wrote is all in inactive segments and cleanable.
3. A new partition, or every partition under overwrite, is built in the staging area and moved into place
   with one rename, so no reader sees half a partition; appends to an existing one go through its writer lock.
4. The staging directory is removed after the commit or abort; an abort also removes the log dir (and its
   parents) if the job created them and they are still empty.
A topic that already has partitions in the log dir keeps its partition count (another N is refused). A crash
of the committing process can leave some partitions committed and the staging directory behind. Every step
in full, and why: see docs/spark.md, "How a write lands".
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..codec import format as fmt
from ..codec.errors import LogStateError
from ..files.fileio import DEFAULT_FILE_OPS
from ..files.pathcheck import STAGING_PREFIX, STAGING_SUFFIX, topic_name_problem
from ..partition.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    cached_offset_checkpoint,
)
from ..partition.locks import CLEANER_LOCK, KAFKA_LOCK, WRITER_LOCK, LogDirLock, PartitionLock
from ..partition.log import (
    CHECKPOINT_LOCK,
    LogConfig,
    PartitionLog,
    parse_partition_dir_name,
    update_log_dir_checkpoint,
)

__all__ = [
    "STAGING_PREFIX",
    "CommitSummary",
    "PieceWriter",
    "StagedPiece",
    "abort_job",
    "check_topic_partitions",
    "commit_job",
    "missing_dirs",
    "new_job_id",
    "staging_dir",
]

log = logging.getLogger(__name__)

_CHUNK_BYTES = 16 * 1024 * 1024
_LOCK_TIMEOUT_S = 60.0
_RENAME_EXCHANGE = 2
_RENAME_NOREPLACE = 1


@dataclass(frozen=True, slots=True)
class StagedPiece:
    """One task's batches for one partition: `records` records in `bytes` bytes at `path`."""

    partition: int
    path: str
    records: int
    bytes: int
    task: int
    attempt: int


@dataclass(slots=True)
class CommitSummary:
    """What a commit wrote: records and bytes appended per partition (this job's alone, whoever else appends),
    and the log end offset each partition reached."""

    records: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)
    log_end_offset: dict[int, int] = field(default_factory=dict)

    @property
    def total_records(self) -> int:
        return sum(self.records.values())

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def new_job_id() -> str:
    return uuid.uuid4().hex


def staging_dir(log_dir: str | os.PathLike, job_id: str) -> Path:
    return Path(log_dir) / f"{STAGING_PREFIX}{job_id}{STAGING_SUFFIX}"


def topic_partition_dirs(log_dir: str | os.PathLike, topic: str) -> dict[int, Path]:
    """The topic's partition directories in `log_dir`, by partition number."""
    found: dict[int, Path] = {}
    root = Path(log_dir)
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        parsed = parse_partition_dir_name(entry.name)
        if parsed is not None and parsed[0] == topic and entry.is_dir():
            found[parsed[1]] = entry
    return found


def check_topic_partitions(log_dir: str | os.PathLike, topic: str, partitions: int, *, overwrite: bool) -> None:
    """Refuse an append that would change the topic's partition count (see the module docstring)."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    if (problem := topic_name_problem(topic)) is not None:
        raise ValueError(f"invalid topic name {topic!r}: {problem}")
    if overwrite:
        return
    existing = sorted(topic_partition_dirs(log_dir, topic))
    if existing and existing != list(range(partitions)):
        raise LogStateError(
            f"{log_dir}: topic {topic!r} has partitions {existing}; appending with {partitions} partitions would "
            f"move keys between partitions (use the existing count, or overwrite the topic)"
        )


class PieceWriter:
    """A task's pieces: appends encoded batches per partition to its own files in the staging area.

    With `staging_made`, the job's staging directory was made by the driver before the job, and the task makes
    only its own directory in it: a task that starts after the job was aborted (the staging directory removed)
    then fails instead of making it again."""

    def __init__(self, log_dir: str | os.PathLike, job_id: str, task: int, attempt: int, *,
                 staging_made: bool = False) -> None:
        self.directory = staging_dir(log_dir, job_id) / f"{task}-{attempt}"
        self.directory.mkdir(parents=not staging_made, exist_ok=True)
        self.task = task
        self.attempt = attempt
        self._files: dict[int, BinaryIO] = {}
        self._records: dict[int, int] = {}
        self._bytes: dict[int, int] = {}

    def append(self, data: dict[int, bytes], records: dict[int, int]) -> None:
        """Append each partition's batches (`data[p]`, holding `records[p]` records) to its piece."""
        for p, payload in data.items():
            f = self._files.get(p)
            if f is None:
                f = self._files[p] = open(self.directory / f"{p}.batches", "wb")
            f.write(payload)
            self._records[p] = self._records.get(p, 0) + records[p]
            self._bytes[p] = self._bytes.get(p, 0) + len(payload)

    def finish(self) -> list[StagedPiece]:
        """Close every piece (no fsync: see the module docstring); the list is what the task reports to the commit."""
        pieces = []
        for p, f in sorted(self._files.items()):
            f.close()
            pieces.append(StagedPiece(p, str(self.directory / f"{p}.batches"), self._records[p], self._bytes[p],
                                      self.task, self.attempt))
        self._files.clear()
        return pieces

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _batch_chunks(path: str, limit: int) -> Iterator[memoryview]:
    """Whole batches of the piece file at `path`, as views of a read-only mapping of the file (read once, from
    the page cache, no copy here). The chunks are those of reading the file `limit` bytes at a time and taking
    the whole batches read so far (a batch larger than that alone): the appends, and so where the log rolls
    and puts index entries, are what they were when the pieces were read that way."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            read = start = 0  # bytes read so far; where the batches not yet handed out start
            while True:
                got = min(limit, size - read)
                read += got
                pos = start
                while pos + fmt.LOG_OVERHEAD <= read:
                    batch = fmt.LOG_OVERHEAD + fmt.PREFIX.unpack_from(mapped, pos)[1]
                    if batch < fmt.RECORD_BATCH_OVERHEAD:
                        raise LogStateError(f"{path}: invalid batch length at position {pos}")
                    if pos + batch > read:
                        if pos == start:  # one batch larger than a chunk: read the rest of it
                            read = min(size, start + batch)
                            pos = start + batch if read == start + batch else start
                        break
                    pos += batch
                if pos > start:
                    with view[start:pos] as chunk:
                        yield chunk
                    start = pos
                elif not got:
                    if read > start:
                        raise LogStateError(f"{path}: incomplete batch at the end of a staged piece")
                    return


def _check_piece(piece: StagedPiece) -> None:
    """The piece file is whole batches, as many bytes as its task reported (reads 12 bytes per batch)."""
    try:
        size = os.path.getsize(piece.path)
    except FileNotFoundError:
        raise LogStateError(f"{piece.path}: staged piece is missing") from None
    if size != piece.bytes:
        raise LogStateError(f"{piece.path}: staged piece has {size} bytes, its task wrote {piece.bytes}")
    with open(piece.path, "rb") as f:
        pos = 0
        while pos < size:
            prefix = os.pread(f.fileno(), fmt.LOG_OVERHEAD, pos)
            length = int.from_bytes(prefix[8:12], "big", signed=True) if len(prefix) == fmt.LOG_OVERHEAD else -1
            if length < fmt.RECORD_BATCH_OVERHEAD - fmt.LOG_OVERHEAD or pos + fmt.LOG_OVERHEAD + length > size:
                raise LogStateError(f"{piece.path}: incomplete or invalid batch at position {pos} of a staged piece")
            pos += fmt.LOG_OVERHEAD + length


def _append_pieces(plog: PartitionLog, pieces: Sequence[StagedPiece], *, flush: bool = True) -> None:
    """Append the pieces in order and roll; with `flush`, fsync and record the recovery point now (a partition
    built in the staging area is fsynced by the roll and its recovery point is set where it lands)."""
    limit = min(plog.config.segment_bytes, _CHUNK_BYTES)
    for piece in pieces:
        for chunk in _batch_chunks(piece.path, limit):
            plog.append_batches(chunk)
    plog.roll(reason="bulk write committed")
    if flush:
        plog.flush()


def _renameat2(a: Path, b: Path, flag: int, name: str) -> None:
    """Linux renameat2 with one flag (RENAME_EXCHANGE, RENAME_NOREPLACE)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flag) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"renameat2({a}, {b}, {name}): {os.strerror(err)}")


def _exchange(a: Path, b: Path) -> None:
    """Atomically swap two directory entries (RENAME_EXCHANGE)."""
    _renameat2(a, b, _RENAME_EXCHANGE, "RENAME_EXCHANGE")


def _move_into_place_new(built: Path, target: Path) -> bool:
    """Put `built` at `target` unless something is there (RENAME_NOREPLACE: a plain rename would replace an
    empty directory); False if something is, as when another job created the partition since the commit
    looked. Without RENAME_NOREPLACE (ENOSYS, EINVAL), a look and a rename, with a window between them."""
    try:
        _renameat2(built, target, _RENAME_NOREPLACE, "RENAME_NOREPLACE")
        return True
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
    if target.exists():
        return False
    os.rename(built, target)
    return True


def _move_into_place(built: Path, target: Path, trash: Path) -> None:
    """Put `built` at `target`; an existing `target` ends up at `trash` (atomically where the OS allows)."""
    if not target.exists():
        os.rename(built, target)
        return
    with PartitionLock(target, WRITER_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S), \
            PartitionLock(target, CLEANER_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S):
        try:
            _exchange(built, target)
            os.rename(built, trash)  # `built` now names the old directory
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EINVAL):
                raise
            # No RENAME_EXCHANGE on this filesystem: two renames, with a window where `target` is missing.
            os.rename(target, trash)
            os.rename(built, target)


def _reset_checkpoints(log_dir: Path, topic: str, partition: int, recovery_point: int | None) -> None:
    """Remove the partition's entries from the checkpoints of its old contents and set its recovery point. An
    entry that is not there is not removed: each update rewrites and fsyncs its file, and a new topic has none."""
    key = (topic, partition)
    for name in (CLEANER_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT):
        if key in cached_offset_checkpoint(log_dir / name)[0]:
            update_log_dir_checkpoint(log_dir, name, key, None)
    if recovery_point is not None or key in cached_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT)[0]:
        update_log_dir_checkpoint(log_dir, RECOVERY_POINT_CHECKPOINT, key, recovery_point)


def _append_partition(plog: PartitionLog, pieces: Sequence[StagedPiece]) -> int:
    """Append the pieces to an existing partition; returns its new log end offset."""
    _append_pieces(plog, pieces)
    if plog.read_log_dir_checkpoint(REPLICATION_OFFSET_CHECKPOINT) is not None:
        plog.write_log_dir_checkpoint(REPLICATION_OFFSET_CHECKPOINT, plog.log_end_offset)  # committed data
    return plog.log_end_offset


def _build_partition(staging: Path, topic: str, partition: int, pieces: Sequence[StagedPiece], config: LogConfig,
                     ) -> tuple[Path, int]:
    built = staging / "out" / f"{topic}-{partition}"
    with PartitionLog.open(built, mode="writer", config=config, create=True) as plog:
        if pieces:
            _append_pieces(plog, pieces, flush=False)
        return built, plog.log_end_offset


def _place_partition(log_dir: Path, staging: Path, topic: str, partition: int, built: Path, end: int, *,
                     replace: bool) -> bool:
    """Move a partition built in the staging area into place: over the old one with `replace` (overwrite),
    else only where none exists (False if one does: another job created it meanwhile; nothing changed)."""
    target = log_dir / f"{topic}-{partition}"
    if replace:
        _move_into_place(built, target, staging / "old" / f"{topic}-{partition}")
    elif not _move_into_place_new(built, target):
        return False
    DEFAULT_FILE_OPS.fsync_dir(log_dir)
    _reset_checkpoints(log_dir, topic, partition, end)
    return True


def commit_job(
    log_dir: str | os.PathLike,
    job_id: str,
    topic: str,
    partitions: int,
    pieces: Iterable[StagedPiece],
    *,
    overwrite: bool = False,
    config: LogConfig | None = None,
    threads: int = 4,
) -> CommitSummary:
    """Append every staged piece to its partition in task order (see the module docstring); then clean up.

    Two phases. First, nothing a reader sees changes: every piece's framing is checked, every existing
    partition's writer is opened (so one held by another writer fails the commit here) and every new or
    replaced partition is built in the staging area. A failure there leaves every partition as it was (the
    staging directory is removed on failure too). Then the appends and the moves into place: a failure of
    one of those (an I/O error) leaves the partitions that got theirs changed and the others not, each a
    valid log.

    Every partition 0..partitions-1 exists afterwards (empty ones too, as when Kafka creates a topic). Raises
    `LogStateError` for a partition-count change on append, `LockTimeoutError` if a partition's writer lock
    stays held by someone else.
    """
    root = Path(log_dir)
    root.mkdir(parents=True, exist_ok=True)
    config = config or LogConfig()
    staging = staging_dir(root, job_id)
    summary = CommitSummary()
    log_dir_lock = LogDirLock(root).acquire()  # never while a Kafka broker owns the log dir (segments.partition.locks)
    try:
        check_topic_partitions(root, topic, partitions, overwrite=overwrite)
        (staging / "out").mkdir(parents=True, exist_ok=True)
        (staging / "old").mkdir(parents=True, exist_ok=True)
        by_partition: dict[int, list[StagedPiece]] = {p: [] for p in range(partitions)}
        for piece in pieces:
            if not 0 <= piece.partition < partitions:
                raise ValueError(f"staged piece {piece.path} is for partition {piece.partition} of {partitions}")
            _check_piece(piece)
            by_partition[piece.partition].append(piece)
        ordered = {p: sorted(ps, key=lambda s: (s.task, s.attempt)) for p, ps in by_partition.items()}
        with contextlib.ExitStack() as open_logs, ThreadPoolExecutor(max_workers=max(1, min(threads, partitions))) as pool:
            appends: dict[int, PartitionLog] = {}
            for p in range(partitions):
                target = root / f"{topic}-{p}"
                if target.is_dir() and not overwrite:
                    appends[p] = open_logs.enter_context(
                        PartitionLog.open(target, mode="writer", config=config, lock_timeout_s=_LOCK_TIMEOUT_S)
                    )
            building = {p: pool.submit(_build_partition, staging, topic, p, ordered[p], config)
                        for p in range(partitions) if p not in appends}
            built = {p: future.result() for p, future in building.items()}
            # Phase two: what readers see changes from here on.
            appending = {p: pool.submit(_append_partition, plog, ordered[p]) for p, plog in appends.items()}
            ends = {}
            for p, (path, end) in built.items():
                if _place_partition(root, staging, topic, p, path, end, replace=overwrite):
                    ends[p] = end
                else:  # created by another job since the commit looked: our pieces go after its records
                    with PartitionLog.open(root / f"{topic}-{p}", mode="writer", config=config,
                                           lock_timeout_s=_LOCK_TIMEOUT_S) as plog:
                        ends[p] = _append_partition(plog, ordered[p])
            for p, future in appending.items():
                ends[p] = future.result()
            for p in range(partitions):
                summary.records[p] = sum(s.records for s in by_partition[p])
                summary.bytes[p] = sum(s.bytes for s in by_partition[p])  # appended as staged, offsets aside
                summary.log_end_offset[p] = ends[p]
        if overwrite:
            for p, path in topic_partition_dirs(root, topic).items():
                if p >= partitions:
                    _move_into_place_removed(path, staging / "old" / path.name)
                    _reset_checkpoints(root, topic, p, None)
            DEFAULT_FILE_OPS.fsync_dir(root)
    finally:
        abort_job(root, job_id)
        log_dir_lock.release()
    log.info("bulk write committed topic=%s partitions=%d records=%d", topic, partitions, summary.total_records)
    return summary


def _move_into_place_removed(path: Path, trash: Path) -> None:
    with PartitionLock(path, WRITER_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S), \
            PartitionLock(path, CLEANER_LOCK).acquire(timeout_s=_LOCK_TIMEOUT_S):
        os.rename(path, trash)


def missing_dirs(path: str | os.PathLike) -> tuple[str, ...]:
    """The directories of `path` (itself and its parents) that do not exist yet, deepest first."""
    missing = []
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        missing.append(str(current))
        current = current.parent
    return tuple(missing)


_LOCK_FILES = frozenset({KAFKA_LOCK, CHECKPOINT_LOCK})


def abort_job(log_dir: str | os.PathLike, job_id: str, *, created_dirs: Sequence[str] = ()) -> None:
    """Remove the job's staging directory and everything in it; then each of `created_dirs` (deepest first:
    the directories the job created, from `missing_dirs`) while it is empty."""
    shutil.rmtree(staging_dir(log_dir, job_id), ignore_errors=True)
    for directory in created_dirs:
        try:
            if os.path.abspath(directory) == os.path.abspath(log_dir) and set(os.listdir(directory)) <= _LOCK_FILES:
                # a log dir this job created that holds nothing but the empty lock files its commit made
                for name in os.listdir(directory):
                    lock_file = os.path.join(directory, name)
                    if os.path.isfile(lock_file) and os.path.getsize(lock_file) == 0:
                        os.unlink(lock_file)
            os.rmdir(directory)
        except OSError as exc:  # not empty (someone else wrote there) or already gone: leave it and its parents
            log.debug("created directory kept dir=%s reason=%s", directory, exc.strerror)
            break
