"""Compiled per-record loops of a cleaning round (numba, cached on disk).

Owns `mark_offsets` / `offsets_marked` (the index phase's bitmap of superseded offsets), and the recopy
phase's `assemble_batches` (verbatim copies, empty headers, uncompressed and lz4 v2 rebuilds of one window),
`copy_records` and `rebase_records` (copying kept v2 records into a new records region, rewriting each
record's timestamp delta when a rebuilt batch gets a new base timestamp: the first kept record's, or the delete
horizon). Every other field of a record is copied byte for byte. Inputs are trusted: they come from a scan
that already validated the records.

It decides what a rebuilt header says, not how it is laid out: headers are written by the codec's
`segments.codec._header_kernels.write_v2_header`, and every size, flag and mask here is a
`segments.codec.format` name.
"""

from __future__ import annotations

import numba
import numpy as np

from segments.codec import format as fmt
from segments.codec._header_kernels import write_v2_header
from segments.codec._lz4_kernels import compress_frame, frame_bound

__all__ = ["assemble_batches", "copy_records", "mark_offsets", "offsets_marked", "rebase_records"]


@numba.njit(cache=True, nogil=True)
def mark_offsets(bits, start, offsets):
    """Set the bit of every offset in [start, start + 8 * bits.size); other offsets (-1 included) are ignored."""
    end = start + 8 * bits.size
    for i in range(offsets.size):
        o = offsets[i]
        if start <= o < end:
            d = o - start
            bits[d >> 3] |= np.uint8(1 << (d & 7))


@numba.njit(cache=True, nogil=True)
def offsets_marked(bits, start, offsets, out):
    """out[i] = 1 if offsets[i]'s bit is set, 0 if not, -1 if offsets[i] lies outside the bitmap."""
    end = start + 8 * bits.size
    for i in range(offsets.size):
        o = offsets[i]
        if start <= o < end:
            d = o - start
            out[i] = (bits[d >> 3] >> (d & 7)) & 1
        else:
            out[i] = -1


@numba.njit(cache=True, nogil=True, inline="always")
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


@numba.njit(cache=True, nogil=True, inline="always")
def _varint_size(value):
    z = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    size = 1
    while z >= np.uint64(0x80):
        z >>= np.uint64(7)
        size += 1
    return size


@numba.njit(cache=True, nogil=True, inline="always")
def _write_varint(out, pos, value):
    z = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    while z >= np.uint64(0x80):
        out[pos] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
        z >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(z)
    return pos + 1


@numba.njit(cache=True, nogil=True)
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


@numba.njit(cache=True, nogil=True)
def copy_records(src, record_pos, record_size, out):
    """Concatenate the raw records at `src[record_pos[i]:+record_size[i]]` into `out`; returns bytes written."""
    o = 0
    for i in range(len(record_pos)):
        n = record_size[i]
        out[o : o + n] = src[record_pos[i] : record_pos[i] + n]
        o += n
    return o


ACTION_DROP = 0
ACTION_VERBATIM = 1
ACTION_REBUILD = 2
ACTION_EMPTY = 3


@numba.njit(cache=True, nogil=True)
def assemble_batches(
    src, arena, start, action, batch_pos, batch_size, magic, attributes, base_offset, last_offset, base_ts,
    max_ts, horizon, pid, epoch, seq, ple, in_arena, record_start, needs_horizon, new_horizon,
    keep, record_pos, record_size, timestamp, out, out_pos, out_batch_pos, out_batch_last, out_batch_max_ts,
    out_needs_crc, n_out, scratch, prefs, lz4_ok,
):
    """Write the output of batches `start..` of a window into `out` from `out_pos`, by action.

    Verbatim batches are copied; empty ones become the 61-byte header; v2 rebuilds get a new header (CRC left
    0 and flagged in `out_needs_crc`) and their kept records (raw, or with re-based timestamp deltas when the
    base timestamp changes); with `lz4_ok` an lz4 batch's records are gathered in `scratch` and written as the
    lz4 frame `compression.compress` writes (`prefs`: `_lz4_kernels.kafka_preferences()`). Stops at the first
    batch it cannot build itself (another codec, lz4 without `lz4_ok`, legacy) or has no room for, and returns
    (that batch's index or len(action), out_pos, n_out, room): room is 0 for a batch to build elsewhere, else
    the bytes it needs at out_pos. `out` must hold the window's bytes + 61 per batch + 10 per record, `scratch`
    the records of any lz4 rebuild + 10 per record.
    """
    n = len(action)
    for i in range(start, n):
        a = action[i]
        if a == ACTION_DROP:
            continue
        if a == ACTION_VERBATIM:
            p = batch_pos[i]
            size = batch_size[i]
            out[out_pos : out_pos + size] = src[p : p + size]
            out_batch_pos[n_out] = out_pos
            out_batch_last[n_out] = last_offset[i]
            out_batch_max_ts[n_out] = max_ts[i]
            out_needs_crc[n_out] = False
            n_out += 1
            out_pos += size
            continue
        if a == ACTION_EMPTY:
            attrs = attributes[i] & ~(fmt.COMPRESSION_MASK | fmt.DELETE_HORIZON_FLAG)
            write_v2_header(out, out_pos, base_offset[i], fmt.BATCH_LENGTH_MIN_V2, ple[i], attrs,
                            last_offset[i] - base_offset[i], fmt.NO_TIMESTAMP, max_ts[i], pid[i], epoch[i], seq[i], 0)
            out_batch_pos[n_out] = out_pos
            out_batch_last[n_out] = last_offset[i]
            out_batch_max_ts[n_out] = max_ts[i]
            out_needs_crc[n_out] = True
            n_out += 1
            out_pos += fmt.RECORD_BATCH_OVERHEAD
            continue
        codec = attributes[i] & fmt.COMPRESSION_MASK
        if magic[i] != fmt.MAGIC_V2 or (codec != fmt.COMPRESSION_NONE and not (lz4_ok and codec == fmt.COMPRESSION_LZ4)):
            return i, out_pos, n_out, 0
        attrs = attributes[i]
        log_append_time = (attrs & fmt.TIMESTAMP_TYPE_MASK) != 0
        first = -1
        count = 0
        largest = np.int64(-(2**63))
        for r in range(record_start[i], record_start[i + 1]):
            if keep[r]:
                if first < 0:
                    first = r
                count += 1
                if timestamp[r] > largest:
                    largest = timestamp[r]
        if horizon[i] >= 0:
            base = horizon[i]
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
                dst[o : o + record_size[r]] = buf[p:end]
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
            dst[o : o + rest] = buf[after_ts:end]
            o += rest
        if codec != fmt.COMPRESSION_NONE:
            room = fmt.RECORD_BATCH_OVERHEAD + frame_bound(o, prefs)
            if hp + room > out.size:
                return i, out_pos, n_out, room
            written = compress_frame(scratch, 0, o, out, hp + fmt.RECORD_BATCH_OVERHEAD, prefs)
            if written < 0:
                return i, out_pos, n_out, 0
            o = hp + fmt.RECORD_BATCH_OVERHEAD + written
        write_v2_header(out, hp, base_offset[i], o - hp - fmt.LOG_OVERHEAD, ple[i], attrs,
                        last_offset[i] - base_offset[i], base, new_max, pid[i], epoch[i], seq[i], count)
        out_batch_pos[n_out] = hp
        out_batch_last[n_out] = last_offset[i]
        out_batch_max_ts[n_out] = new_max
        out_needs_crc[n_out] = True
        n_out += 1
        out_pos = o
    return n, out_pos, n_out, 0
