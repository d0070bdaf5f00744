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

import numpy as np

from offsetmap import OffsetMap, hash_key_spans
from segments.segment import LogSegment

from .survey import LogSurvey

__all__ = ["SafetyCheckError", "check_group"]

_WINDOW_BYTES = 16 * 1024 * 1024


class SafetyCheckError(RuntimeError):
    """A cleaned group lost a record that is the latest of its key: the group is not swapped in."""


def _keyed_records(segments: list[LogSegment], survey: LogSurvey | None, seed: int):
    """(offset, h1, h2, value_len) arrays of every keyed data record in `segments`, in offset order; aborted
    ones left out when `survey` is given (the input side)."""
    offsets, h1s, h2s, lengths = [], [], [], []
    for segment in segments:
        for _, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, verify_crc=False):
            if result.n_records == 0:
                continue
            batch = result.batch_index
            wanted = ~result.is_control[batch] & (result.key_len >= 0)
            if survey is not None:
                aborted = survey.aborted_batches(result.producer_id, result.base_offset, result.is_transactional)
                wanted &= ~aborted[batch]
            for spans in result.key_spans(wanted):
                h1, h2 = hash_key_spans(spans.buffer, spans.key_pos, spans.key_len, seed)
                offsets.append(result.offset[spans.record_index].astype(np.int64))
                h1s.append(h1)
                h2s.append(h2)
                lengths.append(result.value_len[spans.record_index].astype(np.int64))
    if not offsets:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.astype(np.uint64), empty.astype(np.uint64), empty
    offset = np.concatenate(offsets)
    order = np.argsort(offset, kind="stable")  # key spans come grouped by source buffer, not in offset order
    return offset[order], np.concatenate(h1s)[order], np.concatenate(h2s)[order], np.concatenate(lengths)[order]


def must_survive(group: list[LogSegment], offset_map: OffsetMap, survey: LogSurvey) -> tuple[np.ndarray, ...]:
    """(offset, h1, h2, value_len) of the input records the output must hold, in offset order."""
    offset, h1, h2, length = _keyed_records(group, survey, offset_map.seed)
    latest = offset_map.lookup_hashes(h1, h2)
    indexed = latest >= 0
    survive = indexed & (offset == latest)
    # Keys the map does not hold: the last record of each in the group.
    rest = np.flatnonzero(~indexed)
    if len(rest):
        order = rest[np.lexsort((offset[rest], h2[rest], h1[rest]))]
        last = np.append((h1[order][1:] != h1[order][:-1]) | (h2[order][1:] != h2[order][:-1]), True)
        survive[order[last]] = True
    survive &= length >= 0  # tombstones may go
    chosen = np.flatnonzero(survive)
    return offset[chosen], h1[chosen], h2[chosen], length[chosen]


def check_group(group: list[LogSegment], cleaned: LogSegment, offset_map: OffsetMap, survey: LogSurvey,
                partition: str) -> int:
    """Raise `SafetyCheckError` if `cleaned` lacks a record of `group` that must survive; else how many did."""
    offset, h1, h2, length = must_survive(group, offset_map, survey)
    out_offset, out_h1, out_h2, out_length = _keyed_records([cleaned], None, offset_map.seed)
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
