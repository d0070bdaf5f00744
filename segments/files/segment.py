"""One log segment: a `.log` file and its `.index`, `.timeindex` and `.txnindex`.

Owns the files of one segment: appending batches and maintaining the sparse indexes the way Kafka's
`LogSegment` does, translating an offset or a timestamp to a byte position, reading batches back,
recovering (re-validating every batch, rebuilding the indexes, cutting a torn tail) and renaming its
files between the suffix states of the swap protocol (`.cleaned`, `.swap`, `.deleted`).

It does not decide when to roll, which segments exist, or anything about other segments: that is
`segments.partition.log`. It never spells a byte offset of the format itself: the header of the batch at a
file position is read by `read_header_at` (a pread of the header bytes, decoded by the codec's one header reader,
`segments.codec.batches.peek_header`), whole batches by `segments.codec.records` / `segments.codec.legacy`, whole
buffers by `segments.codec.scan`.

Torn tail versus corruption (the project's rule, docs/design.md, "Torn tail versus corruption"): recovery
treats an invalid final batch as a torn tail only when nothing but that batch (or zero bytes, from
preallocation) follows its start; a bad batch that is followed by more data is corruption and raises
`CorruptRecordError` with the file and position, leaving the file untouched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..codec import format as fmt
from ..codec.batches import peek_header
from ..codec.errors import CorruptRecordError, TruncatedBatchError
from ..codec.legacy import decode_legacy_entry
from ..codec.records import BatchHeader, RecordBatch, decode_batch
from .direct import DirectAppender
from .fileio import DEFAULT_FILE_OPS, FileOps
from .index import OffsetIndex, TimeIndex, append_run_entries, build_offset_index_entries, build_time_index_entries
from .mapped import mapped_window
from .txnindex import TransactionIndex

if TYPE_CHECKING:
    from ..codec.scan import ScanResult

__all__ = ["LogSegment", "SegmentPaths", "segment_paths", "FetchData", "RecoveryResult", "read_header_at"]

log = logging.getLogger(__name__)

_FADV_SEQUENTIAL = getattr(os, "POSIX_FADV_SEQUENTIAL", None)

_READ_CHUNK_BYTES = 8 * 1024 * 1024  # window for whole-file walks (recovery, index rebuild)
_ZERO_CHECK_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SegmentPaths:
    log: Path
    index: Path
    timeindex: Path
    txnindex: Path

    def all(self) -> tuple[Path, Path, Path, Path]:
        return (self.log, self.index, self.timeindex, self.txnindex)


def segment_paths(directory: str | os.PathLike, base_offset: int, suffix: str = "") -> SegmentPaths:
    """The four file paths of the segment at `base_offset`, with an optional state suffix (`.cleaned`...)."""
    d = Path(directory)
    return SegmentPaths(
        log=d / (fmt.offset_file_name(base_offset, fmt.LOG_SUFFIX) + suffix),
        index=d / (fmt.offset_file_name(base_offset, fmt.INDEX_SUFFIX) + suffix),
        timeindex=d / (fmt.offset_file_name(base_offset, fmt.TIME_INDEX_SUFFIX) + suffix),
        txnindex=d / (fmt.offset_file_name(base_offset, fmt.TXN_INDEX_SUFFIX) + suffix),
    )


@dataclass(frozen=True, slots=True)
class FetchData:
    """Bytes of whole batches read from one segment, starting at the batch that holds the target offset."""

    segment_base_offset: int
    position: int
    data: bytes


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    """What `LogSegment.recover` found: the valid size, bytes cut from the tail, batches validated."""

    valid_bytes: int
    truncated_bytes: int
    batches: int
    next_offset: int


def read_header_at(fd: int, position: int, path: str | os.PathLike) -> BatchHeader:
    """The header of the batch (any magic) at `position` of the open file `fd` (named `path`, for errors).

    Reads only the header's bytes (one pread of `fmt.RECORD_BATCH_OVERHEAD`) and decodes them with
    `segments.codec.batches.peek_header`, whose errors it raises placed in `path` at `position`:
    `TruncatedBatchError` when the file ends inside the header. Whether the whole batch fits in the file is
    the caller's check (`header.size_bytes`).
    """
    head = os.pread(fd, fmt.RECORD_BATCH_OVERHEAD, position)
    try:
        return peek_header(head, 0)
    except CorruptRecordError as exc:
        raise exc.located(path, position) from None


class LogSegment:
    """A segment's files and the in-memory state needed to append to it and index it.

    Open modes: `writable=True` opens the `.log` for appending (only the partition's writer, or the
    cleaner for a `.cleaned` segment it is building); otherwise the files are only read.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        base_offset: int,
        *,
        suffix: str = "",
        writable: bool = False,
        create: bool = False,
        index_interval_bytes: int = fmt.INDEX_INTERVAL_BYTES_DEFAULT,
        max_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> None:
        self.directory = Path(directory)
        self.base_offset = base_offset
        self.suffix = suffix
        self.writable = writable
        self.index_interval_bytes = index_interval_bytes
        self.max_index_bytes = max_index_bytes
        self.file_ops = file_ops
        self.paths = segment_paths(directory, base_offset, suffix)
        if create:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        elif writable:
            flags = os.O_RDWR
        else:
            flags = os.O_RDONLY
        self._fd = os.open(self.paths.log, flags | os.O_NOFOLLOW, 0o644)  # links are refused (segments.files.pathcheck)
        self.size_bytes = os.fstat(self._fd).st_size
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._txn_index: TransactionIndex | None = None
        # Kafka's append-time indexing state; rebuilt by recover() or load_append_state().
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_so_far = fmt.NO_TIMESTAMP
        self._shallow_offset_of_max_timestamp = base_offset
        self._next_offset: int | None = None
        self._indexes_behind = False  # the file grew since the indexes were read (see refresh_size)
        self._appender: DirectAppender | None = None  # appends around the page cache (write_directly)
        if create:
            self._next_offset = base_offset
            # Like Kafka, a new segment has its (empty) offset and time index files from the start.
            self.offset_index.flush()
            self.time_index.flush()

    # ---- files ------------------------------------------------------------------------------------

    @property
    def offset_index(self) -> OffsetIndex:
        if self._offset_index is None:
            self._offset_index = OffsetIndex(
                self.paths.index,
                self.base_offset,
                max_index_bytes=self.max_index_bytes,
                file_ops=self.file_ops,
                read_only=not self.writable,
            )
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        if self._time_index is None:
            self._time_index = TimeIndex(
                self.paths.timeindex,
                self.base_offset,
                max_index_bytes=self.max_index_bytes,
                file_ops=self.file_ops,
                read_only=not self.writable,
            )
        return self._time_index

    @property
    def txn_index(self) -> TransactionIndex:
        if self._txn_index is None:
            self._txn_index = TransactionIndex(
                self.paths.txnindex, self.base_offset, file_ops=self.file_ops, read_only=not self.writable
            )
        return self._txn_index

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        return self._settled_fd()

    def _settled_fd(self) -> int:
        """The `.log`'s descriptor for any use but appending: the file holds every byte appended so far."""
        if self._appender is not None:
            self._appender.drain()
        return self._fd

    def _cut_fd(self) -> int:
        """The `.log`'s descriptor to truncate: direct appends end first (what they staged would be stale)."""
        self._end_direct_appends(drain=True)
        return self._fd

    def _end_direct_appends(self, *, drain: bool) -> None:
        """Appends are ordinary writes from now on; with `drain`, the file first gets every byte staged."""
        if self._appender is not None:
            if drain:
                self._appender.drain()
            self._appender.close()
            self._appender = None

    def load_indexes(self) -> None:
        """Read the offset and time index files now, so that this object's indexes are this segment's.

        Requires: the files at this segment's paths are the ones its open `.log` belongs to, i.e. the
        caller holds the partition's listing lock (a cleaner swaps files only under the exclusive one).
        Why: index contents are otherwise read at first use, by path; by then a cleaner may have swapped
        a cleaned segment in under the same name, whose positions mean nothing in the `.log` still open
        here. The transaction index is left to first use: only the cleaner reads it, under its own lock.
        """
        _ = self.offset_index.entries, self.time_index.entries

    def _drop_indexes(self) -> None:
        for index in (self._offset_index, self._time_index, self._txn_index):
            if index is not None:
                index.close()
        self._offset_index = self._time_index = self._txn_index = None

    def refresh_size(self, *, reload_indexes: bool = True) -> bool:
        """Re-read the `.log` size of a segment another process may have appended to; True if it changed.

        A read-only object of a segment that was active when it was opened goes stale once its writer
        appends or rolls. When the size changed, the cached next offset is dropped. With `reload_indexes`
        (the caller holds the listing lock, as `load_indexes` requires) the indexes are read again at once
        if they are behind the file. Without it they are kept: a growing active segment's index only gains
        entries, so the loaded ones remain valid positions to scan forward from; they are read again at the
        next refresh under the lock. A file that shrank (its writer cut a torn tail at open) drops them.
        """
        if self.writable:
            return False
        size = os.fstat(self._fd).st_size
        changed = size != self.size_bytes
        if changed:
            shrank = size < self.size_bytes
            self.size_bytes = size
            self._next_offset = None
            self._indexes_behind = True
            if shrank:
                self._drop_indexes()
        if self._indexes_behind and reload_indexes:
            self._drop_indexes()
            self.load_indexes()
            self._indexes_behind = False
        return changed

    def last_modified_ns(self) -> int:
        return os.stat(self.paths.log).st_mtime_ns

    def set_last_modified_ns(self, mtime_ns: int) -> None:
        os.utime(self.paths.log, ns=(mtime_ns, mtime_ns))

    # ---- reading ------------------------------------------------------------------------------------

    def pread(self, position: int, size: int) -> bytes:
        """Up to `size` bytes of the `.log` at `position` (fewer at the end of the file)."""
        return os.pread(self._settled_fd(), size, position)

    def _read_into(self, buffer: np.ndarray, position: int, size: int) -> memoryview:
        """Read `size` bytes at `position` into `buffer` (no new allocation); the bytes read as a view."""
        view = buffer.data[:size]
        fd = self._settled_fd()
        done = 0
        while done < size:
            n = os.preadv(fd, [view[done:]], position + done)
            if n == 0:
                break
            done += n
        return view[:done]

    def header_at(self, position: int) -> BatchHeader | None:
        """The header of the batch at `position`, or None if no whole batch starts there (end or torn tail)."""
        if position + fmt.HEADER_SIZE_UP_TO_MAGIC >= self.size_bytes:
            return None  # 17 bytes or fewer: not even a torn batch can be told from them
        try:
            # Header bytes only: reading a legacy entry whole would allocate its declared size (up to 2 GiB
            # when corrupt) before knowing whether it fits the file.
            header = read_header_at(self._settled_fd(), position, self.paths.log)
        except TruncatedBatchError:
            return None
        if position + header.size_bytes > self.size_bytes:
            return None
        return header

    def iter_headers(self, start_position: int = 0, end_position: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each whole batch from `start_position` (a batch start) to the end."""
        end = self.size_bytes if end_position is None else min(end_position, self.size_bytes)
        pos = start_position
        while pos < end:
            header = self.header_at(pos)
            if header is None:
                return
            yield pos, header
            pos += header.size_bytes

    def translate_offset(self, target_offset: int, start_position: int = 0) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is ≥ `target_offset`, or None."""
        _, position = self.offset_index.lookup(target_offset)
        position = max(position, start_position)
        for pos, header in self.iter_headers(position):
            if header.last_offset >= target_offset:
                return pos, header
        return None

    def read(self, target_offset: int, max_bytes: int, *, max_position: int | None = None) -> FetchData | None:
        """Whole batches from the first one whose last offset is ≥ target, up to `max_bytes` (at least one).

        Returns None when no batch in this segment reaches `target_offset`.
        """
        found = self.translate_offset(target_offset)
        if found is None:
            return None
        start, first = found
        end = start + first.size_bytes
        limit = self.size_bytes if max_position is None else min(max_position, self.size_bytes)
        for pos, header in self.iter_headers(end, limit):
            if pos + header.size_bytes - start > max_bytes:
                break
            end = pos + header.size_bytes
        return FetchData(self.base_offset, start, self.pread(start, end - start))

    def batches(self, start_position: int = 0, *, verify_crc: bool = True) -> Iterator[tuple[int, RecordBatch]]:
        """(position, decoded batch) for every whole batch, any magic (the object path, for tools)."""
        for pos, header in self.iter_headers(start_position):
            data = self.pread(pos, header.size_bytes)
            try:
                if header.magic == fmt.MAGIC_V2:
                    batch = decode_batch(data, 0, verify_crc=verify_crc)
                else:
                    batch = decode_legacy_entry(data, 0, verify_crc=verify_crc)
            except CorruptRecordError as exc:
                raise exc.located(self.paths.log, pos) from None
            yield pos, batch

    def scan_windows(
        self,
        start_position: int = 0,
        *,
        window_bytes: int = _READ_CHUNK_BYTES,
        verify_crc: bool = True,
        headers_only: bool = False,
        stop_at_invalid: bool = False,
        ring=None,
        before_read: Callable[[int], None] | None = None,
        mapped: bool = False,
    ) -> Iterator[tuple[bytes | memoryview, "ScanResult"]]:
        """(window, scan result) over the whole batches from `start_position` (a batch start) to the end.

        Windows are `window_bytes` long (one larger batch gets a window of its own). Each window takes the
        next read buffer and record arrays of `ring` (a `segments.files.readahead.WindowRing`; a ring of one set,
        reused from window to window, if None): a window and its result are valid until the ring hands their
        set out again, i.e. until the next window with a one-set ring, and until the consumer of a read-ahead
        thread asks for the next one with the two-set ring it uses. Raises
        `CorruptRecordError` with this file and position for an invalid batch, or an incomplete one at the
        end; with `stop_at_invalid` (the active segment, which its writer may be appending to) the walk ends
        quietly there instead. `before_read(n)` is called before each read of `n` bytes, on the thread that
        reads (the cleaner's I/O throttle: it may block, or raise to stop the walk). With `mapped` (a caller
        holding the cleaner lock, on an inactive segment: see `segments.files.mapped`) each window is a view of
        a mapping of its pages, not a copy in the ring's read buffer.
        """
        # numba (the scan's kernels) is imported only when a scan runs: start-up of the CLI stays fast
        from ..codec.scan import scan
        from .readahead import WindowRing

        pos = start_position
        size = self.size_bytes
        if _FADV_SEQUENTIAL is not None and pos < size:
            # A whole-segment walk: ask the kernel for its larger read-ahead (it matters from a cold cache).
            os.posix_fadvise(self._settled_fd(), pos, size - pos, _FADV_SEQUENTIAL)
        if ring is None:
            ring = WindowRing(window_bytes, count=1)
        while pos < size:
            read_buffer, buffers = ring.next(min(window_bytes, size - pos))
            if before_read is not None:
                before_read(min(window_bytes, size - pos))
            window: bytes | memoryview | None = None
            if mapped:
                window = mapped_window(self._settled_fd(), pos, min(window_bytes, size - pos))
            if window is None:
                window = self._read_into(read_buffer, pos, min(window_bytes, size - pos))
            try:
                result = scan(window, base_position=pos, verify_crc=verify_crc, headers_only=headers_only, buffers=buffers)
                if result.n_batches == 0 and result.torn_tail and 0 < result.torn_batch_bytes <= size - pos:
                    if before_read is not None:
                        before_read(result.torn_batch_bytes)
                    window = self.pread(pos, result.torn_batch_bytes)
                    result = scan(window, base_position=pos, verify_crc=verify_crc, headers_only=headers_only, buffers=buffers)
            except CorruptRecordError as exc:
                if stop_at_invalid:
                    return
                self._raise_if_resized(size, pos)
                raise exc.located(self.paths.log, 0) from None
            if result.n_batches == 0:
                if stop_at_invalid:
                    return
                self._raise_if_resized(size, pos)
                raise TruncatedBatchError.at_end_of_file(size - pos, result.torn_batch_bytes, position=pos,
                                                         path=self.paths.log)
            yield window, result
            pos = result.end_position

    def _raise_if_resized(self, size: int, position: int) -> None:
        """Raise `CorruptRecordError` saying so if the file is no longer `size` bytes: bytes found invalid in a walk
        of a file that another process truncated or extended meanwhile are not the file's corruption."""
        now = os.fstat(self._settled_fd()).st_size
        if now != size:
            raise CorruptRecordError(
                f"the file changed size while it was read, from {size} to {now} bytes: another process truncated or "
                "wrote it (a segment below the active one is never changed while its partition is locked)",
                position=position,
                path=self.paths.log,
            )

    def find_offset_by_timestamp(self, timestamp_ms: int, start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp ≥ `timestamp_ms` at or after `start_offset`."""
        _, indexed_offset = self.time_index.lookup(timestamp_ms)
        found = self.translate_offset(max(indexed_offset, start_offset))
        if found is None:
            return None
        for _, batch in self.batches(found[0]):
            if batch.header.max_timestamp < timestamp_ms:
                continue
            for record in batch.records:
                if record.timestamp >= timestamp_ms and record.offset >= start_offset:
                    return record.offset, record.timestamp
        return None

    def read_next_offset(self) -> int:
        """The offset after the last batch (base offset for an empty segment). Cached once known."""
        if self._next_offset is None:
            _, position = self.offset_index.lookup(2**63 - 1)
            last, last_position = None, 0
            for at, header in self.iter_headers(position):
                last, last_position = header, at
            if last is None and position > 0:
                for at, header in self.iter_headers(0):
                    last, last_position = header, at
            if last is not None and last.next_offset <= self.base_offset:
                raise CorruptRecordError(
                    f"the last batch ends at offset {last.next_offset - 1}, below the segment's base offset "
                    f"{self.base_offset}", position=last_position, path=self.paths.log,
                )
            self._next_offset = self.base_offset if last is None else last.next_offset
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """Largest batch max timestamp seen in this segment (from the time index when not appended to)."""
        if self._max_timestamp_so_far == fmt.NO_TIMESTAMP:
            ts, _ = self.time_index.last_entry
            return ts
        return self._max_timestamp_so_far

    # ---- appending -----------------------------------------------------------------------------------

    def write_directly(self) -> bool:
        """Send this new, empty segment's `.log` appends around the page cache (`segments.files.direct`): whole
        blocks at once, the partial last one before any other use of the file (a read, an fsync, a close).
        Returns whether the filesystem takes direct writes; where it does not, appends stay ordinary writes."""
        assert self.writable and self.size_bytes == 0 and self._appender is None, f"{self.paths.log}: not new"
        self._appender = DirectAppender(self.paths.log, self._fd, self.file_ops)
        return self._appender.direct

    def _write(self, data: bytes | bytearray | memoryview, position: int) -> None:
        if self._appender is not None:
            self._appender.append(data)  # appends only: `position` is the end of what it was given
        else:
            self.file_ops.pwrite_all(self._fd, data, position)

    def load_append_state(self) -> None:
        """Rebuild Kafka's append-time state (bytes since the last index entry, max timestamp so far).

        Needed before appending to an existing segment; `recover()` also sets it.
        """
        last_indexed_position = self.offset_index.lookup(2**63 - 1)[1] if self.offset_index.entries else 0
        ts, offset = self.time_index.last_entry
        self._max_timestamp_so_far, self._shallow_offset_of_max_timestamp = ts, offset
        start = last_indexed_position
        last_start = start
        for pos, header in self.iter_headers(start):
            last_start = pos
            if header.max_timestamp > self._max_timestamp_so_far:
                self._max_timestamp_so_far = header.max_timestamp
                self._shallow_offset_of_max_timestamp = header.last_offset
            self._next_offset = header.next_offset
        # Bytes appended since the last index entry (Kafka counts whole appends; batches are our unit).
        self._bytes_since_last_index_entry = self.size_bytes - last_indexed_position if last_start else self.size_bytes
        if self._next_offset is None:
            self._next_offset = self.base_offset

    def append(self, data: bytes | bytearray | memoryview, *, largest_offset: int, max_timestamp: int, shallow_offset: int) -> int:
        """Append whole batches (already carrying their final offsets); returns the position written at.

        Mirrors Kafka's LogSegment.append: an offset-index and time-index entry (largest offset of this
        append, its start position) are added when more than `index.interval.bytes` were appended since
        the last entry. Requires a writable segment and offsets that fit the segment's relative range.
        """
        assert self.writable, f"{self.paths.log} is not open for writing"
        if not 0 <= largest_offset - self.base_offset <= fmt.RELATIVE_OFFSET_MAX:
            raise ValueError(f"offset {largest_offset} does not fit segment {self.base_offset}")
        position = self.size_bytes
        self._write(data, position)
        self.size_bytes += len(data)
        if max_timestamp > self._max_timestamp_so_far:
            self._max_timestamp_so_far = max_timestamp
            self._shallow_offset_of_max_timestamp = shallow_offset
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.offset_index.append(largest_offset, position)
            self.time_index.maybe_append(self._max_timestamp_so_far, self._shallow_offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += len(data)
        self._next_offset = largest_offset + 1
        return position

    def append_batches(
        self,
        data: bytes | memoryview,
        batch_positions: np.ndarray,
        batch_last_offsets: np.ndarray,
        batch_max_timestamps: np.ndarray,
    ) -> int:
        """Append whole batches with one write, indexing them as if each batch were its own append.

        `batch_positions` are relative to `data`. Used by the cleaner, whose output chunks hold many
        batches; per-batch indexing keeps reads of the cleaned segment as precise as Kafka's recovery
        rule would make them. The entries of all the batches are found and checked in one compiled pass
        (`index.append_run_entries`) and appended as arrays. Returns the position written at.
        """
        assert self.writable, f"{self.paths.log} is not open for writing"
        n = len(batch_positions)
        if n == 0:
            return self.size_bytes
        last_offsets = np.asarray(batch_last_offsets, dtype=np.int64)
        if not 0 <= int(last_offsets[-1]) - self.base_offset <= fmt.RELATIVE_OFFSET_MAX:
            raise ValueError(f"offset {int(last_offsets[-1])} does not fit segment {self.base_offset}")
        if self.size_bytes + len(data) > fmt.RELATIVE_OFFSET_MAX:
            raise ValueError(f"{self.paths.log} would grow past 2^31-1 bytes; positions would not fit the index")
        start = self.size_bytes
        self._write(data, start)
        self.size_bytes += len(data)
        # The per-batch rule of `append` over every batch at once, and both indexes' appends: one compiled call.
        self._bytes_since_last_index_entry, self._max_timestamp_so_far, self._shallow_offset_of_max_timestamp = (
            append_run_entries(
                self.offset_index, self.time_index, start, np.asarray(batch_positions, dtype=np.int64), last_offsets,
                np.asarray(batch_max_timestamps, dtype=np.int64), end=len(data),
                index_interval_bytes=self.index_interval_bytes,
                state=(self._bytes_since_last_index_entry, self._max_timestamp_so_far,
                       self._shallow_offset_of_max_timestamp)))
        self._next_offset = int(last_offsets[-1]) + 1
        return start

    def index_room(self) -> int:
        """How many more entries both indexes take (the smaller of the two; 0: full, the log must roll)."""
        return min(self.offset_index.entries_max - self.offset_index.entries,
                   self.time_index.entries_max - self.time_index.entries)

    def index_capacity(self) -> int:
        """How many entries both indexes take when empty (the smaller of the two)."""
        return min(self.offset_index.entries_max, self.time_index.entries_max)

    def finalise(self) -> None:
        """Make the segment inactive: final time-index entry, flush and fsync every file.

        Called when the segment is rolled, when the cleaner finishes a `.cleaned` segment, and on close.
        """
        if self._max_timestamp_so_far != fmt.NO_TIMESTAMP:
            self.time_index.maybe_append(
                self._max_timestamp_so_far, self._shallow_offset_of_max_timestamp, skip_full_check=True
            )
        self.offset_index.flush()  # both index files exist once a segment is final, even if empty
        self.flush()

    def flush(self) -> None:
        """fsync the log and flush+fsync the indexes that were touched."""
        if self.writable:
            self.file_ops.fsync_fd(self._settled_fd())
        for index in (self._offset_index, self._time_index, self._txn_index):
            if index is not None:
                index.flush()
                if self.writable:
                    index.fsync()

    # ---- recovery ------------------------------------------------------------------------------------

    def recover(self, *, tail_may_be_torn: bool) -> RecoveryResult:
        """Validate every batch (CRC, framing, records), rebuild the offset and time indexes, cut a torn tail.

        The rebuilt indexes follow Kafka's canonical rule (`LogSegment.recover`). `tail_may_be_torn` is
        true only for the active segment recovered by its writer: then an invalid final batch that is
        a torn tail is cut off (the segment must be writable). Otherwise, and for any invalid batch that
        is not a torn tail, raises `CorruptRecordError` (file and position) and changes nothing.
        """
        # numba (the scan's kernels) is imported only when a scan runs: start-up of the CLI stays fast
        from ..codec.scan import scan as scan_buffer

        positions: list[np.ndarray] = []
        first_offsets: list[np.ndarray] = []
        last_offsets: list[np.ndarray] = []
        max_timestamps: list[np.ndarray] = []
        pos = 0
        batches = 0
        failure: CorruptRecordError | None = None

        def take(result) -> None:
            positions.append(result.batch_position.copy())
            first_offsets.append(result.base_offset.copy())
            last_offsets.append(result.last_offset.copy())
            max_timestamps.append(result.max_timestamp.copy())

        while pos < self.size_bytes:
            chunk = self.pread(pos, min(_READ_CHUNK_BYTES, self.size_bytes - pos))
            try:
                result = scan_buffer(chunk, base_position=pos, verify_crc=True)
                if result.n_batches == 0:
                    # No whole batch in the window: one batch larger than the window, or the tail.
                    header = self.header_at(pos)
                    if header is None:
                        break
                    chunk = self.pread(pos, header.size_bytes)
                    result = scan_buffer(chunk, base_position=pos, verify_crc=True)
            except CorruptRecordError as exc:
                failure = exc.located(self.paths.log, 0)
                bad_start = self._batch_start_containing(pos, failure.position)
                if bad_start > pos:
                    valid = scan_buffer(chunk[: bad_start - pos], base_position=pos, verify_crc=True)
                    take(valid)
                    batches += valid.n_batches
                pos = bad_start
                break
            take(result)
            batches += result.n_batches
            pos = result.end_position
        valid_bytes = pos
        if valid_bytes < self.size_bytes:
            if not tail_may_be_torn:
                raise failure or CorruptRecordError(
                    f"incomplete batch at the end of an inactive segment ({self.size_bytes - valid_bytes} bytes)",
                    position=valid_bytes,
                    path=self.paths.log,
                )
            if failure is not None and not self._is_torn_tail(valid_bytes):
                raise failure
        batch_positions = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        batch_last = np.concatenate(last_offsets) if last_offsets else np.zeros(0, np.int64)
        batch_max_ts = np.concatenate(max_timestamps) if max_timestamps else np.zeros(0, np.int64)
        self._check_offsets_increase(
            batch_positions, np.concatenate(first_offsets) if first_offsets else np.zeros(0, np.int64), batch_last
        )
        truncated = self.size_bytes - valid_bytes
        if truncated:
            assert self.writable, f"{self.paths.log}: truncating needs a writable segment"
            log.warning("truncating torn tail path=%s position=%d bytes=%d", self.paths.log, valid_bytes, truncated)
            os.ftruncate(self._cut_fd(), valid_bytes)
            self.size_bytes = valid_bytes
        self.rebuild_indexes(batch_positions, batch_last, batch_max_ts, write=self.writable)
        # Append state, as after Kafka's recover: the last indexed position and the max timestamp.
        if len(batch_positions):
            self._next_offset = int(batch_last[-1]) + 1
            i = int(np.argmax(batch_max_ts))
            self._max_timestamp_so_far = int(batch_max_ts[i])
            self._shallow_offset_of_max_timestamp = int(batch_last[i])
            offsets, idx_positions = build_offset_index_entries(batch_positions, batch_last, self.index_interval_bytes)
            last_indexed = int(idx_positions[-1]) if len(idx_positions) else 0
            self._bytes_since_last_index_entry = valid_bytes - last_indexed
        else:
            self._next_offset = self.base_offset
            self._bytes_since_last_index_entry = 0
        return RecoveryResult(valid_bytes, truncated, batches, self._next_offset)

    def _check_offsets_increase(self, positions: np.ndarray, first_offsets: np.ndarray, last_offsets: np.ndarray) -> None:
        """Raise `CorruptRecordError` at the first batch whose offsets do not lie above the batch before it and
        within [base, base + 2^31-1]. The CRC does not cover baseOffset: only the order of offsets tells a
        corrupt one, and the index rebuilt from them could not hold it.
        """
        floors = np.concatenate(([self.base_offset], last_offsets[:-1] + 1))
        bad = np.flatnonzero(
            (first_offsets < floors)
            | (last_offsets < first_offsets)
            | (last_offsets - self.base_offset > fmt.RELATIVE_OFFSET_MAX)
        )
        if len(bad):
            j = int(bad[0])
            raise CorruptRecordError(
                f"batch offsets [{int(first_offsets[j])}, {int(last_offsets[j])}] do not follow the batch before "
                f"(expected from {int(floors[j])}) within [{self.base_offset}, {self.base_offset + fmt.RELATIVE_OFFSET_MAX}]",
                position=int(positions[j]),
                path=self.paths.log,
            )

    def _batch_start_containing(self, start: int, position: int) -> int:
        """The start of the batch (walking headers from `start`) whose bytes include `position`."""
        pos = start
        while True:
            try:
                header = self.header_at(pos)
            except CorruptRecordError:
                return pos
            if header is None or pos + header.size_bytes > position:
                return pos
            pos += header.size_bytes

    def _is_torn_tail(self, position: int) -> bool:
        """True if the invalid batch starting at `position` is the last thing in the file.

        That is: its declared size reaches the end of the file (a write cut short), or only zero
        bytes follow its start (preallocated or never-written space).
        """
        prefix = self.pread(position, fmt.LOG_OVERHEAD)
        if len(prefix) < fmt.LOG_OVERHEAD:
            return True
        _, length = fmt.PREFIX.unpack(prefix)
        if length >= 0 and position + fmt.LOG_OVERHEAD + length >= self.size_bytes:
            return True
        pos = position
        while pos < self.size_bytes:
            chunk = self.pread(pos, min(_ZERO_CHECK_CHUNK_BYTES, self.size_bytes - pos))
            if chunk.count(0) != len(chunk):
                return False
            pos += len(chunk)
        return True

    def rebuild_indexes(
        self, batch_positions: np.ndarray, batch_last_offsets: np.ndarray, batch_max_timestamps: np.ndarray, *, write: bool
    ) -> None:
        """Replace both indexes with Kafka's canonical build over the given batches.

        Raises `CorruptRecordError` (file and position) if the batches' last offsets do not increase within
        [base, base + 2^31-1]: then they came from a corrupt log, which no index can describe.
        """
        self._check_offsets_increase(batch_positions, batch_last_offsets, batch_last_offsets)
        offsets, positions = build_offset_index_entries(batch_positions, batch_last_offsets, self.index_interval_bytes)
        ts, ts_offsets = build_time_index_entries(
            batch_positions, batch_last_offsets, batch_max_timestamps, self.index_interval_bytes
        )
        self.offset_index.reset()
        self.time_index.reset()
        self.offset_index.append_many(offsets, positions)
        self.time_index.maybe_append_many(ts, ts_offsets)
        if write:
            self.offset_index.flush()
            self.time_index.flush()

    # ---- lifecycle -----------------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose base offset is ≥ `offset`; returns the new size in bytes."""
        assert self.writable
        found = self.translate_offset(offset)
        if found is None:
            return self.size_bytes
        pos, header = found
        if header.base_offset < offset:
            pos += header.size_bytes
        os.ftruncate(self._cut_fd(), pos)
        self.size_bytes = pos
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self._next_offset = None
        return pos

    def change_suffix(self, new_suffix: str) -> None:
        """Rename every existing file of this segment from the current suffix to `new_suffix` (log first)."""
        new_paths = segment_paths(self.directory, self.base_offset, new_suffix)
        self.file_ops.rename(self.paths.log, new_paths.log)
        if self._offset_index is not None or self.paths.index.exists():
            self.offset_index.rename_to(new_paths.index)
        if self._time_index is not None or self.paths.timeindex.exists():
            self.time_index.rename_to(new_paths.timeindex)
        if self.paths.txnindex.exists() or self._txn_index is not None:
            self.txn_index.rename_to(new_paths.txnindex)
        self.paths = new_paths
        self.suffix = new_suffix

    def close(self, *, discard: bool = False) -> None:
        """Close the log file and the indexes, writing their unwritten entries first unless `discard`."""
        if self._fd >= 0:
            for index in (self._offset_index, self._time_index, self._txn_index):
                if index is not None:
                    index.discard() if discard else index.close()
            self._end_direct_appends(drain=not discard)
            os.close(self._fd)
            self._fd = -1

    def delete_files(self) -> None:
        """Close and remove every file of this segment (with its current suffix). Its indexes' unwritten entries
        are dropped, not written first: on a full disk that write would fail, and its files would stay."""
        self.close(discard=True)
        for path in self.paths.all():
            self.file_ops.remove(path)

    def __repr__(self) -> str:
        return f"LogSegment({self.paths.log}, size={self.size_bytes})"
