"""Compiled per-record loops of a cleaning round (numba, cached on disk).

Owns `select_keys` (the records of a window the index phase inserts), `in_transactions` (data batches of aborted
transactions) and `drop_aborted` (the survey's pass dropping their records), `producer_rows` (a window's batches
with a producer id and its markers' control types) and `window_producers` (the survey's producer tracking over them),
`window_figures` (the survey's offset checks, largest timestamp and soonest horizon of a window), the recopy's
decisions over a window (`decide_window`: the actions and the keep mask; `window_horizons`: delete horizons and
the window's counters; `producer_last_batches`: the batches holding their producer's last data;
`window_markers`: its markers and which control batches may go, with `marker_runs`: the transactions a window's
markers end), and the recopy phase's `assemble_batches` (verbatim copies, empty headers, uncompressed and lz4 v2
rebuilds of one window),
`copy_records` and `rebase_records` (copying kept v2 records into a new records region, rewriting each
record's timestamp delta when a rebuilt batch gets a new base timestamp: the first kept record's, or the delete
horizon). Every other field of a record is copied byte for byte. Inputs are trusted: they come from a scan
that already validated the records.

It decides what a rebuilt header says, not how it is laid out: headers are written by the codec's
`segments.codec._header_kernels.write_v2_header`, and every size, flag and mask here is a
`segments.codec.format` name.
"""

from __future__ import annotations

import numpy as np

from offsetmap._kernels import offset_marked
from segments.codec import compiled
from segments.codec import format as fmt
from segments.codec._control_kernels import first_control_type
from segments.codec._header_kernels import write_v2_header
from segments.codec._lz4_kernels import compress_frame, frame_bound

__all__ = [
    "assemble_batches", "copy_records", "decide_window", "drop_aborted", "in_transactions",
    "marker_runs", "producer_last_batches", "producer_rows", "rebase_records", "select_keys",
    "window_figures", "window_horizons", "window_markers", "window_producers",
]


@compiled.njit(cache=True, nogil=True, inline="always")
def _read_varint(buf, pos):
    z = np.uint64(0)
    shift = 0
    while True:
        b = np.uint64(buf[pos])
        z |= (b & np.uint64(0x7F)) << np.uint64(shift)
        pos += 1
        if b < 0x80:
            break
        shift += 7
    value = np.int64(z >> np.uint64(1)) ^ -np.int64(z & np.uint64(1))
    return value, pos


@compiled.njit(cache=True, nogil=True, inline="always")
def _varint_size(value):
    z = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    size = 1
    while z >= np.uint64(0x80):
        z >>= np.uint64(7)
        size += 1
    return size


@compiled.njit(cache=True, nogil=True, inline="always")
def _write_varint(out, pos, value):
    z = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    while z >= np.uint64(0x80):
        out[pos] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
        z >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(z)
    return pos + 1


@compiled.njit(cache=True, nogil=True)
def rebase_records(src, record_pos, record_size, new_deltas, out):
    """Write each record `i` (at `src[record_pos[i]:+record_size[i]]`) into `out` with timestamp delta
    `new_deltas[i]`; returns the bytes written. `out` must hold the worst case (sizes + 10 per record)."""
    o = 0
    for i in range(len(record_pos)):
        p = record_pos[i]
        end = p + record_size[i]
        _, body = _read_varint(src, p)  # skip the length
        attributes = src[body]
        _, after_ts = _read_varint(src, body + 1)  # skip the old timestamp delta
        rest = end - after_ts
        new_len = 1 + _varint_size(new_deltas[i]) + rest
        o = _write_varint(out, o, new_len)
        out[o] = attributes
        o = _write_varint(out, o + 1, new_deltas[i])
        out[o : o + rest] = src[after_ts:end]
        o += rest
    return o


@compiled.njit(cache=True, nogil=True)
def copy_records(src, record_pos, record_size, out):
    """Concatenate the raw records at `src[record_pos[i]:+record_size[i]]` into `out`; returns bytes written."""
    o = 0
    for i in range(len(record_pos)):
        n = record_size[i]
        out[o : o + n] = src[record_pos[i] : record_pos[i] + n]
        o += n
    return o


@compiled.intrinsic
def _copy_bytes(typingctx, dst, at, src, start, count):
    """dst[at:at + count] = src[start:start + count] (uint8 arrays that do not overlap) as one `llvm.memcpy`: a
    slice assignment needs numba's reference counting, which the kernels declared `compiled.BARE` do without, and
    a loop measured slower than the copy numba's slice assignment makes."""
    from numba import types  # compile time only: the body runs when numba types a caller
    from numba.core import cgutils

    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == types.uint8
            and src.dtype == types.uint8):
        return None
    signature = types.void(dst, at, src, start, count)

    def codegen(context, builder, sig, args):
        dst_type, at_type, src_type, start_type, count_type = sig.args
        dst_array = context.make_array(dst_type)(context, builder, args[0])
        src_array = context.make_array(src_type)(context, builder, args[2])
        to = cgutils.get_item_pointer(context, builder, dst_type, dst_array,
                                      [context.cast(builder, args[1], at_type, types.intp)])
        frm = cgutils.get_item_pointer(context, builder, src_type, src_array,
                                       [context.cast(builder, args[3], start_type, types.intp)])
        cgutils.raw_memcpy(builder, to, frm, context.cast(builder, args[4], count_type, types.intp), 1)
        return context.get_dummy_value()

    return signature, codegen


# The room a rebuilt batch's kept records take beyond their own bytes (re-based timestamp deltas), per record:
# what the window's output buffer allows them (`recopy._window_output`: its bytes + 10 per record).
_REBASE_GROWTH_MAX = 10

ACTION_DROP = 0
ACTION_VERBATIM = 1
ACTION_REBUILD = 2
ACTION_EMPTY = 3


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def assemble_batches(
    src, arena, start, action, batch_position, base_position, batch_size, magic, attributes, clear, base_offset,
    last_offset, base_ts, max_ts, horizon, pid, epoch, seq, ple, in_arena, record_start, needs_horizon, new_horizon,
    keep, record_pos, record_size, timestamp, out, out_pos, out_batch_pos, out_batch_last, out_batch_max_ts,
    crc_positions, n_crc, n_out, scratch, prefs, lz4_ok,
):
    """Write the output of batches `start..` of a window into `out` from `out_pos`, by action.

    Verbatim batches are copied (from `batch_position - base_position` in `src`); empty ones become the 61-byte
    header; v2 rebuilds get a new header (CRC left 0, its position added to `crc_positions`) and their kept
    records (raw, or with re-based timestamp deltas when the base timestamp changes), without their delete
    horizon where `clear` (empty: nowhere); with `lz4_ok` an lz4 batch's records are gathered in `scratch` and
    written as the lz4 frame `compression.compress` writes (`prefs`: `_lz4_kernels.kafka_preferences()`). Stops
    at the first batch it cannot build itself (another codec, lz4 without `lz4_ok`, legacy) or has no room for,
    and returns (that batch's index or len(action), out_pos, n_out, n_crc, room): room is 0 for a batch to
    build elsewhere, the bytes it needs at out_pos when `out` is short, minus the bytes it needs when `scratch`
    is. `out` must hold the window's bytes + 61 per batch + 10 per record.
    """
    n = len(action)
    for i in range(start, n):
        a = action[i]
        if a == ACTION_DROP:
            continue
        if a == ACTION_VERBATIM:
            p = batch_position[i] - base_position
            size = batch_size[i]
            _copy_bytes(out, out_pos, src, p, size)
            out_batch_pos[n_out] = out_pos
            out_batch_last[n_out] = last_offset[i]
            out_batch_max_ts[n_out] = max_ts[i]
            n_out += 1
            out_pos += size
            continue
        attrs = np.int64(attributes[i])
        if a == ACTION_EMPTY:
            attrs &= ~(fmt.COMPRESSION_MASK | fmt.DELETE_HORIZON_FLAG)
            write_v2_header(out, out_pos, base_offset[i], fmt.BATCH_LENGTH_MIN_V2, np.int64(ple[i]), attrs,
                            last_offset[i] - base_offset[i], fmt.NO_TIMESTAMP, max_ts[i], pid[i], np.int64(epoch[i]),
                            np.int64(seq[i]), 0)
            out_batch_pos[n_out] = out_pos
            out_batch_last[n_out] = last_offset[i]
            out_batch_max_ts[n_out] = max_ts[i]
            crc_positions[n_crc] = out_pos
            n_crc += 1
            n_out += 1
            out_pos += fmt.RECORD_BATCH_OVERHEAD
            continue
        codec = attrs & fmt.COMPRESSION_MASK
        if magic[i] != fmt.MAGIC_V2 or (codec != fmt.COMPRESSION_NONE and not (lz4_ok and codec == fmt.COMPRESSION_LZ4)):
            return i, out_pos, n_out, n_crc, 0
        h = horizon[i]
        if clear.size and clear[i]:
            attrs &= ~fmt.DELETE_HORIZON_FLAG
            h = fmt.NO_TIMESTAMP
        log_append_time = (attrs & fmt.TIMESTAMP_TYPE_MASK) != 0
        first = -1
        count = 0
        kept_bytes = 0
        largest = np.int64(-(2**63))
        for r in range(record_start[i], record_start[i + 1]):
            if keep[r]:
                if first < 0:
                    first = r
                count += 1
                kept_bytes += record_size[r]
                if timestamp[r] > largest:
                    largest = timestamp[r]
        if codec != fmt.COMPRESSION_NONE and kept_bytes + _REBASE_GROWTH_MAX * count > scratch.size:
            return i, out_pos, n_out, n_crc, -(kept_bytes + _REBASE_GROWTH_MAX * count)
        if h >= 0:
            base = h
        elif needs_horizon[i]:
            base = new_horizon
            attrs |= fmt.DELETE_HORIZON_FLAG
        else:
            base = timestamp[first]
        new_max = max_ts[i] if log_append_time else largest
        hp = out_pos
        if codec == fmt.COMPRESSION_NONE:
            dst = out
            o = hp + fmt.RECORD_BATCH_OVERHEAD
        else:
            dst = scratch
            o = 0
        buf = arena if in_arena[i] else src
        raw = (not log_append_time) and base == base_ts[i]
        for r in range(record_start[i], record_start[i + 1]):
            if not keep[r]:
                continue
            p = record_pos[r]
            end = p + record_size[r]
            if raw:
                _copy_bytes(dst, o, buf, p, end - p)
                o += record_size[r]
                continue
            _, body = _read_varint(buf, p)
            attributes_byte = buf[body]
            _, after_ts = _read_varint(buf, body + 1)
            rest = end - after_ts
            delta = timestamp[r] - base
            o = _write_varint(dst, o, 1 + _varint_size(delta) + rest)
            dst[o] = attributes_byte
            o = _write_varint(dst, o + 1, delta)
            _copy_bytes(dst, o, buf, after_ts, rest)
            o += rest
        if codec != fmt.COMPRESSION_NONE:
            room = fmt.RECORD_BATCH_OVERHEAD + frame_bound(o, prefs)
            if hp + room > out.size:
                return i, out_pos, n_out, n_crc, room
            written = compress_frame(scratch, 0, o, out, hp + fmt.RECORD_BATCH_OVERHEAD, prefs)
            if written < 0:
                return i, out_pos, n_out, n_crc, 0
            o = hp + fmt.RECORD_BATCH_OVERHEAD + written
        write_v2_header(out, hp, base_offset[i], o - hp - fmt.LOG_OVERHEAD, np.int64(ple[i]), attrs,
                        last_offset[i] - base_offset[i], base, new_max, pid[i], np.int64(epoch[i]), np.int64(seq[i]),
                        count)
        out_batch_pos[n_out] = hp
        out_batch_last[n_out] = last_offset[i]
        out_batch_max_ts[n_out] = new_max
        crc_positions[n_crc] = hp
        n_crc += 1
        n_out += 1
        out_pos = o
    return n, out_pos, n_out, n_crc, 0


# ---- the recopy's decisions over one window (`cleaner.recopy._decide`, `_horizons`) --------------------------------

DECIDE_DONE = 0  # action, keep and needs_horizon are final
DECIDE_LOOKUP = 1  # records `lookup[:count]` need the offset map: call again at phase 1 with `found` filled
DECIDE_MARKERS = 2  # the window's markers need `recopy._markers_discardable`: call again at phase 2 with it

# decide_window's `scalars`: [lookup count, invalid (unkeyed) records]
DECIDE_LOOKUPS = 0
DECIDE_INVALID = 1
DECIDE_SCALARS = 2

# window_horizons' `counts`
COUNT_RECORDS_WRITTEN = 0
COUNT_DIRTY_READ = 1
COUNT_DIRTY_WRITTEN = 2
COUNT_VERBATIM = 3
COUNT_REBUILT = 4
COUNT_EMPTIED = 5
COUNT_STAMPED = 6  # rebuilt batches stamped with a new delete horizon
COUNT_EARLIEST_PENDING = 7  # the soonest pending horizon of the window's written batches, -1 for none
COUNT_KEPT_CONTROL = 8  # how many base offsets of kept control batches are in `kept_control`
COUNTS = 9


@compiled.njit(cache=True, nogil=True, inline="always")
def _is_control(magic, attributes):
    return magic >= fmt.MAGIC_V2 and (attributes & fmt.CONTROL_FLAG) != 0


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def decide_window(
    phase, offsets, key_len, value_len, batch_index, magic, attributes, producer_id, records_count, record_start,
    horizon, aborted, retain_empty, bits, bits_start, use_bits, latest_offset, now_ms, partial, retain_legacy,
    group_last, txn_tracking, is_latest, lookup, found, keep, kept, marker_discardable, action, needs_horizon,
    kept_tombstones, scalars,
):
    """The per-batch actions and the per-record keep mask of one recopied window (the rules: `recopy._decide`).

    Phase 0 marks each keyed record of a live data batch up to `latest_offset` the latest of its key unless the
    superseded bitmap (`bits` from `bits_start`, with `use_bits`) says a later record has its key; records the
    bitmap does not cover go to `lookup` and the kernel returns DECIDE_LOOKUP. Phase 1 (with `found`, the map's
    offset for each of them) finishes `is_latest` and keeps the data records: past `latest_offset`, or the
    latest of their key and not a tombstone whose delete horizon passed (`retain_legacy` for legacy batches;
    every tombstone in a `partial` round), in batches neither control nor `aborted`; `kept` counts them per
    batch, `scalars[DECIDE_INVALID]` the unkeyed records among them. It returns DECIDE_MARKERS when a
    marker's fate needs the transactions (a control batch with records, or with `txn_tracking` a transactional
    data batch written); else every marker is discardable only when empty. Phase 2 (with `marker_discardable`)
    keeps the control records of markers that stay, and sets `needs_horizon` and `action` per batch;
    `retain_empty` batches keeping nothing are written empty, and the group's last batch (`group_last` >= 0), a
    legacy one, is kept whole. Returns DECIDE_DONE then. `kept_tombstones` (an int64 per batch) is its scratch.
    """
    n = magic.size
    if phase == 0:
        count = 0
        for r in range(offsets.size):
            is_latest[r] = 0
            b = batch_index[r]
            if key_len[r] < 0 or offsets[r] > latest_offset or _is_control(magic[b], attributes[b]):
                continue
            marked = offset_marked(bits, bits_start, offsets[r]) if use_bits else np.int8(-1)
            if marked >= 0:
                is_latest[r] = 1 - marked
            else:
                lookup[count] = r
                count += 1
        scalars[DECIDE_LOOKUPS] = count
        if count:
            return DECIDE_LOOKUP
        phase = 1
    if phase == 1:
        for j in range(scalars[DECIDE_LOOKUPS]):
            r = lookup[j]
            is_latest[r] = 1 if offsets[r] >= found[j] else 0
        # Data records first: whether a marker may go depends on the data batches its transaction keeps.
        invalid = 0
        for b in range(n):
            kept[b] = 0
        for r in range(offsets.size):
            b = batch_index[r]
            keep[r] = False
            if aborted[b] or _is_control(magic[b], attributes[b]):
                continue
            if offsets[r] > latest_offset:
                keep[r] = True
                kept[b] += 1
                continue
            if key_len[r] < 0:
                invalid += 1
                continue
            if not is_latest[r]:
                continue
            if value_len[r] < 0 and not partial:
                if magic[b] == fmt.MAGIC_V2:
                    h = horizon[b]
                    retain = h < 0 or now_ms < h
                else:
                    retain = retain_legacy
                if not retain:
                    continue
            keep[r] = True
            kept[b] += 1
        scalars[DECIDE_INVALID] = invalid
        python = False
        for b in range(n):
            control = _is_control(magic[b], attributes[b])
            if control and records_count[b] != 0:
                python = True
            elif (txn_tracking and not control and (kept[b] > 0 or retain_empty[b]) and producer_id[b] >= 0
                  and magic[b] >= fmt.MAGIC_V2 and (attributes[b] & fmt.TRANSACTIONAL_FLAG) != 0):
                python = True
            marker_discardable[b] = control and records_count[b] == 0
        if python:
            return DECIDE_MARKERS
    # phase 2: the markers, then the actions. In a partial round no marker goes: what it commits or aborts may
    # lie in an older generation.
    for r in range(offsets.size):
        b = batch_index[r]
        if (_is_control(magic[b], attributes[b]) and not partial and marker_discardable[b] and horizon[b] >= 0
                and horizon[b] <= now_ms):
            continue  # a discarded marker
        if _is_control(magic[b], attributes[b]):
            keep[r] = True
    for b in range(n):
        kept[b] = 0
        kept_tombstones[b] = 0
    for r in range(offsets.size):
        if keep[r]:
            b = batch_index[r]
            kept[b] += 1
            if value_len[r] < 0:
                kept_tombstones[b] += 1
    for b in range(n):
        v2 = magic[b] == fmt.MAGIC_V2
        control = _is_control(magic[b], attributes[b])
        nh = (v2 and kept[b] > 0 and horizon[b] < 0
              and (kept_tombstones[b] > 0 or (control and marker_discardable[b])))
        needs_horizon[b] = nh
        a = ACTION_DROP
        if kept[b] > 0 and kept[b] == records_count[b] and not nh:
            a = ACTION_VERBATIM
        elif kept[b] > 0 and (kept[b] < records_count[b] or nh):
            a = ACTION_REBUILD
        elif kept[b] == 0 and retain_empty[b]:
            a = ACTION_EMPTY
        action[b] = a
    if (group_last >= 0 and magic[group_last] != fmt.MAGIC_V2 and action[group_last] == ACTION_DROP
            and records_count[group_last] != 0):
        # A legacy batch cannot be emptied; kept whole it still ends the group where the old segments end.
        action[group_last] = ACTION_VERBATIM
        for r in range(record_start[group_last], record_start[group_last + 1]):
            keep[r] = True
    return DECIDE_DONE


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def window_horizons(
    action, keep, needs_horizon, offsets, value_len, batch_index, magic, attributes, base_offset, horizon,
    first_dirty, now_ms, new_horizon, partial, clear, pending, kept_control, counts, kept_tombstones,
):
    """The delete horizons of a window's written batches (the rules: `recopy._horizons`) and its counters.

    A written batch holds a horizon while it keeps a tombstone or is a control batch; a v2 batch written that
    holds none loses its horizon (`clear`; one to be copied is rebuilt instead, in `action`). `pending` is the
    horizon each holding batch is written with (`new_horizon` where `needs_horizon`), -1 for the others and, in
    a full round (not `partial`), for a horizon already passed that is not new. `counts` (COUNT_*): records
    written, dirty records (offset >= `first_dirty`, not in a control batch) read and written, batches by
    action, rebuilt batches newly stamped, the soonest pending horizon, and how many base offsets of kept
    control batches were written to `kept_control`. `kept_tombstones` (an int64 per batch) is its scratch.
    """
    n = action.size
    for b in range(n):
        kept_tombstones[b] = 0
    written_records = 0
    dirty_read = 0
    dirty_written = 0
    for r in range(offsets.size):
        b = batch_index[r]
        if keep[r]:
            written_records += 1
            if value_len[r] < 0:
                kept_tombstones[b] += 1
        if offsets[r] >= first_dirty and not _is_control(magic[b], attributes[b]):
            dirty_read += 1
            if keep[r]:
                dirty_written += 1
    verbatim = 0
    rebuilt = 0
    emptied = 0
    stamped = 0
    earliest = np.int64(-1)
    controls = 0
    for b in range(n):
        control = _is_control(magic[b], attributes[b])
        written = action[b] == ACTION_VERBATIM or action[b] == ACTION_REBUILD
        holds = written and (kept_tombstones[b] > 0 or control)
        c = written and not holds and horizon[b] >= 0 and magic[b] == fmt.MAGIC_V2
        clear[b] = c
        if c and action[b] == ACTION_VERBATIM:
            action[b] = ACTION_REBUILD
        p = new_horizon if needs_horizon[b] else horizon[b]
        if not holds:
            p = -1
        if not partial and not needs_horizon[b] and p <= now_ms:
            p = -1
        pending[b] = p
        if p >= 0 and (earliest < 0 or p < earliest):
            earliest = p
        a = action[b]
        if a == ACTION_VERBATIM:
            verbatim += 1
        elif a == ACTION_REBUILD:
            rebuilt += 1
            if needs_horizon[b]:
                stamped += 1
        elif a == ACTION_EMPTY:
            emptied += 1
        if control and a != ACTION_DROP:
            kept_control[controls] = base_offset[b]
            controls += 1
    counts[COUNT_RECORDS_WRITTEN] = written_records
    counts[COUNT_DIRTY_READ] = dirty_read
    counts[COUNT_DIRTY_WRITTEN] = dirty_written
    counts[COUNT_VERBATIM] = verbatim
    counts[COUNT_REBUILT] = rebuilt
    counts[COUNT_EMPTIED] = emptied
    counts[COUNT_STAMPED] = stamped
    counts[COUNT_EARLIEST_PENDING] = earliest
    counts[COUNT_KEPT_CONTROL] = controls


# ---- the records a window adds to the offset map (`cleaner.indexing`) ---------------------------------------------


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def select_keys(offsets, key_len, batch_index, magic, attributes, aborted, first_dirty, first_uncleanable,
                in_arena, out_offsets, out_rows, out_in_arena):
    """The records of a window the index phase inserts, in order: keyed, with an offset in [first_dirty,
    first_uncleanable), in a batch that is not a control batch nor `aborted` (per batch; empty: none is).
    Writes each one's offset, record index and whether its key lies in the arena (`in_arena` per batch);
    returns how many."""
    count = 0
    check_aborted = aborted.size > 0
    for r in range(offsets.size):
        o = offsets[r]
        if key_len[r] < 0 or o < first_dirty or o >= first_uncleanable:
            continue
        b = batch_index[r]
        if _is_control(magic[b], attributes[b]) or (check_aborted and aborted[b]):
            continue
        out_offsets[count] = o
        out_rows[count] = r
        out_in_arena[count] = in_arena[b]
        count += 1
    return count


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def producer_last_batches(producer_id, magic, attributes, last_offset, table_producer_id, table_last_data,
                          table_last_entry, table_last_timestamp, table_open_first, expired_before, out):
    """out[i]: v2 batch i holds its producer's last data offset (Kafka's isBatchLastRecordOfProducer), by the
    producers' table (`LogSurvey.producer_table`, sorted by producer id): the producer is in it, not expired
    (its last timestamp after `expired_before`, or a transaction open), and the batch's last offset is its last
    data offset, or, when it has no data batch, its last entry's and the batch is a control batch."""
    rows = table_producer_id.size
    for i in range(producer_id.size):
        out[i] = False
        pid = producer_id[i]
        if pid < 0 or magic[i] != fmt.MAGIC_V2 or rows == 0:
            continue
        lo = 0
        hi = rows
        while lo < hi:  # the first row whose producer id is not below pid
            mid = (lo + hi) >> 1
            if table_producer_id[mid] < pid:
                lo = mid + 1
            else:
                hi = mid
        row = min(lo, rows - 1)
        if table_producer_id[row] != pid:
            continue
        if table_last_timestamp[row] <= expired_before and table_open_first[row] < 0:
            continue
        last_data = table_last_data[row]
        if last_data >= 0:
            out[i] = last_offset[i] == last_data
        else:
            out[i] = _is_control(magic[i], attributes[i]) and last_offset[i] == table_last_entry[row]


@compiled.njit(cache=True, nogil=True, inline="always")
def _pair_search(pids, values, pid, value, past):
    """Binary search over rows sorted by (producer id, value): the first row at (`past`: past) (pid, value), or
    pids.size if none."""
    lo = 0
    hi = pids.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if pids[mid] < pid or (pids[mid] == pid and (values[mid] <= value if past else values[mid] < value)):
            lo = mid + 1
        else:
            hi = mid
    return lo


@compiled.njit(cache=True, nogil=True)
def window_markers(is_control, records_count, producer_id, base_offset, txn_producer_id, txn_marker,
                   txn_data_batches, survey_decides, written, marker, out, pids, first, before, after):
    """The markers of a window and whether each control batch may go (`cleaner.recopy._markers_discardable`).

    marker[i]: control batch i has records and is the COMMIT/ABORT marker of one of its producer's closed
    transactions (`txn_*`: their producer ids, markers' offsets and data batches, sorted by producer id, then
    offset; a producer's markers follow its first offsets, so one binary search on (producer id, marker)).
    out[i]: an empty control batch (a marker cleaned before); with `survey_decides`, also a marker whose
    transaction has no data batch in the whole log. Without it, the markers' answers come from the window's
    own runs (`marker_runs` over `written`, which also fills pids/first/before/after); returns how many
    producers that found (0 with `survey_decides`)."""
    rows = txn_producer_id.size
    for i in range(producer_id.size):
        marker[i] = False
        out[i] = is_control[i] and records_count[i] == 0
        if not is_control[i] or records_count[i] == 0 or rows == 0:
            continue
        pid = producer_id[i]
        offset = base_offset[i]
        lo = _pair_search(txn_producer_id, txn_marker, pid, offset, False)  # the first row at or past (pid, offset)
        if lo < rows and txn_producer_id[lo] == pid and txn_marker[lo] == offset:
            marker[i] = True
            if survey_decides:
                out[i] = txn_data_batches[lo] == 0
    if survey_decides:
        return 0
    return marker_runs(producer_id, marker, written, out, pids, first, before, after)


@compiled.njit(cache=True, nogil=True)
def marker_runs(producer_id, marker, written, out, pids, first, before, after):
    """The transactions a window's markers end, per producer, in one walk over its batches in order: a
    producer's COMMIT/ABORT `marker` ends the run of its `written` (transactional data) batches since its previous
    marker. For every marker after the producer's first in the window, out[i] = no batch of its run was written;
    the first one's answer needs the batches written before the window, so the caller gives it. Writes, per
    producer the window involves, in order of first appearance: its id (`pids`), its first marker's index or -1
    (`first`), the batches written before that marker (`before`), and after its last marker or, with none, in
    the whole window (`after`). Returns how many producers."""
    slot = dict()
    count = 0
    for i in range(producer_id.size):
        if not (marker[i] or written[i]):
            continue
        pid = producer_id[i]
        if pid in slot:
            s = slot[pid]
        else:
            s = count
            slot[pid] = s
            pids[s] = pid
            first[s] = -1
            before[s] = 0
            after[s] = 0
            count += 1
        if written[i]:
            after[s] += 1
        else:  # a marker: the run since the previous one ends here
            if first[s] < 0:
                first[s] = i
                before[s] = after[s]
            else:
                out[i] = after[s] == 0
            after[s] = 0
    return count


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def producer_rows(buf, producer_id, is_control, is_transactional, base_offset, last_offset, max_timestamp,
                  records_count, attributes, records_in_arena, records_pos, records_bytes, columns, flags, batch,
                  status):
    """The survey's rows of one scanned window (`buf` its buffer, the other inputs the scan's batch arrays): the
    batches that carry a producer id, in order, with the control type of each marker, in one walk.

    Per row k: `columns` (int64, 5 rows) producer id, base offset, last offset, max timestamp, and the batch's
    end (the control type of a COMMIT/ABORT marker, -1 for any other batch); `flags` (bool, 2 rows) control,
    transactional; `batch[k]` its index among the window's batches; `status[k]` 0 for a batch that ends
    nothing by itself (data, or a control batch without records), 1 for a control batch whose first record's
    type was read here (`segments.codec._control_kernels.first_control_type`, which accepts only what the Python
    decoder would), 2 for one the caller must decode itself (compressed, or not accepted). CRCs are not
    checked here. Returns the number of rows."""
    k = 0
    for j in range(producer_id.size):
        if producer_id[j] < 0:
            continue
        columns[0, k] = producer_id[j]
        columns[1, k] = base_offset[j]
        columns[2, k] = last_offset[j]
        columns[3, k] = max_timestamp[j]
        columns[4, k] = -1
        flags[0, k] = is_control[j]
        flags[1, k] = is_transactional[j]
        batch[k] = j
        status[k] = 0
        if is_control[j] and records_count[j] != 0:
            status[k] = 2
            if (attributes[j] & fmt.COMPRESSION_MASK) == fmt.COMPRESSION_NONE and not records_in_arena[j]:
                control_type, decided = first_control_type(buf, records_pos[j], records_pos[j] + records_bytes[j],
                                                           records_count[j], last_offset[j] - base_offset[j])
                if decided:
                    status[k] = 1
                    if control_type == fmt.CONTROL_TYPE_ABORT or control_type == fmt.CONTROL_TYPE_COMMIT:
                        columns[4, k] = control_type
        k += 1
    return k


@compiled.njit(cache=True, nogil=True)
def window_producers(producer_id, is_control, is_transactional, base_offset, last_offset, max_timestamp, ends,
                     groups, markers):
    """The survey's producer tracking over one window's batches that carry a producer id, in offset order (the
    columns of `cleaner.survey._ProducerRows`; `ends`: a COMMIT/ABORT marker's control type, -1 elsewhere), in
    one walk. A marker's transaction is its producer's transactional data batches since its previous marker in
    the window, or since the window's start for its first (the caller adds what was open before the window).

    Writes, per producer in order of first appearance, the columns of `groups` (int64, 10 rows): its id, the
    last offset of its last batch and whether that batch is a control batch, its newest max timestamp, the last
    offset of its last data batch (-1: none), the index in `markers` of its first marker (-1: none), its
    transactional data batches after its last marker (-1: no marker) and the base offset of the first of them
    (-1: none), its transactional data batches in the window and the base offset of the first (-1: none). Per
    marker, in offset order, the columns of `markers` (int64, 5 rows): producer id, first offset of its
    transaction (the first data batch's base offset, or the marker's own offset when the run is empty), the
    marker's offset, its control type and the run's data batches. Returns (producers, markers)."""
    slot = dict()
    count = 0
    found = 0
    for i in range(producer_id.size):
        pid = producer_id[i]
        if pid in slot:
            s = slot[pid]
            groups[3, s] = max(groups[3, s], max_timestamp[i])
        else:
            s = count
            slot[pid] = s
            count += 1
            groups[0, s] = pid
            groups[3, s] = max_timestamp[i]
            groups[4, s] = -1
            groups[5, s] = -1
            groups[6, s] = 0  # the run since its last marker: data batches, and the first one's base offset
            groups[7, s] = -1
            groups[8, s] = 0
            groups[9, s] = -1
        groups[1, s] = last_offset[i]
        groups[2, s] = 1 if is_control[i] else 0
        if not is_control[i]:
            groups[4, s] = last_offset[i]
            if is_transactional[i]:
                if groups[8, s] == 0:
                    groups[9, s] = base_offset[i]
                groups[8, s] += 1
                if groups[5, s] >= 0:  # after a marker: the run since the last one
                    if groups[6, s] == 0:
                        groups[7, s] = base_offset[i]
                    groups[6, s] += 1
        elif ends[i] >= 0:
            if groups[5, s] < 0:  # its first marker: the run is every transactional data batch so far
                groups[5, s] = found
                run = groups[8, s]
                first = groups[9, s]
            else:
                run = groups[6, s]
                first = groups[7, s]
            markers[0, found] = pid
            markers[1, found] = first if run > 0 else last_offset[i]
            markers[2, found] = last_offset[i]
            markers[3, found] = ends[i]
            markers[4, found] = run
            found += 1
            groups[6, s] = 0
            groups[7, s] = -1
    for s in range(count):
        if groups[5, s] < 0:
            groups[6, s] = -1
    return count, found


@compiled.njit(cache=True, nogil=True, inline="always")
def _in_transaction(pid, base, txn_producer_id, txn_first, txn_marker):
    """Whether a batch (producer id, base offset) lies in one of the given transactions, sorted by (producer id,
    first offset): one of the same producer whose first offset is at most the batch's base offset and whose
    marker is at or after it (producer ids below 0 are in none). A producer's transactions never overlap, so
    its last one starting at or before the batch is the only one to look at: a binary search."""
    if pid < 0:
        return False
    j = _pair_search(txn_producer_id, txn_first, pid, base, True) - 1  # the last row at or before (pid, base)
    return j >= 0 and txn_producer_id[j] == pid and base <= txn_marker[j]


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def in_transactions(producer_id, base_offset, candidate, txn_producer_id, txn_first, txn_marker, out):
    """out[i]: `candidate` batch i (producer id, base offset) lies in one of the given transactions
    (`_in_transaction`)."""
    for i in range(producer_id.size):
        out[i] = candidate[i] and _in_transaction(producer_id[i], base_offset[i], txn_producer_id, txn_first,
                                                  txn_marker)


@compiled.njit(cache=True, nogil=True, inline="always")
def _first_above(a, value, lo):
    """The first index at or after `lo` of ascending `a` whose entry is above `value` (a.size if none)."""
    hi = a.size
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def drop_aborted(offsets, h1, h2, producer_id, base_offset, last_offset, txn_producer_id, txn_first, txn_marker):
    """Remove from a window's selected records (offsets ascending, with their hashes h1, h2) those of the data
    batches (producer id, base and last offset, in offset order) that lie in one of the given aborted
    transactions (`_in_transaction`), moving the others down in order, in place; returns how many are left.
    The survey's pass dropping aborted records, in one walk."""
    n = offsets.size
    kept = 0
    read = 0  # records before `read` are decided: kept (moved down to below `kept`) or dropped
    for i in range(producer_id.size):
        if not _in_transaction(producer_id[i], base_offset[i], txn_producer_id, txn_first, txn_marker):
            continue
        start = _first_above(offsets, base_offset[i] - 1, read)  # the batch's records: [start, stop)
        stop = _first_above(offsets, last_offset[i], start)
        if kept == read:
            kept = start
        else:
            for r in range(read, start):
                offsets[kept] = offsets[r]
                h1[kept] = h1[r]
                h2[kept] = h2[r]
                kept += 1
        read = stop
    if kept == read:
        return n
    for r in range(read, n):
        offsets[kept] = offsets[r]
        h1[kept] = h1[r]
        h2[kept] = h2[r]
        kept += 1
    return kept


@compiled.njit(cache=True, nogil=True, **compiled.BARE)
def window_figures(base_offset, last_offset, is_legacy, compression, max_timestamp, delete_horizon_ms, records_count,
                   floor, ceiling, check, out):
    """The survey's figures of one scanned window, in one walk: out[0] the first batch whose offsets are out of
    place (-1: none; only with `check`): it starts below `floor` (for the first batch) or the offset after the
    batch before it, ends below where it starts, or ends at or past `ceiling`; a legacy compressed wrapper starts
    at its last (outer) offset, its first being unknown from its header. out[1] the largest max timestamp (at
    least -1); out[2] the soonest delete horizon of a batch with records (-1: none); out[3] how many batches are
    legacy compressed wrappers."""
    bad = -1
    largest = -1
    soonest = -1
    wrappers = 0
    for i in range(base_offset.size):
        last = last_offset[i]
        wrapper = is_legacy[i] and compression[i] != fmt.COMPRESSION_NONE
        if wrapper:
            wrappers += 1
        if check and bad < 0:
            start = last if wrapper else base_offset[i]
            if start < floor or last < start or last >= ceiling:
                bad = i
            floor = last + 1
        if max_timestamp[i] > largest:
            largest = max_timestamp[i]
        horizon = delete_horizon_ms[i]
        if horizon >= 0 and records_count[i] != 0 and (soonest < 0 or horizon < soonest):
            soonest = horizon
    out[0] = bad
    out[1] = largest
    out[2] = soonest
    out[3] = wrappers
