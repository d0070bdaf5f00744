"""Text checkpoint files (docs/format.md 3.5) and `partition.metadata`: their grammar, reading and writing.

Owns the names of the standard checkpoint files, the pure encode/decode of their text
(`encode_*`/`decode_*` over bytes), reading them from disk, and writing them the durable way: always
through `FileOps.write_atomic` (`<name>.tmp`, fsync, rename over `<name>`, fsync the directory), so a
crash leaves either the old or the new file. It does not decide what the offsets mean or take locks:
`update_offset_checkpoint` is a read-merge-write, and the caller must hold whatever lock serialises
writers of that file (the cleaner manager's lock for `cleaner-offset-checkpoint`).

Rules: writers separate fields with one space and sort offset entries by (topic, partition), so equal content
gives equal bytes; readers split on whitespace, read a missing file as empty, and raise `CheckpointError`
naming the file and the 1-based line for anything malformed. The grammar of each file and the reader's rules
in full, following Kafka's `CheckpointFile`: docs/format.md section 3.5.

A log dir's offset checkpoint holds a line per partition and is read and rewritten at every round, so an
offset checkpoint's parsed entries are kept per path (`_OffsetCheckpointCache`): a read still reads the file's
bytes, and parses them only when they differ from the bytes last read or written here; an update re-encodes only
the lines it changes. The files stay the one source of truth (docs/design.md, "Many partitions").
"""

from __future__ import annotations

import base64
import bisect
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..codec.errors import CheckpointError
from ..files.fileio import DEFAULT_FILE_OPS, FileOps
from ..files.pathcheck import check_regular_fd, open_no_follow

__all__ = [
    "CHECKPOINT_BYTES_MAX",
    "CLEANER_OFFSET_CHECKPOINT",
    "LEADER_EPOCH_CHECKPOINT",
    "LOG_START_OFFSET_CHECKPOINT",
    "PARTITION_METADATA_FILE",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "PartitionMetadata",
    "decode_leader_epoch_checkpoint",
    "decode_offset_checkpoint",
    "decode_partition_metadata",
    "encode_leader_epoch_checkpoint",
    "encode_offset_checkpoint",
    "read_leader_epoch_checkpoint",
    "cached_offset_checkpoint",
    "read_offset_checkpoint",
    "read_partition_metadata",
    "update_offset_checkpoint",
    "write_leader_epoch_checkpoint",
    "write_offset_checkpoint",
]

# ---- names and versions ---------------------------------------------------------------------------------
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"  # log.dir root: first dirty offset per partition
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"  # log.dir root
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"  # log.dir root: high watermarks
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"  # log.dir root
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"  # partition directory
# logcleaner's own state files (Kafka ignores them): scheduling state per log dir, generations per partition
SURVIVORSHIP_CHECKPOINT = "logcleaner-survivorship-checkpoint"  # log.dir root (cleaner.survivorship)
GENERATIONS_FILE = ".logcleaner-generations"  # partition directory (cleaner.generations)
PARTITION_METADATA_FILE = "partition.metadata"  # partition directory

OFFSET_CHECKPOINT_VERSION = 0
LEADER_EPOCH_CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0

# A log dir with 200,000 partitions and 249-character topic names needs about 52 MiB.
CHECKPOINT_BYTES_MAX = 64 * 1024 * 1024
PARTITION_METADATA_BYTES_MAX = 4096

_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECIMAL = re.compile(r"-?[0-9]+")  # ASCII digits only: Python's int() would also take "1_0" and "٣"
_TOPIC_ID = re.compile(r"[A-Za-z0-9_-]{22}")  # a 16-byte UUID in unpadded base64url
_ZERO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"

TopicPartition = tuple[str, int]


# ---- decoding -------------------------------------------------------------------------------------------


def _int(text: str, *, what: str, low: int, high: int, path: str | os.PathLike, line: int) -> int:
    if not _DECIMAL.fullmatch(text):
        raise CheckpointError(f"expected {what} as a decimal integer, found {text!r}", path=path, line=line)
    value = int(text)
    if not low <= value <= high:
        raise CheckpointError(f"{what} {value} is outside [{low}, {high}]", path=path, line=line)
    return value


def _lines(data: bytes, path: str | os.PathLike, bytes_max: int) -> list[str]:
    """The file's lines without their terminators (`\\n`, and a `\\r` before it, as Java's readLine)."""
    if len(data) > bytes_max:
        raise CheckpointError(f"{len(data)} bytes is more than the limit of {bytes_max}", path=path, line=0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CheckpointError(f"not UTF-8: {exc.reason}", path=path, line=line) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the terminator of the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _decode_entries(
    data: bytes, *, path: str | os.PathLike, version: int, fields: int, bytes_max: int
) -> list[tuple[int, list[str]]]:
    """Check the version and count lines; the entry lines as (line number, fields)."""
    lines = _lines(data, path, bytes_max)
    if not lines:
        return []
    found = _int(lines[0].strip(), what="the version", low=_INT64_MIN, high=_INT64_MAX, path=path, line=1)
    if found != version:
        raise CheckpointError(f"expected version {version}, found {found}", path=path, line=1)
    if len(lines) == 1:
        return []
    count = _int(lines[1].strip(), what="the entry count", low=0, high=_INT64_MAX, path=path, line=2)
    entries = []
    for number, text in enumerate(lines[2:], start=3):
        parts = text.split()
        if len(parts) != fields:
            raise CheckpointError(
                f"expected {fields} fields separated by whitespace, found {len(parts)} in {text!r}",
                path=path,
                line=number,
            )
        entries.append((number, parts))
    if len(entries) != count:
        # Point at the first extra line, or at the line where the first missing entry should be.
        line = 3 + count if len(entries) > count else 3 + len(entries)
        raise CheckpointError(f"expected {count} entries, found {len(entries)}", path=path, line=line)
    return entries


def decode_offset_checkpoint(
    data: bytes, *, path: str | os.PathLike = "<bytes>", checkpoint_bytes_max: int = CHECKPOINT_BYTES_MAX
) -> dict[TopicPartition, int]:
    """Parse an offset checkpoint (`topic partition offset` lines); see docs/format.md section 3.5 for the rules."""
    result: dict[TopicPartition, int] = {}
    for line, (topic, partition_text, offset_text) in _decode_entries(
        data, path=path, version=OFFSET_CHECKPOINT_VERSION, fields=3, bytes_max=checkpoint_bytes_max
    ):
        partition = _int(partition_text, what="the partition", low=0, high=_INT32_MAX, path=path, line=line)
        offset = _int(offset_text, what="the offset", low=_INT64_MIN, high=_INT64_MAX, path=path, line=line)
        if (topic, partition) in result:
            raise CheckpointError(f"partition {topic}-{partition} is listed twice", path=path, line=line)
        result[(topic, partition)] = offset
    return result


def decode_leader_epoch_checkpoint(
    data: bytes, *, path: str | os.PathLike = "<bytes>", checkpoint_bytes_max: int = CHECKPOINT_BYTES_MAX
) -> list[tuple[int, int]]:
    """Parse a `leader-epoch-checkpoint` (`epoch startOffset` lines) into `(epoch, start_offset)` in file order.

    The order and monotonicity of epochs are not checked here: that is the leader-epoch cache's business.
    """
    result = []
    for line, (epoch_text, offset_text) in _decode_entries(
        data, path=path, version=LEADER_EPOCH_CHECKPOINT_VERSION, fields=2, bytes_max=checkpoint_bytes_max
    ):
        epoch = _int(epoch_text, what="the epoch", low=-(2**31), high=_INT32_MAX, path=path, line=line)
        offset = _int(offset_text, what="the start offset", low=_INT64_MIN, high=_INT64_MAX, path=path, line=line)
        result.append((epoch, offset))
    return result


# ---- encoding -------------------------------------------------------------------------------------------


def _check_int(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an int in [{low}, {high}], got {value!r}")
    return value


def encode_offset_checkpoint(entries: Mapping[TopicPartition, int]) -> bytes:
    """The bytes of an offset checkpoint holding `entries`, sorted by (topic, partition).

    Requires topics to be non-empty strings without whitespace (which would break the line grammar),
    partitions non-negative int32s and offsets int64s; raises `ValueError` otherwise.
    """
    lines = [str(OFFSET_CHECKPOINT_VERSION), str(len(entries))]
    for (topic, partition), offset in sorted(entries.items()):
        _check_entry(topic, partition, offset)
        lines.append(f"{topic} {partition} {offset}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def _check_entry(topic: object, partition: object, offset: object) -> None:
    if not isinstance(topic, str) or not topic or any(ch.isspace() for ch in topic):
        raise ValueError(f"topic must be a non-empty string without whitespace, got {topic!r}")
    _check_int(partition, "partition", 0, _INT32_MAX)
    _check_int(offset, "offset", _INT64_MIN, _INT64_MAX)


def encode_leader_epoch_checkpoint(entries: Iterable[tuple[int, int]]) -> bytes:
    """The bytes of a `leader-epoch-checkpoint` holding `(epoch, start_offset)` entries in the given order."""
    entries = list(entries)
    lines = [str(LEADER_EPOCH_CHECKPOINT_VERSION), str(len(entries))]
    for epoch, offset in entries:
        _check_int(epoch, "epoch", -(2**31), _INT32_MAX)
        _check_int(offset, "start offset", _INT64_MIN, _INT64_MAX)
        lines.append(f"{epoch} {offset}")
    return ("\n".join(lines) + "\n").encode("utf-8")


# ---- files ------------------------------------------------------------------------------------------------


def _read_limited(path: str | os.PathLike, bytes_max: int) -> bytes | None:
    """The file's bytes (at most `bytes_max + 1` are read, so the caller can see it is too big), or None.

    Raises `LinkRefusedError` for a link, `NotRegularFileError` for a FIFO, socket, device or directory.
    """
    try:
        # A checkpoint that is a symbolic link is refused, never read. O_NONBLOCK: opening a FIFO would
        # otherwise block until someone writes to it; it is refused by the fstat below instead.
        fd = open_no_follow(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    try:
        size = check_regular_fd(fd, path).st_size
        # Read what the file holds now, plus one byte to see it grew: not a `bytes_max + 1` buffer for every read
        # (64 MiB by default: a fresh mapping per read, of a file read at every round).
        want = min(size, bytes_max) + 1
        chunks = []
        total = 0
        while total <= bytes_max:
            chunk = os.read(fd, min(want, bytes_max + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            want = max(want, 1 << 16)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _OffsetCheckpointCache:
    """One offset checkpoint's bytes as last read or written by this process, and its entries.

    `version` grows whenever the content changes; `foreign_version` only when the bytes found on disk are not
    the ones last read or written here (someone else wrote the file). An update rewrites the canonical bytes
    (`encode_offset_checkpoint`'s) by splicing the lines it changes, so its cost does not grow with the
    number of entries beyond copying the bytes."""

    __slots__ = ("lock", "known", "data", "entries", "canonical", "keys", "version", "foreign_version")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.known = False  # False: `data` is not known to be what the file holds (never read, a write failed)
        self.data: bytes | None = None
        self.entries: dict[TopicPartition, int] = {}
        self.canonical = False  # `data` is encode_offset_checkpoint(entries), and `keys` the sorted keys
        self.keys: list[TopicPartition] = []
        self.version = 0
        self.foreign_version = 0

    def load(self, data: bytes | None, path: str | os.PathLike, bytes_max: int) -> None:
        """Take the file's bytes as read now (None: no file); parsed only when they changed."""
        if self.known and data == self.data:
            return
        entries = {} if data is None else decode_offset_checkpoint(data, path=path, checkpoint_bytes_max=bytes_max)
        self.known, self.data, self.entries, self.canonical, self.keys = True, data, entries, False, []
        self.version += 1
        self.foreign_version += 1

    def update(self, updates: Mapping[TopicPartition, int], removals: Iterable[TopicPartition]) -> bytes:
        """Apply `removals` then `updates` (checked as `encode_offset_checkpoint` checks them); the new bytes."""
        for (topic, partition), offset in updates.items():
            _check_entry(topic, partition, offset)
        entries, keys = self.entries, self.keys
        if not self.canonical or self.data is None:
            self.data = encode_offset_checkpoint(entries)
            keys[:] = sorted(entries)
            self.canonical = True
        data = self.data
        body = data[data.index(b"\n", data.index(b"\n") + 1) + 1:]  # after the version and count lines
        for key in removals:
            if key in entries:
                start, end = _line_span(body, key)
                body = body[:start] + body[end:]
                del entries[key]
                del keys[bisect.bisect_left(keys, key)]
        for key, offset in updates.items():
            line = f"{key[0]} {key[1]} {offset}\n".encode("utf-8")
            if key in entries:
                start, end = _line_span(body, key)
            else:
                i = bisect.bisect_left(keys, key)
                start = end = _line_span(body, keys[i])[0] if i < len(keys) else len(body)
                keys.insert(i, key)
            body = body[:start] + line + body[end:]
            entries[key] = offset
        self.data = f"{OFFSET_CHECKPOINT_VERSION}\n{len(keys)}\n".encode() + body
        self.version += 1
        return self.data


def _line_span(body: bytes, key: TopicPartition) -> tuple[int, int]:
    """Where `key`'s line is in the entry lines `body` of a canonical offset checkpoint: [start, end)."""
    prefix = f"{key[0]} {key[1]} ".encode("utf-8")  # a topic holds no whitespace: no other line starts so
    start = 0 if body.startswith(prefix) else body.index(b"\n" + prefix) + 1
    return start, body.index(b"\n", start) + 1


_cache_lock = threading.Lock()
_caches: dict[str, _OffsetCheckpointCache] = {}


def _cache_of(path: str | os.PathLike) -> _OffsetCheckpointCache:
    key = os.path.abspath(path)
    with _cache_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = _OffsetCheckpointCache()
        return cache


def read_offset_checkpoint(
    path: str | os.PathLike, *, checkpoint_bytes_max: int = CHECKPOINT_BYTES_MAX
) -> dict[TopicPartition, int]:
    """Read an offset checkpoint into `{(topic, partition): offset}`; a missing file gives `{}`.

    Raises `CheckpointError` (file, line) as described in docs/format.md section 3.5. The file is read every
    time; it is parsed again only when its bytes changed (see the module docstring).
    """
    entries, _, _ = cached_offset_checkpoint(path, checkpoint_bytes_max=checkpoint_bytes_max)
    return dict(entries)


def cached_offset_checkpoint(
    path: str | os.PathLike, *, checkpoint_bytes_max: int = CHECKPOINT_BYTES_MAX
) -> tuple[Mapping[TopicPartition, int], int, int]:
    """The offset checkpoint at `path` as read now, without copying its entries: (a read-only view of them,
    which later writes through this module change in place; the content's version; the foreign version,
    which changes only when someone other than this process changed the file). Raises as
    `read_offset_checkpoint`."""
    cache = _cache_of(path)
    with cache.lock:  # read under the lock: bytes read before another thread's update would be taken as newer
        cache.load(_read_limited(path, checkpoint_bytes_max), path, checkpoint_bytes_max)
        return MappingProxyType(cache.entries), cache.version, cache.foreign_version


def write_offset_checkpoint(
    path: str | os.PathLike, entries: Mapping[TopicPartition, int], *, file_ops: FileOps = DEFAULT_FILE_OPS
) -> None:
    """Replace the offset checkpoint at `path` with `entries`: `<path>.tmp`, fsync, rename, fsync the directory.

    Raises `ValueError` for entries `encode_offset_checkpoint` rejects, before any file is touched.
    """
    file_ops.write_atomic(path, encode_offset_checkpoint(entries))


def update_offset_checkpoint(
    path: str | os.PathLike,
    updates: Mapping[TopicPartition, int],
    removals: Iterable[TopicPartition] = (),
    *,
    file_ops: FileOps = DEFAULT_FILE_OPS,
    hint: bool = False,
) -> dict[TopicPartition, int]:
    """Read the checkpoint at `path`, drop `removals`, then set `updates`, and write it atomically.

    The order is Kafka's (`LogCleanerManager.updateCheckpoints`): a partition both removed and updated
    ends up with the updated value. Threads of this process are serialised by the file's cache lock
    (the file is read under it too); writers in other processes by the lock the caller holds. Returns what was written. With `hint` (a file
    nothing depends on for safety: the survivorship checkpoint), nothing is fsynced and an unreadable file is
    replaced instead of raising. Raises `CheckpointError` if the current
    file cannot be parsed (nothing is written then).
    """
    cache = _cache_of(path)
    with cache.lock:  # read under the lock, as in cached_offset_checkpoint
        try:
            cache.load(_read_limited(path, CHECKPOINT_BYTES_MAX), path, CHECKPOINT_BYTES_MAX)
        except CheckpointError:
            if not hint:
                raise
            cache.load(None, path, CHECKPOINT_BYTES_MAX)  # a lost hint: start again from no entries
        try:
            encoded = cache.update(updates, removals)
            file_ops.write_atomic(path, encoded, durable=not hint)
        except BaseException:
            cache.known = False  # what the file holds is not known here now: the next read parses it again
            raise
        return dict(cache.entries)


def read_leader_epoch_checkpoint(
    path: str | os.PathLike, *, checkpoint_bytes_max: int = CHECKPOINT_BYTES_MAX
) -> list[tuple[int, int]]:
    """Read a `leader-epoch-checkpoint` into `[(epoch, start_offset), ...]`; a missing file gives `[]`."""
    data = _read_limited(path, checkpoint_bytes_max)
    if data is None:
        return []
    return decode_leader_epoch_checkpoint(data, path=path, checkpoint_bytes_max=checkpoint_bytes_max)


def write_leader_epoch_checkpoint(
    path: str | os.PathLike, entries: Iterable[tuple[int, int]], *, file_ops: FileOps = DEFAULT_FILE_OPS
) -> None:
    """Replace the `leader-epoch-checkpoint` at `path` atomically (as `write_offset_checkpoint`)."""
    file_ops.write_atomic(path, encode_leader_epoch_checkpoint(entries))


# ---- partition.metadata -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """The content of `partition.metadata`: `version: 0` and `topic_id: <22-char base64url UUID>`."""

    version: int
    topic_id: str

    @property
    def topic_id_bytes(self) -> bytes:
        """The topic id as its 16 UUID bytes."""
        return base64.urlsafe_b64decode(self.topic_id + "==")


def _key_value(text: str, key: str, *, path: str | os.PathLike, line: int) -> str:
    parts = text.split()
    if len(parts) != 2 or parts[0] != key:
        raise CheckpointError(f"expected '{key} <value>', found {text!r}", path=path, line=line)
    return parts[1]


def decode_partition_metadata(data: bytes, *, path: str | os.PathLike = "<bytes>") -> PartitionMetadata:
    """Parse `partition.metadata`. Raises `CheckpointError` (file, line) for a missing or malformed line,
    a version other than 0, a topic id that is not 22 base64url characters or is the zero UUID (Kafka
    rejects it), or anything but blank lines after the two lines."""
    lines = _lines(data, path, PARTITION_METADATA_BYTES_MAX)
    if len(lines) < 2:
        raise CheckpointError(f"expected 2 lines, found {len(lines)}", path=path, line=len(lines) + 1)
    version_text = _key_value(lines[0], "version:", path=path, line=1)
    version = _int(version_text, what="the version", low=_INT64_MIN, high=_INT64_MAX, path=path, line=1)
    if version != PARTITION_METADATA_VERSION:
        raise CheckpointError(f"expected version {PARTITION_METADATA_VERSION}, found {version}", path=path, line=1)
    topic_id = _key_value(lines[1], "topic_id:", path=path, line=2)
    if not _TOPIC_ID.fullmatch(topic_id):
        raise CheckpointError(f"expected a 22-character base64url topic id, found {topic_id!r}", path=path, line=2)
    if topic_id == _ZERO_TOPIC_ID:
        raise CheckpointError("the topic id is the zero UUID", path=path, line=2)
    for number, text in enumerate(lines[2:], start=3):
        if text.strip():
            raise CheckpointError(f"expected the end of the file, found {text!r}", path=path, line=number)
    return PartitionMetadata(version, topic_id)


def read_partition_metadata(path: str | os.PathLike) -> PartitionMetadata | None:
    """Read `partition.metadata`; None if the file does not exist (a partition without a topic id)."""
    data = _read_limited(path, PARTITION_METADATA_BYTES_MAX)
    if data is None:
        return None
    return decode_partition_metadata(data, path=path)
