"""One home for the batch header layout: `segments.codec.format`'s struct layouts, which everything else follows.

The named offsets and widths of format.py must be where its structs put each field; the compiled kernels
(`segments.codec._scan_kernels` reading, `segments.codec._header_kernels.write_v2_header` writing, and
`cleaner._kernels.assemble_batches` using it) must read and write each field where `fmt.BATCH_V2` does, and
must not spell an offset of their own; and `segments.codec.batches.peek_header`, the one reader of a header by
position, must agree with all of them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import struct

import numpy as np
import pytest

import cleaner._kernels as cleaner_kernels
from segments.codec import _crc_kernels, _header_kernels, _scan_kernels
from segments.codec import format as fmt
from segments.codec.batches import peek_header
from segments.codec.errors import CorruptRecordError
from segments.codec.legacy import decode_legacy_header, encode_legacy_message
from segments.codec.records import BatchHeader, Record, batch_crc, encode_batch
from segments.codec.scan import scan

# The format.py name of each BatchHeader field (BatchHeader(*fmt.BATCH_V2.unpack(...)) relies on that order).
V2_NAMES = {"batch_length": "LENGTH"}


def _v2_constant(field: str) -> str:
    return V2_NAMES.get(field, field.upper())


def _spans(layout: struct.Struct) -> list[tuple[int, int]]:
    """(offset, width) of each field of `layout`, found by packing it with one field at a time all ones
    (-1, or the unsigned maximum) and the others zero: not by parsing the format string as format.py does."""
    zeros = [b"\0" * int(code[:-1]) if code.endswith("s") else 0 for code in _codes(layout)]
    spans = []
    for i, code in enumerate(_codes(layout)):
        values = list(zeros)
        width = struct.calcsize(">" + code)
        values[i] = b"\xff" * width if code.endswith("s") else (2 ** (8 * width) - 1 if code.isupper() else -1)
        raw = layout.pack(*values)
        ones = [k for k, b in enumerate(raw) if b]
        spans.append((ones[0], len(ones)))
        assert ones == list(range(ones[0], ones[0] + len(ones)))
    return spans


def _codes(layout: struct.Struct) -> list[str]:
    codes, count = [], ""
    for ch in layout.format[1:]:
        if ch.isdigit():
            count += ch
        else:
            codes.append(count + ch)
            count = ""
    return codes


# ---- format.py: the named ints are the struct layouts' ------------------------------------------------------


def test_every_v2_field_offset_and_width_is_where_batch_v2_puts_it():
    fields = [f.name for f in dataclasses.fields(BatchHeader)]
    spans = _spans(fmt.BATCH_V2)
    assert len(fields) == len(spans)
    for field, (offset, width) in zip(fields, spans):
        name = _v2_constant(field)
        assert (getattr(fmt, f"{name}_OFFSET"), getattr(fmt, f"{name}_BYTES")) == (offset, width), field
    assert fmt.RECORD_BATCH_OVERHEAD == sum(width for _, width in spans) == 61
    assert (fmt.LOG_OVERHEAD, fmt.HEADER_SIZE_UP_TO_MAGIC) == (fmt.PREFIX.size, fmt.PREFIX_UP_TO_MAGIC.size)


def test_every_legacy_field_offset_is_where_legacy_header_puts_it():
    offset, size, crc, magic, attributes = _spans(fmt.LEGACY_HEADER)
    assert (fmt.BASE_OFFSET_OFFSET, fmt.BASE_OFFSET_BYTES) == offset
    assert (fmt.LENGTH_OFFSET, fmt.LENGTH_BYTES) == size
    assert (fmt.LEGACY_CRC_OFFSET, fmt.LEGACY_CRC_BYTES) == crc
    assert (fmt.LEGACY_MAGIC_OFFSET, fmt.MAGIC_BYTES) == magic == (fmt.MAGIC_OFFSET, fmt.MAGIC_BYTES)
    assert (fmt.LEGACY_ATTRIBUTES_OFFSET, fmt.LEGACY_ATTRIBUTES_BYTES) == attributes
    assert fmt.LEGACY_TIMESTAMP_OFFSET == fmt.LEGACY_KEY_LENGTH_OFFSET_V0 == fmt.LEGACY_HEADER.size
    assert fmt.LEGACY_KEY_LENGTH_OFFSET_V1 == fmt.LEGACY_HEADER.size + fmt.LEGACY_TIMESTAMP.size
    assert fmt.LEGACY_KEY_LENGTH_OFFSET == {0: fmt.LEGACY_KEY_LENGTH_OFFSET_V0, 1: fmt.LEGACY_KEY_LENGTH_OFFSET_V1}


def test_the_named_ints_are_plain_ints_numba_can_freeze():
    for name in dir(fmt):
        if name.endswith(("_OFFSET", "_BYTES", "_OVERHEAD")) and name.isupper() and name != "LEGACY_KEY_LENGTH_OFFSET":
            assert type(getattr(fmt, name)) is int, name  # LEGACY_KEY_LENGTH_OFFSET, by magic, has _V0 / _V1 ints


# ---- the kernels read and write each field where fmt.BATCH_V2 does ---------------------------------------------

# Every field distinct and every byte of it non-zero, so a field read or written one byte off, or with the
# wrong width, shows. Valid as a header: gzip (the records are not looked at with headers_only), transactional.
FIELDS = dict(
    base_offset=0x0102030405060708,
    partition_leader_epoch=0x0A0B0C0D,
    attributes=0x0111,
    last_offset_delta=0x1A1B1C1D,
    base_timestamp=0x2122232425262728,
    max_timestamp=0x3132333435363738,
    producer_id=0x4142434445464748,
    producer_epoch=0x5152,
    base_sequence=0x61626364,
    records_count=0x00717273,
)
BODY = bytes(range(1, 24))


def _packed(fields: dict, body: bytes = BODY, crc: int | None = None) -> bytes:
    values = dict(fields, batch_length=fmt.BATCH_LENGTH_MIN_V2 + len(body), magic=fmt.MAGIC_V2, crc=0)
    raw = fmt.BATCH_V2.pack(*(values[f.name] for f in dataclasses.fields(BatchHeader))) + body
    values["crc"] = batch_crc(raw, 0, len(raw)) if crc is None else crc
    return fmt.BATCH_V2.pack(*(values[f.name] for f in dataclasses.fields(BatchHeader))) + body


def test_the_scan_kernels_read_every_v2_field_where_batch_v2_puts_it():
    first = encode_batch([Record(0, 5, b"k", b"v")], base_offset=0)  # so the batch under test is not at byte 0
    data = first + _packed(FIELDS)
    result = scan(data, headers_only=True)
    header = BatchHeader(*fmt.BATCH_V2.unpack_from(data, len(first)))
    assert peek_header(data, len(first)) == header
    assert result.n_batches == 2
    got = {
        "base_offset": result.base_offset[1],
        "batch_length": result.batch_size[1] - fmt.LOG_OVERHEAD,
        "partition_leader_epoch": result.partition_leader_epoch[1],
        "magic": result.magic[1],
        "crc": result.crc[1],
        "attributes": result.attributes[1],
        "last_offset_delta": result.last_offset[1] - result.base_offset[1],
        "base_timestamp": result.base_timestamp[1],
        "max_timestamp": result.max_timestamp[1],
        "producer_id": result.producer_id[1],
        "producer_epoch": result.producer_epoch[1],
        "base_sequence": result.base_sequence[1],
        "records_count": result.records_count[1],
    }
    assert {k: int(v) for k, v in got.items()} == dataclasses.asdict(header)
    assert int(result.records_pos[1]) == len(first) + fmt.RECORD_BATCH_OVERHEAD
    assert int(result.records_bytes[1]) == len(BODY)


@pytest.mark.parametrize(
    ("field", "value", "offset"),
    [
        ("attributes", 0x0007, fmt.ATTRIBUTES_OFFSET),  # codec 7
        ("last_offset_delta", -3, fmt.LAST_OFFSET_DELTA_OFFSET),
        ("records_count", -2, fmt.RECORDS_COUNT_OFFSET),
    ],
)
def test_the_scan_kernels_and_peek_header_blame_the_same_header_byte(field, value, offset):
    first = encode_batch([Record(0, 5, b"k", b"v")], base_offset=0)
    data = first + _packed(dict(FIELDS, **{field: value}))
    with pytest.raises(CorruptRecordError) as kernel:
        scan(data, headers_only=True)
    with pytest.raises(CorruptRecordError) as reader:
        peek_header(data, len(first))
    assert kernel.value.position == reader.value.position == len(first) + offset


@pytest.mark.parametrize("magic", [fmt.MAGIC_V0, fmt.MAGIC_V1])
def test_the_scan_kernels_read_legacy_fields_where_legacy_header_puts_them(magic):
    timestamp = 0x0102030405060708 if magic else fmt.NO_TIMESTAMP
    first = encode_legacy_message(7, b"a", b"b", magic=magic, timestamp=timestamp)
    entry = encode_legacy_message(0x1112131415161718, b"key", b"value", magic=magic, timestamp=timestamp)
    result = scan(first + entry)
    header = decode_legacy_header(entry)
    assert peek_header(first + entry, len(first)) == header
    assert (int(result.base_offset[1]), int(result.crc[1]), int(result.attributes[1])) == (
        header.base_offset, header.crc, header.attributes)
    assert (int(result.max_timestamp[1]), int(result.magic[1])) == (header.max_timestamp, magic)
    key = result.key_bytes(1)
    assert key == b"key"


def test_write_v2_header_writes_every_field_where_batch_v2_reads_it():
    for fields in (FIELDS, dict(FIELDS, partition_leader_epoch=-1, base_timestamp=-1, producer_id=-1,
                                producer_epoch=-1, base_sequence=-1, attributes=0x7FFF)):
        out = np.zeros(3 + fmt.RECORD_BATCH_OVERHEAD + 5, dtype=np.uint8)
        length = fmt.BATCH_LENGTH_MIN_V2 + len(BODY)
        _header_kernels.write_v2_header(
            out, 3, fields["base_offset"], length, fields["partition_leader_epoch"], fields["attributes"],
            fields["last_offset_delta"], fields["base_timestamp"], fields["max_timestamp"], fields["producer_id"],
            fields["producer_epoch"], fields["base_sequence"], fields["records_count"],
        )
        assert bytes(out[3 : 3 + fmt.RECORD_BATCH_OVERHEAD]) == _packed(fields, crc=0)[: fmt.RECORD_BATCH_OVERHEAD]
        assert not out[:3].any() and not out[3 + fmt.RECORD_BATCH_OVERHEAD :].any()


# ---- no kernel spells an offset of its own ------------------------------------------------------------------------

# The kernels that read or write header fields. Their only int literals are 0 and 1 (loop bounds, the next byte):
# every offset, width, flag and size is a `fmt.*` name. Listed exceptions are not about the layout.
KERNELS = {
    _scan_kernels: ["count_batches", "parse_headers", "check_headers", "_parse_legacy", "count_legacy_inner",
                    "_walk_legacy", "_walk_v2", "walk_records", "window_ranges", "fill_columns", "finish_window",
                    "finish_records"],
    _header_kernels: ["write_v2_header", "put_be"],
    _crc_kernels: ["_stamp_sse42", "_stamp_table", "_read_be"],  # it writes with _header_kernels.put_be
    cleaner_kernels: ["assemble_batches"],
}
NOT_LAYOUT = {
    ("put_be", 8), ("put_be", 0xFF),  # one byte at a time
    ("_read_be", 8),
    ("assemble_batches", 2), ("assemble_batches", 63),  # -(2**63), the smallest int64
}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in KERNELS.items() for n in names])
def test_header_kernels_take_every_offset_from_format(module, name):
    source = inspect.getsource(getattr(module, name).py_func)
    literals = [
        (node.value, source.splitlines()[node.lineno - 1].strip())
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value not in (0, 1)
        and (name, node.value) not in NOT_LAYOUT
    ]
    assert literals == [], f"{module.__name__}.{name} spells numbers format.py owns: {literals}"
