"""Control batches in bulk: the type of each one's control record (docs/format.md section 1.7) from a scan.

A reader of transactions needs, for every control batch, the type its first record's key holds (COMMIT,
ABORT or another one), and the guarantee that the batch decodes. `control_types` reads both for many batches
of one `segments.codec.scan.ScanResult` (a header-only scan is enough) with one compiled kernel
(`_control_kernels`), no Python per batch: it decides a batch only where `records.decode_batch` and
`records.decode_control_key` would accept it, and leaves every other one (compressed, with record headers,
malformed, or a CRC it has to check and that fails) to the caller, who decodes it with those functions and so
reports a fault as they do; the CRCs it checks are one call of `_crc_kernels.batch_crcs`, without the GIL.
Pure: no I/O. The kernels load at the first call.
"""

from __future__ import annotations

import numpy as np

from . import _crc_kernels as crc
from . import format as fmt

__all__ = ["control_types", "crcs_match"]


def control_types(result, batches: np.ndarray, *, crc_checked: bool) -> tuple[np.ndarray, np.ndarray]:
    """(types, decided) for `batches`, indices of v2 control batches with records in `result`'s batch arrays.

    types[j] (int64) is the int16 type of the first control record of batch `batches[j]` where decided[j];
    decided[j] is False where the caller must decode the batch itself (see the module docstring). Without
    `crc_checked` (the scan did not verify CRCs) a batch is decided only once its CRC-32C matches.
    """
    # the kernels load only when a round reads control batches: start-up of the CLI stays fast
    from ._control_kernels import control_types as kernel

    batches = np.asarray(batches, dtype=np.int64)
    types = np.zeros(len(batches), dtype=np.int64)
    decided = np.zeros(len(batches), dtype=np.bool_)
    plain = np.flatnonzero(
        ((result.attributes[batches] & fmt.COMPRESSION_MASK) == fmt.COMPRESSION_NONE)
        & ~result.records_in_arena[batches]
    )
    if not len(plain):
        return types, decided
    rows = batches[plain]
    start = result.records_pos[rows]
    plain_types = np.zeros(len(rows), dtype=np.int64)
    plain_decided = np.zeros(len(rows), dtype=np.bool_)
    kernel(
        result.buffer, start, start + result.records_bytes[rows], result.records_count[rows].astype(np.int64),
        result.last_offset[rows] - result.base_offset[rows], plain_types, plain_decided,
    )
    if not crc_checked:
        plain_decided &= crcs_match(result, rows)
    types[plain] = plain_types
    decided[plain] = plain_decided
    return types, decided


def crcs_match(result, batches: np.ndarray) -> np.ndarray:
    """True where the CRC-32C of batch `batches[j]` of `result` (its buffer holds the whole batch) matches its
    header's: one call of `_crc_kernels.batch_crcs`, without the GIL."""
    positions = result.batch_buffer_pos[batches]
    computed = np.empty(len(batches), dtype=np.int64)
    crc.batch_crcs(result.buffer, positions + fmt.ATTRIBUTES_OFFSET, positions + result.batch_size[batches], computed)
    return computed == result.crc[batches]
