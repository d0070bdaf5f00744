"""The offset index (`.index`) and time index (`.timeindex`) of one segment: docs/format.md 3.1 and 3.2.

Owns opening, appending to (entry by entry or as arrays: `append_many`, `maybe_append_many`, each checked in one
compiled call of `_index_kernels`), looking up in, truncating, checking, writing and renaming the two sparse
indexes of a segment, and Kafka's rules for building them from batches: at append time over a run of batches
(`interval_entries`, compiled in `_index_kernels`) and the canonical whole-segment build
(`build_offset_index_entries`, `build_time_index_entries`). It must not read `.log` files (callers pass
batch positions, offsets and timestamps) and does not decide when an index is rebuilt: the log calls
`sanity_check()` on every index it opens and rebuilds the index on `CorruptIndexError`, as Kafka's
`LogSegment.sanityCheck` / `LogLoader` do. The byte layouts come from `segments.codec.format`.

Rules a caller must know: an index file always holds exactly its valid entries (never preallocated); entries
live in memory and reach the file only at `flush()` (`append` flushes by itself past `_PENDING_BYTES_MAX`),
`fsync()` flushes and fsyncs, `close()` flushes without fsync; opening never validates; `is_full` tells the
log to roll; an entry that breaks an invariant raises `IndexAppendError`, a file that does `CorruptIndexError`;
`read_only=True` never changes the file. Not thread-safe: the log that owns the segment serialises access
under its lock. The decisions, and where they differ from Kafka: see docs/design.md, "Index files".
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Literal, cast

import numpy as np
import numpy.typing as npt

from ..codec import format as fmt
from ..codec.errors import CorruptIndexError, IndexAppendError, IndexOffsetOverflowError, LogStateError
from .fileio import DEFAULT_FILE_OPS, FileOps

__all__ = [
    "OffsetIndex",
    "TimeIndex",
    "build_offset_index_entries",
    "build_time_index_entries",
    "append_run_entries",
    "interval_entries",
]

_INT32_MAX = 2**31 - 1  # positions are int32
_INT64_MAX = 2**63 - 1  # timestamps are int64
_CAPACITY_MIN_ENTRIES = 64  # first allocation of the in-memory columns
_PENDING_BYTES_MAX = 64 * 1024  # appended entries waiting for a write; append writes them at this size

ArrayLike = npt.ArrayLike


def _write_new_file(path: str | os.PathLike, data: bytes, file_ops: FileOps) -> None:
    """Replace the content of `path` with `data` in one write, then fsync the file (not the directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)  # never truncate a link's target
    try:
        file_ops.pwrite_all(fd, data, 0)
        file_ops.fsync_fd(fd)
    finally:
        os.close(fd)


def _search(column: np.ndarray, value: int, side: Literal["left", "right"]) -> int:
    """`np.searchsorted(column, value, side)` for a Python int that may lie outside the column's dtype."""
    value = operator.index(value)
    info = np.iinfo(column.dtype)
    if value < info.min:
        return 0
    if value > info.max:
        return len(column)
    return int(np.searchsorted(column, column.dtype.type(value), side=side))


def _entries_max(max_index_bytes: int, entry_bytes: int) -> int:
    max_index_bytes = operator.index(max_index_bytes)
    if max_index_bytes < entry_bytes:
        raise ValueError(f"max_index_bytes must be at least {entry_bytes}, got {max_index_bytes}")
    return max_index_bytes // entry_bytes


def _steps(values: np.ndarray, *, strictly_increasing: bool) -> np.ndarray:
    """Mask of the entries that break the order with their predecessor (never the first entry)."""
    mask = np.zeros(len(values), dtype=bool)
    mask[1:] = values[1:] <= values[:-1] if strictly_increasing else values[1:] < values[:-1]
    return mask


@functools.cache
def _kernels() -> ModuleType:
    """`_index_kernels`, imported at the first call with entries: the kernels load only when a segment is indexed
    by arrays (the CLI's start-up stays fast), and a cached call is cheaper per call than an `import`."""
    from . import _index_kernels

    return _index_kernels


def _int64_columns(*values: ArrayLike) -> list[np.ndarray] | None:
    """`values` as 1-D int64 arrays of one length, or None if any holds something else than integers that fit
    int64 (the caller then appends entry by entry, whose checks say what is wrong)."""
    if all(type(v) is np.ndarray and v.dtype == np.int64 and v.ndim == 1 and v.flags.c_contiguous for v in values):
        arrays = [cast(np.ndarray, v) for v in values]  # the appends' usual input, as it is
        if any(len(a) != len(arrays[0]) for a in arrays):
            raise ValueError(f"entry arrays must be of one length, got {[len(a) for a in arrays]}")
        return arrays
    arrays = []
    for value in values:
        array = np.asarray(value)
        if array.ndim != 1:
            return None
        if array.size == 0:
            array = np.zeros(0, np.int64)
        elif array.dtype.kind not in "iu" or (array.dtype.kind == "u" and int(array.max()) > _INT64_MAX):
            return None
        arrays.append(np.ascontiguousarray(array, dtype=np.int64))
    if any(len(a) != len(arrays[0]) for a in arrays):
        raise ValueError(f"entry arrays must be of one length, got {[len(a) for a in arrays]}")
    return arrays


def _items(values: ArrayLike) -> list[Any]:
    """The items of a sequence the array appends could not take as int64, for the entry-by-entry path."""
    return list(cast(Iterable[Any], values))


def _first_true(mask: np.ndarray, shift: int = 0) -> int | None:
    """Index (plus `shift`) of the first True in `mask`, or None."""
    hits = np.flatnonzero(mask)
    return None if len(hits) == 0 else int(hits[0]) + shift


class _EntryFile:
    """A file of fixed-size entries mirrored in contiguous numpy columns: the mechanics all three indexes share.

    Invariant: the first `_file_entries` entries in memory equal the first entries of the file, and the
    file is `_file_bytes` long (None: there is no file). `_dirty` says memory and file differ, which
    `flush()` repairs. Columns are allocated with spare capacity; only `[:_n]` is valid.
    Each subclass defines the classmethod `_validated(path, base_offset, first, second, entries_max)`
    that checks a whole set of entries before `_write_file` writes them.
    """

    _disk_dtype: ClassVar[np.dtype]
    _columns: ClassVar[tuple[tuple[str, type], ...]]  # (field of _disk_dtype, native in-memory dtype)
    _create_on_open: ClassVar[bool] = True

    # (path, base_offset, first, second, entries_max) -> the entries as columns, after the checks `append`
    # makes; each index that writes a whole file at once (`_write_file`) defines it as a classmethod
    _validated: ClassVar[Callable[..., dict[str, np.ndarray]]]

    def __init__(
        self,
        path: str | os.PathLike,
        base_offset: int,
        *,
        entries_max: int,
        file_ops: FileOps,
        read_only: bool,
    ) -> None:
        base_offset = operator.index(base_offset)
        if base_offset < 0:
            raise ValueError(f"base_offset must be non-negative, got {base_offset}")
        self.path = Path(path)
        self.base_offset = base_offset
        self.entries_max = entries_max
        self.read_only = read_only
        self.file_ops = file_ops
        self._entry_bytes = self._disk_dtype.itemsize
        self._cols: dict[str, np.ndarray] = {}
        self._n: int | None = None  # None: the file has not been read yet
        self._file_entries = 0
        self._file_bytes: int | None = None
        self._dirty = False
        self._closed = False
        if self._create_on_open and not read_only:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size == 0:
                self._set_empty(file_bytes=0)
        elif not self.path.exists():
            self._set_empty(file_bytes=None)

    # ---- state -------------------------------------------------------------------------------------

    def _set_empty(self, *, file_bytes: int | None) -> None:
        self._cols = {name: np.empty(0, dtype) for name, dtype in self._columns}
        self._n = 0
        self._file_entries = 0
        self._file_bytes = file_bytes

    def _load(self) -> None:
        data = self.path.read_bytes()
        n = len(data) // self._entry_bytes
        records = np.frombuffer(data, dtype=self._disk_dtype, count=n)
        # astype copies each field into its own contiguous native array, which searchsorted needs.
        self._cols = {name: records[name].astype(dtype) for name, dtype in self._columns}
        self._n = n
        self._file_entries = n
        self._file_bytes = len(data)

    def _adopt(self, columns: dict[str, np.ndarray], file_bytes: int) -> None:
        """Take entries just written to the file as the loaded state (saves reading them back)."""
        self._cols = {name: np.ascontiguousarray(columns[name], dtype=dtype) for name, dtype in self._columns}
        self._n = len(self._cols[self._columns[0][0]])
        self._file_entries = self._n
        self._file_bytes = file_bytes

    def _ensure_open(self) -> None:
        if self._closed:
            raise LogStateError(f"{self.path}: the index is closed")

    def _loaded(self) -> int:
        """The number of entries, reading the file first if that has not happened yet."""
        self._ensure_open()
        if self._n is None:
            self._load()
        assert self._n is not None
        return self._n

    def _column(self, name: str) -> np.ndarray:
        n = self._loaded()
        return self._cols[name][:n]

    def _push(self, values: tuple[int, ...]) -> None:
        n = self._loaded()
        capacity = len(self._cols[self._columns[0][0]])
        if n == capacity:
            new_capacity = max(_CAPACITY_MIN_ENTRIES, 2 * capacity)
            new_capacity = min(new_capacity, max(self.entries_max, n + 1))
            for name, dtype in self._columns:
                grown: np.ndarray = np.empty(new_capacity, dtype)
                grown[:n] = self._cols[name][:n]
                self._cols[name] = grown
        for (name, _), value in zip(self._columns, values):
            self._cols[name][n] = value
        self._n = n + 1
        self._dirty = True
        if not self.read_only and (self._n - self._file_entries) * self._entry_bytes >= _PENDING_BYTES_MAX:
            self.flush()

    def _push_many(self, values: tuple[np.ndarray, ...]) -> None:
        """`_push` of many entries, one array per column (already checked), with one copy per column."""
        count = len(values[0])
        if count == 0:
            return
        n = self._loaded()
        capacity = len(self._cols[self._columns[0][0]])
        if n + count > capacity:
            new_capacity = max(_CAPACITY_MIN_ENTRIES, 2 * capacity, n + count)
            new_capacity = min(new_capacity, max(self.entries_max, n + count))
            for name, dtype in self._columns:
                grown: np.ndarray = np.empty(new_capacity, dtype)
                grown[:n] = self._cols[name][:n]
                self._cols[name] = grown
        for (name, _), column in zip(self._columns, values):
            self._cols[name][n:n + count] = column
        self._n = n + count
        self._dirty = True
        if not self.read_only and (self._n - self._file_entries) * self._entry_bytes >= _PENDING_BYTES_MAX:
            self.flush()

    def _truncate(self, keep: int) -> None:
        n = self._loaded()
        if keep >= n:
            return
        self._n = keep
        self._file_entries = min(self._file_entries, keep)
        self._dirty = True
        capacity = len(self._cols[self._columns[0][0]])
        if capacity > _CAPACITY_MIN_ENTRIES and keep < capacity // 4:
            # Give memory back: an index's memory stays bounded by its entries.
            smaller = max(_CAPACITY_MIN_ENTRIES, 2 * keep)
            self._cols = {name: self._cols[name][:smaller].copy() for name, _ in self._columns}

    @classmethod
    def _encode_columns(cls, columns: dict[str, np.ndarray], start: int, stop: int) -> bytes:
        records = np.empty(stop - start, dtype=cls._disk_dtype)
        for name, _ in cls._columns:
            records[name] = columns[name][start:stop]
        return records.tobytes()

    def _raise_first(self, checks: list[tuple[np.ndarray, Callable[[int], str]]]) -> None:
        """Raise `CorruptIndexError` for the problem at the lowest byte position, if there is one.

        The candidates are a partial entry at the end of the file (a torn append) and, for each
        `(mask, message)`, the first entry the mask flags (`message(i)` says what is wrong with entry i).
        """
        problems: list[tuple[int, str]] = []
        size = self._entry_bytes
        if self._file_bytes is not None and self._file_bytes % size:
            whole = self._file_bytes - self._file_bytes % size
            problems.append(
                (whole, f"file length {self._file_bytes} is not a multiple of the {size}-byte entry size: "
                        f"{self._file_bytes - whole} bytes of a partial entry at the end (a torn append)")
            )
        for mask, message in checks:
            i = _first_true(mask)
            if i is not None:
                problems.append((i * size, f"entry {i}: {message(i)}"))
        if problems:
            position, reason = min(problems, key=lambda problem: problem[0])
            raise CorruptIndexError(reason, path=self.path, position=position)

    @classmethod
    def _write_file(
        cls,
        path: str | os.PathLike,
        base_offset: int,
        first: ArrayLike,
        second: ArrayLike,
        max_index_bytes: int,
        file_ops: FileOps,
    ) -> tuple[dict[str, np.ndarray], int]:
        """Validate whole-index entries, write them to `path` in one write and fsync; (columns, file bytes)."""
        entries_max = _entries_max(max_index_bytes, cls._disk_dtype.itemsize)
        columns = cls._validated(path, base_offset, first, second, entries_max)
        count = len(columns[cls._columns[0][0]])
        data = cls._encode_columns(columns, 0, count)
        _write_new_file(path, data, file_ops)
        return columns, len(data)

    # ---- shared public API ---------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        """The number of valid entries."""
        return self._loaded()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def truncate_to_entries(self, entries: int) -> None:
        """Keep the first `entries` entries (no-op if there are not more). Requires `entries >= 0`."""
        if entries < 0:
            raise ValueError(f"entries must be >= 0, got {entries}")
        self._truncate(entries)

    def reset(self) -> None:
        """Remove every entry (the file is emptied at the next flush)."""
        self._truncate(0)

    def flush(self) -> None:
        """Make the file equal to memory: write the entries it lacks and cut it to `entries × entry_size`.

        Creates the file if it does not exist. Does not fsync. Raises `LogStateError` if the index is
        closed, or read-only with changes in memory.
        """
        self._ensure_open()
        if not self._dirty:
            return
        if self.read_only:
            raise LogStateError(f"{self.path}: a read-only index has changes that cannot be written")
        assert self._n is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            if self._n > self._file_entries:
                data = self._encode_columns(self._cols, self._file_entries, self._n)
                self.file_ops.pwrite_all(fd, data, self._file_entries * self._entry_bytes)
            size = self._n * self._entry_bytes
            if self._file_bytes != size:
                os.ftruncate(fd, size)
        finally:
            os.close(fd)
        self._file_entries = self._n
        self._file_bytes = self._n * self._entry_bytes
        self._dirty = False

    def fsync(self) -> None:
        """Flush, then fsync the file through `file_ops` (nothing to do for a read-only or absent file)."""
        self.flush()
        if self.read_only or not self.path.exists():
            return
        self.file_ops.fsync_file(self.path)

    def close(self) -> None:
        """Flush (without fsync) and release memory. Idempotent; only `rename_to`/`delete` work afterwards."""
        if self._closed:
            return
        if self._dirty and not self.read_only:
            self.flush()
        self._cols = {}
        self._n = None
        self._closed = True

    def discard(self) -> None:
        """Close without writing what is not yet in the file (its file is about to be removed). Idempotent."""
        self._cols = {}
        self._n = None
        self._dirty = False
        self._closed = True

    def delete(self) -> None:
        """Close without writing and remove the file (an absent file is fine)."""
        self._cols = {}
        self._n = None
        self._dirty = False
        self._closed = True
        self.file_ops.remove(self.path)
        self._file_bytes = None

    def rename_to(self, new_path: str | os.PathLike) -> None:
        """Rename the file (if it exists) to `new_path` through `file_ops` and point this index at it.

        Used by the swap protocol (`.cleaned` → `.swap` → ``, `` → `.deleted`); the caller fsyncs the
        directory. Works on a closed index. Changes not yet flushed go to the new path.
        """
        new_path = Path(new_path)
        if self.path.exists():
            self.file_ops.rename(self.path, new_path)
        elif self._file_bytes is not None:
            # The file we knew is gone: the next flush must write every entry, not just the new ones.
            self._file_entries, self._file_bytes = 0, None
            self._dirty = bool(self._n)
        self.path = new_path

    def __repr__(self) -> str:
        count = "?" if self._n is None else self._n
        return f"{type(self).__name__}({str(self.path)!r}, base_offset={self.base_offset}, entries={count})"


# ---- the two sparse indexes ------------------------------------------------------------------------------


class _SparseIndex(_EntryFile):
    """What `.index` and `.timeindex` share: opening from `segment.index.bytes` (`max_index_bytes`)."""

    def __init__(
        self,
        path: str | os.PathLike,
        base_offset: int,
        *,
        max_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT,
        file_ops: FileOps = DEFAULT_FILE_OPS,
        read_only: bool = False,
    ) -> None:
        self.max_index_bytes = max_index_bytes
        super().__init__(
            path,
            base_offset,
            entries_max=_entries_max(max_index_bytes, self._disk_dtype.itemsize),
            file_ops=file_ops,
            read_only=read_only,
        )


# ---- offset index ---------------------------------------------------------------------------------------


class OffsetIndex(_SparseIndex):
    """A segment's `.index`: sparse `(offset, position)` entries, offsets strictly increasing, positions not decreasing.

    Opens `path` or creates it empty (unless `read_only`). `max_index_bytes` is `segment.index.bytes`.
    """

    _disk_dtype = fmt.OFFSET_INDEX_ENTRY_DTYPE
    _columns = (("relative_offset", np.int32), ("position", np.int32))

    @property
    def is_full(self) -> bool:
        """True when no entry can be appended: the log must roll the segment."""
        return self.entries >= self.entries_max

    @property
    def last_offset(self) -> int:
        """The offset of the last entry, or the base offset if there is none."""
        n = self._loaded()
        return self.base_offset + int(self._cols["relative_offset"][n - 1]) if n else self.base_offset

    def append(self, offset: int, position: int) -> None:
        """Append `(offset, position)`: the last offset of the batch starting at `position` of the `.log`.

        Requires: the index is not full; `offset` is above the last entry's offset; `0 <= offset - base
        <= 2^31-1`; `0 <= position <= 2^31-1` and not below the last entry's position. Raises
        `IndexAppendError` (`IndexOffsetOverflowError` for the relative-offset range) otherwise and
        changes nothing. The entry reaches the file at the next flush.
        """
        offset, position = operator.index(offset), operator.index(position)
        n = self._loaded()
        if n >= self.entries_max:
            raise IndexAppendError(
                f"the index is full ({n} entries of {self._entry_bytes} bytes, max_index_bytes "
                f"{self.max_index_bytes})",
                path=self.path,
                offset=offset,
            )
        relative = offset - self.base_offset
        if not 0 <= relative <= fmt.RELATIVE_OFFSET_MAX:
            raise IndexOffsetOverflowError(
                f"offset - base offset {self.base_offset} = {relative} is outside [0, {fmt.RELATIVE_OFFSET_MAX}]",
                path=self.path,
                offset=offset,
            )
        if n and relative <= int(self._cols["relative_offset"][n - 1]):
            raise IndexAppendError(
                f"expected an offset above the last entry's offset {self.last_offset}",
                path=self.path,
                offset=offset,
            )
        if not 0 <= position <= _INT32_MAX:
            raise IndexAppendError(f"position {position} is outside [0, {_INT32_MAX}]", path=self.path, offset=offset)
        if n and position < int(self._cols["position"][n - 1]):
            raise IndexAppendError(
                f"position {position} is below the last entry's position {int(self._cols['position'][n - 1])}",
                path=self.path,
                offset=offset,
            )
        self._push((relative, position))

    def _append_floor(self) -> tuple[int, int, int]:
        """(entries, the lowest relative offset and position the next entry may have): the bounds `append`
        checks, for the array appends."""
        n = self._loaded()
        if not n:
            return 0, 0, 0
        return n, int(self._cols["relative_offset"][n - 1]) + 1, int(self._cols["position"][n - 1])

    def append_many(self, offsets: ArrayLike, positions: ArrayLike) -> None:
        """`append` of each `(offset, position)` in order, checked and stored as arrays (one copy per column).

        When every entry passes `append`'s checks (offsets increasing, positions not decreasing, both from the
        last entry's, in range, room for all), they are stored at once; otherwise `append` runs entry by entry,
        so the entries before the first bad one are appended and it raises `append`'s error.
        """
        columns = _int64_columns(offsets, positions)
        if columns is not None and len(columns[0]) == 0:
            return
        if columns is not None:
            offsets, positions = columns
            n, lowest_relative, lowest_position = self._append_floor()
            relative = np.empty(len(offsets), np.int32)
            position = np.empty(len(offsets), np.int32)
            # The checks `append` makes, over every entry in one compiled call (`_index_kernels.offset_entries`).
            if n + len(offsets) <= self.entries_max and _kernels().offset_entries(
                offsets, positions, self.base_offset, lowest_relative, lowest_position, fmt.RELATIVE_OFFSET_MAX,
                _INT32_MAX, relative, position,
            ):
                self._push_many((relative, position))
                return
        for offset, position in zip(_items(offsets), _items(positions)):
            self.append(offset, position)

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """The entry with the largest offset <= `target_offset` as `(offset, position)`, or `(base, 0)` if none.

        The caller scans batches forward from the position to the first batch with lastOffset >= target.
        """
        relative = self._column("relative_offset")
        i = _search(relative, target_offset - self.base_offset, "right") - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + int(relative[i]), int(self._cols["position"][i])

    def entry(self, i: int) -> tuple[int, int]:
        """Entry `i` (0-based, `0 <= i < entries`) as `(offset, position)`; raises `IndexError` otherwise."""
        n = self._loaded()
        if not 0 <= i < n:
            raise IndexError(f"{self.path}: entry {i} of an index with {n} entries")
        return self.base_offset + int(self._cols["relative_offset"][i]), int(self._cols["position"][i])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= `offset`."""
        keep = _search(self._column("relative_offset"), offset - self.base_offset, "left")
        self._truncate(keep)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the entries as `(offsets, positions)`, int64, absolute offsets."""
        relative = self._column("relative_offset")
        return relative.astype(np.int64) + self.base_offset, self._column("position").astype(np.int64)

    def sanity_check(self, log_size_bytes: int | None = None) -> None:
        """Check the index as read from its file (plus any entries appended since).

        Raises `CorruptIndexError` naming the file and the byte position of the first problem: a length
        that is not a multiple of 8 (a torn append); a negative relative offset; an offset not above the
        previous entry's (also what the zero slots of an untrimmed, preallocated file look like); a
        negative position or one below the previous entry's; with `log_size_bytes`, a position at or past
        the end of the `.log`.
        """
        base = self.base_offset
        offset = self._column("relative_offset").astype(np.int64) + base
        position = self._column("position").astype(np.int64)

        def not_increasing(i: int) -> str:
            zero_slot = offset[i] == base and position[i] == 0
            hint = " (a zero slot: an untrimmed, preallocated index?)" if zero_slot else ""
            return f"expected an offset above {offset[i - 1]}, found {offset[i]}{hint}"

        checks = [
            (offset < base, lambda i: f"offset {offset[i]} is below the segment base {base} (relative offset < 0)"),
            (_steps(offset, strictly_increasing=True), not_increasing),
            (position < 0, lambda i: f"negative position {position[i]}"),
            (
                _steps(position, strictly_increasing=False),
                lambda i: f"position {position[i]} is below the previous entry's position {position[i - 1]}",
            ),
        ]
        if log_size_bytes is not None:
            checks.append(
                (
                    position >= log_size_bytes,
                    lambda i: f"position {position[i]} is not inside the log ({log_size_bytes} bytes)",
                )
            )
        self._raise_first(checks)

    # ---- whole-index writes --------------------------------------------------------------------------

    @classmethod
    def _validated(
        cls, path: str | os.PathLike, base_offset: int, offsets: ArrayLike, positions: ArrayLike, entries_max: int
    ) -> dict[str, np.ndarray]:
        """The entries as columns, after checking what `append` would check; raises `IndexAppendError`."""
        offsets = np.asarray(offsets, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        if offsets.ndim != 1 or offsets.shape != positions.shape:
            raise ValueError(
                f"offsets and positions must be 1-D of one length, got {offsets.shape} and {positions.shape}"
            )
        if len(offsets) > entries_max:
            raise IndexAppendError(
                f"{len(offsets)} entries do not fit an index of {entries_max} entries",
                path=path,
                offset=int(offsets[-1]),
            )
        relative = offsets - base_offset
        i = _first_true((relative < 0) | (relative > fmt.RELATIVE_OFFSET_MAX))
        if i is not None:
            raise IndexOffsetOverflowError(
                f"entry {i}: offset - base offset {base_offset} = {int(relative[i])} is outside "
                f"[0, {fmt.RELATIVE_OFFSET_MAX}]",
                path=path,
                offset=int(offsets[i]),
            )
        i = _first_true(relative[1:] <= relative[:-1], shift=1)
        if i is not None:
            raise IndexAppendError(
                f"entry {i}: expected an offset above {int(offsets[i - 1])}", path=path, offset=int(offsets[i])
            )
        backwards = np.zeros(len(positions), dtype=bool)
        backwards[1:] = positions[1:] < positions[:-1]
        i = _first_true((positions < 0) | (positions > _INT32_MAX) | backwards)
        if i is not None:
            raise IndexAppendError(
                f"entry {i}: position {int(positions[i])} is negative, too large or below the previous one",
                path=path,
                offset=int(offsets[i]),
            )
        return {"relative_offset": relative.astype(np.int32), "position": positions.astype(np.int32)}

    @classmethod
    def write_entries(
        cls,
        path: str | os.PathLike,
        base_offset: int,
        offsets: ArrayLike,
        positions: ArrayLike,
        *,
        max_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> None:
        """Write a whole index file (replacing `path`) in one write, then fsync it through `file_ops`.

        Requires the entries `append` would accept, in order; raises `IndexAppendError` otherwise,
        before touching the file. Does not fsync the directory.
        """
        cls._write_file(path, base_offset, offsets, positions, max_index_bytes, file_ops)

    @classmethod
    def from_entries(
        cls,
        path: str | os.PathLike,
        base_offset: int,
        offsets: ArrayLike,
        positions: ArrayLike,
        *,
        max_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> OffsetIndex:
        """`write_entries`, then the open index over the file (its entries already in memory)."""
        columns, file_bytes = cls._write_file(path, base_offset, offsets, positions, max_index_bytes, file_ops)
        index = cls(path, base_offset, max_index_bytes=max_index_bytes, file_ops=file_ops)
        index._adopt(columns, file_bytes)
        return index


# ---- time index -------------------------------------------------------------------------------------------


class TimeIndex(_SparseIndex):
    """A segment's `.timeindex`: `(timestamp, offset)` entries, timestamps strictly increasing, offsets not decreasing.

    Opens `path` or creates it empty (unless `read_only`). `max_index_bytes` is `segment.index.bytes`.
    """

    _disk_dtype = fmt.TIME_INDEX_ENTRY_DTYPE
    _columns = (("timestamp", np.int64), ("relative_offset", np.int32))

    @property
    def is_full(self) -> bool:
        """True at `entries_max - 1` entries: the last slot is kept for the segment's final entry."""
        return self.entries >= self.entries_max - fmt.TIME_INDEX_RESERVED_ENTRIES

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last entry as `(timestamp, offset)`, or `(-1, base_offset)` if there is none."""
        n = self._loaded()
        if n == 0:
            return fmt.NO_TIMESTAMP, self.base_offset
        return int(self._cols["timestamp"][n - 1]), self.base_offset + int(self._cols["relative_offset"][n - 1])

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bool:
        """Append `(timestamp, offset)` if `timestamp` is above the last entry's (initially -1); True if it did.

        `timestamp` is the largest batch max timestamp so far, `offset` the last offset of the earliest
        batch holding it. Raises `IndexAppendError` if the index has entries and `offset` is below the
        last entry's offset or `timestamp` below its timestamp (Kafka checks both even when it appends
        nothing), or if an entry would be appended to a full index: `is_full`, or with
        `skip_full_check=True` (the segment's final entry) all `entries_max` slots used.
        `IndexOffsetOverflowError` if `0 <= offset - base <= 2^31-1` does not hold.
        """
        timestamp, offset = operator.index(timestamp), operator.index(offset)
        n = self._loaded()
        last_timestamp, last_offset = self.last_entry
        if n and offset < last_offset:
            raise IndexAppendError(
                f"expected an offset of at least the last entry's offset {last_offset}", path=self.path, offset=offset
            )
        if n and timestamp < last_timestamp:
            raise IndexAppendError(
                f"timestamp {timestamp} is below the last entry's timestamp {last_timestamp}",
                path=self.path,
                offset=offset,
            )
        if timestamp <= last_timestamp:
            return False
        if timestamp > _INT64_MAX:
            raise IndexAppendError(f"timestamp {timestamp} does not fit an int64", path=self.path, offset=offset)
        limit = self.entries_max if skip_full_check else self.entries_max - fmt.TIME_INDEX_RESERVED_ENTRIES
        if n >= limit:
            raise IndexAppendError(
                f"the time index is full ({n} entries of {self._entry_bytes} bytes, max_index_bytes "
                f"{self.max_index_bytes}{'' if skip_full_check else ', one slot reserved'})",
                path=self.path,
                offset=offset,
            )
        relative = offset - self.base_offset
        if not 0 <= relative <= fmt.RELATIVE_OFFSET_MAX:
            raise IndexOffsetOverflowError(
                f"offset - base offset {self.base_offset} = {relative} is outside [0, {fmt.RELATIVE_OFFSET_MAX}]",
                path=self.path,
                offset=offset,
            )
        self._push((timestamp, relative))
        return True

    def maybe_append_many(self, timestamps: ArrayLike, offsets: ArrayLike) -> int:
        """`maybe_append` of each `(timestamp, offset)` in order (no `skip_full_check`); the number appended.

        The candidates the append rule makes (timestamps and offsets not decreasing, from the last entry's, in
        the segment's range) are checked and stored as arrays: those whose timestamp is above the one before
        (the first: above the last entry's) are appended, if there is room for them. Any other input goes
        through `maybe_append` candidate by candidate, with its results and errors.
        """
        columns = _int64_columns(timestamps, offsets)
        if columns is not None and len(columns[0]) == 0:
            return 0
        if columns is not None:
            timestamps, offsets = columns
            n = self._loaded()
            last_timestamp, last_offset = self.last_entry  # (-1, base) when there is none
            chosen = np.empty(len(timestamps), np.int64)
            relative = np.empty(len(timestamps), np.int32)
            # The candidates that pass the checks and the rule, in one compiled call (`_index_kernels.time_entries`).
            count = int(_kernels().time_entries(timestamps, offsets, self.base_offset, last_timestamp, last_offset,
                                                fmt.RELATIVE_OFFSET_MAX, chosen, relative))
            if count >= 0 and n + count <= self.entries_max - fmt.TIME_INDEX_RESERVED_ENTRIES:
                self._push_many((chosen[:count], relative[:count]))
                return count
        return sum(self.maybe_append(t, o) for t, o in zip(_items(timestamps), _items(offsets)))

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """The entry with the largest timestamp <= `target_timestamp` as `(timestamp, offset)`, or `(-1, base)`."""
        timestamps = self._column("timestamp")
        i = _search(timestamps, target_timestamp, "right") - 1
        if i < 0:
            return fmt.NO_TIMESTAMP, self.base_offset
        return int(timestamps[i]), self.base_offset + int(self._cols["relative_offset"][i])

    def entry(self, i: int) -> tuple[int, int]:
        """Entry `i` (0-based, `0 <= i < entries`) as `(timestamp, offset)`; raises `IndexError` otherwise."""
        n = self._loaded()
        if not 0 <= i < n:
            raise IndexError(f"{self.path}: entry {i} of a time index with {n} entries")
        return int(self._cols["timestamp"][i]), self.base_offset + int(self._cols["relative_offset"][i])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= `offset`.

        (Kafka's binary search would keep all but the last of several entries equal to `offset`; offsets
        repeat only in hand-made files, and here every such entry goes.)
        """
        keep = _search(self._column("relative_offset"), offset - self.base_offset, "left")
        self._truncate(keep)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the entries as `(timestamps, offsets)`, int64, absolute offsets."""
        relative = self._column("relative_offset")
        return self._column("timestamp").copy(), relative.astype(np.int64) + self.base_offset

    def sanity_check(self) -> None:
        """Check the index as read from its file (plus any entries appended since).

        Raises `CorruptIndexError` naming the file and the byte position of the first problem: a length
        that is not a multiple of 12 (a torn append); a timestamp not above the previous entry's (the
        first must be above -1, Kafka's initial "previous"; zero slots of a preallocated file fail here);
        a negative relative offset; an offset below the previous entry's.
        """
        base = self.base_offset
        timestamps = self._column("timestamp")
        offset = self._column("relative_offset").astype(np.int64) + base
        previous = np.r_[np.int64(fmt.NO_TIMESTAMP), timestamps[:-1]]  # the first entry's "previous" is -1

        def not_increasing(i: int) -> str:
            zero_slot = timestamps[i] == 0 and offset[i] == base
            hint = " (a zero slot: an untrimmed, preallocated index?)" if zero_slot else ""
            return f"expected a timestamp above {previous[i]}, found {timestamps[i]}{hint}"

        self._raise_first(
            [
                (timestamps <= previous, not_increasing),
                (offset < base, lambda i: f"offset {offset[i]} is below the segment base {base} (relative offset < 0)"),
                (
                    _steps(offset, strictly_increasing=False),
                    lambda i: f"offset {offset[i]} is below the previous entry's offset {offset[i - 1]}",
                ),
            ]
        )

    # ---- whole-index writes --------------------------------------------------------------------------

    @classmethod
    def _validated(
        cls, path: str | os.PathLike, base_offset: int, timestamps: ArrayLike, offsets: ArrayLike, entries_max: int
    ) -> dict[str, np.ndarray]:
        """The entries as columns, after checking what `maybe_append` would accept; raises `IndexAppendError`."""
        timestamps = np.asarray(timestamps, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        if timestamps.ndim != 1 or timestamps.shape != offsets.shape:
            raise ValueError(
                f"timestamps and offsets must be 1-D of one length, got {timestamps.shape} and {offsets.shape}"
            )
        if len(offsets) > entries_max:
            raise IndexAppendError(
                f"{len(offsets)} entries do not fit a time index of {entries_max} entries",
                path=path,
                offset=int(offsets[-1]),
            )
        relative = offsets - base_offset
        i = _first_true((relative < 0) | (relative > fmt.RELATIVE_OFFSET_MAX))
        if i is not None:
            raise IndexOffsetOverflowError(
                f"entry {i}: offset - base offset {base_offset} = {int(relative[i])} is outside "
                f"[0, {fmt.RELATIVE_OFFSET_MAX}]",
                path=path,
                offset=int(offsets[i]),
            )
        i = _first_true(timestamps <= np.r_[np.int64(fmt.NO_TIMESTAMP), timestamps[:-1]])
        if i is not None:
            raise IndexAppendError(
                f"entry {i}: timestamp {int(timestamps[i])} is not above the previous one",
                path=path,
                offset=int(offsets[i]),
            )
        i = _first_true(relative[1:] < relative[:-1], shift=1)
        if i is not None:
            raise IndexAppendError(
                f"entry {i}: expected an offset of at least {int(offsets[i - 1])}", path=path, offset=int(offsets[i])
            )
        return {"timestamp": timestamps, "relative_offset": relative.astype(np.int32)}

    @classmethod
    def write_entries(
        cls,
        path: str | os.PathLike,
        base_offset: int,
        timestamps: ArrayLike,
        offsets: ArrayLike,
        *,
        max_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> None:
        """Write a whole time index file (replacing `path`) in one write, then fsync it through `file_ops`.

        Requires timestamps strictly increasing from above -1, offsets not decreasing and in the
        segment's range, at most `entries_max` entries (the final entry may use the reserved slot);
        raises `IndexAppendError` otherwise, before touching the file. Does not fsync the directory.
        """
        cls._write_file(path, base_offset, timestamps, offsets, max_index_bytes, file_ops)

    @classmethod
    def from_entries(
        cls,
        path: str | os.PathLike,
        base_offset: int,
        timestamps: ArrayLike,
        offsets: ArrayLike,
        *,
        max_index_bytes: int = fmt.SEGMENT_INDEX_BYTES_DEFAULT,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> TimeIndex:
        """`write_entries`, then the open time index over the file (its entries already in memory)."""
        columns, file_bytes = cls._write_file(path, base_offset, timestamps, offsets, max_index_bytes, file_ops)
        index = cls(path, base_offset, max_index_bytes=max_index_bytes, file_ops=file_ops)
        index._adopt(columns, file_bytes)
        return index


# ---- Kafka's canonical build rule ---------------------------------------------------------------------------


def _batch_arrays(*columns: ArrayLike) -> list[np.ndarray]:
    arrays = [np.asarray(c, dtype=np.int64) for c in columns]
    if any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"batch arrays must be 1-D of one length, got {[a.shape for a in arrays]}")
    positions = arrays[0]
    if len(positions) and (positions[0] < 0 or np.any(positions[1:] <= positions[:-1])):
        raise ValueError("batch positions must be non-negative and strictly increasing")
    return arrays


def interval_entries(
    positions: np.ndarray,
    last_offsets: np.ndarray,
    max_timestamps: np.ndarray,
    *,
    end: int,
    index_interval_bytes: int,
    bytes_since: int = 0,
    max_timestamp: int = fmt.NO_TIMESTAMP,
    shallow_offset: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int]]:
    """Kafka's append-time rule over a run of batches, as if each batch were its own `LogSegment.append`.

    For each batch in order: the running max timestamp moves to its max timestamp if that is greater (its
    offset to the batch's last offset); then, if more than `index_interval_bytes` were appended since the
    last offset-index entry, the batch is indexed and the count restarts; then its size (to the next
    position, the last one's to `end`) is counted. `bytes_since`, `max_timestamp` and `shallow_offset` are
    the state before the first batch. Requires 1-D int64 arrays of one length, positions increasing.
    Returns (indices of the indexed batches, the time-index candidates at them as timestamps and offsets,
    the state after the last batch as `(bytes_since, max_timestamp, shallow_offset)`). The compiled walk is
    `segments.files._index_kernels.index_candidates` (the kernels load at the first call with batches).
    """
    count = len(positions)
    if count == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, (bytes_since, max_timestamp, shallow_offset)
    out = np.empty((3, count), np.int64)  # indexed batches, the time candidates' timestamps and offsets
    found, bytes_since, max_timestamp, shallow_offset = _kernels().index_candidates(
        np.ascontiguousarray(positions, dtype=np.int64),
        np.ascontiguousarray(last_offsets, dtype=np.int64),
        np.ascontiguousarray(max_timestamps, dtype=np.int64),
        end,
        min(int(index_interval_bytes), _INT64_MAX),
        bytes_since,
        max_timestamp,
        shallow_offset,
        out[0],
        out[1],
        out[2],
    )
    return out[0, :found], out[1, :found], out[2, :found], (int(bytes_since), int(max_timestamp), int(shallow_offset))


def append_run_entries(
    offset_index: OffsetIndex,
    time_index: TimeIndex,
    start: int,
    positions: np.ndarray,
    last_offsets: np.ndarray,
    max_timestamps: np.ndarray,
    *,
    end: int,
    index_interval_bytes: int,
    state: tuple[int, int, int],
) -> tuple[int, int, int]:
    """Append to both indexes the entries `interval_entries` makes for a run of batches written at file position
    `start` (`positions` relative to it, the last batch ending at `end`), from `state` (bytes_since,
    max_timestamp, shallow_offset); returns the state after the run. The entries, and both indexes' checks of
    them, are one compiled call (`_index_kernels.run_entries`); when a check fails, or an index lacks room, the
    entries go through `OffsetIndex.append_many` / `TimeIndex.maybe_append_many`, which append what they take
    and raise their errors, as a caller of those would see. Requires 1-D int64 arrays of one length, positions
    increasing."""
    count = len(positions)
    if count == 0:
        return state
    n_offsets, lowest_relative, lowest_position = offset_index._append_floor()
    n_times = time_index._loaded()
    last_timestamp, last_offset = time_index.last_entry
    scratch = np.empty((5, count), np.int64)
    relative, position, time_relative = np.empty((3, count), np.int32)
    timestamps = np.empty(count, np.int64)
    after = np.empty(3, np.int64)
    found, ok, timed = _kernels().run_entries(
        np.ascontiguousarray(positions, dtype=np.int64), np.ascontiguousarray(last_offsets, dtype=np.int64),
        np.ascontiguousarray(max_timestamps, dtype=np.int64), end, min(int(index_interval_bytes), _INT64_MAX),
        *state, start, offset_index.base_offset, lowest_relative, lowest_position, fmt.RELATIVE_OFFSET_MAX,
        _INT32_MAX, last_timestamp, last_offset, scratch, relative, position, timestamps, time_relative, after)
    if found:
        if ok and n_offsets + found <= offset_index.entries_max:
            offset_index._push_many((relative[:found], position[:found]))
        else:
            offset_index.append_many(scratch[3, :found], scratch[4, :found])
        if timed >= 0 and n_times + timed <= time_index.entries_max - fmt.TIME_INDEX_RESERVED_ENTRIES:
            time_index._push_many((timestamps[:timed], time_relative[:timed]))
        else:
            time_index.maybe_append_many(scratch[1, :found], scratch[2, :found])
    bytes_since, max_timestamp, shallow_offset = after.tolist()
    return bytes_since, max_timestamp, shallow_offset


def _canonical_entries(
    positions: np.ndarray, last_offsets: np.ndarray, max_timestamps: np.ndarray, index_interval_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int, int]]:
    """`interval_entries` from the start of a segment (see `build_offset_index_entries`)."""
    if not isinstance(index_interval_bytes, (int, np.integer)) or index_interval_bytes < 0:
        raise ValueError(f"index_interval_bytes must be a non-negative int, got {index_interval_bytes!r}")
    # `lastIndexed = 0` with a batch at `pos` indexed when `pos - lastIndexed` passes the interval is the append
    # rule with as many bytes counted before the first batch as its position (0 for a whole segment).
    first = int(positions[0]) if len(positions) else 0
    end = int(positions[-1]) if len(positions) else 0
    return interval_entries(
        positions, last_offsets, max_timestamps, end=end, index_interval_bytes=index_interval_bytes, bytes_since=first
    )


def build_offset_index_entries(
    batch_positions: ArrayLike,
    batch_last_offsets: ArrayLike,
    index_interval_bytes: int = fmt.INDEX_INTERVAL_BYTES_DEFAULT,
) -> tuple[np.ndarray, np.ndarray]:
    """Kafka's canonical offset-index rule (`LogSegment.recover`, docs/format.md 3.1) over a segment's batches.

    `lastIndexed = 0`; for each batch at `pos`: if `pos - lastIndexed > index_interval_bytes`, index
    `(batch last offset, pos)` and set `lastIndexed = pos` (so the batch at 0 is never indexed).
    Requires 1-D arrays of one length with positions non-negative and strictly increasing (`ValueError`).
    Returns `(offsets, positions)` as int64 arrays; offsets are whatever the batches say (a log with
    offsets out of order yields entries that `OffsetIndex` rejects).
    """
    positions, last_offsets = _batch_arrays(batch_positions, batch_last_offsets)
    no_timestamps = np.full(len(positions), fmt.NO_TIMESTAMP, np.int64)
    chosen, _, _, _ = _canonical_entries(positions, last_offsets, no_timestamps, index_interval_bytes)
    return last_offsets[chosen], positions[chosen]


def build_time_index_entries(
    batch_positions: ArrayLike,
    batch_last_offsets: ArrayLike,
    batch_max_timestamps: ArrayLike,
    index_interval_bytes: int = fmt.INDEX_INTERVAL_BYTES_DEFAULT,
) -> tuple[np.ndarray, np.ndarray]:
    """Kafka's canonical time-index rule (docs/format.md 3.2) over a segment's batches, final entry included.

    Interpretation, following `LogSegment.recover` and `onBecomeInactiveSegment`:
    * `maxTimestampSoFar` starts at -1 and is updated with each batch's max timestamp *before* that batch
      is considered for indexing; it only moves on a strictly greater timestamp, so its "shallow offset"
      is the last offset of the **earliest** batch holding the max timestamp.
    * At every batch the offset-index rule indexes, `(maxTimestampSoFar, shallowOffset)` is a candidate.
    * After the last batch, `(segment max timestamp, its shallow offset)` is the final candidate.
    * A candidate is kept only if its timestamp is strictly greater than the last kept one (initially -1),
      so a segment whose batches all carry -1 (v0 data) gets no entries.
    Returns `(timestamps, offsets)` as int64 arrays, ready for `TimeIndex.maybe_append` or `write_entries`.
    Kafka 2.4 recorded the offset of the record with the max timestamp rather than the batch's last
    offset, so its files have the same timestamps but offsets inside the same batches.
    """
    positions, last_offsets, max_timestamps = _batch_arrays(batch_positions, batch_last_offsets, batch_max_timestamps)
    _, timestamps, offsets, (_, final_timestamp, final_offset) = _canonical_entries(
        positions, last_offsets, max_timestamps, index_interval_bytes
    )
    candidate_ts = np.r_[timestamps, np.int64(final_timestamp)]
    candidate_offsets = np.r_[offsets, np.int64(final_offset)]
    # Candidates never decrease, so "above the last kept one" is "above the previous candidate".
    keep = candidate_ts > np.r_[np.int64(fmt.NO_TIMESTAMP), candidate_ts[:-1]]
    return candidate_ts[keep], candidate_offsets[keep]
