"""Compiled kernels of `segments.codec.control`, and the rule they share with the survey's walk over a window
(`cleaner._kernels.producer_rows` calls `first_control_type`).

`control_types` walks the records of uncompressed v2 control batches with the rules of the Python decoder
(`segments.codec.records.decode_batch`) and reads the type of each batch's first control record. It accepts a
batch only where that decoder would: anything it does not vouch for (a varint it would have to question, a
record with headers, whose keys the decoder checks as UTF-8, a short key or a negative version) is left
undecided for the caller to decode in Python, which then reports any fault exactly as it always did. It
never raises. Field offsets come from `segments.codec.format`; the varint readers are the bulk scan's.
"""

from __future__ import annotations

import numpy as np

from . import compiled
from . import format as fmt
from ._scan_kernels import _i16, _varint, _varlong

assert fmt.CONTROL_KEY_VERSION_BYTES == 2 and fmt.CONTROL_KEY_TYPE_BYTES == 2  # read with `_i16`
_CONTROL_KEY_BYTES = fmt.CONTROL_KEY.size  # a struct's size: not a compile-time constant for numba


@compiled.njit(cache=True, nogil=True)
def first_control_type(d, p, end, count, last_offset_delta):
    """(type, True) for the v2 records region d[p:end] of `count` records if the Python decoder accepts it and
    its first record's key is a control key; (0, False) when the caller must decide."""
    control_type = np.int64(0)
    previous_delta = np.int64(-1)
    for k in range(count):
        length, c = _varint(d, p, end)
        if c < 0 or length < 0:
            return np.int64(0), False
        record_end = c + length
        if record_end > end or c >= record_end:
            return np.int64(0), False
        c += fmt.RECORD_ATTRIBUTES_BYTES
        _, c = _varlong(d, c, record_end)  # timestampDelta
        if c < 0:
            return np.int64(0), False
        offset_delta, c = _varint(d, c, record_end)
        if c < 0:
            return np.int64(0), False
        klen, c = _varint(d, c, record_end)
        if c < 0 or klen < -1 or c + klen > record_end:
            return np.int64(0), False
        if k == 0:
            if klen < _CONTROL_KEY_BYTES or _i16(d, c + fmt.CONTROL_KEY_VERSION_OFFSET) < 0:
                return np.int64(0), False
            control_type = _i16(d, c + fmt.CONTROL_KEY_TYPE_OFFSET)
        if klen > 0:
            c += klen
        vlen, c = _varint(d, c, record_end)
        if c < 0 or vlen < -1 or c + vlen > record_end:
            return np.int64(0), False
        if vlen > 0:
            c += vlen
        header_count, c = _varint(d, c, record_end)
        if c < 0 or header_count != 0 or c != record_end:
            return np.int64(0), False
        if offset_delta <= previous_delta or offset_delta > last_offset_delta:
            return np.int64(0), False
        previous_delta = offset_delta
        p = record_end
    if p != end or count < 1:
        return np.int64(0), False
    return control_type, True


@compiled.njit(cache=True, nogil=True)
def control_types(buf, records_pos, records_end, counts, last_offset_deltas, types, decided):
    """For each batch j whose records region is buf[records_pos[j]:records_end[j]] (uncompressed, wholly in
    `buf`): types[j] = its first control record's type and decided[j] = True, or decided[j] = False."""
    for j in range(len(records_pos)):
        types[j], decided[j] = first_control_type(
            buf, records_pos[j], records_end[j], counts[j], last_offset_deltas[j]
        )
