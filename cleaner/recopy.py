"""The recopy phase of a round: every segment up to the end of what was indexed, filtered, group by group.

Owns Kafka's `Cleaner.cleanSegments` + `MemoryRecords.filterTo` decisions, per batch and per record (which
batches are discarded, kept or dropped; which records are the latest for their key and kept), and writing
each group's output. Rules that matter to the rest of the round:
* An untouched batch is copied byte for byte; any other is rebuilt with the same offsets, producer fields,
  leader epoch, codec and timestamp type. Batches are never merged or split.
* The last batch of each group is kept (as an empty batch if need be), so a crash mid-swap leaves each group
  exactly old or new; a producer's last batch is kept likewise.
* A batch carries a delete horizon only while it keeps a tombstone or is a kept marker, so a passed horizon
  always means work for the next pass (`RecopyStats.earliest_delete_horizon_ms`).
* A group whose output is its input byte for byte is not swapped: a pass with nothing to remove changes no file.
* A window's decisions are compiled calls over its scan arrays (`_kernels.decide_window`, `window_horizons`);
  Python runs per batch only for one the kernels cannot rebuild, and per window for map lookups and markers.
The rules in full, and why they differ from Kafka's where they do: see docs/design.md, "Recopy".
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from offsetmap import OffsetMap, hash_key_spans
from segments.codec import format as fmt
from segments.codec.legacy import encode_legacy_wrapper
from segments.codec.records import Record, encode_batch_from_region
from segments.files import faults
from segments.files.readahead import WindowRing, read_ahead
from segments.files.segment import LogSegment
from segments.files.txnindex import AbortedTxns
from segments.partition.log import PartitionLog

from .indexing import SupersededOffsets
from .survey import WINDOW_BYTES, LogSurvey

__all__ = ["RecopyContext", "RecopyStats", "clean_group", "group_segments"]

ACTION_DROP = 0
ACTION_VERBATIM = 1
ACTION_REBUILD = 2
ACTION_EMPTY = 3


@dataclass(frozen=True, slots=True)
class RecopyContext:
    """What every decision of one round depends on."""

    offset_map: OffsetMap
    latest_offset: int  # the map covers [first dirty, latest_offset]; later records are kept
    survey: LogSurvey
    now_ms: int
    delete_retention_ms: int
    legacy_delete_horizon_ms: int
    producer_expiration_ms: int
    superseded: SupersededOffsets | None = None  # the index phase's superseded offsets (None: ask the map)
    dry_run: bool = False
    partial: bool = False  # a generational round below the log's full range: tombstones and markers stay
    first_dirty: int = 0  # records at or past it are the dirty section's (survivorship is measured on them)
    # Per producer id: data batches of its current transaction this round has written so far, carried from
    # window to window and group to group (mutated by the recopy); None: markers decided by the survey alone.
    txn_data_written: dict[int, int] | None = None
    direct_writes: bool = True  # the `.cleaned` segments' appends go around the page cache (log.cleaner.io.direct)


@dataclass(slots=True)
class RecopyStats:
    """Counters of the recopy phase (summed over groups)."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    batches_read: int = 0
    batches_written: int = 0
    batches_copied_verbatim: int = 0
    batches_rebuilt: int = 0
    batches_emptied: int = 0
    invalid_records: int = 0
    dirty_records_read: int = 0
    dirty_records_written: int = 0
    tombstones_stamped_batches: int = 0
    # the soonest horizon of a written batch that keeps a tombstone or a marker a later pass may remove (-1: none)
    earliest_delete_horizon_ms: int = -1
    groups_unchanged: int = 0  # groups whose output was their input: not swapped
    elapsed_s: float = 0.0
    groups: list[tuple[int, int]] = field(default_factory=list)  # (first base, segments) per group


def group_segments(
    segments: list[LogSegment],
    end_offset: int,
    *,
    first_uncleanable: int,
    segment_bytes: int,
    segment_index_bytes: int,
) -> list[list[LogSegment]]:
    """Kafka's `groupSegmentsBySize` over the segments that hold offsets below `end_offset`.

    A group grows while its log bytes stay ≤ segment.bytes, each of its index files' bytes ≤
    segment.index.bytes, and the next segment is empty or its estimated last offset stays within 2^31-1 of
    the group's base offset. A segment's last offset is estimated as the next segment's base - 1 (the
    segment after the range counts too), else `first_uncleanable - 1` — never `end_offset - 1`, which
    undercounts when the map filled inside a segment.
    """
    segs = [s for s in segments if s.base_offset < end_offset]
    following = [s.base_offset for s in segments if s.base_offset >= end_offset]
    groups: list[list[LogSegment]] = []
    i = 0

    def index_bytes(seg: LogSegment) -> tuple[int, int]:
        sizes = []
        for path in (seg.paths.index, seg.paths.timeindex):
            try:
                sizes.append(os.stat(path).st_size)
            except FileNotFoundError:
                sizes.append(0)
        return sizes[0], sizes[1]

    while i < len(segs):
        group = [segs[i]]
        log_size = segs[i].size_bytes
        offset_index_size, time_index_size = index_bytes(segs[i])
        i += 1
        while i < len(segs):
            nxt = segs[i]
            nxt_index, nxt_time = index_bytes(nxt)
            if i + 1 < len(segs):
                estimated_last = segs[i + 1].base_offset - 1
            elif following:
                estimated_last = following[0] - 1
            else:
                estimated_last = first_uncleanable - 1
            if (
                log_size + nxt.size_bytes <= segment_bytes
                and offset_index_size + nxt_index <= segment_index_bytes
                and time_index_size + nxt_time <= segment_index_bytes
                and (nxt.size_bytes == 0 or estimated_last - group[0].base_offset <= fmt.RELATIVE_OFFSET_MAX)
            ):
                group.append(nxt)
                log_size += nxt.size_bytes
                offset_index_size += nxt_index
                time_index_size += nxt_time
                i += 1
            else:
                break
        groups.append(group)
    return groups


@functools.cache
def _kern() -> ModuleType:
    """`cleaner._kernels`, imported at the first call: the kernels load only when a round recopies (the CLI's start-up
    stays fast), and a cached call is cheaper per window than an `import` statement."""
    from . import _kernels

    return _kernels


class _OutputBuffer:
    """A reusable output area for one window's batches, grown when a window needs more."""

    def __init__(self) -> None:
        self.data = np.empty(0, dtype=np.uint8)
        self.positions = np.empty(0, dtype=np.int64)
        self.last_offsets = np.empty(0, dtype=np.int64)
        self.max_timestamps = np.empty(0, dtype=np.int64)
        self.crc_positions = np.empty(0, dtype=np.int64)  # where the kernel wrote a batch whose CRC is to stamp
        self.scratch = np.empty(0, dtype=np.uint8)  # the records of one lz4 batch rebuilt by the kernel
        self.lz4_preferences: np.ndarray | None = None  # the frame settings the kernel compresses with

    def reserve(self, data_bytes: int, batches: int, written_bytes: int, written_batches: int) -> None:
        """Room for `data_bytes` and `batches`, keeping the first `written_bytes` and `written_batches` (what this
        window wrote so far: a grown area copies only that, under the GIL; its new pages are first touched by
        the kernel, without it)."""
        if len(self.data) < data_bytes:
            grown = np.empty(max(data_bytes, 2 * len(self.data)), dtype=np.uint8)
            grown[:written_bytes] = self.data[:written_bytes]
            self.data = grown
        if len(self.positions) < batches:
            size = max(batches, 2 * len(self.positions))
            for name in ("positions", "last_offsets", "max_timestamps", "crc_positions"):
                old = getattr(self, name)
                grown = np.empty(size, dtype=old.dtype)
                grown[:written_batches] = old[:written_batches]
                setattr(self, name, grown)


def _producer_last_batches(result, ctx: RecopyContext) -> np.ndarray:
    """True for batches that hold their producer's last data offset (Kafka's isBatchLastRecordOfProducer): one
    compiled call (`_kernels.producer_last_batches`) over the window and the survey's producer table."""
    out = np.empty(result.n_batches, dtype=bool)
    table = ctx.survey.producer_table()
    # Kafka's isProducerExpired: expired once now - lastTimestamp >= producer.id.expiration.ms (no open transaction).
    expired_before = min(max(ctx.now_ms - ctx.producer_expiration_ms, -(2**63)), 2**63 - 1)
    _kern().producer_last_batches(
        result.producer_id, result.magic, result.attributes, result.last_offset, table.producer_id,
        table.last_data_offset, table.last_entry_offset, table.last_timestamp, table.open_txn_first_offset,
        expired_before, out,
    )
    return out


def _decide(result, ctx: RecopyContext, retain_tombstones_legacy: bool, group_last: int):
    """Per-batch actions and the per-record keep mask for one window (see docs/design.md, "Recopy").

    The records are decided by `_kernels.decide_window` in one call without the GIL; Python runs between its
    phases only for records the superseded bitmap does not cover (looked up in the map) and for a window whose
    markers depend on its transactions (`_markers_discardable`). The batches' transaction facts come from the
    survey (`aborted_batches`, `_producer_last_batches`).
    """
    kern = _kern()
    n = result.n_batches
    magic = result.magic
    aborted = ctx.survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional)
    retain_empty = _producer_last_batches(result, ctx)  # v2 batches only
    if group_last >= 0:
        retain_empty[group_last] |= magic[group_last] == fmt.MAGIC_V2
    superseded = ctx.superseded
    bits, bits_start = (superseded.bits, superseded.start) if superseded is not None else (_NO_BITS, 0)
    n_records = result.n_records
    is_latest = np.empty(n_records, dtype=np.uint8)
    lookup = np.empty(n_records, dtype=np.int64)
    keep = np.empty(n_records, dtype=np.bool_)
    kept = np.empty(n, dtype=np.int64)
    discardable = np.empty(n, dtype=np.bool_)
    action = np.empty(n, dtype=np.int8)
    needs_horizon = np.empty(n, dtype=np.bool_)
    tombstones = np.empty(n, dtype=np.int64)  # the kernel's scratch
    scalars = np.zeros(kern.DECIDE_SCALARS, dtype=np.int64)
    found = _NO_OFFSETS
    phase = 0
    while True:
        status = kern.decide_window(
            phase, result.offset, result.key_len, result.value_len, result.batch_index, magic, result.attributes,
            result.producer_id, result.records_count, result.record_start, result.delete_horizon_ms, aborted,
            retain_empty, bits, bits_start, superseded is not None, ctx.latest_offset, ctx.now_ms, ctx.partial,
            retain_tombstones_legacy, group_last, ctx.txn_data_written is not None, is_latest, lookup, found, keep,
            kept, discardable, action, needs_horizon, tombstones, scalars,
        )
        if status == kern.DECIDE_LOOKUP:
            found = _map_offsets(result, ctx, lookup[: int(scalars[kern.DECIDE_LOOKUPS])])
            phase = 1
        elif status == kern.DECIDE_MARKERS:
            # An empty header kept for its producer is data still: without its marker it would read as an open
            # transaction.
            discardable = _markers_discardable(result, ctx, ~result.is_control & ((kept > 0) | retain_empty))
            phase = 2
        else:
            return action, keep, needs_horizon, int(scalars[kern.DECIDE_INVALID])


_NO_BITS = np.zeros(0, dtype=np.uint8)
_NO_OFFSETS = np.zeros(0, dtype=np.int64)


def _map_offsets(result, ctx: RecopyContext, records: np.ndarray) -> np.ndarray:
    """The offset the map holds for the key of each of `records` (indices into the scan's record arrays), -1 for
    a key it does not hold."""
    found = np.empty(len(records), dtype=np.int64)
    in_arena = result.record_in_arena[records] if len(result.arena) else np.zeros(len(records), dtype=bool)
    for flag, source in ((False, result.buffer), (True, result.arena)):
        sel = np.nonzero(in_arena == flag)[0]
        if len(sel):
            r = records[sel]
            h1, h2 = hash_key_spans(source, result.key_pos[r], result.key_len[r], ctx.offset_map.seed)
            found[sel] = ctx.offset_map.lookup_hashes(h1, h2)
    return found


def _markers_discardable(result, ctx: RecopyContext, data_written: np.ndarray) -> np.ndarray:
    """True for the control batches of a window whose records may go once their delete horizon passes.

    An empty control batch (a marker cleaned before) always; a COMMIT/ABORT marker when its transaction keeps
    no data batch in this pass (`data_written`: the window's data batches written, records or an empty
    header), counted from the producer's previous marker across windows and groups in
    `ctx.txn_data_written`, which this advances; without it (a partial round), when the survey finds no data
    batch of the transaction in the whole log. Other control records never. One compiled walk over the window
    (`_kernels.window_markers`), then Python per producer it involves.
    """
    n = result.n_batches
    written_so_far = ctx.txn_data_written
    pids = result.producer_id
    marker = np.empty(n, dtype=np.bool_)
    out = np.empty(n, dtype=np.bool_)
    producers = np.empty((4, n), dtype=np.int64)  # per producer: id, first marker, written before it, after the last
    # the run's data batches (only read without the survey deciding: `marker` stands in, unread, otherwise)
    written = data_written & result.is_transactional & (pids >= 0) if written_so_far is not None else marker
    count = _kern().window_markers(result.is_control, result.records_count, pids, result.base_offset,
                                   *ctx.survey.closed_markers, written_so_far is None, written, marker, out,
                                   *producers)
    if written_so_far is None:
        return out
    for pid, first, before, after in sorted(zip(*(row[:count].tolist() for row in producers))):
        carried = written_so_far.get(pid, 0)
        if first >= 0:
            out[first] = carried + before == 0
            written_so_far[pid] = after  # the transaction the window leaves open
        else:
            written_so_far[pid] = carried + after
    return out


def _horizons(result, ctx: RecopyContext, action, keep, needs_horizon):
    """Which written batches lose their delete horizon, and the horizon a later pass may act on, per batch.

    A batch carries a horizon only while it keeps a tombstone or is a kept marker (see docs/design.md,
    "Recopy"): a v2 batch written with records that keeps neither loses it (rebuilt, if it was to be
    copied). The pending horizon of a batch that keeps one is the one it is written with; in a full round a
    horizon that had already passed counts no more, since this pass kept the batch anyway (records past the
    offset map's end, which the next round of a partition cleans regardless). One compiled call
    (`_kernels.window_horizons`), which also counts the window for `RecopyStats`. Returns (action, clear,
    counts, kept control batches' base offsets); `counts` is indexed by `_kernels.COUNT_*`.
    """
    kern = _kern()
    n = result.n_batches
    clear = np.empty(n, dtype=np.bool_)
    pending = np.empty(n, dtype=np.int64)
    kept_control = np.empty(n, dtype=np.int64)
    counts = np.empty(kern.COUNTS, dtype=np.int64)
    kern.window_horizons(
        action, keep, needs_horizon, result.offset, result.value_len, result.batch_index, result.magic,
        result.attributes, result.base_offset, result.delete_horizon_ms, ctx.first_dirty, ctx.now_ms,
        ctx.now_ms + ctx.delete_retention_ms, ctx.partial, clear, pending, kept_control, counts,
        np.empty(n, dtype=np.int64),  # the kernel's scratch
    )
    return action, clear, counts, kept_control[: int(counts[kern.COUNT_KEPT_CONTROL])]


def _rebuild_v2(result, i: int, records: np.ndarray, stamp_horizon: bool, ctx: RecopyContext,
                clear_horizon: bool = False) -> tuple[bytes, int]:
    """A rebuilt v2 batch holding `records` (indices into the scan's record arrays); returns (bytes, max ts).
    With `clear_horizon` its delete horizon, if any, is dropped (it keeps no tombstone and is no marker)."""
    # numba (the round's kernels) is imported only when a round recopies: start-up of the CLI stays fast
    from ._kernels import copy_records, rebase_records

    attributes = int(result.attributes[i])
    log_append_time = bool(attributes & fmt.TIMESTAMP_TYPE_MASK)
    timestamps = result.timestamp[records]
    if clear_horizon:
        attributes &= ~fmt.DELETE_HORIZON_FLAG
        base_ts = int(timestamps[0])
    elif result.delete_horizon_ms[i] >= 0:
        base_ts = int(result.delete_horizon_ms[i])  # an existing horizon is kept on later rewrites
    elif stamp_horizon:
        base_ts = ctx.now_ms + ctx.delete_retention_ms
        attributes |= fmt.DELETE_HORIZON_FLAG
    else:
        base_ts = int(timestamps[0])
    max_ts = int(result.max_timestamp[i]) if log_append_time else int(timestamps.max())
    source = result.arena if result.records_in_arena[i] else result.buffer
    pos = result.record_pos[records]
    size = result.record_size[records]
    out = np.empty(int(size.sum()) + 10 * len(records), dtype=np.uint8)
    if not log_append_time and base_ts == int(result.base_timestamp[i]):
        written = copy_records(source, pos, size, out)  # deltas unchanged: raw bytes as they are
    else:
        written = rebase_records(source, pos, size, (timestamps - base_ts).astype(np.int64), out)
    data = encode_batch_from_region(
        out.data[:written],
        records_count=len(records),
        base_offset=int(result.base_offset[i]),
        last_offset_delta=int(result.last_offset[i] - result.base_offset[i]),
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        attributes=attributes,
        partition_leader_epoch=int(result.partition_leader_epoch[i]),
        producer_id=int(result.producer_id[i]),
        producer_epoch=int(result.producer_epoch[i]),
        base_sequence=int(result.base_sequence[i]),
    )
    return data, max_ts


def _rebuild_legacy(result, i: int, records: np.ndarray) -> tuple[bytes, int, int]:
    """A legacy wrapper re-compressed around its kept inner messages; returns (bytes, last offset, max ts)."""
    attributes = int(result.attributes[i])
    timestamp_type = 1 if attributes & fmt.LEGACY_TIMESTAMP_TYPE_MASK else 0
    inner = [
        Record(offset=int(result.offset[r]), timestamp=int(result.timestamp[r]), key=result.key_bytes(int(r)),
               value=result.value_bytes(int(r)))
        for r in records.tolist()
    ]
    magic = int(result.magic[i])
    wrapper_ts = int(result.max_timestamp[i]) if timestamp_type else None
    data = encode_legacy_wrapper(
        inner, magic=magic, codec=attributes & fmt.COMPRESSION_MASK, timestamp_type=timestamp_type,
        wrapper_timestamp=wrapper_ts,
    )
    max_ts = wrapper_ts if wrapper_ts is not None else (max(r.timestamp for r in inner) if magic else -1)
    return data, inner[-1].offset, max_ts


def _window_output(result, ctx: RecopyContext, action, keep, needs_horizon, out: _OutputBuffer,
                   clear_horizon: np.ndarray | None = None):
    """Write the window's output batches into `out`; returns (bytes written, batches written).

    The compiled `assemble_batches` does verbatim copies, empty headers, uncompressed v2 rebuilds and, when
    liblz4 is bound (`segments.codec._lz4_kernels.ENABLED`), lz4 v2 rebuilds; it hands back the batches it
    cannot build (other codecs, legacy), which are built here one by one.
    Rebuilt batches marked in `clear_horizon` are written without their delete horizon.
    """
    kern, lz4k, crc = _kern(), _lz4_kernels(), _crc_kernels()
    n = result.n_batches
    worst = len(result.buffer) + fmt.RECORD_BATCH_OVERHEAD * n + 10 * result.n_records
    out.reserve(worst, n, 0, 0)
    if out.lz4_preferences is None:
        out.lz4_preferences = lz4k.kafka_preferences()
    clear = _NO_FLAGS if clear_horizon is None else clear_horizon
    i = pos = count = n_crc = 0
    while True:
        i, pos, count, n_crc, room = kern.assemble_batches(
            result.buffer, result.arena, i, action, result.batch_position, result.base_position, result.batch_size,
            result.magic, result.attributes, clear, result.base_offset, result.last_offset, result.base_timestamp,
            result.max_timestamp, result.delete_horizon_ms, result.producer_id, result.producer_epoch,
            result.base_sequence, result.partition_leader_epoch, result.records_in_arena, result.record_start,
            needs_horizon, ctx.now_ms + ctx.delete_retention_ms, keep, result.record_pos, result.record_size,
            result.timestamp, out.data, pos, out.positions, out.last_offsets, out.max_timestamps, out.crc_positions,
            n_crc, count, out.scratch, out.lz4_preferences, lz4k.ENABLED,
        )
        if i >= n:
            break
        if room > 0:  # an lz4 rebuild's frame may need more than the worst case of its input
            out.reserve(pos + room + (worst - pos), n, pos, max(count, n_crc))
            continue
        if room < 0:  # an lz4 rebuild's records need a larger scratch
            out.scratch = np.empty(max(-room, 2 * len(out.scratch)), dtype=np.uint8)
            continue
        records = np.arange(result.record_start[i], result.record_start[i + 1])
        records = records[keep[records]]
        if result.magic[i] == fmt.MAGIC_V2:
            data, max_ts = _rebuild_v2(result, i, records, bool(needs_horizon[i]), ctx,
                                       clear_horizon is not None and bool(clear_horizon[i]))
            last = int(result.last_offset[i])
        else:
            data, last, max_ts = _rebuild_legacy(result, i, records)
        out.reserve(pos + len(data) + (worst - pos), n, pos, max(count, n_crc))
        out.data[pos : pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
        out.positions[count], out.last_offsets[count], out.max_timestamps[count] = pos, last, max_ts
        count += 1
        pos += len(data)
        i += 1
    # The CRC-32C of every batch the kernel wrote, in one compiled call without the GIL.
    crc.stamp_v2_crcs(out.data, out.crc_positions[:n_crc])
    return pos, count


_NO_FLAGS = np.zeros(0, dtype=np.bool_)


@functools.cache
def _lz4_kernels() -> ModuleType:
    """`segments.codec._lz4_kernels` (it binds liblz4), imported at the first call, as `_kern`."""
    from segments.codec import _lz4_kernels

    return _lz4_kernels


@functools.cache
def _crc_kernels() -> ModuleType:
    """`segments.codec._crc_kernels`, imported at the first call, as `_kern`."""
    from segments.codec import _crc_kernels

    return _crc_kernels


def clean_group(
    log: PartitionLog,
    group: list[LogSegment],
    ctx: RecopyContext,
    stats: RecopyStats,
    *,
    check_abort: Callable[[], None] = lambda: None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    ring: WindowRing | None = None,
    charge_io: Callable[[int], None] = lambda n: None,
) -> LogSegment | None:
    """Write the `.cleaned` segment replacing `group` (fsynced, mtime of the group's last segment).

    Returns it unswapped; None in a dry run, and when the output is the group's input byte for byte (one
    segment, every batch copied untouched, the same `.txnindex` entries): then its `.cleaned` files are removed
    before any fsync and `stats.groups_unchanged` counts it. On any error the `.cleaned` files are removed and
    the error propagates; the log itself is untouched. `ring` holds the read buffers (a new one if None).
    `charge_io(n)` is called before each read (on the read-ahead thread) and each write of n bytes (the I/O
    throttle: it may block, or raise to abort); `on_bytes(n, direction)` after each.
    """
    started = time.monotonic()
    cleaned = None if ctx.dry_run else log.new_cleaned_segment(group[0].base_offset)
    try:
        if cleaned is not None and ctx.direct_writes:
            cleaned.write_directly()
        original = AbortedTxns.concatenate(seg.txn_index.columns() for seg in group if seg.paths.txnindex.exists())
        kept_markers: list[np.ndarray] = []
        output = _OutputBuffer()
        unchanged = len(group) == 1  # several segments become one: never the same files
        for result, action, keep, needs_horizon, clear_horizon, counts, kept_control, invalid in read_ahead(
            _decided_windows(group, ctx, ring if ring is not None else WindowRing(WINDOW_BYTES), charge_io,
                             log.reads_mapped),
            name="recopy-read-ahead", total_bytes=sum(seg.size_bytes for seg in group),
        ):
            check_abort()
            read = result.end_position - result.start_position
            stats.bytes_read += read
            on_bytes(read, "read")
            stats.records_read += result.n_records
            stats.batches_read += result.n_batches
            _count_window(stats, counts, invalid)
            written, batches = _window_output(result, ctx, action, keep, needs_horizon, output, clear_horizon)
            stats.batches_written += batches
            if unchanged:  # a memcmp per window while nothing differs; nothing once something does
                start = result.start_position - result.base_position
                unchanged = written == read and np.array_equal(output.data[:written], result.buffer[start:start + read])
            if len(kept_control):
                kept_markers.append(kept_control)
            if batches:
                stats.bytes_written += written
                on_bytes(written, "write")
                if cleaned is not None:
                    charge_io(written)
                    cleaned.append_batches(
                        output.data.data[:written], output.positions[:batches],
                        output.last_offsets[:batches], output.max_timestamps[:batches],
                    )
                    faults.hit("recopy.mid_group")
        if cleaned is not None:
            entries = _txn_entries(cleaned, group, kept_markers, original, ctx.survey)
            if unchanged and entries.same_as(original):
                # Nothing to swap: the old segment stays as it is (same inode and mtime); no fsync, no rename.
                cleaned.delete_files()
                stats.groups_unchanged += 1
                stats.groups.append((group[0].base_offset, len(group)))
                return None
            cleaned.txn_index.append_many(entries)
            # The index files are written at finalise: with a small index.interval.bytes they are not small.
            charge_io((cleaned.offset_index.entries + 1) * fmt.OFFSET_INDEX_ENTRY.size
                      + (cleaned.time_index.entries + 1) * fmt.TIME_INDEX_ENTRY.size)
            cleaned.finalise()
            cleaned.set_last_modified_ns(group[-1].last_modified_ns())
            faults.hit("recopy.group_written")
        stats.groups.append((group[0].base_offset, len(group)))
        return cleaned
    except BaseException:
        if cleaned is not None:
            cleaned.delete_files()
        raise
    finally:
        stats.elapsed_s += time.monotonic() - started


def _decided_windows(group: list[LogSegment], ctx: RecopyContext, ring: WindowRing,
                     charge_io: Callable[[int], None] | None = None,
                     mapped: Callable[[LogSegment], bool] = lambda segment: False):
    """(scan result, actions, keep mask, needs horizon, clear horizon, the window's counts, its kept control
    batches' base offsets, invalid count) per window of `group` (`_decide`, `_horizons`), in order (the transaction state of `ctx` advances window by window); runs on
    the read-ahead thread (charges each read to `charge_io` before it, reads, scans and decides; the map and
    the survey are only read in this phase). `mapped(segment)` says whether to read it through a mapping
    (`PartitionLog.reads_mapped`)."""
    nonempty = [k for k, s in enumerate(group) if s.size_bytes > 0]
    last_nonempty = nonempty[-1] if nonempty else -1
    for k, seg in enumerate(group):
        retain_legacy_tombstones = seg.last_modified_ns() // 1_000_000 > ctx.legacy_delete_horizon_ms
        size = seg.size_bytes
        for _, result in seg.scan_windows(window_bytes=ring.window_bytes, ring=ring, verify_crc=False,
                                          before_read=charge_io, mapped=mapped(seg)):
            group_last = result.n_batches - 1 if (k == last_nonempty and result.end_position == size) else -1
            action, keep, needs_horizon, invalid = _decide(result, ctx, retain_legacy_tombstones, group_last)
            action, clear_horizon, counts, kept_control = _horizons(result, ctx, action, keep, needs_horizon)
            yield result, action, keep, needs_horizon, clear_horizon, counts, kept_control, invalid


def _count_window(stats: RecopyStats, counts: np.ndarray, invalid: int) -> None:
    """Add a window's counters (`_horizons`) to `stats`, and track the soonest pending delete horizon of the
    written batches: when a next pass is due."""
    kern = _kern()
    c = counts.tolist()
    stats.invalid_records += invalid
    stats.records_written += c[kern.COUNT_RECORDS_WRITTEN]
    stats.dirty_records_read += c[kern.COUNT_DIRTY_READ]
    stats.dirty_records_written += c[kern.COUNT_DIRTY_WRITTEN]
    stats.batches_copied_verbatim += c[kern.COUNT_VERBATIM]
    stats.batches_rebuilt += c[kern.COUNT_REBUILT]
    stats.batches_emptied += c[kern.COUNT_EMPTIED]
    stats.tombstones_stamped_batches += c[kern.COUNT_STAMPED]
    soonest = c[kern.COUNT_EARLIEST_PENDING]
    if soonest >= 0 and (stats.earliest_delete_horizon_ms < 0 or soonest < stats.earliest_delete_horizon_ms):
        stats.earliest_delete_horizon_ms = soonest


def _txn_entries(cleaned: LogSegment, group, kept_markers: list[np.ndarray], original: AbortedTxns,
                 survey: LogSurvey) -> AbortedTxns:
    """The cleaned segment's `.txnindex`: aborted transactions whose ABORT marker it keeps while data remains.
    One that the group's own `.txnindex` files list (same producer and marker; the last such entry) is
    re-appended as it was (Kafka's rule), though its first data may have gone since."""
    start = group[0].base_offset
    end = max(cleaned.read_next_offset(), start)
    table = survey.transaction_table
    rows = survey.aborted_rows_ending_in(start, end)
    kept = np.concatenate(kept_markers) if kept_markers else np.empty(0, dtype=np.int64)
    if len(kept):  # the kept control batches' offsets increase (log order): membership by binary search
        markers = table.marker_offset[rows]
        at = np.minimum(np.searchsorted(kept, markers), len(kept) - 1)
        rows = rows[(kept[at] == markers) & (table.data_batches[rows] != 0)]
    else:
        rows = rows[:0]
    producer_id, marker = table.producer_id[rows], table.marker_offset[rows]
    first_offset, stable = table.first_offset[rows].copy(), marker + 1
    n = original.entries
    if n and len(rows):  # match (producer, marker) pairs through ids shared by both sides
        pairs = np.concatenate((np.stack((original.producer_id, original.last_offset), axis=1),
                                np.stack((producer_id, marker), axis=1)))
        _, ids = np.unique(pairs, axis=0, return_inverse=True)
        ids = ids.reshape(-1)
        latest = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        np.maximum.at(latest, ids[:n], np.arange(n))  # the last entry listing each pair
        j = latest[ids[n:]]
        listed = j >= 0
        first_offset[listed] = original.first_offset[j[listed]]
        stable[listed] = original.last_stable_offset[j[listed]]
    return AbortedTxns.of(producer_id, first_offset, marker, stable)
