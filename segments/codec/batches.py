"""Walking a buffer of concatenated batches of any magic (0, 1, 2): the shape of a `.log` file (pure, no I/O).

Owns the framing rules of `docs/format.md` section 3 (`.log`): every batch starts with the shared 17-byte
prefix (offset, length, 4 magic-dependent bytes, magic), the walker dispatches on byte 16 and decodes nothing
beyond that prefix itself (v2 goes to `segments.codec.records`, v0/v1 to `segments.codec.legacy`), and it
tells a torn tail from corruption. The file reader, recovery and verify call it over bytes they read and add
the path to its errors (`CorruptRecordError.located`). It also owns `peek_header`, the one reader of "the
header of the batch at position P" for every magic, which needs only the header bytes (61 for v2, 18/26 for
v0/v1): the file layer preads just those (`segments.files.segment.read_header_at`, `LogSegment.header_at`),
recovery reads a `.swap` file's headers with it, and `iter_batch_headers` uses it for each batch it frames.

Torn tail versus corruption, the project's rule for every reader of `.log` bytes: at most 17 bytes left, or a
declared batch running past `end`, is a torn tail; anything invalid in a batch wholly before `end` is
corruption. At a torn tail `tail="stop"` (the default) ends silently and `tail="raise"` raises
`TruncatedBatchError` (a `CorruptRecordError`: catch it first) at the torn batch's start. Every case, and the
error positions: see docs/design.md, "Torn tail versus corruption".
"""

from __future__ import annotations

from collections.abc import Iterator

from . import format as fmt
from .compression import DECOMPRESSED_BYTES_MAX_DEFAULT
from .errors import CorruptRecordError, TruncatedBatchError, UnsupportedFormatError
from .legacy import _legacy_header_fields, decode_legacy_entry
from .records import BatchHeader, RecordBatch, _v2_header_fields, decode_batch

__all__ = [
    "TAIL_RAISE",
    "TAIL_STOP",
    "decode_any_batch",
    "iter_batch_headers",
    "iter_batches",
    "peek_header",
    "read_next_offset",
]

TAIL_STOP = "stop"
TAIL_RAISE = "raise"
_TAIL_MODES = (TAIL_STOP, TAIL_RAISE)
_LEGACY_MAGICS = (fmt.MAGIC_V0, fmt.MAGIC_V1)


def peek_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader:
    """The header of the batch of any magic at `pos`, decoded from its header bytes alone.

    Requires nothing of the rest of the batch: `buf` may end right after the header (a file reader preads
    `fmt.RECORD_BATCH_OVERHEAD` bytes). Ensures the checks a header can take without its body and CRC: for
    v2 (`segments.codec.records`) batchLength ≥ 49, a codec ≤ 4, lastOffsetDelta ≥ 0 and recordsCount ≥ 0; for
    any other magic, as a v0/v1 entry (`segments.codec.legacy`, see `decode_legacy_header` for the fields it
    gives), magic 0 or 1, messageSize ≥ its magic's minimum and a codec ≤ 3. Raises `TruncatedBatchError`
    when `buf` ends before the header does (fewer than 17 bytes, or than the magic's header), otherwise
    `UnsupportedFormatError` / `CorruptRecordError`, positions relative to `buf`. Whether the whole batch fits
    is the caller's check (`header.size_bytes`).
    """
    if pos + fmt.HEADER_SIZE_UP_TO_MAGIC > len(buf):
        raise TruncatedBatchError(f"fewer than {fmt.HEADER_SIZE_UP_TO_MAGIC} bytes left", position=pos)
    if buf[pos + fmt.MAGIC_OFFSET] == fmt.MAGIC_V2:
        return _v2_header_fields(buf, pos)
    return _legacy_header_fields(buf, pos)


def _frame(view: memoryview, pos: int, end: int) -> tuple[int, int] | None:
    """(magic, size_bytes) of the whole batch at `pos`, or None at a torn tail; raises on corruption."""
    remaining = end - pos
    if remaining <= fmt.HEADER_SIZE_UP_TO_MAGIC:
        return None
    _, length, _, magic = fmt.PREFIX_UP_TO_MAGIC.unpack_from(view, pos)
    if length < fmt.LENGTH_MIN:
        raise CorruptRecordError(
            f"declared length {length} is below the minimum {fmt.LENGTH_MIN} of any batch",
            position=pos + fmt.LENGTH_OFFSET,
        )
    size_bytes = fmt.LOG_OVERHEAD + length
    if size_bytes > remaining:
        return None
    if magic != fmt.MAGIC_V2 and magic not in _LEGACY_MAGICS:
        raise UnsupportedFormatError(f"unknown magic {magic}", position=pos + fmt.MAGIC_OFFSET)
    return magic, size_bytes


def _torn_tail(view: memoryview, pos: int, end: int) -> TruncatedBatchError:
    remaining = end - pos
    if remaining <= fmt.HEADER_SIZE_UP_TO_MAGIC:
        reason = f"torn tail: {remaining} bytes left, fewer than the {fmt.HEADER_SIZE_UP_TO_MAGIC + 1} a batch needs"
    else:
        _, length = fmt.PREFIX.unpack_from(view, pos)
        reason = f"torn tail: batch of {fmt.LOG_OVERHEAD + length} bytes declared, {remaining} bytes left"
    return TruncatedBatchError(reason, position=pos)


def _bounds(buf: bytes | memoryview, start: int, end: int | None, tail: str) -> tuple[memoryview, int]:
    if tail not in _TAIL_MODES:
        raise ValueError(f"tail must be one of {_TAIL_MODES}, not {tail!r}")
    length = len(buf)
    end = length if end is None else end
    if not 0 <= start <= end <= length:
        raise ValueError(f"invalid range [{start}, {end}) of a {length}-byte buffer")
    # Decoders take the buffer's length as the end of the data, so hand them a view cut at `end`;
    # positions stay relative to `buf` because the view starts at 0.
    return memoryview(buf)[:end], end


def _as_corruption(exc: TruncatedBatchError) -> CorruptRecordError:
    return CorruptRecordError(f"inconsistent sizes inside a whole batch: {exc.reason}", position=exc.position)


def iter_batch_headers(
    buf: bytes | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    tail: str = TAIL_STOP,
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield `(position, header)` for each batch of any magic in `buf[start:end]`, in order.

    Requires `start` to be the start of a batch. Headers only (`peek_header`): no CRC check, no decompression
    (legacy wrappers report their outer offset as both base and last offset, see `decode_legacy_header`).
    Ensures each yielded batch lies wholly inside `[start, end)`. Torn tail and corruption: see the
    module docstring and docs/design.md, "Torn tail versus corruption" (`tail="stop"` ends silently,
    `tail="raise"` raises `TruncatedBatchError` at the torn batch's start). Raises `CorruptRecordError`/`UnsupportedFormatError` for corruption before the
    tail. The walk advances at least 26 bytes per batch, so it ends.
    """
    view, end = _bounds(buf, start, end, tail)
    pos = start
    while pos < end:
        frame = _frame(view, pos, end)
        if frame is None:
            if tail == TAIL_RAISE:
                raise _torn_tail(view, pos, end)
            return
        _, size_bytes = frame
        try:
            header = peek_header(view, pos)  # the batch lies wholly in the view: `_frame` checked its size
        except TruncatedBatchError as exc:
            raise _as_corruption(exc) from None
        yield pos, header
        pos += size_bytes


def iter_batches(
    buf: bytes | memoryview,
    start: int = 0,
    end: int | None = None,
    *,
    tail: str = TAIL_STOP,
    verify_crc: bool = True,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX_DEFAULT,
) -> Iterator[tuple[int, RecordBatch]]:
    """Yield `(position, batch)` with every batch of any magic in `buf[start:end]` fully decoded.

    Like `iter_batch_headers` (same framing, tail and corruption rules) but each batch is decoded
    whole: CRC (CRC-32C for v2, CRC-32 for v0/v1) when `verify_crc`, decompression bounded by
    `decompressed_bytes_max`, every record. Legacy wrappers come back with their inner messages and
    their first inner offset as base offset (`decode_legacy_entry`).
    """
    view, end = _bounds(buf, start, end, tail)
    pos = start
    while pos < end:
        frame = _frame(view, pos, end)
        if frame is None:
            if tail == TAIL_RAISE:
                raise _torn_tail(view, pos, end)
            return
        _, size_bytes = frame
        yield pos, _decode_whole(view, pos, verify_crc, decompressed_bytes_max)
        pos += size_bytes


def _decode_whole(view: memoryview, pos: int, verify_crc: bool, decompressed_bytes_max: int) -> RecordBatch:
    magic = view[pos + fmt.MAGIC_OFFSET]
    try:
        if magic == fmt.MAGIC_V2:
            return decode_batch(view, pos, verify_crc=verify_crc, decompressed_bytes_max=decompressed_bytes_max)
        return decode_legacy_entry(view, pos, verify_crc=verify_crc, decompressed_bytes_max=decompressed_bytes_max)
    except TruncatedBatchError as exc:
        raise _as_corruption(exc) from None


def decode_any_batch(
    buf: bytes | memoryview,
    pos: int = 0,
    *,
    verify_crc: bool = True,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX_DEFAULT,
) -> RecordBatch:
    """The fully decoded batch of any magic at `pos`, which must lie wholly inside `buf`.

    For a reader that jumps to a known batch start (an index entry). Raises `TruncatedBatchError` if the batch
    runs past the buffer (or 17 bytes or fewer are left), otherwise as `iter_batches`.
    """
    view = memoryview(buf)
    frame = _frame(view, pos, len(view))
    if frame is None:
        raise _torn_tail(view, pos, len(view))
    return _decode_whole(view, pos, verify_crc, decompressed_bytes_max)


def read_next_offset(buf: bytes | memoryview, start: int = 0, end: int | None = None) -> int | None:
    """The last batch's lastOffset + 1 in `buf[start:end]`, or None if it holds no whole batch.

    Kafka's `readNextOffset`, used by recovery on `.swap` segments. A torn tail is ignored; a legacy
    wrapper counts with its offset field (the offset of its last inner message). Headers only, so CRCs
    are not checked. Raises like `iter_batch_headers` for corruption before the tail.
    """
    next_offset = None
    for _, header in iter_batch_headers(buf, start, end):
        next_offset = header.next_offset
    return next_offset
