"""Kafka-format segment storage: the codec, segment and index files, checkpoints and the partition log.

Public API is listed in `__all__`; modules not named here are internal.
"""

from . import format
from .compression import compress, decompress
from .errors import (
    CheckpointError,
    CorruptIndexError,
    CorruptRecordError,
    LockTimeoutError,
    LogStateError,
    OffsetOutOfRangeError,
    SegmentError,
    TruncatedBatchError,
    UnsupportedFormatError,
)
from .fileio import DEFAULT_FILE_OPS, FileOps
from .records import (
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

__all__ = [
    "BatchHeader",
    "CheckpointError",
    "CorruptIndexError",
    "CorruptRecordError",
    "DEFAULT_FILE_OPS",
    "FileOps",
    "Header",
    "LockTimeoutError",
    "LogStateError",
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
    "decompress",
    "encode_batch",
    "encode_batch_from_region",
    "encode_control_batch",
    "encode_record",
    "format",
]
