"""Kafka-format segment storage: the codec, segment and index files, checkpoints and the partition log.

Public API is listed in `__all__`; modules not named here are internal.
"""

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
