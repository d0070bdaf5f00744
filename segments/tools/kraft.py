"""Reading a KRaft cluster's metadata log: which topics exist and what their configs say.

Owns turning `__cluster_metadata-0/` into a `ClusterMetadata`: the latest snapshot
(`<end offset>-<epoch>.checkpoint`, the batch format of a segment between SnapshotHeader and
SnapshotFooter control records) is read first, then the log's segments from the snapshot's end offset on
(older segments are deleted once a snapshot covers them, so on an older broker the topics live in the
snapshot alone). Records are applied in offset order as Kafka's controller replays them: TopicRecord adds
a topic, RemoveTopicRecord removes it with its configs, ConfigRecord sets or (null value) deletes one
config of a topic, of a broker (by node id) or of the cluster (empty name); records inside a metadata
transaction count only once its EndTransactionRecord is read (AbortTransactionRecord drops them).
Control batches are skipped; a torn tail (a broker writing, or a crash) ends the read.

Read-only: it opens files for reading only, never follows a link and never opens a non-regular file.
Errors name the file and byte (`CorruptRecordError`), or the file and what is wrong (`LogStateError`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..codec import format as fmt
from ..codec.batches import iter_batches
from ..codec.errors import CorruptRecordError, LogStateError, display_path
from ..codec.metadata_records import (
    ConfigRecord,
    ConfigResourceType,
    MetadataRecord,
    RemoveTopicRecord,
    TopicRecord,
    TransactionMarkerRecord,
    decode_metadata_record,
)

__all__ = ["METADATA_PARTITION", "ClusterMetadata", "find_metadata_log", "read_cluster_metadata"]

METADATA_PARTITION = "__cluster_metadata-0"
_SNAPSHOT_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_BEGIN, _END, _ABORT = 23, 24, 25


@dataclass(frozen=True)
class ClusterMetadata:
    """What a metadata log says about topics and configs, as of `end_offset`."""

    directory: str  # the __cluster_metadata-0 directory read
    snapshot: str | None  # the snapshot file name the read started from
    end_offset: int  # offset after the last record applied
    topics: Mapping[str, bytes] = field(default_factory=dict)  # live topic name -> topic id
    removed_topics: Mapping[str, bytes] = field(default_factory=dict)  # name -> id of topics removed and not recreated
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    broker_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # "" = cluster default

    @property
    def label(self) -> str:
        """How a message names this source: "KRaft metadata in <dir>"."""
        return f"KRaft metadata in {display_path(self.directory)}"


def find_metadata_log(candidates: list[str | os.PathLike]) -> Path | None:
    """The first `<dir>/__cluster_metadata-0` that is a real directory (not a link), or None."""
    for base in candidates:
        path = Path(base) / METADATA_PARTITION
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def _regular_file_bytes(path: Path) -> bytes:
    """The bytes of a regular file, never following a link nor opening a FIFO or device for long."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LogStateError(f"{display_path(path)}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as file:
            return file.read()
    finally:
        os.close(fd)


class _Replay:
    """The controller's replay of metadata records, restricted to topics and configs."""

    def __init__(self) -> None:
        self.topics: dict[str, bytes] = {}
        self.names_by_id: dict[bytes, str] = {}
        self.removed: dict[str, bytes] = {}
        self.configs: dict[tuple[int, str], dict[str, str]] = {}
        self.pending: list[MetadataRecord] | None = None  # inside a metadata transaction

    def record(self, rec: MetadataRecord) -> None:
        if isinstance(rec, TransactionMarkerRecord):
            if rec.api_key == _BEGIN:
                self.pending = []
            elif rec.api_key == _END:
                pending, self.pending = self.pending or [], None
                for r in pending:
                    self._apply(r)
            elif rec.api_key == _ABORT:
                self.pending = None
            return
        if self.pending is not None:
            self.pending.append(rec)
        else:
            self._apply(rec)

    def _apply(self, rec: MetadataRecord) -> None:
        if isinstance(rec, TopicRecord):
            self.topics[rec.name] = rec.topic_id
            self.names_by_id[rec.topic_id] = rec.name
            self.removed.pop(rec.name, None)
        elif isinstance(rec, RemoveTopicRecord):
            name = self.names_by_id.pop(rec.topic_id, None)
            if name is not None and self.topics.get(name) == rec.topic_id:
                del self.topics[name]
                self.removed[name] = rec.topic_id
                self.configs.pop((ConfigResourceType.TOPIC, name), None)
        elif isinstance(rec, ConfigRecord):
            configs = self.configs.setdefault((rec.resource_type, rec.resource_name), {})
            if rec.value is None:
                configs.pop(rec.name, None)
            else:
                configs[rec.name] = rec.value

    def result(self, directory: Path, snapshot: str | None, end_offset: int) -> ClusterMetadata:
        topic_configs = {name: dict(c) for (kind, name), c in self.configs.items()
                         if kind == ConfigResourceType.TOPIC and c and name in self.topics}
        broker_configs = {name: dict(c) for (kind, name), c in self.configs.items()
                          if kind == ConfigResourceType.BROKER and c}
        return ClusterMetadata(str(directory), snapshot, end_offset, dict(self.topics), dict(self.removed),
                               topic_configs, broker_configs)


def _replay_file(replay: _Replay, path: Path, from_offset: int) -> int:
    """Apply the records at or past `from_offset` in one file; the offset after the last one read."""
    next_offset = from_offset
    try:
        for position, batch in iter_batches(_regular_file_bytes(path)):
            header = batch.header
            if not header.is_control and header.magic == fmt.MAGIC_V2:
                for record in batch.records:
                    if record.offset >= from_offset:
                        try:
                            replay.record(decode_metadata_record(record.value))
                        except CorruptRecordError as exc:
                            raise CorruptRecordError(f"metadata record at offset {record.offset}: {exc.reason}",
                                                     position=position, path=path) from None
            next_offset = max(next_offset, header.next_offset)
    except CorruptRecordError as exc:
        raise (exc if exc.path is not None else exc.located(path)) from None
    return next_offset


def read_cluster_metadata(directory: str | os.PathLike) -> ClusterMetadata:
    """Topics and configs from a `__cluster_metadata-0` directory: the latest snapshot, then the log.

    Raises `CorruptRecordError` (file and byte) for data that does not decode, `LogStateError` for a
    snapshot or segment that is not a regular file, `OSError` when the directory cannot be read.
    """
    directory = Path(directory)
    snapshots: list[tuple[int, int, str]] = []
    segments: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        if (m := _SNAPSHOT_NAME.match(name)) is not None:
            snapshots.append((int(m.group(1)), int(m.group(2)), name))
        elif name.endswith(fmt.LOG_SUFFIX) and len(name) == fmt.OFFSET_DIGITS + len(fmt.LOG_SUFFIX) \
                and name[: fmt.OFFSET_DIGITS].isdigit():
            segments.append((int(name[: fmt.OFFSET_DIGITS]), name))
    replay = _Replay()
    start = 0
    snapshot_name = None
    if snapshots:
        start, _, snapshot_name = max(snapshots)
        _replay_file(replay, directory / snapshot_name, 0)
        if replay.pending is not None:
            raise LogStateError(f"{display_path(directory / snapshot_name)}: the snapshot ends inside a "
                                "metadata transaction")
    end = start
    segments.sort()
    for i, (_, name) in enumerate(segments):
        if i + 1 < len(segments) and segments[i + 1][0] <= start:
            continue  # wholly below the snapshot
        end = max(end, _replay_file(replay, directory / name, start))
    replay.pending = None  # an unfinished transaction at the end of the log is not committed
    return replay.result(directory, snapshot_name, end)
