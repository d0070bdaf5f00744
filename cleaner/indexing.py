"""The index phase of a round: the dirty section's keys into the offset map, up to the map's fill limit.

Owns Kafka's `Cleaner.buildOffsetMap`: walk the segments overlapping [first_dirty, first_uncleanable) in
bounded windows, hash the key of every record at or after `first_dirty` that lies in a non-control batch
of a transaction that was not aborted (unkeyed records are skipped), and insert (hash, offset) into the
map in offset order. The map's `latest_offset` follows every batch's last offset and jumps over the gaps
between segments (KAFKA-8764), so a fully indexed section ends at `first_uncleanable - 1`.

When the map fills, indexing stops at the last record that fit (possibly inside a batch, so even a tiny
map always makes progress) and the round cleans up to there; the next round continues from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from offsetmap import OffsetMap, hash_key_spans
from segments.log import PartitionLog
from segments.scan import ScanBuffers

from .survey import LogSurvey

__all__ = ["IndexResult", "build_offset_map"]

WINDOW_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class IndexResult:
    """How far the map got: `end_offset` is exclusive (the next round's first dirty offset)."""

    end_offset: int
    records_indexed: int
    records_read: int
    bytes_read: int
    map_full: bool
    elapsed_s: float


def _hashes_in_order(result, records: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """h1, h2 of the keys of `records` (indices into the scan's record arrays), in the given order."""
    h1 = np.empty(len(records), dtype=np.uint64)
    h2 = np.empty(len(records), dtype=np.uint64)
    in_arena = result.record_in_arena[records] if len(result.arena) else np.zeros(len(records), dtype=bool)
    for flag, source in ((False, result.buffer), (True, result.arena)):
        sel = np.nonzero(in_arena == flag)[0]
        if not len(sel):
            continue
        r = records[sel]
        a, b = hash_key_spans(source, result.key_pos[r], result.key_len[r], seed)
        h1[sel] = a
        h2[sel] = b
    return h1, h2


def build_offset_map(
    log: PartitionLog,
    survey: LogSurvey,
    offset_map: OffsetMap,
    first_dirty: int,
    first_uncleanable: int,
    *,
    check_abort: Callable[[], None] = lambda: None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
) -> IndexResult:
    """Fill `offset_map` (cleared by the caller) from the dirty section; see the module docstring.

    `check_abort` is called at each window (it raises to abort the round); `on_bytes(n, "read")` is told the
    bytes read (the I/O throttle). Raises `CorruptRecordError` naming the file and position.
    """
    started = time.monotonic()
    records_indexed = records_read = bytes_read = 0
    map_full = False
    buffers = ScanBuffers()
    read_buffer = np.empty(WINDOW_BYTES, dtype=np.uint8)
    segments = [s for s in log.segments if s.base_offset < first_uncleanable and s.read_next_offset() > first_dirty]
    for k, segment in enumerate(segments):
        found = segment.translate_offset(first_dirty) if segment.base_offset <= first_dirty else None
        for _, result in segment.scan_windows(
            found[0] if found is not None else 0, window_bytes=WINDOW_BYTES, buffers=buffers, read_buffer=read_buffer
        ):
            check_abort()
            pos = result.start_position
            bytes_read += result.end_position - pos
            on_bytes(result.end_position - pos, "read")
            records_read += result.n_records
            bi = result.batch_index
            aborted = survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional)
            eligible = ~result.is_control & ~aborted
            offsets = result.offset
            selected = np.nonzero(
                eligible[bi] & (offsets >= first_dirty) & (offsets < first_uncleanable) & (result.key_len >= 0)
            )[0]
            if len(selected):
                h1, h2 = _hashes_in_order(result, selected, offset_map.seed)
                consumed = offset_map.insert_hashes(h1, h2, offsets[selected])
                records_indexed += consumed
                if consumed < len(selected):
                    map_full = True
                    break
            last = int(result.last_offset[-1])
            if last >= first_dirty and last >= offset_map.latest_offset:
                offset_map.advance_latest_offset(min(last, first_uncleanable - 1))
        if map_full:
            break
        # The whole segment is indexed: skip the offset gap up to the next segment (KAFKA-8764).
        next_base = segments[k + 1].base_offset if k + 1 < len(segments) else first_uncleanable
        gap_end = min(next_base, first_uncleanable) - 1
        if gap_end >= max(offset_map.latest_offset, first_dirty):
            offset_map.advance_latest_offset(gap_end)
    end = offset_map.latest_offset + 1 if offset_map.latest_offset >= first_dirty else first_dirty
    return IndexResult(end, records_indexed, records_read, bytes_read, map_full, time.monotonic() - started)
