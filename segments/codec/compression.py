"""Kafka's five compression codecs over byte strings (pure, no I/O).

Owns the stream formats of `docs/format.md` section 1.6: gzip (RFC 1952), snappy with xerial
snappy-java framing (and raw snappy on read), lz4 frame (Kafka's FLG=0x60/BD=0x40 on write; any
valid frame on read, plus the broken header checksum of magic-0 messages), and zstd (streaming, the
content size may be absent). All codecs are C/Rust-backed packages.

Every decompression is bounded by `decompressed_bytes_max`; passing it raises rather than allocating
without limit. Errors are `CorruptRecordError` with the position the caller passes in.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.block
import lz4.frame
import zstandard

from . import format as fmt
from .errors import CorruptRecordError, UnsupportedFormatError

__all__ = ["compress", "decompress", "DECOMPRESSED_BYTES_MAX_DEFAULT"]

# A bound on one batch's decompressed records region. Kafka bounds it by max.decompressed.message.bytes;
# our default is generous (far above max.message.bytes) but still finite.
DECOMPRESSED_BYTES_MAX_DEFAULT = 256 * 1024 * 1024

_GZIP_LEVEL = 6  # java.util.zip.GZIPOutputStream's default, as Kafka's
_ZSTD_LEVEL = 3  # Kafka's default zstd level
_LZ4_STEP_BYTES_MIN = 64 * 1024  # first output allocation of an lz4 decode; grows by steps
_ZSTD_INPUT_CHUNK_BYTES = 128 * 1024  # bounds the output held between limit checks
_LZ4_BLOCK_SIZES = {4: 64 * 1024, 5: 256 * 1024, 6: 1024 * 1024, 7: 4 * 1024 * 1024}
_LZ4_UINT32 = struct.Struct("<I")


def compress(codec: int, data: bytes | memoryview) -> bytes:
    """Compress `data` as Kafka's producer would for `codec` (1..4). Codec 0 returns the bytes as given."""
    if codec == fmt.COMPRESSION_NONE:
        return bytes(data)
    if codec == fmt.COMPRESSION_GZIP:
        obj = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: gzip container
        return obj.compress(data) + obj.flush()
    if codec == fmt.COMPRESSION_SNAPPY:
        return _xerial_compress(bytes(data))
    if codec == fmt.COMPRESSION_LZ4:
        return lz4.frame.compress(
            bytes(data),
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            store_size=False,
        )
    if codec == fmt.COMPRESSION_ZSTD:
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(bytes(data))
    raise ValueError(f"unknown compression codec {codec}")


def decompress(
    codec: int,
    data: bytes | memoryview,
    *,
    position: int = 0,
    magic: int = fmt.MAGIC_V2,
    decompressed_bytes_max: int = DECOMPRESSED_BYTES_MAX_DEFAULT,
) -> bytes:
    """Decompress one batch's (or legacy wrapper's) compressed region.

    `position` is where the compressed bytes start (used in error messages); `magic` selects the
    magic-0 lz4 quirk. Raises `UnsupportedFormatError` for an unknown codec and `CorruptRecordError`
    for a stream that does not decode or decodes to more than `decompressed_bytes_max` bytes.
    """
    try:
        if codec == fmt.COMPRESSION_GZIP:
            out = _gzip_decompress(data, decompressed_bytes_max)
        elif codec == fmt.COMPRESSION_SNAPPY:
            out = _snappy_decompress(bytes(data), decompressed_bytes_max)
        elif codec == fmt.COMPRESSION_LZ4:
            out = _lz4_decompress(bytes(data), magic, decompressed_bytes_max)
        elif codec == fmt.COMPRESSION_ZSTD:
            out = _zstd_decompress(data, decompressed_bytes_max)
        else:
            # position 0: the handler below adds `position` to every error raised in this block
            raise UnsupportedFormatError(f"unknown compression codec {codec}", position=0)
    except CorruptRecordError as exc:
        raise type(exc)(exc.reason, position=position + exc.position) from None
    except (
        zlib.error,
        RuntimeError,
        ValueError,
        zstandard.ZstdError,
        cramjam.DecompressionError,
        lz4.block.LZ4BlockError,  # raised by the lenient magic-0 lz4 path; it subclasses only Exception
    ) as exc:
        name = fmt.COMPRESSION_NAMES.get(codec, codec)
        raise CorruptRecordError(f"{name} stream does not decode: {exc}", position=position) from None
    if len(out) > decompressed_bytes_max:
        raise CorruptRecordError(
            f"decompressed size {len(out)} exceeds the limit of {decompressed_bytes_max} bytes",
            position=position,
        )
    return out


def _gzip_decompress(data: bytes | memoryview, limit: int) -> bytes:
    obj = zlib.decompressobj(47)  # 32 + 15: accept gzip or zlib headers
    out = obj.decompress(data, limit + 1)
    if not obj.eof and len(out) <= limit:
        raise CorruptRecordError("gzip stream ends early", position=0)
    return out


def _xerial_compress(data: bytes) -> bytes:
    parts = [fmt.XERIAL_HEADER.pack(fmt.XERIAL_MAGIC, fmt.XERIAL_VERSION, fmt.XERIAL_VERSION)]
    for start in range(0, len(data), fmt.XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(data[start : start + fmt.XERIAL_BLOCK_BYTES]))
        parts.append(fmt.XERIAL_CHUNK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    if len(data) < fmt.XERIAL_HEADER.size or not data.startswith(fmt.XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    # The two version ints are ignored: some producers write them little-endian.
    pos = fmt.XERIAL_HEADER.size
    parts = []
    total = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise CorruptRecordError("xerial chunk length is cut short", position=pos)
        (length,) = fmt.XERIAL_CHUNK_LENGTH.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise CorruptRecordError(f"xerial chunk of {length} bytes runs past the stream", position=pos - 4)
        chunk = bytes(cramjam.snappy.decompress_raw(data[pos : pos + length]))
        total += len(chunk)
        if total > limit:
            raise CorruptRecordError(f"decompressed size exceeds the limit of {limit} bytes", position=pos)
        parts.append(chunk)
        pos += length
    return b"".join(parts)


def _lz4_decompress(data: bytes, magic: int, limit: int) -> bytes:
    if magic == fmt.MAGIC_V0:
        return _lz4_frame_decompress_lenient(data, limit)
    if not data.startswith(fmt.LZ4_FRAME_MAGIC):
        raise CorruptRecordError("lz4 stream does not start with the frame magic", position=0)
    # Bounded steps: python-lz4 allocates `max_length` up front, so asking for the whole limit at once
    # would cost a huge allocation per batch.
    decoder = lz4.frame.LZ4FrameDecompressor()
    step = max(_LZ4_STEP_BYTES_MIN, 8 * len(data))
    parts = [decoder.decompress(data, max_length=min(step, limit + 1))]
    total = len(parts[0])
    while not decoder.eof and total <= limit and not decoder.needs_input:
        chunk = decoder.decompress(b"", max_length=min(step, limit + 1 - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    if total > limit:
        raise CorruptRecordError(f"decompressed size exceeds the limit of {limit} bytes", position=0)
    if not decoder.eof:
        raise CorruptRecordError("lz4 frame ends early", position=0)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _lz4_frame_decompress_lenient(data: bytes, limit: int) -> bytes:
    """Decode an lz4 frame without checking the header checksum byte.

    Kafka's magic-0 lz4 messages compute that byte over magic+descriptor (a known bug), so a strict
    frame decoder rejects them. Blocks must be independent, as Kafka writes them.
    """
    if len(data) < 7 or not data.startswith(fmt.LZ4_FRAME_MAGIC):
        raise CorruptRecordError("lz4 stream does not start with the frame magic", position=0)
    flg, bd = data[4], data[5]
    block_checksum = bool(flg & 0x10)
    has_content_size = bool(flg & 0x08)
    has_dict_id = bool(flg & 0x01)
    block_bytes_max = _LZ4_BLOCK_SIZES.get((bd >> 4) & 0x07)
    if block_bytes_max is None:
        raise CorruptRecordError(f"lz4 frame declares an invalid block size (BD 0x{bd:02x})", position=5)
    pos = 6 + (8 if has_content_size else 0) + (4 if has_dict_id else 0) + 1  # + header checksum
    parts = []
    total = 0
    while True:
        if pos + 4 > len(data):
            raise CorruptRecordError("lz4 frame ends before its end mark", position=pos)
        (size,) = _LZ4_UINT32.unpack_from(data, pos)
        pos += 4
        if size == 0:
            break
        stored = bool(size & 0x80000000)
        size &= 0x7FFFFFFF
        if size > block_bytes_max or pos + size > len(data):
            raise CorruptRecordError(f"lz4 block of {size} bytes runs past the frame", position=pos - 4)
        block = data[pos : pos + size]
        chunk = block if stored else lz4.block.decompress(block, uncompressed_size=block_bytes_max)
        pos += size + (4 if block_checksum else 0)
        total += len(chunk)
        if total > limit:
            raise CorruptRecordError(f"decompressed size exceeds the limit of {limit} bytes", position=pos)
        parts.append(chunk)
    return b"".join(parts)


def _zstd_decompress(data: bytes | memoryview, limit: int) -> bytes:
    decoder = zstandard.ZstdDecompressor().decompressobj()
    parts = []
    total = 0
    view = memoryview(data)
    for start in range(0, len(view), _ZSTD_INPUT_CHUNK_BYTES):
        chunk = decoder.decompress(view[start : start + _ZSTD_INPUT_CHUNK_BYTES])
        total += len(chunk)
        if total > limit:
            raise CorruptRecordError(f"decompressed size exceeds the limit of {limit} bytes", position=0)
        parts.append(chunk)
    if not decoder.eof:
        raise CorruptRecordError("zstd frame ends early", position=0)
    return b"".join(parts)
