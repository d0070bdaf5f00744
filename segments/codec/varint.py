"""Zigzag base-128 varints and varlongs (docs/format.md section 1.4), pure Python.

The object path (tools, tests, rebuilding batches) uses these; the bulk scan has its own compiled
decoder with identical rules. Decoding enforces Kafka's limits: at most 5 bytes for a varint and 10 for
a varlong, and a value that fits its width.
"""

from __future__ import annotations

from . import format as fmt
from .errors import CorruptRecordError, TruncatedBatchError

__all__ = [
    "encode_varint", "decode_varint", "decode_varlong", "varint_size",
    "encode_unsigned_varint", "decode_unsigned_varint",
]


def encode_varint(value: int) -> bytes:
    """Zigzag-encode a signed int64 (a varint is the same encoding for values that fit 32 bits)."""
    assert -(2**63) <= value < 2**63, value
    return _base128(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def _base128(z: int) -> bytes:
    """7 bits a byte, least significant group first, the high bit set on every byte but the last."""
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def varint_size(value: int) -> int:
    """Bytes `encode_varint(value)` produces."""
    z = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def _decode(buf: bytes | memoryview, pos: int, end: int, bytes_max: int, bits: int) -> tuple[int, int]:
    z = 0
    shift = 0
    for i in range(bytes_max):
        if pos + i >= end:
            raise TruncatedBatchError("varint runs past the end of the data", position=pos)
        b = buf[pos + i]
        z |= (b & 0x7F) << shift
        if not b & 0x80:
            if z >> bits:
                raise CorruptRecordError(f"varint does not fit {bits} bits", position=pos)
            return (z >> 1) ^ -(z & 1), pos + i + 1
        shift += 7
    raise CorruptRecordError(f"varint longer than {bytes_max} bytes", position=pos)


def decode_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode a 32-bit zigzag varint at `pos`; returns (value, next position)."""
    return _decode(buf, pos, end, fmt.VARINT_BYTES_MAX, 32)


def decode_varlong(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode a 64-bit zigzag varlong at `pos`; returns (value, next position)."""
    return _decode(buf, pos, end, fmt.VARLONG_BYTES_MAX, 64)


def encode_unsigned_varint(value: int) -> bytes:
    """Base-128 encode an unsigned int32 without zigzag (Kafka's flexible-version lengths and counts)."""
    assert 0 <= value < 2**32, value
    return _base128(value)


def decode_unsigned_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode an unsigned (not zigzag) varint of at most 5 bytes and 32 bits at `pos`; (value, next position)."""
    value = 0
    for i in range(fmt.VARINT_BYTES_MAX):
        if pos + i >= end:
            raise TruncatedBatchError("unsigned varint runs past the end of the data", position=pos)
        b = buf[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if value >> 32:
                raise CorruptRecordError("unsigned varint does not fit 32 bits", position=pos)
            return value, pos + i + 1
    raise CorruptRecordError(f"unsigned varint longer than {fmt.VARINT_BYTES_MAX} bytes", position=pos)
