"""The optional safety check of a round (`log.cleaner.verify`): no key loses its latest record.

Owns `check_group`, run on a group's finished `.cleaned` segment before it is swapped in. It recomputes,
without the recopy's keep decisions, which records of the group's input must survive, and confirms that each
is in the output with the same key and value size:

* a keyed data record whose key's latest offset in the offset map is its own offset (the key was indexed);
* for a key the map does not hold (its records all lie below the indexed range), the key's last record in
  the group;
* left out, because compaction may remove them: tombstones (their delete horizon may have passed), records
  of aborted transactions, control records and records without a key.

A miss raises `SafetyCheckError` naming the partition, the group, the offset and the key; the round then
removes the `.cleaned` files and stops before the swap, so the group and every later one stay as they were
(groups already swapped passed the same check) and the cleaner checkpoint is not moved. The cost is a second
read of the group's input and a read of its output (see `bench/verify_bench.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from offsetmap import OffsetMap, hash_key_spans
from segments.files.segment import LogSegment

from .errors import CleanerError
from .survey import LogSurvey

__all__ = ["SafetyCheckError", "check_group"]

_WINDOW_BYTES = 16 * 1024 * 1024


class SafetyCheckError(CleanerError, RuntimeError):
    """A cleaned group lost a record that is the latest of its key: the group is not swapped in."""


def _windows(segments: list[LogSegment], survey: LogSurvey | None, seed: int,
             charge_io: Callable[[int], None] | None = None):
    """Per scan window, (offset, h1, h2, value_len) arrays of its keyed data records in offset order; records
    of aborted transactions left out when `survey` is given (the input side). Each read is charged to
    `charge_io` before it is done (the I/O throttle)."""
    for segment in segments:
        for _, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, verify_crc=False, before_read=charge_io):
            if result.n_records == 0:
                continue
            batch = result.batch_index
            wanted = ~result.is_control[batch] & (result.key_len >= 0)
            if survey is not None:
                aborted = survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional)
                wanted &= ~aborted[batch]
            parts = []
            for spans in result.key_spans(wanted):
                h1, h2 = hash_key_spans(spans.buffer, spans.key_pos, spans.key_len, seed)
                index = spans.record_index
                parts.append((result.offset[index].astype(np.int64), h1, h2, result.value_len[index].astype(np.int64)))
            if not parts:
                continue
            offset, h1, h2, length = (np.concatenate(a) for a in zip(*parts)) if len(parts) > 1 else parts[0]
            if len(parts) > 1:  # key spans come grouped by source buffer (plain, decompressed), not in offset order
                order = np.argsort(offset, kind="stable")
                offset, h1, h2, length = offset[order], h1[order], h2[order], length[order]
            yield offset, h1, h2, length


def _joined(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.astype(np.uint64), empty.astype(np.uint64), empty
    return tuple(np.concatenate(a) for a in zip(*parts))


def must_survive(group: list[LogSegment], offset_map: OffsetMap, survey: LogSurvey,
                 charge_io: Callable[[int], None] | None = None) -> tuple[np.ndarray, ...]:
    """(offset, h1, h2, value_len) of the input records the output must hold, in offset order."""
    indexed_parts: list[tuple[np.ndarray, ...]] = []
    other_parts: list[tuple[np.ndarray, ...]] = []
    for offset, h1, h2, length in _windows(group, survey, offset_map.seed, charge_io):
        latest = offset_map.lookup_hashes(h1, h2)
        indexed = latest >= 0
        mine = indexed & (offset == latest) & (length >= 0)  # tombstones may go
        indexed_parts.append((offset[mine], h1[mine], h2[mine], length[mine]))
        other = ~indexed
        if other.any():
            other_parts.append((offset[other], h1[other], h2[other], length[other]))
    survivors = [_joined(indexed_parts)]
    # Keys the map does not hold: the last record of each in the group.
    offset, h1, h2, length = _joined(other_parts)
    if len(offset):
        order = np.lexsort((offset, h2, h1))
        last = order[np.append((h1[order][1:] != h1[order][:-1]) | (h2[order][1:] != h2[order][:-1]), True)]
        last = last[length[last] >= 0]
        survivors.append((offset[last], h1[last], h2[last], length[last]))
        offset, h1, h2, length = _joined(survivors)
        order = np.argsort(offset, kind="stable")
        return offset[order], h1[order], h2[order], length[order]
    return survivors[0]


def check_group(group: list[LogSegment], cleaned: LogSegment, offset_map: OffsetMap, survey: LogSurvey,
                partition: str, charge_io: Callable[[int], None] | None = None) -> int:
    """Raise `SafetyCheckError` if `cleaned` lacks a record of `group` that must survive; else how many did.
    Every read is charged to `charge_io` (the I/O throttle) before it is done."""
    offset, h1, h2, length = must_survive(group, offset_map, survey, charge_io)
    out_offset, out_h1, out_h2, out_length = _joined(list(_windows([cleaned], None, offset_map.seed, charge_io)))
    at = np.searchsorted(out_offset, offset)
    found = at < len(out_offset)
    at = np.minimum(at, max(len(out_offset) - 1, 0))
    if len(out_offset):
        found &= (out_offset[at] == offset) & (out_h1[at] == h1) & (out_h2[at] == h2) & (out_length[at] == length)
    missing = np.flatnonzero(~found)
    if len(missing):
        first = int(missing[0])
        key = _key_at(group, int(offset[first]))
        raise SafetyCheckError(
            f"{partition}: safety check (log.cleaner.verify) failed for the group of segments "
            f"{group[0].base_offset}..{group[-1].base_offset}: the record at offset {offset[first]} "
            f"(key {key!r}) is the latest of its key but is missing from the cleaned segment "
            f"({len(missing)} such record(s)); the group was not swapped in"
        )
    return len(offset)


def _key_at(group: list[LogSegment], offset: int) -> bytes | None:
    """The key of the record at `offset` in `group` (for the error message)."""
    for segment in group:
        for _, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, verify_crc=False):
            hits = np.flatnonzero(result.offset == offset)
            if len(hits):
                return result.key_bytes(int(hits[0]))
    return None
