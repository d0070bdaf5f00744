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
`segments.files.readahead`); control batches and legacy wrappers, which are rare, are decoded in full. This is the
round's only CRC check: the index and recopy phases read the same inactive segments again, which the
cleaner lock keeps unchanged, and do not check them twice. Memory is proportional to the number of
transactions and producers, not to the log. It reads the active segment too (open transactions end there),
without CRC checks, since its writer may be appending to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.records import decode_batch, decode_control_key
from segments.files.facts import SegmentFacts
from segments.files.readahead import WindowRing, read_ahead
from segments.partition.facts import LogFacts
from segments.partition.log import PartitionLog

__all__ = ["WINDOW_BYTES", "LogSurvey", "ProducerState", "SegmentSurvey", "Transaction", "survey_log"]

WINDOW_BYTES = 8 * 1024 * 1024  # one window of a round's reads (survey, index and recopy alike)


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


@dataclass
class LogSurvey:
    """The survey's result; see the module docstring."""

    segments: list[SegmentSurvey]
    producers: dict[int, ProducerState]
    transactions: list[Transaction]
    bytes_read: int = 0
    # Per producer: sorted first offsets, marker offsets and kinds of its closed transactions.
    _by_producer: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        grouped: dict[int, list[Transaction]] = {}
        for txn in self.transactions:
            if txn.marker_offset >= 0:
                grouped.setdefault(txn.producer_id, []).append(txn)
        for pid, txns in grouped.items():
            txns.sort(key=lambda t: t.first_offset)
            self._by_producer[pid] = (
                np.array([t.first_offset for t in txns], dtype=np.int64),
                np.array([t.marker_offset for t in txns], dtype=np.int64),
                np.array([t.aborted for t in txns], dtype=bool),
                np.array([t.data_batches for t in txns], dtype=np.int64),
            )

    def first_unstable_offset(self, high_watermark: int | None = None) -> int | None:
        """The first offset of the earliest undecided transaction (Kafka's first unstable offset), or None.

        A transaction is undecided while it has no marker, and also while its marker is not yet below the
        high watermark (Kafka's unreplicated transactions: the marker could still be truncated).
        """
        firsts = [p.open_txn_first_offset for p in self.producers.values() if p.open_txn_first_offset >= 0]
        if high_watermark is not None:
            firsts += [t.first_offset for t in self.transactions if t.marker_offset >= high_watermark]
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
        out = np.zeros(len(producer_id), dtype=bool)
        candidates = np.nonzero(transactional & (producer_id >= 0))[0]
        if not len(candidates):
            return out
        for pid in np.unique(producer_id[candidates]).tolist():
            txns = self._by_producer.get(pid)
            if txns is None:
                continue
            firsts, markers, aborted, _ = txns
            idx = candidates[producer_id[candidates] == pid]
            j = np.searchsorted(firsts, base_offset[idx], side="right") - 1
            inside = (j >= 0) & (base_offset[idx] <= markers[np.maximum(j, 0)])
            out[idx] = inside & aborted[np.maximum(j, 0)]
        return out

    def marker_is_discardable(self, producer_id: int, marker_offset: int) -> bool:
        """True if the COMMIT/ABORT marker at `marker_offset` ends a transaction with no data batch left.

        Control records of any other type (not transaction markers) are never discardable, as in Kafka.
        """
        txns = self._by_producer.get(producer_id)
        if txns is None:
            return False
        _, markers, _, data_batches = txns
        j = int(np.searchsorted(markers, marker_offset))
        if j < len(markers) and markers[j] == marker_offset:
            return bool(data_batches[j] == 0)
        return False

    def is_transaction_marker(self, producer_id: int, marker_offset: int) -> bool:
        """True if the control batch at `marker_offset` is the COMMIT/ABORT marker of one of the producer's
        transactions (other control records end none)."""
        txns = self._by_producer.get(producer_id)
        if txns is None:
            return False
        markers = txns[1]
        j = int(np.searchsorted(markers, marker_offset))
        return j < len(markers) and int(markers[j]) == marker_offset

    def aborted_transactions_ending_in(self, start: int, end: int) -> list[Transaction]:
        """Aborted transactions whose marker lies in [start, end), by marker offset (for `.txnindex`)."""
        out = [t for t in self.transactions if t.aborted and start <= t.marker_offset < end]
        out.sort(key=lambda t: t.marker_offset)
        return out


def _checked_windows(segments, ring: WindowRing, charge_io: Callable[[int], None] | None):
    """(segment index, window, header scan) per window, then (index, None, None) at each segment's end; runs
    on the read-ahead thread (which charges each read to `charge_io` before it). CRCs are checked except in
    the active segment (the last)."""
    for i, segment in enumerate(segments):
        active = i == len(segments) - 1
        for window, result in segment.scan_windows(
            window_bytes=ring.window_bytes, verify_crc=not active, headers_only=True, stop_at_invalid=active,
            ring=ring, before_read=charge_io,
        ):
            yield i, window, result
        yield i, None, None


def survey_log(
    log: PartitionLog,
    ring: WindowRing | None = None,
    *,
    charge_io: Callable[[int], None] | None = None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
) -> LogSurvey:
    """Survey every segment of `log` (a cleaner- or reader-mode log) in offset order.

    `ring` holds the read buffers (a new two-set ring if None). `charge_io(n)` is called before each read of
    n bytes (the I/O throttle; it may raise to abort), `on_bytes(n, "read")` after each window. Raises
    `CorruptRecordError` (file, position) for an invalid batch in an inactive segment, or an incomplete
    batch at the end of one.
    """
    ring = ring if ring is not None else WindowRing(WINDOW_BYTES)
    segments = log.segments
    producers: dict[int, ProducerState] = {}
    transactions: list[Transaction] = []
    surveys: list[SegmentSurvey] = []
    bytes_read = 0
    sizes = [segment.size_bytes for segment in segments]
    largest_ts = first_ts = horizon_ms = -1
    next_offset = segments[0].base_offset if segments else 0
    offset_floor = 0  # the lowest offset the next batch of an inactive segment may start at
    for i, window, result in read_ahead(_checked_windows(segments, ring, charge_io), name="survey-read-ahead"):
        segment = segments[i]
        if result is not None and i < len(segments) - 1:
            offset_floor = _check_offsets(result, segment, segments[i + 1].base_offset, offset_floor)
            _check_legacy_wrappers(result, window, segment.paths.log)
        if result is None:  # segment i is done
            surveys.append(
                SegmentSurvey(
                    base_offset=segment.base_offset,
                    size_bytes=sizes[i],
                    largest_timestamp=largest_ts,
                    first_batch_timestamp=first_ts,
                    next_offset=next_offset,
                    last_modified_ms=os.stat(segment.paths.log).st_mtime_ns // 1_000_000,
                    earliest_delete_horizon_ms=horizon_ms,
                )
            )
            largest_ts = first_ts = horizon_ms = -1
            next_offset = segments[i + 1].base_offset if i + 1 < len(segments) else 0
            continue
        bytes_read += result.end_position - result.start_position
        on_bytes(result.end_position - result.start_position, "read")
        if first_ts == -1 and result.start_position == 0:
            first_ts = int(result.max_timestamp[0])
        largest_ts = max(largest_ts, int(result.max_timestamp.max()))
        horizons = result.delete_horizon_ms[(result.delete_horizon_ms >= 0) & (result.records_count != 0)]
        if len(horizons):
            soonest = int(horizons.min())
            horizon_ms = soonest if horizon_ms < 0 else min(horizon_ms, soonest)
        next_offset = int(result.last_offset[-1]) + 1
        _track_producers(result, window, producers, transactions, segment.paths.log)
    for state in producers.values():
        if state.open_txn_first_offset >= 0:
            transactions.append(
                Transaction(state.producer_id, state.open_txn_first_offset, -1, -1, state.open_txn_data_batches)
            )
    return LogSurvey(surveys, producers, transactions, bytes_read)


def _check_offsets(result, segment, next_base: int, offset_floor: int) -> int:
    """Check the batch offsets of one window of an inactive segment; returns the floor for the next batch.

    Raises `CorruptRecordError` at the first batch that starts below `offset_floor` or its segment's base
    (out of order, overlapping) or ends at or past `next_base`, the next segment's base (segments hold
    disjoint offset ranges; this also keeps every offset within base + 2^31-1, which the segment roll
    ensures). A legacy wrapper's first inner offset is unknown from its header alone, so its outer (last)
    offset stands for it.
    """
    base_offsets = result.base_offset
    last_offsets = result.last_offset
    wrapper = result.is_legacy & (result.compression != fmt.COMPRESSION_NONE)  # base offset -1: not known here
    starts = np.where(wrapper, last_offsets, base_offsets)
    floors = np.concatenate(([max(offset_floor, segment.base_offset)], last_offsets[:-1] + 1))
    ceiling = min(next_base, segment.base_offset + fmt.RELATIVE_OFFSET_MAX + 1)
    bad = np.flatnonzero((starts < floors) | (last_offsets < starts) | (last_offsets >= ceiling))
    if len(bad):
        j = int(bad[0])
        start, last, floor = int(starts[j]), int(last_offsets[j]), int(floors[j])
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
    return int(last_offsets[-1]) + 1 if len(last_offsets) else offset_floor


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


def _track_producers(result, window: bytes, producers: dict[int, ProducerState], transactions: list[Transaction], path) -> None:
    """Advance each producer's state over the batches of one window, in offset order."""
    pids = result.producer_id
    relevant = np.nonzero(pids >= 0)[0]
    if not len(relevant):
        return
    control = result.is_control
    transactional = result.is_transactional
    for i in relevant.tolist():
        pid = int(pids[i])
        state = producers.get(pid)
        if state is None:
            state = producers[pid] = ProducerState(pid)
        last_offset = int(result.last_offset[i])
        state.last_entry_offset = last_offset
        state.last_entry_is_control = bool(control[i])
        state.last_timestamp = max(state.last_timestamp, int(result.max_timestamp[i]))
        if not control[i]:
            state.last_data_offset = last_offset
            if transactional[i]:
                if state.open_txn_first_offset < 0:
                    state.open_txn_first_offset = int(result.base_offset[i])
                    state.open_txn_data_batches = 0
                state.open_txn_data_batches += 1
            continue
        if result.records_count[i] == 0:
            continue  # an empty control batch (a cleaned marker): it ends nothing
        position = int(result.batch_position[i])
        local = position - result.base_position
        try:
            batch = decode_batch(window, local)
        except CorruptRecordError as exc:  # positions relative to the window: place them in the file
            raise exc.located(path, result.base_position) from None
        try:
            _, control_type = decode_control_key(batch.records[0].key)
        except CorruptRecordError as exc:
            raise CorruptRecordError(exc.reason, position=position, path=path) from None
        if control_type not in (fmt.CONTROL_TYPE_ABORT, fmt.CONTROL_TYPE_COMMIT):
            continue  # KRaft and other control records do not end transactions
        first = state.open_txn_first_offset
        transactions.append(
            Transaction(pid, first if first >= 0 else last_offset, last_offset, control_type, state.open_txn_data_batches)
        )
        state.open_txn_first_offset = -1
        state.open_txn_data_batches = 0
