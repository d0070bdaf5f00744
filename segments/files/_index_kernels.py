"""The sparse indexes' append rule over a run of batches, compiled: `index_candidates` (numba, cached on disk).

Owns the one implementation of Kafka's append-time indexing rule (`LogSegment.append`, docs/format.md 3.1
and 3.2) over many batches at once: the running max timestamp and the last offset of the earliest batch
holding it, updated before each batch is considered; an offset-index entry at a batch when more than
`index.interval.bytes` were appended since the last entry, with a time-index candidate `(max timestamp so
far, its offset)` there. `segments.files.index` calls it (`index_candidates_for`) for `LogSegment.append_batches`
and for the canonical whole-segment build; whether a time candidate becomes an entry is the `TimeIndex`'s rule.

Imported only inside functions (numba must not load at the CLI's start-up). Compiled `nogil`: the caller
passes contiguous int64 arrays and gets the counts and the state after the last batch.
"""

from __future__ import annotations

import numba

__all__ = ["index_candidates"]


@numba.njit(cache=True, nogil=True)
def index_candidates(positions, last_offsets, max_timestamps, end, interval, bytes_since, max_timestamp, shallow_offset,
                     out_batch, out_timestamp, out_offset):
    """Walk the batches at `positions` (increasing; the last one ends at `end`) as appends, one by one.

    State in: `bytes_since` (bytes appended since the last offset-index entry), `max_timestamp` and
    `shallow_offset` (the running max and its batch's last offset). For batch i: if its max timestamp is above
    the running max, the running max becomes it and its offset the batch's last offset; then if `bytes_since >
    interval` the batch is indexed (its index goes to `out_batch`, the running max and offset to
    `out_timestamp`/`out_offset`) and `bytes_since` restarts at 0; then `bytes_since` grows by the batch's
    size (the next position, or `end`, minus its own). The outputs hold at least len(positions) items.
    Returns (entries written, bytes_since, max_timestamp, shallow_offset) after the last batch.
    """
    n = len(positions)
    count = 0
    for i in range(n):
        ts = max_timestamps[i]
        if ts > max_timestamp:
            max_timestamp = ts
            shallow_offset = last_offsets[i]
        if bytes_since > interval:
            out_batch[count] = i
            out_timestamp[count] = max_timestamp
            out_offset[count] = shallow_offset
            count += 1
            bytes_since = 0
        following = positions[i + 1] if i + 1 < n else end
        bytes_since += following - positions[i]
    return count, bytes_since, max_timestamp, shallow_offset
