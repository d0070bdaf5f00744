"""The v2 batch header written by compiled code: `write_v2_header` (numba, cached on disk).

Owns the one numba writer of a 61-byte v2 header (`docs/format.md` 1.1): every field at its offset and width
from `segments.codec.format`, magic 2, and the CRC field left 0 for the caller to fill once the records
behind the header are in place; and `put_be`, the big-endian store it is built from. The cleaner's recopy
kernels (`cleaner._kernels`) call it for every header they write; the object path writes the same layout with
`fmt.BATCH_V2.pack` (`segments.codec.records`), and tests/segments/test_header_layout.py holds the two to
each other.

numba freezes the `fmt` ints into the compiled code and `cache=True` keeps it on disk; numba's cache is one
folder per fingerprint of the three packages (`compiled.numba_cache_dir`), so an edit of this file or format.py
recompiles the callers too.
"""

from __future__ import annotations

import numpy as np

from . import compiled
from . import format as fmt

__all__ = ["put_be", "write_v2_header"]


@compiled.njit(cache=True, nogil=True, inline="always")
def put_be(out, pos, value, width):
    """Store the low `width` bytes of `value` at out[pos:pos + width], big-endian (two's complement)."""
    for k in range(width - 1, -1, -1):
        out[pos + k] = np.uint8(value & 0xFF)
        value >>= 8


@compiled.njit(cache=True, nogil=True)
def write_v2_header(out, hp, base_offset, batch_length, partition_leader_epoch, attributes, last_offset_delta,
                    base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, records_count):
    """Write the 61-byte header of a v2 batch at out[hp:hp + 61]: the given fields, magic 2 and a zero CRC."""
    put_be(out, hp + fmt.BASE_OFFSET_OFFSET, base_offset, fmt.BASE_OFFSET_BYTES)
    put_be(out, hp + fmt.LENGTH_OFFSET, batch_length, fmt.LENGTH_BYTES)
    put_be(out, hp + fmt.PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch, fmt.PARTITION_LEADER_EPOCH_BYTES)
    put_be(out, hp + fmt.MAGIC_OFFSET, fmt.MAGIC_V2, fmt.MAGIC_BYTES)
    put_be(out, hp + fmt.CRC_OFFSET, 0, fmt.CRC_BYTES)  # filled in by the caller
    put_be(out, hp + fmt.ATTRIBUTES_OFFSET, attributes, fmt.ATTRIBUTES_BYTES)
    put_be(out, hp + fmt.LAST_OFFSET_DELTA_OFFSET, last_offset_delta, fmt.LAST_OFFSET_DELTA_BYTES)
    put_be(out, hp + fmt.BASE_TIMESTAMP_OFFSET, base_timestamp, fmt.BASE_TIMESTAMP_BYTES)
    put_be(out, hp + fmt.MAX_TIMESTAMP_OFFSET, max_timestamp, fmt.MAX_TIMESTAMP_BYTES)
    put_be(out, hp + fmt.PRODUCER_ID_OFFSET, producer_id, fmt.PRODUCER_ID_BYTES)
    put_be(out, hp + fmt.PRODUCER_EPOCH_OFFSET, producer_epoch, fmt.PRODUCER_EPOCH_BYTES)
    put_be(out, hp + fmt.BASE_SEQUENCE_OFFSET, base_sequence, fmt.BASE_SEQUENCE_BYTES)
    put_be(out, hp + fmt.RECORDS_COUNT_OFFSET, records_count, fmt.RECORDS_COUNT_BYTES)
