"""The five codecs of docs/format.md section 1.6: round trips, stream framing, limits and corrupt input."""

from __future__ import annotations

import gzip
import random
import struct

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from segments.codec import format as fmt
from segments.codec.compression import compress, decompress
from segments.codec.errors import CorruptRecordError, SegmentError, TruncatedBatchError, UnsupportedFormatError
from segments.codec.legacy import _with_kafka_broken_lz4_header_checksum, _xxh32_short

CODECS = [fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD]
CODEC_IDS = [fmt.COMPRESSION_NAMES[c] for c in CODECS]
# Compressible, and long enough for several xerial chunks (32 KiB) and lz4 blocks (64 KiB).
SAMPLE = b"".join(b"record-%06d:" % i + bytes(range(i % 7, 40)) for i in range(3000))


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=3000))
def test_decompress_of_compress_returns_the_data(codec, data):
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_multi_block_data_round_trips(codec):
    assert len(SAMPLE) > 2 * 64 * 1024
    assert decompress(codec, compress(codec, SAMPLE)) == SAMPLE


def test_codec_none_returns_the_bytes_unchanged():
    assert compress(fmt.COMPRESSION_NONE, memoryview(b"abc")) == b"abc"


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_decompress_with_codec_5_to_7_is_unsupported(codec):
    with pytest.raises(UnsupportedFormatError) as info:
        decompress(codec, b"\x00" * 10, position=40)
    assert info.value.position == 40


# ---- stream formats --------------------------------------------------------------------------------------


def test_gzip_output_is_a_standard_gzip_stream():
    assert gzip.decompress(compress(fmt.COMPRESSION_GZIP, SAMPLE)) == SAMPLE


def test_snappy_output_uses_xerial_framing_with_32k_chunks():
    out = compress(fmt.COMPRESSION_SNAPPY, SAMPLE)
    magic, version, compatible = fmt.XERIAL_HEADER.unpack_from(out)
    assert (magic, version, compatible) == (fmt.XERIAL_MAGIC, 1, 1)
    chunks = 0
    pos = fmt.XERIAL_HEADER.size
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        pos += 4 + length
        chunks += 1
    assert pos == len(out)
    assert chunks == -(-len(SAMPLE) // fmt.XERIAL_BLOCK_BYTES)


def test_lz4_output_is_a_frame_with_kafkas_flags_and_block_size():
    out = compress(fmt.COMPRESSION_LZ4, SAMPLE)
    assert out[:4] == fmt.LZ4_FRAME_MAGIC
    assert (out[4], out[5]) == (0x60, 0x40)
    assert lz4.frame.decompress(out) == SAMPLE


def test_zstd_output_is_a_standard_frame():
    assert zstandard.ZstdDecompressor().decompress(compress(fmt.COMPRESSION_ZSTD, SAMPLE)) == SAMPLE


def test_raw_snappy_without_framing_is_accepted():
    import cramjam

    raw = bytes(cramjam.snappy.compress_raw(SAMPLE))
    assert decompress(fmt.COMPRESSION_SNAPPY, raw) == SAMPLE


def test_xerial_version_ints_written_little_endian_are_ignored():
    out = bytearray(compress(fmt.COMPRESSION_SNAPPY, SAMPLE))
    out[8:16] = struct.pack("<ii", 1, 1)
    assert decompress(fmt.COMPRESSION_SNAPPY, bytes(out)) == SAMPLE


def test_lz4_frame_with_content_checksum_and_size_is_accepted():
    frame = lz4.frame.compress(SAMPLE, content_checksum=True, store_size=True, block_checksum=True)
    assert decompress(fmt.COMPRESSION_LZ4, frame) == SAMPLE


def test_zstd_frame_without_content_size_is_accepted():
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(SAMPLE)
    assert decompress(fmt.COMPRESSION_ZSTD, frame) == SAMPLE


def test_zstd_streamed_frame_is_accepted():
    compressor = zstandard.ZstdCompressor().compressobj()
    frame = compressor.compress(SAMPLE) + compressor.flush()
    assert decompress(fmt.COMPRESSION_ZSTD, frame) == SAMPLE


# ---- the magic-0 lz4 quirk ----------------------------------------------------------------------------------


def test_magic_0_lz4_frame_with_kafkas_broken_header_checksum_decodes_only_with_magic_0():
    broken = _with_kafka_broken_lz4_header_checksum(compress(fmt.COMPRESSION_LZ4, SAMPLE))
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(broken)  # a strict frame decoder rejects it
    assert decompress(fmt.COMPRESSION_LZ4, broken, magic=fmt.MAGIC_V0) == SAMPLE
    with pytest.raises(CorruptRecordError):
        decompress(fmt.COMPRESSION_LZ4, broken, magic=fmt.MAGIC_V1)


def test_xxh32_used_for_the_broken_checksum_matches_reference_values_and_lz4_frame():
    assert (_xxh32_short(b""), _xxh32_short(b"a"), _xxh32_short(b"abc")) == (0x02CC5D05, 0x550D7456, 0x32D153FF)
    for flags in ({}, {"content_checksum": True}, {"block_checksum": True}, {"block_size": lz4.frame.BLOCKSIZE_MAX4MB}):
        frame = lz4.frame.compress(b"x", store_size=False, **flags)
        assert frame[6] == (_xxh32_short(frame[4:6]) >> 8) & 0xFF  # the correct header checksum


def test_lenient_lz4_reader_accepts_block_checksums_and_stored_blocks():
    frame = lz4.frame.compress(bytes(random.Random(1).randbytes(5000)), block_checksum=True, store_size=False)
    assert decompress(fmt.COMPRESSION_LZ4, frame, magic=fmt.MAGIC_V0) == lz4.frame.decompress(frame)


# ---- interoperability with kafka-python's codecs ------------------------------------------------------------

KAFKA_PYTHON_ENCODERS = {
    fmt.COMPRESSION_GZIP: kafka_codec.gzip_encode,
    fmt.COMPRESSION_SNAPPY: kafka_codec.snappy_encode,
    fmt.COMPRESSION_LZ4: kafka_codec.lz4_encode,
    fmt.COMPRESSION_ZSTD: kafka_codec.zstd_encode,
}
KAFKA_PYTHON_DECODERS = {
    fmt.COMPRESSION_GZIP: kafka_codec.gzip_decode,
    fmt.COMPRESSION_SNAPPY: kafka_codec.snappy_decode,
    fmt.COMPRESSION_LZ4: kafka_codec.lz4_decode,
    fmt.COMPRESSION_ZSTD: kafka_codec.zstd_decode,
}


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_kafka_python_decodes_what_we_compress(codec):
    assert KAFKA_PYTHON_DECODERS[codec](compress(codec, SAMPLE)) == SAMPLE


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_we_decompress_what_kafka_python_compresses(codec):
    assert decompress(codec, KAFKA_PYTHON_ENCODERS[codec](SAMPLE)) == SAMPLE


# ---- limits -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_output_beyond_decompressed_bytes_max_is_corrupt(codec):
    stream = compress(codec, SAMPLE)
    with pytest.raises(CorruptRecordError, match="limit"):
        decompress(codec, stream, decompressed_bytes_max=len(SAMPLE) - 1)
    assert decompress(codec, stream, decompressed_bytes_max=len(SAMPLE)) == SAMPLE


def test_magic_0_lz4_output_beyond_the_limit_is_corrupt():
    broken = _with_kafka_broken_lz4_header_checksum(compress(fmt.COMPRESSION_LZ4, SAMPLE))
    with pytest.raises(CorruptRecordError, match="limit"):
        decompress(fmt.COMPRESSION_LZ4, broken, magic=fmt.MAGIC_V0, decompressed_bytes_max=1000)


# ---- corrupt input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [fmt.MAGIC_V0, fmt.MAGIC_V2])
@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_a_truncated_stream_is_corrupt_at_or_after_the_given_position(codec, magic):
    stream = compress(codec, SAMPLE)
    if magic == fmt.MAGIC_V0 and codec == fmt.COMPRESSION_LZ4:
        stream = _with_kafka_broken_lz4_header_checksum(stream)
    for cut in (1, len(stream) // 2, len(stream) - 1):
        with pytest.raises(CorruptRecordError) as info:
            decompress(codec, stream[:cut], position=1000, magic=magic)
        assert type(info.value) is CorruptRecordError  # never mistaken for a torn tail
        assert info.value.position >= 1000


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_garbage_is_corrupt(codec):
    with pytest.raises(CorruptRecordError):
        decompress(codec, bytes(range(7, 107)), position=61)


def test_xerial_chunk_length_past_the_stream_is_corrupt_at_the_chunk():
    out = bytearray(compress(fmt.COMPRESSION_SNAPPY, b"abc" * 100))
    out[16:20] = struct.pack(">i", 10_000)
    with pytest.raises(CorruptRecordError, match="xerial chunk") as info:
        decompress(fmt.COMPRESSION_SNAPPY, bytes(out), position=61)
    assert info.value.position == 61 + 16


@pytest.mark.parametrize("magic", [fmt.MAGIC_V0, fmt.MAGIC_V1])
@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_byte_damage_raises_only_segment_errors(codec, magic, data):
    stream = bytearray(compress(codec, SAMPLE[:3000]))
    if magic == fmt.MAGIC_V0 and codec == fmt.COMPRESSION_LZ4:
        stream = bytearray(_with_kafka_broken_lz4_header_checksum(bytes(stream)))
    for _ in range(data.draw(st.integers(1, 4))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        stream = stream[: data.draw(st.integers(0, len(stream)))]
    try:
        decompress(codec, bytes(stream), magic=magic)
    except SegmentError as exc:
        assert isinstance(exc, CorruptRecordError) and not isinstance(exc, TruncatedBatchError)
