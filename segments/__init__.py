"""Kafka-format segment storage: the codec, segment and index files, checkpoints and the partition log.

Public API is listed in `__all__`; modules not named here are internal.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use (`__getattr__`)
    from .codec import format
    from .codec.batches import iter_batch_headers, iter_batches
    from .codec.compression import compress, decompress
    from .codec.errors import (
        CheckpointError,
        CorruptIndexError,
        CorruptRecordError,
        LinkRefusedError,
        LockTimeoutError,
        LogDirOwnedError,
        LogStateError,
        NotRegularFileError,
        OffsetOutOfRangeError,
        SegmentError,
        TruncatedBatchError,
        UnsupportedFormatError,
    )
    from .codec.legacy import decode_legacy_entry, decode_legacy_header
    from .codec.records import (
        BatchHeader,
        Header,
        Record,
        RecordBatch,
        decode_batch,
        decode_batch_header,
        decode_control_key,
        decode_end_txn_marker,
        encode_batch,
        encode_batch_from_region,
        encode_control_batch,
        encode_record,
        make_attributes,
    )
    from .files.fileio import DEFAULT_FILE_OPS, FileOps
    from .partition.log import LogConfig, PartitionLog, parse_partition_dir_name

# The public names and the modules they live in. The package imports none of them itself (PEP 562): importing
# one light module, `segments.codec.errors` say, must not load numpy, the compression codecs and the partition
# layer with it (the start-up of `logcleaner --help`, issue 19).
_SOURCES = {
    ".codec": ("format",),
    ".codec.batches": ("iter_batch_headers", "iter_batches"),
    ".codec.compression": ("compress", "decompress"),
    ".codec.errors": (
        "CheckpointError", "CorruptIndexError", "CorruptRecordError", "LinkRefusedError", "LockTimeoutError",
        "LogDirOwnedError", "LogStateError", "NotRegularFileError", "OffsetOutOfRangeError", "SegmentError",
        "TruncatedBatchError", "UnsupportedFormatError",
    ),
    ".codec.legacy": ("decode_legacy_entry", "decode_legacy_header"),
    ".codec.records": (
        "BatchHeader", "Header", "Record", "RecordBatch", "decode_batch", "decode_batch_header", "decode_control_key",
        "decode_end_txn_marker", "encode_batch", "encode_batch_from_region", "encode_control_batch", "encode_record",
        "make_attributes",
    ),
    ".files.fileio": ("DEFAULT_FILE_OPS", "FileOps"),
    ".partition.log": ("LogConfig", "PartitionLog", "parse_partition_dir_name"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except AttributeError:  # a submodule not imported yet (`format`), found as `from <module> import <name>` would
        value = importlib.import_module(f"{module}.{name}", __name__)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


__all__ = [
    "BatchHeader",
    "CheckpointError",
    "CorruptIndexError",
    "CorruptRecordError",
    "DEFAULT_FILE_OPS",
    "FileOps",
    "Header",
    "LinkRefusedError",
    "LogConfig",
    "PartitionLog",
    "LockTimeoutError",
    "LogDirOwnedError",
    "LogStateError",
    "NotRegularFileError",
    "OffsetOutOfRangeError",
    "Record",
    "RecordBatch",
    "SegmentError",
    "TruncatedBatchError",
    "UnsupportedFormatError",
    "compress",
    "decode_batch",
    "decode_batch_header",
    "decode_control_key",
    "decode_end_txn_marker",
    "decode_legacy_entry",
    "decode_legacy_header",
    "decompress",
    "encode_batch",
    "encode_batch_from_region",
    "encode_control_batch",
    "encode_record",
    "format",
    "iter_batch_headers",
    "iter_batches",
    "make_attributes",
    "parse_partition_dir_name",
]
