"""The survey of a whole partition that a cleaning round's decisions need, from one pass over batch headers.

Owns what Kafka's cleaner takes from the broker's producer and transaction state, rebuilt here from the
files alone (a standalone cleaner has no broker): which transactions exist and how they ended (committed,
aborted or still open), how many data batches each still has, each producer's last batch and last
timestamp, and each segment's largest timestamp and soonest delete horizon. It also checks the inactive
segments, so that a round finds their corruption before it swaps anything in: every batch's CRC and framing;
the order of offsets, which the CRC does not cover (batches strictly increasing and not overlapping, each
inside its segment's range [base, next segment's base) and within base + 2^31-1; a corrupt offset would
otherwise reach the offset map or a cleaned segment's index); and every legacy (v0/v1) compressed wrapper in
full, since its inner messages carry CRCs of their own. What a valid CRC covers inside a v2 batch's records is
decoded by the later phases: the index phase decodes the dirty section before anything is swapped, the recopy
phase the clean section group by group.

One pass over the headers (`segments.codec.scan` with `headers_only`, read and checked on a read-ahead thread,
or, for a round given three threads or more, on all of them but its own, a segment each, taken in offset order:
`segments.files.readahead`); the records of control batches are decoded in full by a compiled walk over each
window (`cleaner._kernels.producer_rows`, with the codec's rule, `segments.codec._control_kernels`; the Python
decoder only for a batch it leaves undecided, which reports a fault), legacy wrappers, which are rare, by a scan
of their own. Producers and transactions are tracked by compiled walks per window (`window_producers`), never
per batch in Python. This is the round's only CRC check: the index and recopy
phases read the same inactive segments again, which the cleaner lock keeps unchanged, and do not check them
twice. Memory is proportional to the number of transactions and producers, not to the log. It reads the
active segment too (open transactions end there); since its writer may be appending to it, only its control
batches' CRCs are checked there.

The rounds of one partition that follow each other (a map too small for the dirty section: partial rounds) read
mostly the same inactive segments again. A `SurveyMemo`, kept by the cleaner thread (or `clean`'s partition) like
its map, holds what the survey took from each inactive segment it checked (its figures, the first and last
offsets, the rows of its batches that carry a producer id), keyed by the file's identity (device, inode, size,
modification and change times); the next survey replays a segment whose file is unchanged instead of reading it,
and reads every other one. Replaying gives the same survey as reading (the same rows through the same steps), and
a file changed in any way is read and checked again. Bounded by `MEMO_BYTES_MAX`; a segment the memo cannot
hold is read again next round, as without one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.records import decode_batch, decode_control_key
from segments.files.facts import SegmentFacts
from segments.files.readahead import WindowRing, read_ahead_in_order
from segments.files.segment import LogSegment
from segments.partition.facts import LogFacts
from segments.partition.log import PartitionLog

if TYPE_CHECKING:  # the index phase imports this module
    from .indexing import IndexAhead

__all__ = [
    "MEMO_BYTES_MAX", "WINDOW_BYTES", "LogSurvey", "ProducerState", "ProducerTable", "SegmentSurvey", "SurveyMemo",
    "Transaction", "TransactionTable", "survey_log",
]

# One window of a round's reads (survey, index and recopy). Each window costs its share of Python on the GIL: at
# 16 MiB a round holds it 7-10% of its time on W1-W4, at 8 MiB 8-13%. Since the record walk prefetches
# (`segments.codec._scan_kernels.RECORD_PREFETCH_BYTES`), the kernels cost 1-15% more a GB over 16 MiB than over 8
# (the most: W3's CRC-checked scan), and whole rounds are as fast within the host's drift (bench/RESULTS.md,
# twentieth round).
WINDOW_BYTES = 16 * 1024 * 1024
# What a `SurveyMemo` may hold: ~50 bytes a batch with a producer id (idempotent or transactional), a few hundred a
# segment; 16 MiB covers ~5 GB of an idempotent producer's 16 KiB batches, and any size of log without producers.
MEMO_BYTES_MAX = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Transaction:
    """One transaction of a producer: its first data offset, its marker (or -1 while open), its data batches."""

    producer_id: int
    first_offset: int
    marker_offset: int  # -1: no marker yet (the transaction is open)
    control_type: int  # fmt.CONTROL_TYPE_ABORT / _COMMIT, or -1 while open
    data_batches: int

    @property
    def aborted(self) -> bool:
        return self.control_type == fmt.CONTROL_TYPE_ABORT


@dataclass(slots=True)
class ProducerState:
    """What the round needs of one producer id: its last data batch, its last batch of any kind, when."""

    producer_id: int
    last_data_offset: int = -1  # lastOffset of its last data batch
    last_entry_offset: int = -1  # lastOffset of its last batch, data or control
    last_entry_is_control: bool = False
    last_timestamp: int = -1
    open_txn_first_offset: int = -1
    open_txn_data_batches: int = 0


class ProducerTable(NamedTuple):
    """`ProducerState`s as int64 columns, one row per producer, sorted by producer id."""

    producer_id: np.ndarray
    last_data_offset: np.ndarray
    last_entry_offset: np.ndarray
    last_timestamp: np.ndarray
    open_txn_first_offset: np.ndarray


@dataclass(frozen=True, slots=True)
class SegmentSurvey:
    base_offset: int
    size_bytes: int
    largest_timestamp: int  # max batch maxTimestamp; -1 when the segment holds no timestamps
    first_batch_timestamp: int  # maxTimestamp of its first batch (-1 if empty)
    next_offset: int  # last batch's lastOffset + 1, or the base offset if empty
    last_modified_ms: int
    # The soonest delete horizon among its batches with records (-1: none). A cleaner writes a horizon only on a
    # batch that keeps a tombstone or a marker (`cleaner.recopy`), so one that has passed means work for a pass.
    earliest_delete_horizon_ms: int = -1


class TransactionTable(NamedTuple):
    """`Transaction`s as int64 columns, one row per transaction: the closed ones in the order of their markers,
    then the open ones (marker and control type -1)."""

    producer_id: np.ndarray
    first_offset: np.ndarray
    marker_offset: np.ndarray
    control_type: np.ndarray
    data_batches: np.ndarray

    def rows(self, index: np.ndarray) -> list[Transaction]:
        """The transactions at `index` as objects."""
        return list(map(Transaction, *(column[index].tolist() for column in self)))


class _ClosedTransactions:
    """The closed transactions sorted by producer id, then first offset (a producer's markers then follow in
    offset order too: its transactions never overlap), as the compiled searches over them take them: which data
    batches lie in aborted ones (`aborted_columns`, `cleaner._kernels.in_transactions`), and which control batch
    is the marker of which transaction (`marker_columns`, `cleaner._kernels.window_markers`)."""

    def __init__(self, table: TransactionTable) -> None:
        closed = np.flatnonzero(table.marker_offset >= 0)
        closed = closed[np.argsort(table.first_offset[closed], kind="stable")]
        closed = closed[np.argsort(table.producer_id[closed], kind="stable")]
        producer_id, first_offset, marker_offset = (table.producer_id[closed], table.first_offset[closed],
                                                    table.marker_offset[closed])
        aborted = np.flatnonzero(table.control_type[closed] == fmt.CONTROL_TYPE_ABORT)
        self.aborted_columns = (producer_id[aborted], first_offset[aborted], marker_offset[aborted])
        self.marker_columns = (producer_id, marker_offset, table.data_batches[closed])

    def aborted_batches(self, producer_id: np.ndarray, base_offset: np.ndarray, transactional: np.ndarray) -> np.ndarray:
        """For data batches: True where the batch is transactional and lies in one of these transactions that ended
        with an ABORT marker (one compiled search without the GIL: `cleaner._kernels.in_transactions`)."""
        from . import _kernels

        out = np.empty(len(producer_id), dtype=np.bool_)
        _kernels.in_transactions(producer_id, base_offset, transactional, *self.aborted_columns, out)
        return out


@dataclass
class LogSurvey:
    """The survey's result; see the module docstring."""

    segments: list[SegmentSurvey]
    producers: dict[int, ProducerState]
    transaction_table: TransactionTable
    bytes_read: int = 0
    _closed: _ClosedTransactions = field(init=False, repr=False, compare=False)
    _producer_table: ProducerTable | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._closed = _ClosedTransactions(self.transaction_table)

    @property
    def transactions(self) -> list[Transaction]:
        """Every transaction, as `transaction_table` orders them (made on each call: for tools and tests)."""
        return self.transaction_table.rows(np.arange(len(self.transaction_table.producer_id)))

    def first_unstable_offset(self, high_watermark: int | None = None) -> int | None:
        """The first offset of the earliest undecided transaction (Kafka's first unstable offset), or None.

        A transaction is undecided while it has no marker, and also while its marker is not yet below the
        high watermark (Kafka's unreplicated transactions: the marker could still be truncated).
        """
        firsts = [p.open_txn_first_offset for p in self.producers.values() if p.open_txn_first_offset >= 0]
        if high_watermark is not None:
            table = self.transaction_table
            unreplicated = table.first_offset[table.marker_offset >= high_watermark]
            if len(unreplicated):
                firsts.append(int(unreplicated.min()))
        return min(firsts) if firsts else None

    def facts(self, high_watermark: int | None = None) -> LogFacts:
        """The survey's figures as the facts `cleaner.cleanable` works from: the same ones the daemon's
        selection reads without a survey (`segments.partition.facts`), so both find the same range."""
        segments = tuple(
            SegmentFacts(s.base_offset, s.size_bytes, s.next_offset, s.largest_timestamp, s.first_batch_timestamp,
                         s.last_modified_ms, s.earliest_delete_horizon_ms)
            for s in self.segments
        )
        return LogFacts(segments, high_watermark, self.first_unstable_offset(high_watermark))

    def aborted_batches(self, producer_id: np.ndarray, base_offset: np.ndarray, transactional: np.ndarray) -> np.ndarray:
        """For data batches: True where the batch belongs to a transaction that ended with an ABORT marker."""
        return self._closed.aborted_batches(producer_id, base_offset, transactional)

    @property
    def closed_markers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The closed transactions' producer ids, markers' offsets and data batches, sorted by (producer id,
        marker): what `cleaner._kernels.window_markers` searches for a window's markers."""
        return self._closed.marker_columns

    def producer_table(self) -> ProducerTable:
        """The producers' states as arrays sorted by producer id (made once, then cached)."""
        if self._producer_table is None:
            states = sorted(self.producers.values(), key=lambda p: p.producer_id)
            self._producer_table = ProducerTable(
                *(
                    np.array([getattr(p, name) for p in states], dtype=np.int64)
                    for name in ProducerTable._fields
                )
            )
        return self._producer_table

    def aborted_rows_ending_in(self, start: int, end: int) -> np.ndarray:
        """The rows of `transaction_table` of the aborted transactions whose marker lies in [start, end), by
        marker offset (for `.txnindex`)."""
        table = self.transaction_table
        markers = table.marker_offset
        rows = np.flatnonzero((table.control_type == fmt.CONTROL_TYPE_ABORT) & (start <= markers) & (markers < end))
        return rows[np.argsort(markers[rows], kind="stable")]


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """A file's identity for the memo: any write, truncation or replacement changes it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class _Remembered:
    """What a survey took from one checked inactive segment (see `SurveyMemo`)."""

    identity: tuple[int, ...]
    survey: SegmentSurvey
    first_start: int  # the offset its first batch (at position 0) starts at, as `_window_figures` reads it (-1: none)
    last_position: int  # the position of its last batch
    producer_rows: tuple[_ProducerRows, ...]
    nbytes: int


class SurveyMemo:
    """What the surveys of one partition took from its inactive segments, for the next round of the same
    partition (see the module docstring). One per cleaner thread, used by one survey at a time; a survey of
    another partition starts it afresh. At most `bytes_max` bytes of rows and figures."""

    __slots__ = ("_bytes", "_directory", "_segments", "bytes_max")

    def __init__(self, bytes_max: int = MEMO_BYTES_MAX) -> None:
        self.bytes_max = bytes_max
        self._directory: str | None = None
        self._segments: dict[str, _Remembered] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._segments)

    def begin(self, directory: str, paths: list[str]) -> None:
        """A survey of `directory` whose segment files are `paths` starts: forget every other segment."""
        if directory != self._directory:
            self._directory, self._segments, self._bytes = directory, {}, 0
            return
        kept = set(paths)
        for path in [p for p in self._segments if p not in kept]:
            self._bytes -= self._segments.pop(path).nbytes

    def get(self, path: str, identity: tuple[int, ...]) -> _Remembered | None:
        remembered = self._segments.get(path)
        return remembered if remembered is not None and remembered.identity == identity else None

    def put(self, path: str, remembered: _Remembered) -> None:
        old = self._segments.pop(path, None)
        if old is not None:
            self._bytes -= old.nbytes
        if self._bytes + remembered.nbytes <= self.bytes_max:
            self._segments[path] = remembered
            self._bytes += remembered.nbytes


_SEGMENT_MEMO_BYTES = 256  # a `_Remembered` without its rows, roughly


def _segment_windows(segments, i: int, ring: WindowRing, charge_io: Callable[[int], None] | None,
                     ahead: IndexAhead | None, memo: SurveyMemo | None, mapped: Callable[[LogSegment], bool]):
    """Segment i's items: (i, window, header scan, keys, rows, None) per window, then (i, None, None, None, None,
    stat) at its end; or (i, None, remembered, None, None, stat) alone for an inactive segment the memo holds
    unchanged and `ahead` does not index. Runs on a read-ahead thread (which charges each read to `charge_io`
    before it). CRCs are checked except in the active segment (the last). The segments `ahead` indexes are scanned
    with their records, and `keys` are the window's records to index with their hashes (None elsewhere). `rows`
    are the window's `_producer_rows`, or the exception they raised, which the round's thread raises where it
    takes them (after the window's offset checks, as when it made them itself). `mapped(segment)` says whether
    to read it through a mapping (`PartitionLog.reads_mapped`)."""
    segment = segments[i]
    active = i == len(segments) - 1
    records = ahead is not None and not active and ahead.scans_records(i)
    st = os.stat(segment.paths.log)
    remembered = memo.get(str(segment.paths.log), _identity(st)) if memo is not None and not active else None
    if remembered is not None and not records:
        yield i, None, remembered, None, None, st
        return
    for window, result in segment.scan_windows(
        window_bytes=ring.window_bytes, verify_crc=not active, headers_only=not records, stop_at_invalid=active,
        ring=ring, before_read=charge_io, mapped=mapped(segment),
    ):
        keys = ahead.keys(result) if records and ahead is not None else None
        try:
            rows: _ProducerRows | Exception | None = _producer_rows(result, window, segment.paths.log,
                                                                    crc_checked=not active)
        except Exception as exc:  # noqa: BLE001 - raised on the round's thread, in its place
            rows = exc
        yield i, window, result, keys, rows, None
    yield i, None, None, None, None, st


def survey_log(
    log: PartitionLog,
    ring: WindowRing | None = None,
    *,
    charge_io: Callable[[int], None] | None = None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    index_ahead: IndexAhead | None = None,
    memo: SurveyMemo | None = None,
    more_rings: tuple[WindowRing, ...] = (),
) -> LogSurvey:
    """Survey every segment of `log` (a cleaner- or reader-mode log) in offset order.

    `ring` holds the read buffers (a new two-set ring if None). `charge_io(n)` is called before each read of
    n bytes (the I/O throttle; it may raise to abort), `on_bytes(n, "read")` after each window. With
    `index_ahead`, the same pass fills the round's offset map (`cleaner.indexing.IndexAhead`). With `memo`, the
    inactive segments it holds unchanged are replayed, not read, and the ones read are added to it. With
    `more_rings`, that many more segments are read and checked at once, each on a thread of its own with one of
    them (the round's spare cores), and taken in offset order all the same. Raises
    `CorruptRecordError` (file, position) for an invalid batch in an inactive segment, or an incomplete
    batch at the end of one.
    """
    ring = ring if ring is not None else WindowRing(WINDOW_BYTES)
    segments = log.segments
    if memo is not None:
        memo.begin(str(log.directory), [str(segment.paths.log) for segment in segments])
    producers: dict[int, ProducerState] = {}
    ended: list[tuple[np.ndarray, ...]] = []  # per window: the transactions its markers end, as columns
    surveys: list[SegmentSurvey] = []
    bytes_read = 0
    sizes = [segment.size_bytes for segment in segments]
    largest_ts = first_ts = horizon_ms = first_start = last_position = -1
    rows_read: list[_ProducerRows] = []  # the segment's rows, for the memo
    next_offset = segments[0].base_offset if segments else 0
    offset_floor = 0  # the lowest offset the next batch of an inactive segment may start at
    sources = [functools.partial(_segment_windows, segments, i, charge_io=charge_io, ahead=index_ahead, memo=memo,
                                 mapped=log.reads_mapped) for i in range(len(segments))]
    for i, window, result, keys, window_rows, st in read_ahead_in_order(
            sources, [ring, *more_rings], name="survey-read-ahead", total_bytes=sum(sizes)):
        segment = segments[i]
        inactive = i < len(segments) - 1
        if isinstance(result, _Remembered):
            offset_floor = _check_remembered(result, segment, segments[i + 1].base_offset, offset_floor)
            for rows in result.producer_rows:
                _track_producers_for(index_ahead, rows, producers, ended)
            surveys.append(result.survey)
            if index_ahead is not None:
                index_ahead.segment_done(i, result.survey.next_offset)
            next_offset = segments[i + 1].base_offset
            continue
        if result is not None:
            floor, window_largest_ts, window_horizon_ms, wrappers = _window_figures(
                result, segment, segments[i + 1].base_offset if inactive else None, offset_floor)
            if inactive:
                if first_start < 0:
                    first_start = _batch_start(result, 0)
                offset_floor = floor
                last_position = int(result.batch_position[-1])
                if wrappers:
                    _check_legacy_wrappers(result, window, segment.paths.log)
        if result is None:  # segment i is done
            surveys.append(
                SegmentSurvey(
                    base_offset=segment.base_offset,
                    size_bytes=sizes[i],
                    largest_timestamp=largest_ts,
                    first_batch_timestamp=first_ts,
                    next_offset=next_offset,
                    last_modified_ms=st.st_mtime_ns // 1_000_000,
                    earliest_delete_horizon_ms=horizon_ms,
                )
            )
            if memo is not None and inactive:
                memo.put(str(segment.paths.log), _Remembered(
                    _identity(st), surveys[-1], first_start, last_position, tuple(rows_read),
                    _SEGMENT_MEMO_BYTES + sum(rows.nbytes for rows in rows_read)))
            if index_ahead is not None:
                index_ahead.segment_done(i, next_offset)
            largest_ts = first_ts = horizon_ms = first_start = last_position = -1
            rows_read = []
            next_offset = segments[i + 1].base_offset if i + 1 < len(segments) else 0
            continue
        bytes_read += result.end_position - result.start_position
        on_bytes(result.end_position - result.start_position, "read")
        if first_ts == -1 and result.start_position == 0:
            first_ts = int(result.max_timestamp[0])
        largest_ts = max(largest_ts, window_largest_ts)
        if window_horizon_ms >= 0:
            horizon_ms = window_horizon_ms if horizon_ms < 0 else min(horizon_ms, window_horizon_ms)
        next_offset = int(result.last_offset[-1]) + 1
        if isinstance(window_rows, Exception):
            raise window_rows
        if window_rows is not None:
            _track_producers_for(index_ahead, window_rows, producers, ended)
            if memo is not None and inactive:
                rows_read.append(window_rows)
        if index_ahead is not None:
            index_ahead.take(i, result, keys)
    open_rows = [(s.producer_id, s.open_txn_first_offset, -1, -1, s.open_txn_data_batches)
                 for s in producers.values() if s.open_txn_first_offset >= 0]
    ended.append(tuple(np.array(open_rows, dtype=np.int64).reshape(-1, len(TransactionTable._fields)).T))
    table = TransactionTable(*(np.concatenate(column) for column in zip(*ended)))
    return LogSurvey(surveys, producers, table, bytes_read)


def _batch_start(result, j: int) -> int:
    """Where batch j of a window starts, as `_window_figures` reads it: a legacy compressed wrapper at its last
    (outer) offset, its first being unknown from its header alone."""
    wrapper = bool(result.is_legacy[j]) and int(result.compression[j]) != fmt.COMPRESSION_NONE
    return int(result.last_offset[j] if wrapper else result.base_offset[j])


def _check_remembered(remembered: _Remembered, segment, next_base: int, offset_floor: int) -> int:
    """`_window_figures`' offset checks for a segment the memo replays: its batches were checked among themselves
    when it was read; here its first batch against the batches before it, its last against the next segment's
    base."""
    if remembered.first_start < 0:  # no batch
        return offset_floor
    start, last = remembered.first_start, remembered.survey.next_offset - 1
    floor = max(offset_floor, segment.base_offset)
    ceiling = min(next_base, segment.base_offset + fmt.RELATIVE_OFFSET_MAX + 1)
    if start < floor:
        raise CorruptRecordError(
            f"batch offsets from {start} do not follow the offsets before them (expected at least {floor}; segment "
            f"base {segment.base_offset})", position=0, path=segment.paths.log)
    if last >= ceiling:
        raise CorruptRecordError(
            f"batch offsets up to {last} reach past the segment's range [{segment.base_offset}, {ceiling}) (the next "
            f"segment starts at {next_base})", position=remembered.last_position, path=segment.paths.log)
    return last + 1


def _window_figures(result, segment, next_base: int | None, offset_floor: int) -> tuple[int, int, int, bool]:
    """A scanned window's figures, in one compiled walk (`cleaner._kernels.window_figures`): (the floor for the next
    batch, its largest max timestamp (at least -1), its soonest delete horizon of a batch with records (-1: none),
    whether it holds a legacy compressed wrapper).

    In a window of an inactive segment (`next_base`: the next segment's base; None for the active one) the batch
    offsets are checked: raises `CorruptRecordError` at the first batch that starts below `offset_floor` or its
    segment's base (out of order, overlapping) or ends at or past `next_base` (segments hold disjoint offset
    ranges; this also keeps every offset within base + 2^31-1, which the segment roll ensures). A legacy
    wrapper's first inner offset is unknown from its header alone, so its outer (last) offset stands for it.
    """
    from . import _kernels

    last_offsets = result.last_offset
    check = next_base is not None
    first_floor = max(offset_floor, segment.base_offset)
    ceiling = min(next_base, segment.base_offset + fmt.RELATIVE_OFFSET_MAX + 1) if check else 0
    out = np.empty(4, dtype=np.int64)
    _kernels.window_figures(result.base_offset, last_offsets, result.is_legacy, result.compression, result.max_timestamp,
                            result.delete_horizon_ms, result.records_count, first_floor, ceiling, check, out)
    j = int(out[0])
    if j >= 0:
        last, start = int(last_offsets[j]), _batch_start(result, j)
        floor = first_floor if j == 0 else int(last_offsets[j - 1]) + 1
        if start < floor:
            reason = (
                f"batch offsets [{start}, {last}] do not follow the offsets before them "
                f"(expected at least {floor}; segment base {segment.base_offset})"
            )
        elif last < start:  # baseOffset + lastOffsetDelta wrapped past 2^63-1
            reason = f"batch offsets [{start}, {last}] end below where they start"
        else:
            reason = (
                f"batch offsets [{start}, {last}] reach past the segment's range [{segment.base_offset}, {ceiling}) "
                f"(the next segment starts at {next_base})"
            )
        raise CorruptRecordError(reason, position=int(result.batch_position[j]), path=segment.paths.log)
    floor = int(last_offsets[-1]) + 1 if len(last_offsets) else offset_floor
    return floor, int(out[1]), int(out[2]), bool(out[3])


def _check_legacy_wrappers(result, window, path) -> None:
    """Decode every v0/v1 compressed wrapper of a window of an inactive segment in full (inner messages and
    their own CRC-32s, which only decompression reaches), so that damage inside one stops the round before
    anything is swapped. Such wrappers are rare and old; v2 batches are decoded by the later phases."""
    # numba (the scan's kernels) is imported only when a scan runs: start-up of the CLI stays fast
    from segments.codec.scan import scan

    for i in np.flatnonzero(result.is_legacy & (result.compression != fmt.COMPRESSION_NONE)).tolist():
        start = int(result.batch_position[i]) - result.base_position
        try:
            scan(window, start=start, end=start + int(result.batch_size[i]), base_position=result.base_position)
        except CorruptRecordError as exc:
            raise exc.located(path, 0) from None


class _ProducerRows(NamedTuple):
    """The batches of one window that carry a producer id, in offset order: what the producer tracking reads of
    them (`ends`: the control type of a COMMIT/ABORT marker, -1 for every other batch)."""

    producer_id: np.ndarray
    is_control: np.ndarray
    is_transactional: np.ndarray
    base_offset: np.ndarray
    last_offset: np.ndarray
    max_timestamp: np.ndarray
    ends: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(column.nbytes for column in self)


def _producer_rows(result, window: bytes, path, *, crc_checked: bool) -> _ProducerRows | None:
    """The rows of a scanned window's batches that carry a producer id (None if none does), with the control type
    of each COMMIT/ABORT marker, in one compiled walk (`cleaner._kernels.producer_rows`). A control batch that
    walk leaves undecided (compressed, or not plainly well formed), or whose CRC-32C the scan did not check
    (`crc_checked` False) and does not match, is decoded here in Python, which raises `CorruptRecordError` (file,
    byte) for the first malformed one."""
    from segments.codec.control import crcs_match

    from . import _kernels

    n = int(np.count_nonzero(result.producer_id >= 0))
    if not n:
        return None
    columns = np.empty((5, n), dtype=np.int64)
    flags = np.empty((2, n), dtype=np.bool_)
    batch = np.empty(n, dtype=np.int64)
    status = np.empty(n, dtype=np.int8)
    _kernels.producer_rows(result.buffer, result.producer_id, result.is_control, result.is_transactional,
                           result.base_offset, result.last_offset, result.max_timestamp, result.records_count,
                           result.attributes, result.records_in_arena, result.records_pos, result.records_bytes,
                           columns, flags, batch, status)
    ends = columns[4]
    if not crc_checked:  # a control batch is decided only once its CRC-32C matches
        decided = np.flatnonzero(status == _DECIDED)
        if len(decided):
            status[decided[~crcs_match(result, batch[decided])]] = _UNDECIDED
    for k in np.flatnonzero(status == _UNDECIDED).tolist():
        control_type = _decode_control_type(result, window, int(batch[k]), path)
        ends[k] = control_type if control_type in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT) else -1
    return _ProducerRows(columns[0], flags[0], flags[1], columns[1], columns[2], columns[3], ends)


_DECIDED, _UNDECIDED = 1, 2  # `_kernels.producer_rows`' status of a control batch with records


def _track_producers(rows: _ProducerRows, producers: dict[int, ProducerState],
                     ended: list[tuple[np.ndarray, ...]]) -> list[int]:
    """Advance each producer's state over the rows of one window, in offset order, and append the transactions its
    markers end to `ended` as `TransactionTable` columns, in the order of their markers. Returns the producers
    whose open transaction may have changed: those with a marker or transactional data in the window.

    One compiled walk over the rows without the GIL (`cleaner._kernels.window_producers`): per producer of the
    window its figures, per marker its transaction, a marker's transaction being its producer's transactional
    data batches since the producer's previous marker (or, for its first marker here, since the window's start,
    plus what was open before it). Python then only sets each producer's fields, new producers entering
    `producers` in log order."""
    from . import _kernels

    n = len(rows.producer_id)
    groups = np.empty((10, n), dtype=np.int64)
    markers = np.empty((5, n), dtype=np.int64)
    count, found = _kernels.window_producers(rows.producer_id, rows.is_control, rows.is_transactional,
                                             rows.base_offset, rows.last_offset, rows.max_timestamp, rows.ends,
                                             groups, markers)
    markers = markers[:, :found].copy()  # what `ended` keeps: not the rows' whole buffer
    counts, firsts = markers[4], markers[1]
    touched = []
    for pid, last_entry, is_control, ts, last_data, k, left, left_first, txn_total, txn_first in zip(
            *groups[:, :count].tolist()):
        state = producers.get(pid)
        if state is None:
            state = producers[pid] = ProducerState(pid)
        state.last_entry_offset = last_entry
        state.last_entry_is_control = bool(is_control)
        state.last_timestamp = max(state.last_timestamp, ts)
        if last_data >= 0:
            state.last_data_offset = last_data
        if k >= 0 or txn_total:
            touched.append(pid)
        if k < 0:  # no marker: its transactional data extends (or opens) a transaction
            if txn_total:
                if state.open_txn_first_offset < 0:
                    state.open_txn_first_offset, state.open_txn_data_batches = txn_first, 0
                state.open_txn_data_batches += txn_total
            continue
        counts[k] += state.open_txn_data_batches  # its first marker ends what was open before the window
        if state.open_txn_first_offset >= 0:
            firsts[k] = state.open_txn_first_offset
        state.open_txn_first_offset, state.open_txn_data_batches = left_first, left
    if found:
        ended.append((markers[0], firsts, markers[2], markers[3], counts))
    return touched


def _track_producers_for(index_ahead: IndexAhead | None, rows: _ProducerRows, producers: dict[int, ProducerState],
                         ended: list[tuple[np.ndarray, ...]]) -> None:
    """`_track_producers`, then tell `index_ahead` (if any) what changed: the window's producers and the
    transactions it ended."""
    before = len(ended)
    touched = _track_producers(rows, producers, ended)
    if index_ahead is not None:
        index_ahead.track(touched, producers, ended[before] if len(ended) > before else None)


def _decode_control_type(result, window: bytes, i: int, path) -> int:
    """The type of control batch i's first record, decoded in full by the Python decoder (CRC included)."""
    position = int(result.batch_position[i])
    try:
        batch = decode_batch(window, position - result.base_position)
    except CorruptRecordError as exc:  # positions relative to the window: place them in the file
        raise exc.located(path, result.base_position) from None
    try:
        _, control_type = decode_control_key(batch.records[0].key)
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.reason, position=position, path=path) from None
    return control_type
