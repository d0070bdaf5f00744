"""The transaction index (`.txnindex`) of one segment: docs/format.md 3.3.

Owns the aborted-transaction entries of a segment: appending them as ABORT markers are written,
collecting the ones a fetch must report, truncating, checking, writing and renaming the file. Each
entry records one aborted transaction whose **ABORT marker lies in this segment** (the transaction may
have begun in an earlier one), ordered by strictly increasing `last_offset` (the marker's offset). It
does not read `.log` files or decide which transactions were aborted (the producer-state code and the
cleaner do), and does not decide when to rebuild (recovery resets the index and re-appends).

It shares the mechanics of `segments.files.index` (entries in memory, read lazily, deferred writes through
the `FileOps` passed in, `read_only`, `IndexAppendError`, `CorruptIndexError`), with two differences, both
Kafka's: the file is created lazily (most segments have none; `write_entries` with no entries removes it),
and the entry count is limited by `TXN_INDEX_ENTRIES_MAX` rather than `segment.index.bytes`. See
docs/design.md, "Index files". Not thread-safe: the log that owns the segment serialises access under its lock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..codec import format as fmt
from ..codec.errors import IndexAppendError
from .fileio import DEFAULT_FILE_OPS, FileOps
from .index import _EntryFile, _first_true, _steps, _write_new_file

__all__ = ["TXN_INDEX_ENTRIES_MAX", "AbortedTxn", "AbortedTxns", "TransactionIndex", "TxnIndexSearchResult"]

TXN_INDEX_ENTRIES_MAX = (2**31 - 1) // fmt.RECORD_BATCH_OVERHEAD
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One `.txnindex` entry, fields in file order (`TXN_INDEX_ENTRY`)."""

    version: int  # TXN_INDEX_VERSION (0)
    producer_id: int
    first_offset: int  # the transaction's first offset (possibly in an earlier segment)
    last_offset: int  # the offset of the ABORT marker, in this segment
    last_stable_offset: int  # the partition's LSO when the marker was written


class AbortedTxns(NamedTuple):
    """Many `.txnindex` entries as columns, one row per entry (`AbortedTxn`'s fields, in file order): what a
    whole segment's entries are read and appended as, without an object per entry."""

    version: np.ndarray
    producer_id: np.ndarray
    first_offset: np.ndarray
    last_offset: np.ndarray
    last_stable_offset: np.ndarray

    @classmethod
    def of(cls, producer_id, first_offset, last_offset, last_stable_offset) -> AbortedTxns:
        """Entries of the current version from int64 columns."""
        columns = [np.asarray(c, dtype=np.int64) for c in (producer_id, first_offset, last_offset, last_stable_offset)]
        return cls(np.full(len(columns[0]), fmt.TXN_INDEX_VERSION, dtype=np.int16), *columns)

    @classmethod
    def concatenate(cls, parts: Iterable[AbortedTxns]) -> AbortedTxns:
        parts = list(parts)
        if not parts:
            return cls.of(*([()] * 4))
        return cls(*(np.concatenate(column) for column in zip(*parts)))

    @property
    def entries(self) -> int:
        return len(self.last_offset)

    def row(self, i: int) -> AbortedTxn:
        return AbortedTxn(*(int(column[i]) for column in self))

    def rows(self) -> tuple[AbortedTxn, ...]:
        return tuple(map(AbortedTxn, *(column.tolist() for column in self)))

    def same_as(self, other: AbortedTxns) -> bool:
        """The same entries in the same order."""
        return self.entries == other.entries and all(np.array_equal(a, b) for a, b in zip(self, other))


@dataclass(frozen=True, slots=True)
class TxnIndexSearchResult:
    """What `collect_aborted_txns` found.

    `is_complete` is Kafka's flag: an entry with `last_stable_offset >= upper_bound_offset` was reached,
    so no later segment can hold an aborted transaction that overlaps the fetch and the caller stops.
    """

    aborted_txns: tuple[AbortedTxn, ...]
    is_complete: bool


def _check_txn(txn: AbortedTxn, previous_last_offset: int | None, *, base_offset: int, path: str | os.PathLike) -> None:
    """Raise `IndexAppendError` unless `txn` may follow an entry with `previous_last_offset` (None: first)."""
    for name in ("producer_id", "first_offset", "last_offset", "last_stable_offset"):
        value = getattr(txn, name)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise IndexAppendError(f"{name} {value} does not fit an int64", path=path, offset=txn.last_offset)
    if txn.version != fmt.TXN_INDEX_VERSION:
        raise IndexAppendError(
            f"expected version {fmt.TXN_INDEX_VERSION}, found {txn.version}", path=path, offset=txn.last_offset
        )
    if txn.last_offset < base_offset:
        raise IndexAppendError(
            f"the ABORT marker offset is below the segment base {base_offset}",
            path=path,
            offset=txn.last_offset,
        )
    if txn.first_offset > txn.last_offset:
        raise IndexAppendError(
            f"first offset {txn.first_offset} is above the ABORT marker offset", path=path, offset=txn.last_offset
        )
    if previous_last_offset is not None and txn.last_offset <= previous_last_offset:
        raise IndexAppendError(
            f"expected an ABORT marker offset above the last entry's {previous_last_offset}",
            path=path,
            offset=txn.last_offset,
        )


class TransactionIndex(_EntryFile):
    """A segment's `.txnindex`. Opening never creates the file; the first flushed entry does."""

    _disk_dtype = fmt.TXN_INDEX_ENTRY_DTYPE
    _columns = (
        ("version", np.int16),
        ("producer_id", np.int64),
        ("first_offset", np.int64),
        ("last_offset", np.int64),
        ("last_stable_offset", np.int64),
    )
    _create_on_open = False

    def __init__(
        self,
        path: str | os.PathLike,
        base_offset: int,
        *,
        file_ops: FileOps = DEFAULT_FILE_OPS,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            path, base_offset, entries_max=TXN_INDEX_ENTRIES_MAX, file_ops=file_ops, read_only=read_only
        )

    # ---- reading -------------------------------------------------------------------------------------

    def _txn(self, i: int) -> AbortedTxn:
        return AbortedTxn(*(int(self._cols[name][i]) for name, _ in self._columns))

    @property
    def last_offset(self) -> int | None:
        """The ABORT-marker offset of the last entry, or None if there is none."""
        n = self._loaded()
        return int(self._cols["last_offset"][n - 1]) if n else None

    def all_aborted(self) -> tuple[AbortedTxn, ...]:
        """Every entry, in file order."""
        return self.columns().rows()

    def columns(self) -> AbortedTxns:
        """Every entry, in file order, as columns (copies)."""
        return AbortedTxns(*(self._column(name).copy() for name, _ in self._columns))

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """The aborted transactions a fetch of `[fetch_offset, upper_bound_offset)` must report.

        Kafka's `TransactionIndex.collectAbortedTxns`: walking the entries in order, an entry is taken
        if its range overlaps the fetch (`last_offset >= fetch_offset` and `first_offset <
        upper_bound_offset`); the walk stops, complete, after the first entry whose `last_stable_offset
        >= upper_bound_offset` (that entry is taken if it overlaps). Entries after it are not looked at.
        """
        first = self._column("first_offset")
        last = self._column("last_offset")
        stop = _first_true(self._column("last_stable_offset") >= upper_bound_offset)
        end = len(last) if stop is None else stop + 1
        hits = np.flatnonzero((last[:end] >= fetch_offset) & (first[:end] < upper_bound_offset))
        return TxnIndexSearchResult(tuple(self._txn(int(i)) for i in hits), stop is not None)

    def entry(self, i: int) -> AbortedTxn:
        """Entry `i` (0-based, `0 <= i < entries`); raises `IndexError` otherwise."""
        n = self._loaded()
        if not 0 <= i < n:
            raise IndexError(f"{self.path}: entry {i} of a transaction index with {n} entries")
        return self._txn(i)

    # ---- changing ------------------------------------------------------------------------------------

    def append(self, txn: AbortedTxn) -> None:
        """Append `txn`; the file is created at the next flush if it does not exist.

        Requires version 0, `base_offset <= txn.last_offset`, `first_offset <= last_offset`, a
        `last_offset` above the last entry's, every field an int64, and fewer than
        `TXN_INDEX_ENTRIES_MAX` entries. Raises `IndexAppendError` otherwise and changes nothing.
        """
        n = self._loaded()
        if n >= self.entries_max:
            raise IndexAppendError(
                f"the transaction index is full ({n} entries)", path=self.path, offset=txn.last_offset
            )
        _check_txn(txn, self.last_offset, base_offset=self.base_offset, path=self.path)
        self._push(
            (txn.version, txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)
        )

    def append_many(self, txns: AbortedTxns) -> None:
        """`append` of every entry of `txns` in order, checked as a whole: `IndexAppendError` for the first
        entry `append` would refuse (with its message), and then nothing is appended."""
        if not txns.entries:
            return
        n = self._loaded()
        if n + txns.entries > self.entries_max:
            raise IndexAppendError(f"the transaction index is full ({n} entries, {txns.entries} more)", path=self.path,
                                   offset=int(txns.last_offset[self.entries_max - n]))
        previous = self.last_offset
        last = txns.last_offset
        follows = np.empty(txns.entries, dtype=bool)
        follows[0] = previous is None or last[0] > previous
        follows[1:] = last[1:] > last[:-1]
        bad = ~follows | (txns.version != fmt.TXN_INDEX_VERSION) | (last < self.base_offset) | (txns.first_offset > last)
        i = _first_true(bad)
        if i is not None:
            _check_txn(txns.row(i), previous if i == 0 else int(last[i - 1]), base_offset=self.base_offset,
                       path=self.path)
        self._push_many(tuple(txns))

    def truncate_to(self, offset: int) -> None:
        """Remove the first entry whose `last_offset >= offset` and every entry after it (Kafka's rule)."""
        first_removed = _first_true(self._column("last_offset") >= offset)
        if first_removed is not None:
            self._truncate(first_removed)

    def sanity_check(self) -> None:
        """Check the index as read from its file (plus entries appended since); an absent file passes.

        Raises `CorruptIndexError` naming the file and the byte position of the first problem: a length
        that is not a multiple of 34 (a torn append); a version other than 0; an ABORT-marker offset
        below the segment base; an ABORT-marker offset not above the previous entry's.
        """
        version = self._column("version")
        last = self._column("last_offset")
        base, expected_version = self.base_offset, fmt.TXN_INDEX_VERSION
        self._raise_first(
            [
                (version != expected_version, lambda i: f"expected version {expected_version}, found {version[i]}"),
                (last < base, lambda i: f"ABORT marker offset {last[i]} is below the segment base {base}"),
                (
                    _steps(last, strictly_increasing=True),
                    lambda i: f"expected an ABORT marker offset above {last[i - 1]}, found {last[i]}",
                ),
            ]
        )

    # ---- whole-index writes --------------------------------------------------------------------------

    @classmethod
    def write_entries(
        cls,
        path: str | os.PathLike,
        txns: Iterable[AbortedTxn],
        *,
        base_offset: int = 0,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> None:
        """Write a whole transaction index (replacing `path`) in one write and fsync it through `file_ops`.

        With no entries the file is removed instead (Kafka creates the file lazily, so an absent file
        means "no aborted transactions"). Requires what `append` requires of each entry, in order
        (`base_offset` is the segment's); raises `IndexAppendError` before touching the file.
        Does not fsync the directory.
        """
        cls.from_entries(path, base_offset, txns, file_ops=file_ops).close()

    @classmethod
    def from_entries(
        cls,
        path: str | os.PathLike,
        base_offset: int,
        txns: Iterable[AbortedTxn],
        *,
        file_ops: FileOps = DEFAULT_FILE_OPS,
    ) -> TransactionIndex:
        """`write_entries`, then the open index over the file (its entries already in memory)."""
        txns = list(txns)
        # Validate everything before touching the file.
        if len(txns) > TXN_INDEX_ENTRIES_MAX:
            raise IndexAppendError(
                f"{len(txns)} entries exceed {TXN_INDEX_ENTRIES_MAX}", path=path, offset=txns[-1].last_offset
            )
        previous: int | None = None
        for txn in txns:
            _check_txn(txn, previous, base_offset=base_offset, path=path)
            previous = txn.last_offset
        if not txns:
            file_ops.remove(path)
            return cls(path, base_offset, file_ops=file_ops)
        columns = {
            name: np.fromiter((getattr(t, name) for t in txns), dtype=dtype, count=len(txns))
            for name, dtype in cls._columns
        }
        data = cls._encode_columns(columns, 0, len(txns))
        _write_new_file(path, data, file_ops)
        index = cls(path, base_offset, file_ops=file_ops)
        index._adopt(columns, len(data))
        return index
