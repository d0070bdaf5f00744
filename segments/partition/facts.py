"""A partition's cheap facts: its segments' sizes, offsets, timestamps and delete horizons, and its first
unstable offset.

Owns `LogFacts`, what deciding where a partition may be cleaned needs of its files (the arithmetic itself is
`cleaner.cleanable`, shared by the daemon's selection and by every round), and `FactsCache`, which reads
them from a partition directory without opening the log (no lock taken, no index checked, nothing
recovered, nothing written): a listing, an `lstat` per live `.log` file, and a walk of the batch headers
(`segments.files.facts`) of each segment file not walked before (a large inactive one in windows, by the
compiled header scan; the others batch by batch). A file seen before with the same inode, size and mtime is not
read again; an active segment that grew is walked on from where its walk stopped. So a pass over many
partitions reads, in the steady state, only the bytes appended since the last pass; a segment file is read
in full once (at the first pass, or once a round has swapped it in).

`FactsCache.unchanged` tells, from two `lstat`s (the directory, the active segment), whether a partition
read before may have changed since: any roll, swap, retention or recovery renames, creates or removes a file
(the directory's mtime), and a writer only appends to the active segment (its size and mtime). A read whose
mtimes were younger than `RACY_NS` is not trusted by it (a later change within the same timestamp tick would
leave them equal), so the partition is read again until they have aged. The rule, and what it does not see:
docs/design.md, "Many partitions".

The first unstable offset (Kafka's: the first offset of the earliest transaction not yet decided) is folded
from the segments' `TxnSummary`s in offset order: a transaction with no COMMIT/ABORT marker, or whose
marker is not below the high watermark (it could still be truncated), is undecided. It is the figure a
round's survey (`cleaner.survey.LogSurvey.first_unstable_offset`) finds from the same headers.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..codec import format as fmt
from ..files import pathcheck
from ..files.facts import SegmentFacts, SegmentWalk, TxnSummary, file_identity
from ..files.names import parse_segment_file_name
from ..files.segment import LogSegment

__all__ = ["RACY_NS", "FactsCache", "LogFacts", "first_unstable_offset"]

# A file's mtime younger than this at a read does not show a later change: timestamps are taken from a coarse
# clock (a tick of milliseconds on ext4 and XFS; 1 s or 2 s on older filesystems), so a change in the same tick
# leaves it equal.
RACY_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class LogFacts:
    """A partition's segments (oldest first; the last is the active one), and what bounds cleaning besides."""

    segments: tuple[SegmentFacts, ...]
    high_watermark: int | None  # from the replication-offset-checkpoint; None when it has no entry
    first_unstable_offset: int | None  # of the earliest undecided transaction (given the high watermark)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    def earliest_delete_horizon_ms(self, start: int, end: int, skip: frozenset[int] = frozenset()) -> int:
        """The least delete horizon kept in the segments whose base offset is in [`start`, `end`), those in
        `skip` left out (-1: none)."""
        return min((s.earliest_delete_horizon_ms for s in self.segments if start <= s.base_offset < end
                    and s.base_offset not in skip and s.earliest_delete_horizon_ms >= 0), default=-1)


def first_unstable_offset(summaries: Iterable[TxnSummary], high_watermark: int | None = None) -> int | None:
    """The first offset of the earliest undecided transaction, from every segment's summary in offset order."""
    open_: dict[int, int] = {}  # producer id -> first offset of its transaction open so far
    least: int | None = None  # of the transactions whose marker is at or above the high watermark
    for txn in summaries:
        if txn.empty:
            continue
        if high_watermark is not None and txn.max_marker >= high_watermark:
            for pid, marker, first in txn.first_markers:
                if marker >= high_watermark:
                    begun = open_.get(pid, first if first >= 0 else marker)
                    least = begun if least is None else min(least, begun)
            i = bisect.bisect_left(txn.later_markers, high_watermark)
            if i < len(txn.later_markers):
                least = txn.later_firsts_min[i] if least is None else min(least, txn.later_firsts_min[i])
        for pid, _, _ in txn.first_markers:
            open_.pop(pid, None)
        for pid, first in txn.open_at_end:
            open_.setdefault(pid, first)
    firsts = list(open_.values()) + ([] if least is None else [least])
    return min(firsts) if firsts else None


@dataclass(slots=True)
class _Walked:
    identity: tuple[int, int, int, int]
    walk: SegmentWalk
    facts: SegmentFacts
    txn: TxnSummary


@dataclass(slots=True)
class _Partition:
    lock: threading.Lock = field(default_factory=threading.Lock)
    segments: dict[int, _Walked] = field(default_factory=dict)
    # At the last read: the directory's (inode, mtime), the active segment's path and (inode, size, mtime);
    # None when that read was racy (an mtime younger than RACY_NS) or failed: `unchanged` is then False.
    probe: tuple[int, int, str, int, int, int] | None = None


class FactsCache:
    """`LogFacts` of partition directories, each segment file walked once while it does not change.

    Thread-safe: readers of one directory take turns (the second finds the first one's walk done), readers
    of different directories do not wait for each other.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[Path, _Partition] = {}

    def read(self, directory: str | os.PathLike, *, high_watermark: int | None = None) -> LogFacts:
        """The facts of the partition at `directory` now.

        Links are not followed and a FIFO, socket or device named like a segment file is not opened
        (`segments.files.pathcheck`). Raises `OSError` (e.g. a segment removed while being read: read again)
        or `SegmentError` (`CorruptRecordError` at a header that is not a batch's; a link; a special file).
        """
        directory = Path(directory)
        with self._lock:
            partition = self._partitions.setdefault(directory, _Partition())
        partition.probe = None  # until this read has succeeded
        dir_st = os.lstat(directory)  # before the listing: a change after it shows in the mtime
        read_ns = time.time_ns()
        pathcheck.check_partition_dir(directory)
        bases = sorted(
            parsed.offset for name in os.listdir(directory)
            if (parsed := parse_segment_file_name(name)) is not None and parsed.kind == fmt.LOG_SUFFIX
            and not parsed.state
        )
        with partition.lock:
            walked: dict[int, _Walked] = {}
            active_st = None
            for i, base in enumerate(bases):
                seen = partition.segments.get(base)
                st = pathcheck.check_regular_file(directory / fmt.offset_file_name(base, fmt.LOG_SUFFIX))
                walked[base] = seen if seen is not None and seen.identity == file_identity(st) else (
                    _walk(directory, base, seen, active=i == len(bases) - 1))
                active_st = st
            partition.segments = walked
            if read_ns - dir_st.st_mtime_ns >= RACY_NS and (active_st is None or (
                    read_ns - active_st.st_mtime_ns >= RACY_NS and walked[bases[-1]].identity == file_identity(active_st))):
                active = os.fspath(directory / fmt.offset_file_name(bases[-1], fmt.LOG_SUFFIX)) if bases else ""
                partition.probe = (dir_st.st_ino, dir_st.st_mtime_ns, active,
                                   *((active_st.st_ino, active_st.st_size, active_st.st_mtime_ns) if active_st else (0, 0, 0)))
        segments = [w.facts for w in walked.values()]
        unstable = first_unstable_offset((w.txn for w in walked.values()), high_watermark)
        return LogFacts(tuple(segments), high_watermark, unstable)

    def unchanged(self, directory: Path) -> bool:
        """True when the partition was read before and neither its directory (inode, mtime) nor its active
        segment (inode, size, mtime) changed since, that read not being racy (see the module docstring):
        two `lstat`s, nothing opened. False means: read it again."""
        partition = self._partitions.get(directory)
        probe = partition.probe if partition is not None else None
        if probe is None:
            return False
        try:
            st = os.lstat(directory)
            if st.st_ino != probe[0] or st.st_mtime_ns != probe[1]:
                return False
            if not probe[2]:
                return True  # no segment then, and the directory did not change
            st = os.lstat(probe[2])
        except OSError:
            return False
        return (st.st_ino, st.st_size, st.st_mtime_ns) == probe[3:]

    def bases(self, directory: Path) -> list[int] | None:
        """The base offsets of the partition's segments as last read (None: never read)."""
        partition = self._partitions.get(directory)
        return None if partition is None else sorted(partition.segments)

    def forget(self, directory: str | os.PathLike) -> None:
        """Drop what is kept of a partition (removed, or no longer of interest)."""
        with self._lock:
            self._partitions.pop(Path(directory), None)


def _walk(directory: Path, base: int, seen: _Walked | None, *, active: bool) -> _Walked:
    """Walk segment `base` on from `seen` when it is the same file grown (an active segment), else from its start."""
    segment = LogSegment(directory, base)  # read-only; a link is refused
    try:
        st = os.fstat(segment.fileno())
        identity = file_identity(st)
        walk = None
        if seen is not None and seen.identity[:2] == identity[:2] and identity[2] >= seen.identity[2]:
            walk = seen.walk if seen.walk.advance(segment, inactive=not active) else None
        if walk is None:
            walk = SegmentWalk(base)
            walk.advance(segment, inactive=not active)
        return _Walked(identity, walk, walk.facts(segment.size_bytes, st.st_mtime_ns // 1_000_000), walk.txn_summary())
    finally:
        segment.close()
