"""The index phase of a round: the dirty section's keys into the offset map, up to the map's fill limit.

Owns Kafka's `Cleaner.buildOffsetMap`: walk the segments overlapping [first_dirty, first_uncleanable) in
bounded windows, hash the key of every record at or after `first_dirty` that lies in a non-control batch
of a transaction that was not aborted (unkeyed records are skipped), and insert (hash, offset) into the
map in offset order. The map's `latest_offset` follows every batch's last offset and jumps over the gaps
between segments (KAFKA-8764), so a fully indexed section ends at `first_uncleanable - 1`.

When the map fills, indexing stops at the last record that fit (possibly inside a batch, so even a tiny
map always makes progress) and the round cleans up to there; the next round continues from it.

While inserting, the map reports the offset each record replaces: those offsets are superseded (a later record
of the dirty section has the same key), which is all the recopy phase needs to know of an indexed record, so it
does not hash and look it up a second time. They go into `SupersededOffsets`, a bitmap over the dirty
section's offsets (one bit an offset; at most one byte per key the map admits, under 4% of the map's memory;
a dirty section with gaps so wide that its offsets outrun that is covered from its start and the rest is
looked up in the map as before). CRCs are not checked again here: the survey checked every batch of the
inactive segments this round, and the cleaner lock keeps them unchanged since.

When the section's bounds can be foreseen before the survey, the survey's own pass fills the map
(`IndexAhead`, the same rules through `_MapFiller`, holding back what follows an open transaction until it
ends) and the section is read once, not twice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from offsetmap import OffsetMap, hash_key_rows
from segments.codec import format as fmt
from segments.files.readahead import WindowRing, read_ahead
from segments.files.segment import LogSegment
from segments.partition.log import PartitionLog

from .survey import WINDOW_BYTES, LogSurvey

__all__ = ["IndexAhead", "IndexResult", "PartThreads", "SupersededOffsets", "build_offset_map"]

_NONE = np.empty(0, dtype=np.int64)  # no record selected
_NO_BATCHES = np.empty(0, dtype=np.bool_)  # no batch is aborted


@functools.cache
def _kern() -> ModuleType:
    """`cleaner._kernels`, imported at the first call: the kernels load only when a round indexes (the CLI's start-up
    stays fast), and a cached call is cheaper per window than an `import` statement."""
    from . import _kernels

    return _kernels


class SupersededOffsets:
    """Which offsets of [start, start + span) a later indexed record of the same key supersedes (a bitmap)."""

    __slots__ = ("bits", "start")

    def __init__(self, start: int, span: int) -> None:
        self.start = start
        self.bits = np.zeros((max(span, 0) + 7) // 8, dtype=np.uint8)

    @property
    def end(self) -> int:
        """First offset past the bitmap."""
        return self.start + 8 * len(self.bits)


@dataclass(frozen=True, slots=True)
class IndexResult:
    """How far the map got: `end_offset` is exclusive (the next round's first dirty offset)."""

    end_offset: int
    records_indexed: int
    records_read: int
    bytes_read: int
    map_full: bool
    elapsed_s: float
    superseded: SupersededOffsets


def _window_keys(result, aborted: np.ndarray | None, first_dirty: int, first_uncleanable: int, seed: int):
    """(offsets, h1, h2) of the records of one scanned window to index, in order: every keyed record in
    [first_dirty, first_uncleanable) of a batch that is not a control batch nor `aborted` (None: no batch is).
    Two compiled calls without the GIL: `_kernels.select_keys`, then `offsetmap.hash_key_rows` over the window
    and its arena."""
    kern = _kern()
    n = result.n_records
    offsets = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    in_arena = np.empty(n, dtype=np.bool_)
    count = kern.select_keys(result.offset, result.key_len, result.batch_index, result.magic, result.attributes,
                             _NO_BATCHES if aborted is None else aborted, first_dirty, first_uncleanable,
                             result.records_in_arena, offsets, rows, in_arena)
    if not count:
        return _NONE, None, None
    h1, h2 = hash_key_rows(result.buffer, result.arena, result.key_pos, result.key_len, rows[:count], in_arena[:count],
                           seed)
    return offsets[:count], h1, h2


class PartThreads:
    """The threads that fill the parts of a round's offset map at once (`OffsetMap.reset(..., parts=...)`,
    `insert_hashes(run=...)`): a window's calls for all parts but the first go to `helpers` threads, the first
    runs on the calling thread, and every call has returned before the results are given back (a kernel still
    writing the table must not outlive the insert). With no helpers, or once closed, the calls run one after
    another on the calling thread. A context manager: the threads end with it."""

    def __init__(self, helpers: int) -> None:
        self.parts = max(helpers, 0) + 1
        self._pool = (concurrent.futures.ThreadPoolExecutor(helpers, thread_name_prefix="logcleaner-map-part")
                      if helpers > 0 else None)

    def __enter__(self) -> PartThreads:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __call__(self, calls: Sequence[Callable[[], tuple[int, int]]]) -> list[tuple[int, int]]:
        pool = self._pool
        if pool is None or len(calls) < 2:
            return [call() for call in calls]
        futures = [pool.submit(call) for call in calls[1:]]
        try:
            first = calls[0]()
        finally:
            concurrent.futures.wait(futures)
        return [first, *(future.result() for future in futures)]


class _MapFiller:
    """Inserting a dirty section's windows into the map, in offset order: the rules of `build_offset_map`
    whichever pass reads the windows (the index phase's own, or the survey's, `IndexAhead`); a map split into
    parts is filled on `parts`' threads."""

    def __init__(self, offset_map: OffsetMap, first_dirty: int, first_uncleanable: int,
                 parts: PartThreads | None = None) -> None:
        self.parts = parts
        self.map = offset_map
        self.first_dirty = first_dirty
        self.first_uncleanable = first_uncleanable
        self.superseded = SupersededOffsets(
            first_dirty, min(first_uncleanable - first_dirty, 8 * offset_map.active_capacity))
        self.records_indexed = self.records_read = self.bytes_read = 0
        self.map_full = False

    def window(self, result, offsets: np.ndarray, h1, h2) -> bool:
        """Insert one window's selected records (`_window_keys`: their offsets and hashes); True when the map
        filled (indexing stops there)."""
        self.records_read += result.n_records
        if self.insert(offsets, h1, h2):
            return True
        self.window_end(int(result.last_offset[-1]))
        return False

    def insert(self, offsets: np.ndarray, h1, h2) -> bool:
        """Insert selected records, in offset order; True when the map filled (indexing stops there). A
        window's records may come in several calls: the map ends the same."""
        if len(offsets):
            # the offsets these records supersede are marked by the map as it replaces them
            consumed = self.map.insert_hashes(h1, h2, offsets, superseded=(self.superseded.bits, self.superseded.start),
                                              run=self.parts)
            self.records_indexed += consumed
            if consumed < len(offsets):
                self.map_full = True
                return True
        return False

    def window_end(self, last: int) -> None:
        """A window whose last batch ends at offset `last` is inserted whole: the map has seen up to it."""
        if last >= self.first_dirty and last >= self.map.latest_offset:
            self.map.advance_latest_offset(min(last, self.first_uncleanable - 1))

    def segment_done(self, next_base: int) -> None:
        """A segment is indexed whole: skip the offset gap up to `next_base`, the next segment's base or
        `first_uncleanable` (KAFKA-8764)."""
        gap_end = min(next_base, self.first_uncleanable) - 1
        if gap_end >= max(self.map.latest_offset, self.first_dirty):
            self.map.advance_latest_offset(gap_end)

    def bound(self, first_uncleanable: int) -> None:
        """The section ends at `first_uncleanable` (at most the one assumed so far, and nothing at or past it
        inserted yet): clamp there from now on, and cover the offsets `build_offset_map` would cover."""
        self.first_uncleanable = first_uncleanable
        bits = self.superseded.bits
        self.superseded.bits = bits[:min(len(bits), (max(first_uncleanable - self.first_dirty, 0) + 7) // 8)]

    def result(self, elapsed_s: float) -> IndexResult:
        latest = self.map.latest_offset
        end = latest + 1 if latest >= self.first_dirty else self.first_dirty
        return IndexResult(end, self.records_indexed, self.records_read, self.bytes_read, self.map_full, elapsed_s,
                           self.superseded)


def _hashed_windows(segments, survey: LogSurvey, first_dirty: int, first_uncleanable: int, seed: int, ring: WindowRing,
                    charge_io: Callable[[int], None] | None = None,
                    mapped: Callable[[LogSegment], bool] = lambda segment: False):
    """(k, scan result, offsets of the records to index, their h1, h2) per window of the dirty section, then
    (k, None, ...) once segment k is done; runs on the read-ahead thread (charges each read to `charge_io` before
    it, reads, scans and hashes, all outside the GIL); `mapped(segment)` says whether to read it through a
    mapping (`PartitionLog.reads_mapped`)."""
    for k, segment in enumerate(segments):
        # The offset index is consulted only to start inside a segment (after a round that filled its map); a
        # section that starts at a segment's base reads it from its first byte and never trusts a derived file.
        found = segment.translate_offset(first_dirty) if segment.base_offset < first_dirty else None
        for _, result in segment.scan_windows(
            found[0] if found is not None else 0, window_bytes=ring.window_bytes, ring=ring, verify_crc=False,
            before_read=charge_io, mapped=mapped(segment),
        ):
            aborted = survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional)
            yield (k, result, *_window_keys(result, aborted, first_dirty, first_uncleanable, seed))
        yield k, None, None, None, None


def build_offset_map(
    log: PartitionLog,
    survey: LogSurvey,
    offset_map: OffsetMap,
    first_dirty: int,
    first_uncleanable: int,
    *,
    check_abort: Callable[[], None] = lambda: None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    ring: WindowRing | None = None,
    charge_io: Callable[[int], None] | None = None,
    parts: PartThreads | None = None,
) -> IndexResult:
    """Fill `offset_map` (cleared by the caller) from the dirty section; see the module docstring.

    `check_abort` is called at each window (it raises to abort the round); `on_bytes(n, "read")` is told the
    bytes read, after each window; `charge_io(n)` is called before each read of n bytes, on the read-ahead
    thread (the I/O throttle; it may raise to abort); `ring` holds the read buffers (a new one if None). Raises
    `CorruptRecordError` naming the file and position. A map split into parts is filled on `parts`' threads.
    """
    started = time.monotonic()
    filler = _MapFiller(offset_map, first_dirty, first_uncleanable, parts)
    next_offsets = {s.base_offset: s.next_offset for s in survey.segments}  # from the headers, not the indexes
    segments = [s for s in log.segments if s.base_offset < first_uncleanable and next_offsets[s.base_offset] > first_dirty]
    ring = ring if ring is not None else WindowRing(WINDOW_BYTES)
    windows = _hashed_windows(segments, survey, first_dirty, first_uncleanable, offset_map.seed, ring, charge_io,
                              mapped=log.reads_mapped)
    for k, result, offsets, h1, h2 in read_ahead(windows, name="index-read-ahead",
                                                  total_bytes=sum(s.size_bytes for s in segments)):
        if result is None:
            filler.segment_done(segments[k + 1].base_offset if k + 1 < len(segments) else first_uncleanable)
            continue
        check_abort()
        filler.bytes_read += result.end_position - result.start_position
        on_bytes(result.end_position - result.start_position, "read")
        if filler.window(result, offsets, h1, h2):
            break
    return filler.result(time.monotonic() - started)


class _HeldWindow:
    """A surveyed window of the section whose records are not all in the map yet: its selected records (offsets
    and hashes, from `done` on) and, when it has transactional data batches, their producer ids and offsets, to
    drop the aborted ones once their transactions have ended."""

    __slots__ = ("counted", "done", "h1", "h2", "last", "n_records", "offsets", "txn")

    def __init__(self, result, keys, txn) -> None:
        self.n_records = result.n_records
        self.last = int(result.last_offset[-1])
        self.offsets, self.h1, self.h2 = keys
        self.txn = txn  # (producer_id, base_offset, last_offset) of its transactional data batches, or None
        self.done = 0  # records before it are in the map (or dropped)
        self.counted = False  # added to the records read

    @property
    def nbytes(self) -> int:
        return 24 * (len(self.offsets) - self.done) + (0 if self.txn is None else 24 * len(self.txn[0]))


# How much a survey's pass may hold back while a transaction is open (24 bytes a record); past it the index phase
# reads the section again. W4's transactions hold back a few batches; a transaction left open holds the rest of the log.
HELD_BYTES_MAX = 32 * 1024 * 1024


class IndexAhead:
    """The index phase done inside the survey's pass, so that the dirty section is read once instead of twice.

    Used when the dirty section's bounds can be foreseen before the survey: from the cleaner checkpoint (or the
    log start) to the active segment or the high watermark, whichever is lower. The survey scans the records
    of the segments overlapping it (not only their headers), hashes them on its read-ahead thread, and the
    round's thread inserts them with the index phase's own rules (`_MapFiller`): the same records in the same
    order, so the same map.

    Transactions decide what may go in yet. A record at or past the first offset of a transaction still open
    may belong to an aborted transaction, or lie past the section's end, which such a transaction bounds
    (Kafka's first unstable offset): it is held back, with the events that follow it (a window's end, a
    segment's), and they go in, in order, when that bound moves past them; a held record of an aborted
    transaction is dropped then. The survey's end gives the section's end: what is still held below it goes
    in, the rest is dropped, and if anything had gone in at or past it (an open transaction's bound fell
    inside a segment already indexed), `result` returns None. It returns None as well when the survey's
    section starts elsewhere, when more than `HELD_BYTES_MAX` was held, or at a window of the section whose
    records were not scanned; the round then runs `build_offset_map` as before.
    The read-ahead thread only reads this object's flags; the round's thread sets them.
    """

    def __init__(self, offset_map: OffsetMap, segments, first_dirty: int, end: int,
                 parts: PartThreads | None = None) -> None:
        self.first_dirty = first_dirty
        self.end = end
        self._bases = [s.base_offset for s in segments]
        self._filler = _MapFiller(offset_map, first_dirty, end, parts)
        self._seed = offset_map.seed
        self.alive = True  # False once abandoned: the index phase runs after the survey
        self._stopped = False  # the map filled: later windows are surveyed by their headers only
        self._indexing: set[int] = set()  # segments whose records the read-ahead thread scans
        self._held: collections.deque[_HeldWindow | int] = collections.deque()  # windows, and ends of segments (i)
        self._held_bytes = 0
        self._reached = -1  # the highest offset an event that went in stands for
        self._open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._aborted: list[tuple[np.ndarray, ...]] = []  # aborted transactions (TransactionTable columns)
        self._aborted_merged = True  # `_aborted` is one set of columns, sorted, pruned to the last window released

    def scans_records(self, i: int) -> bool:
        """(read-ahead thread) Whether segment i's records are scanned: it overlaps the section, which is
        still being indexed."""
        if not self.alive or self._stopped:
            return False
        base = self._bases[i]
        following = self._bases[i + 1] if i + 1 < len(self._bases) else None
        wanted = base < self.end and (following is None or following > self.first_dirty)
        if wanted:
            self._indexing.add(i)
        return wanted

    def keys(self, result):
        """(read-ahead thread) The records to index in a window of a segment whose records were scanned: their
        offsets and hashes (`_window_keys`), aborted transactions' records included (dropped when released)."""
        return _window_keys(result, None, self.first_dirty, self.end, self._seed)

    def track(self, touched: list[int], producers: dict, ended: tuple[np.ndarray, ...] | None) -> None:
        """(round's thread) The survey tracked the producers of a window, whose open transactions may have changed
        for the producers `touched`, and which ended the transactions `ended` (`TransactionTable` columns, or
        None); called before `take` of that window."""
        if not self.alive or self._stopped:
            return
        if ended is not None:  # the aborted transactions that may hold records of the section
            aborted = (ended[3] == fmt.CONTROL_TYPE_ABORT) & (ended[2] >= self.first_dirty)  # type, marker
            if aborted.any():
                self._aborted.append(tuple(column[aborted] for column in ended))
                self._aborted_merged = False
        for pid in touched:
            first = producers[pid].open_txn_first_offset
            if first >= 0:
                self._open[pid] = first
            else:
                self._open.pop(pid, None)

    def take(self, i: int, result, keys) -> None:
        """(round's thread) One surveyed window of segment i, with `keys` if its records were scanned."""
        if not self.alive or self._stopped:
            return
        in_section = (result.last_offset >= self.first_dirty) & (result.base_offset < self.end)
        if in_section.any() and keys is None:
            self._abandon()  # the records were not scanned
            return
        if i not in self._indexing:  # a window the index phase does not read
            return
        txn = np.flatnonzero(in_section & result.is_transactional & ~result.is_control)
        held = _HeldWindow(result, keys,  # scanned: segment i's records are (`scans_records`)
                           (result.producer_id[txn], result.base_offset[txn], result.last_offset[txn])
                           if len(txn) else None)
        self._held.append(held)
        self._held_bytes += held.nbytes
        self._release(self._stable_bound())
        if self._held_bytes > HELD_BYTES_MAX:
            self._abandon()

    def segment_done(self, i: int, next_offset: int) -> None:
        """(round's thread) Segment i is surveyed whole; `next_offset` is the offset after its last batch."""
        if not self.alive or self._stopped or i not in self._indexing or next_offset <= self.first_dirty:
            return
        self._held.append(i)
        self._release(self._stable_bound())

    def result(self, first_dirty: int, first_uncleanable: int, map_from: int) -> IndexResult | None:
        """The index built in the survey, if the round's section is the one assumed, or ends below it where
        nothing went in yet; else None. Its time is the survey's (`elapsed_s` 0: the phases of a round stay
        disjoint)."""
        if (not self.alive or (first_dirty, map_from) != (self.first_dirty, self.first_dirty)
                or first_uncleanable > self.end or self._reached >= first_uncleanable):
            return None
        self._filler.bound(first_uncleanable)
        if not self._stopped:
            self._release(first_uncleanable)
        self._held.clear()
        return self._filler.result(0.0)

    def _abandon(self) -> None:
        self.alive = False
        self._held.clear()
        self._aborted.clear()

    def _stable_bound(self) -> int:
        """Below which offset every transaction is decided: the first offset of the earliest one still open, or the
        end assumed. (A marker at or past the high watermark leaves its transaction undecided, but lies past the
        end assumed: it is seen after the last window indexed.)"""
        return min([self.end, *self._open.values()])

    def _release(self, bound: int) -> None:
        """Put in the map, in order, what is held below offset `bound` (up to a window's first record at or past
        it), dropping the records of aborted transactions."""
        filler, held = self._filler, self._held
        while held:
            item = held[0]
            if isinstance(item, int):  # the end of segment item: the offset gap up to the next segment's base
                following = self._bases[item + 1] if item + 1 < len(self._bases) else self.end
                if following - 1 >= bound:
                    return
                filler.segment_done(following)
                self._reached = max(self._reached, following - 1)
                held.popleft()
                continue
            stop = int(np.searchsorted(item.offsets, bound))
            if stop == item.done and item.last >= bound:
                return
            if not item.counted:
                filler.records_read += item.n_records
                item.counted = True
            if stop > item.done:
                offsets, h1, h2 = item.offsets[item.done:stop], item.h1[item.done:stop], item.h2[item.done:stop]
                self._reached = max(self._reached, int(offsets[-1]))
                self._held_bytes -= 24 * (stop - item.done)
                item.done = stop
                if item.txn is not None:
                    offsets, h1, h2 = self._without_aborted(item.txn, offsets, h1, h2)
                if filler.insert(offsets, h1, h2):
                    self._stopped = True
                    held.clear()
                    return
            if item.last >= bound:
                return
            filler.window_end(item.last)
            self._reached = max(self._reached, item.last)
            self._held_bytes -= item.nbytes
            held.popleft()

    def _without_aborted(self, txn: tuple[np.ndarray, ...], offsets: np.ndarray, h1, h2):
        """The records among (offsets, h1, h2), all below the stable bound, that no aborted transaction holds;
        `txn` the window's transactional data batches (producer id, base offset, last offset)."""
        if not self._aborted:
            return offsets, h1, h2
        producer_id, base, last = txn
        if not self._aborted_merged:  # without those ended before this window's batches: no later one is in them
            columns = [np.concatenate(column) for column in zip(*self._aborted)]
            live = np.flatnonzero(columns[2] >= base[0])  # the marker
            live = live[np.lexsort((columns[1][live], columns[0][live]))]  # by (producer id, first offset)
            self._aborted = [tuple(column[live] for column in columns)]
            self._aborted_merged = True
        # The records of each aborted batch are a run of the sorted offsets; the runs between them are kept, moved
        # down in place (these arrays are the held window's own, and this part of them is done with).
        kept = _kern().drop_aborted(offsets, h1, h2, producer_id, base, last, *self._aborted[0][:3])
        return (offsets, h1, h2) if kept == len(offsets) else (offsets[:kept], h1[:kept], h2[:kept])
