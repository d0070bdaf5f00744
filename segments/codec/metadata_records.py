"""KRaft metadata records: the values of `__cluster_metadata`'s records, decoded and encoded (pure).

Owns the byte grammar of the records logcleaner reads to learn each topic's policy (docs/format.md
section 3.6). Every record value is an `ApiMessageAndVersion` frame: unsigned varints
frame version (1), apiKey and record version, then the record in Kafka's flexible encoding — compact
strings (unsigned varint length + 1, 0 meaning null), 16-byte UUIDs, and tagged fields last (an unsigned
varint count, then tag, size and bytes of each). Keys are null.

Decoded here: TopicRecord (apiKey 2), ConfigRecord (4), RemoveTopicRecord (9) and the metadata
transaction markers BeginTransactionRecord (23), EndTransactionRecord (24), AbortTransactionRecord (25).
Any other apiKey comes back as `OtherMetadataRecord`. Fields are read in version 0's order; later versions
of these records only add fields after them, so a higher version decodes to the same fields.
It never opens a file (`segments.tools.kraft` reads the metadata log and its snapshots).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import CorruptRecordError
from .varint import decode_unsigned_varint, encode_unsigned_varint

__all__ = [
    "ConfigRecord",
    "ConfigResourceType",
    "MetadataRecord",
    "OtherMetadataRecord",
    "RemoveTopicRecord",
    "TopicRecord",
    "TransactionMarkerRecord",
    "decode_metadata_record",
    "encode_config_record",
    "encode_remove_topic_record",
    "encode_topic_record",
    "encode_transaction_marker",
]

FRAME_VERSION = 1  # ApiMessageAndVersion's own version, first varint of every value
UUID_BYTES = 16


class ApiKey(enum.IntEnum):
    TOPIC = 2
    CONFIG = 4
    REMOVE_TOPIC = 9
    BEGIN_TRANSACTION = 23
    END_TRANSACTION = 24
    ABORT_TRANSACTION = 25


class ConfigResourceType(enum.IntEnum):
    """ConfigRecord.ResourceType: Kafka's `ConfigResource.Type` ids."""

    TOPIC = 2
    BROKER = 4  # ResourceName "" is the cluster-wide default, else a broker's node id


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: bytes  # 16 bytes


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    resource_type: int
    resource_name: str
    name: str
    value: str | None  # None: the config was deleted (reverts to its default)


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    topic_id: bytes


@dataclass(frozen=True, slots=True)
class TransactionMarkerRecord:
    """Begin (23), End (24) or Abort (25) of a metadata transaction (KIP-868)."""

    api_key: int


@dataclass(frozen=True, slots=True)
class OtherMetadataRecord:
    api_key: int
    version: int


MetadataRecord = TopicRecord | ConfigRecord | RemoveTopicRecord | TransactionMarkerRecord | OtherMetadataRecord


class _Reader:
    """A cursor over one record value; errors carry the position inside the value."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def uvarint(self) -> int:
        value, self.pos = decode_unsigned_varint(self.data, self.pos, len(self.data))
        return value

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise CorruptRecordError(f"{what} needs {n} bytes, {len(self.data) - self.pos} left", position=self.pos)
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def int8(self, what: str) -> int:
        return int.from_bytes(self.take(1, what), "big", signed=True)

    def compact_string(self, what: str, *, nullable: bool = False) -> str | None:
        at = self.pos
        length = self.uvarint()
        if length == 0:
            if not nullable:
                raise CorruptRecordError(f"{what} is null", position=at)
            return None
        raw = self.take(length - 1, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError(f"{what} is not UTF-8", position=at) from None

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint(), "a tagged field")


def decode_metadata_record(value: bytes | memoryview | None) -> MetadataRecord:
    """The metadata record in one record value. Raises `CorruptRecordError` (position inside the value)."""
    if value is None:
        raise CorruptRecordError("a metadata record has a null value", position=0)
    r = _Reader(value)
    frame = r.uvarint()
    if frame != FRAME_VERSION:
        raise CorruptRecordError(f"expected ApiMessageAndVersion frame version {FRAME_VERSION}, found {frame}",
                                 position=0)
    api_key = r.uvarint()
    version = r.uvarint()
    if api_key == ApiKey.TOPIC:
        record: MetadataRecord = TopicRecord(r.compact_string("TopicRecord.Name") or "", r.take(UUID_BYTES, "a UUID"))
    elif api_key == ApiKey.CONFIG:
        record = ConfigRecord(
            r.int8("ConfigRecord.ResourceType"),
            r.compact_string("ConfigRecord.ResourceName") or "",
            r.compact_string("ConfigRecord.Name") or "",
            r.compact_string("ConfigRecord.Value", nullable=True),
        )
    elif api_key == ApiKey.REMOVE_TOPIC:
        record = RemoveTopicRecord(r.take(UUID_BYTES, "a UUID"))
    elif api_key in (ApiKey.BEGIN_TRANSACTION, ApiKey.END_TRANSACTION, ApiKey.ABORT_TRANSACTION):
        return TransactionMarkerRecord(api_key)
    else:
        return OtherMetadataRecord(api_key, version)
    if version == 0:  # a later version may append fields before its tagged fields: not ours to read
        r.tagged_fields()
        if r.pos != len(r.data):
            raise CorruptRecordError(f"{len(r.data) - r.pos} bytes after the record", position=r.pos)
    return record


# ---- encoding (for tests and tools that build metadata logs) -------------------------------------------


def _frame(api_key: int, body: bytes, version: int = 0) -> bytes:
    return (encode_unsigned_varint(FRAME_VERSION) + encode_unsigned_varint(api_key)
            + encode_unsigned_varint(version) + body + b"\x00")  # no tagged fields


def _compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode("utf-8")
    return encode_unsigned_varint(len(raw) + 1) + raw


def encode_topic_record(name: str, topic_id: bytes) -> bytes:
    assert len(topic_id) == UUID_BYTES
    return _frame(ApiKey.TOPIC, _compact_string(name) + topic_id)


def encode_config_record(resource_type: int, resource_name: str, name: str, value: str | None) -> bytes:
    body = resource_type.to_bytes(1, "big", signed=True) + _compact_string(resource_name) + _compact_string(name)
    return _frame(ApiKey.CONFIG, body + _compact_string(value))


def encode_remove_topic_record(topic_id: bytes) -> bytes:
    assert len(topic_id) == UUID_BYTES
    return _frame(ApiKey.REMOVE_TOPIC, topic_id)


def encode_transaction_marker(api_key: int) -> bytes:
    """Begin (23), End (24) or Abort (25) with no tagged fields (Begin's Name is a tagged field)."""
    return _frame(api_key, b"")
