"""The sparse indexes' append rule over a run of batches, compiled: `index_candidates` (numba, cached on disk).

Owns the one implementation of Kafka's append-time indexing rule (`LogSegment.append`, docs/format.md 3.1
and 3.2) over many batches at once: the running max timestamp and the last offset of the earliest batch
holding it, updated before each batch is considered; an offset-index entry at a batch when more than
`index.interval.bytes` were appended since the last entry, with a time-index candidate `(max timestamp so
far, its offset)` there. `segments.files.index` calls it (`index_candidates`) for `LogSegment.append_batches`
and for the canonical whole-segment build. Also the array appends' checks of `OffsetIndex.append_many`
(`offset_entries`) and the `TimeIndex`'s rule for which candidates become entries (`time_entries`), each in
one call; the single-entry paths of `segments.files.index` say what they check and raise. `run_entries` is the
three in one call, for a run of batches appended to a segment (`segments.files.index.append_run_entries`).

Imported only at the first call (numba must not load at the CLI's start-up). Compiled `nogil`: the caller
passes contiguous int64 arrays and gets the counts and the state after the last batch.
"""

from __future__ import annotations

from ..codec import compiled

__all__ = ["index_candidates", "offset_entries", "run_entries", "time_entries"]


@compiled.njit(cache=True, nogil=True)
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


@compiled.njit(cache=True, nogil=True)
def offset_entries(offsets, positions, base_offset, lowest_relative, lowest_position, relative_max, position_max,
                   out_relative, out_position):
    """`OffsetIndex.append`'s checks over entries at once: True when every `(offset, position)` would pass them
    in order after an entry at (`lowest_relative` - 1, `lowest_position`) — relative offsets increasing from
    `lowest_relative` up to `relative_max`, positions not decreasing from `lowest_position` up to `position_max`
    — with the relative offsets and positions written (int32) to the outputs; False at the first that would not
    (the outputs are then partly written)."""
    previous_relative = lowest_relative - 1
    previous_position = lowest_position
    for i in range(offsets.size):
        relative = offsets[i] - base_offset
        position = positions[i]
        if relative <= previous_relative or relative > relative_max:
            return False
        if position < previous_position or position > position_max:
            return False
        out_relative[i] = relative
        out_position[i] = position
        previous_relative = relative
        previous_position = position
    return True


@compiled.njit(cache=True, nogil=True)
def time_entries(timestamps, offsets, base_offset, last_timestamp, last_offset, relative_max, out_timestamp,
                 out_relative):
    """The time index's append rule over candidates at once (`TimeIndex.maybe_append` one by one): when the
    candidates' timestamps and offsets do not decrease, from the last entry's (`last_timestamp`, `last_offset`;
    -1 and the base offset for none), and every offset is within `relative_max` of `base_offset`, the
    candidates whose timestamp is above the one before (the first: above `last_timestamp`) are written to the
    outputs (timestamp, int32 relative offset) and their count is returned; else -1 (nothing is decided)."""
    n = timestamps.size
    if n == 0:
        return 0
    if timestamps[0] < last_timestamp or offsets[0] < last_offset or offsets[n - 1] - base_offset > relative_max:
        return -1
    for i in range(1, n):
        if timestamps[i] < timestamps[i - 1] or offsets[i] < offsets[i - 1]:
            return -1
    count = 0
    previous = last_timestamp
    for i in range(n):
        if timestamps[i] > previous:
            out_timestamp[count] = timestamps[i]
            out_relative[count] = offsets[i] - base_offset
            count += 1
        previous = timestamps[i]
    return count


@compiled.njit(cache=True, nogil=True)
def run_entries(positions, last_offsets, max_timestamps, end, interval, bytes_since, max_timestamp, shallow_offset,
                start, base_offset, lowest_relative, lowest_position, relative_max, position_max, last_timestamp,
                last_offset, scratch, out_relative, out_position, out_timestamp, out_time_relative, state):
    """`index_candidates` over a run of batches written at file position `start` (`positions` relative to it),
    then `offset_entries` over the indexed batches' (last offset, position) and `time_entries` over their
    time-index candidates, in one call. `scratch` is int64 (5, len(positions)): the candidates (batch, timestamp,
    offset) and the offset-index inputs (offset, position) are left in its rows. Writes the state after the last
    batch to `state` (bytes_since, max_timestamp, shallow_offset). Returns (candidates, whether the offset index
    takes them all, the time-index entries or -1)."""
    count, bytes_since, max_timestamp, shallow_offset = index_candidates(
        positions, last_offsets, max_timestamps, end, interval, bytes_since, max_timestamp, shallow_offset,
        scratch[0], scratch[1], scratch[2])
    state[0] = bytes_since
    state[1] = max_timestamp
    state[2] = shallow_offset
    for k in range(count):
        scratch[3, k] = last_offsets[scratch[0, k]]
        scratch[4, k] = start + positions[scratch[0, k]]
    ok = offset_entries(scratch[3, :count], scratch[4, :count], base_offset, lowest_relative, lowest_position,
                        relative_max, position_max, out_relative, out_position)
    time_count = time_entries(scratch[1, :count], scratch[2, :count], base_offset, last_timestamp, last_offset,
                              relative_max, out_timestamp, out_time_relative)
    return count, ok, time_count
