"""Compiled per-record loops of the recopy phase (numba, cached on disk).

Owns `rebase_records`: copying kept v2 records into a new records region while rewriting each record's
timestamp delta (when a rebuilt batch gets a new base timestamp: the first kept record's, or the delete
horizon). Every other field of a record is copied byte for byte. Inputs are trusted: they come from a scan
that already validated the records.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["rebase_records", "copy_records"]


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
