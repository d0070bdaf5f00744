"""Cheap facts about one segment, from its batch headers alone: what deciding where to clean needs of it.

Owns `SegmentFacts` (size, next offset, largest and first batch timestamps, mtime), `TxnSummary` (what the
segment contributes to its partition's transaction state, in a form `segments.partition.facts` folds over
the segments cheaply into Kafka's first unstable offset) and `SegmentWalk`, which reads both by walking the
segment's batch headers, and can continue over the bytes appended since (a growing active segment). An
inactive segment of `WINDOWED_MIN_BYTES` or more is walked in windows by the compiled header scan
(`segments.codec.scan`, `headers_only`, no CRC check), at the speed its bytes are read; a smaller one, and
the active one, batch by batch (one small read per header).

The figures are the ones a cleaning round's survey (`cleaner.survey`) takes from the same headers: the
largest timestamp is the largest batch maxTimestamp (-1 when none), the first batch timestamp the first
batch's maxTimestamp, the next offset the last batch's lastOffset + 1 (the base offset if empty), the earliest
delete horizon the least baseTimestamp of the batches with records whose attribute bit 6 is set (KIP-534: a
cleaner stamps it on a batch keeping a tombstone or a transaction marker; -1 when none); a
transaction opens at a producer's first transactional data batch and ends at its COMMIT or ABORT marker (a
control batch with records; one emptied by a cleaner ends nothing). A walk raises `CorruptRecordError`
(file, position) at a header that is not a batch's, and at an incomplete final batch of an inactive segment
(corruption, which a round's survey would find as well); in the active segment, such a batch (its writer may
be appending it) ends the walk quietly, and a later walk goes on from there. No CRC is checked but a control
batch's: checking is the round's survey's job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..codec import format as fmt
from ..codec.control import control_types
from ..codec.errors import CorruptRecordError
from ..codec.records import decode_batch, decode_control_key
from .readahead import WindowRing
from .segment import LogSegment

__all__ = ["EMPTY_TXN_SUMMARY", "WINDOWED_MIN_BYTES", "SegmentFacts", "SegmentWalk", "TxnSummary", "file_identity"]

_WINDOW_BYTES = 1024 * 1024  # of the windowed walk (a larger batch gets a window of its own)
WINDOWED_MIN_BYTES = 64 * 1024  # below this, a call of the compiled scan costs more than reading header by header


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    """One segment as selection and a round's range see it (the survey's figures, read from headers)."""

    base_offset: int
    size_bytes: int
    next_offset: int  # the last batch's lastOffset + 1, or the base offset if the segment is empty
    largest_timestamp: int  # the largest batch maxTimestamp; -1 when the segment holds no timestamps
    first_batch_timestamp: int  # maxTimestamp of its first batch (-1 if empty)
    last_modified_ms: int
    earliest_delete_horizon_ms: int = -1  # the least delete horizon of its batches with records (-1: none)


@dataclass(frozen=True, slots=True)
class TxnSummary:
    """What one segment does to its partition's transactions, in file order, per producer.

    `first_markers`: (producer id, offset of its first COMMIT/ABORT marker here, first offset of its
    transactional data here before that marker or -1): that marker ends the transaction open when the
    segment began, if any. `later_markers`: the offsets of the producers' other markers here, ascending, and
    `later_firsts_min[i]`: the least first offset of the transactions ending at `later_markers[i:]` (which all
    began here). `open_at_end`: (producer id, first offset) of each transaction begun here and still open at
    the segment's end. `max_marker`: the last marker's offset (-1: none).
    """

    first_markers: tuple[tuple[int, int, int], ...]
    later_markers: tuple[int, ...]
    later_firsts_min: tuple[int, ...]
    open_at_end: tuple[tuple[int, int], ...]
    max_marker: int

    @property
    def empty(self) -> bool:
        return not self.first_markers and not self.open_at_end


EMPTY_TXN_SUMMARY = TxnSummary((), (), (), (), -1)


class SegmentWalk:
    """The walk over one segment's batch headers so far: its facts and its transaction summary.

    `advance(segment)` walks from where the walk stopped to the end of the segment as opened, and returns
    False, walking nothing, if the segment is not the file walked so far (the batch walked last is no
    longer where it was, or the walk was a windowed one): then a new walk is needed. With `inactive` (the
    segment is not the active one), an incomplete final batch is corruption, and a new walk of a large
    segment goes in windows. Not thread-safe: one caller at a time.
    """

    __slots__ = ("base_offset", "position", "next_offset", "largest_timestamp", "first_batch_timestamp",
                 "earliest_delete_horizon_ms", "_last", "_first_markers", "_later", "_open", "_max_marker", "_summary")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.position = 0  # where the next batch starts (the end of the last whole batch walked)
        self.next_offset = base_offset
        self.largest_timestamp = -1
        self.first_batch_timestamp = -1
        self.earliest_delete_horizon_ms = -1
        self._last: tuple[int, int, int, int] | None = None  # (position, base offset, crc, length) of the last batch
        self._first_markers: dict[int, tuple[int, int]] = {}  # producer id -> (marker, first data offset or -1)
        self._later: list[tuple[int, int]] = []  # (marker, first offset) of the other transactions ending here
        self._open: dict[int, int] = {}  # producer id -> first offset of its transaction begun here, still open
        self._max_marker = -1
        self._summary: TxnSummary | None = EMPTY_TXN_SUMMARY

    def advance(self, segment: LogSegment, *, inactive: bool = False) -> bool:
        if inactive and self.position == 0 and segment.size_bytes >= WINDOWED_MIN_BYTES:
            self._walk_windows(segment)
            return True
        if self.position > 0 and self._last is None:
            return False  # walked in windows: no batch to check a continuation against
        if self._last is not None:
            position, base_offset, crc, length = self._last
            header = segment.header_at(position)
            if header is None or (header.base_offset, header.crc, header.batch_length) != (base_offset, crc, length):
                return False
        for position, header in segment.iter_headers(self.position):
            self._take(segment, position, header)
            self.position = position + header.size_bytes
        if inactive and self.position < segment.size_bytes:
            raise CorruptRecordError(
                f"incomplete batch at the end of an inactive segment ({segment.size_bytes - self.position} bytes)",
                position=self.position, path=segment.paths.log,
            )
        return True

    def _walk_windows(self, segment: LogSegment) -> None:
        ring = WindowRing(_WINDOW_BYTES, count=1)
        for window, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, verify_crc=False, headers_only=True,
                                                   ring=ring):
            if self.first_batch_timestamp == -1 and result.start_position == 0:
                self.first_batch_timestamp = int(result.max_timestamp[0])
            self.largest_timestamp = max(self.largest_timestamp, int(result.max_timestamp.max()))
            horizons = result.delete_horizon_ms[(result.delete_horizon_ms >= 0) & (result.records_count != 0)]
            if len(horizons):
                self._note_horizon(int(horizons.min()))
            self.next_offset = int(result.last_offset[-1]) + 1
            self.position = result.end_position
            # Only transactional data batches and control batches of a producer change its transactions.
            relevant = np.flatnonzero((result.producer_id >= 0) & (result.is_transactional | result.is_control))
            if not len(relevant):
                continue
            # The control records' types in one compiled call; a batch it leaves undecided is decoded below.
            markers = relevant[result.is_control[relevant] & (result.records_count[relevant] != 0)]
            types, decided = control_types(result, markers, crc_checked=False)
            known = {int(b): int(t) for b, t, d in zip(markers.tolist(), types.tolist(), decided.tolist()) if d}
            for i in relevant.tolist():
                position = int(result.batch_position[i])
                if not result.is_control[i]:
                    self._open_transaction(int(result.producer_id[i]), int(result.base_offset[i]))
                elif result.records_count[i] != 0:
                    local = position - result.base_position
                    self._end_transaction(segment, position, window[local: local + int(result.batch_size[i])],
                                          int(result.producer_id[i]), int(result.last_offset[i]), known.get(i))

    def _note_horizon(self, horizon_ms: int) -> None:
        if self.earliest_delete_horizon_ms < 0 or horizon_ms < self.earliest_delete_horizon_ms:
            self.earliest_delete_horizon_ms = horizon_ms

    def _open_transaction(self, pid: int, first_offset: int) -> None:
        if pid not in self._open:
            self._open[pid] = first_offset
            self._summary = None

    def _end_transaction(self, segment: LogSegment, position: int, data, pid: int, marker: int,
                         control_type: int | None = None) -> None:
        """A control batch with records at `position` (`data`: its bytes): a marker ends `pid`'s transaction.
        `control_type`, when known (`control_types`), saves decoding the batch."""
        if control_type is None:
            try:
                batch = decode_batch(data, 0)
                _, control_type = decode_control_key(batch.records[0].key)
            except CorruptRecordError as exc:
                raise exc.located(segment.paths.log, position) from None
        if control_type not in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT):
            return  # KRaft and other control records end no transaction
        first = self._open.pop(pid, -1)
        if pid not in self._first_markers:
            self._first_markers[pid] = (marker, first)
        else:
            self._later.append((marker, first if first >= 0 else marker))
        self._max_marker = marker
        self._summary = None

    def _take(self, segment: LogSegment, position: int, header) -> None:
        self._last = (position, header.base_offset, header.crc, header.batch_length)
        if self.first_batch_timestamp == -1 and position == 0:
            self.first_batch_timestamp = header.max_timestamp
        self.largest_timestamp = max(self.largest_timestamp, header.max_timestamp)
        if header.has_delete_horizon and header.records_count != 0:
            self._note_horizon(header.base_timestamp)
        self.next_offset = header.next_offset
        pid = header.producer_id
        if pid < 0:
            return
        if not header.is_control:
            if header.is_transactional:
                self._open_transaction(pid, header.base_offset)
        elif header.records_count != 0:  # an empty control batch (a cleaned marker) ends nothing
            self._end_transaction(segment, position, segment.pread(position, header.size_bytes), pid,
                                  header.last_offset)

    def facts(self, size_bytes: int, last_modified_ms: int) -> SegmentFacts:
        return SegmentFacts(self.base_offset, size_bytes, self.next_offset, self.largest_timestamp,
                            self.first_batch_timestamp, last_modified_ms, self.earliest_delete_horizon_ms)

    def txn_summary(self) -> TxnSummary:
        if self._summary is None:
            later = sorted(self._later)
            mins: list[int] = []
            least = None
            for _, first in reversed(later):
                least = first if least is None else min(least, first)
                mins.append(least)
            mins.reverse()
            self._summary = TxnSummary(
                tuple((pid, marker, first) for pid, (marker, first) in self._first_markers.items()),
                tuple(marker for marker, _ in later),
                tuple(mins),
                tuple(self._open.items()),
                self._max_marker,
            )
        return self._summary


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells a segment file changed: (device, inode, size, mtime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
