"""The exceptions of `segments/`: one root, and subclasses that carry where and what.

Every error that comes from data (a file, a buffer) names the file (when known), the byte position and
what was expected versus found. The pure codec raises with `path=None` and positions relative to the
buffer it was given; the file layer calls `located()` to add the path and the file position.
"""

from __future__ import annotations

import os

# how a refused path is described (the errors below, and `segments.files.pathcheck`)
LINK_REFUSED = "is a symbolic link; logcleaner does not follow links inside a log dir"
NOT_REGULAR = "not a regular file; logcleaner reads and writes only regular files inside a log dir"


def display_path(path: str | bytes | os.PathLike) -> str:
    """`path` on one printable line: undecodable bytes as `\\xNN`, control and invisible characters escaped."""
    raw = os.fsencode(path)
    text = raw.decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


class SegmentError(Exception):
    """Root of every error raised by `segments/`."""


class CorruptRecordError(SegmentError):
    """Bytes that do not form a valid batch/message: bad CRC, impossible length, bad varint, etc."""

    def __init__(self, reason: str, *, position: int, path: str | os.PathLike | None = None) -> None:
        self.reason = reason
        self.position = position
        self.path = None if path is None else os.fspath(path)
        where = f"{self.path}: " if self.path is not None else ""
        super().__init__(f"{where}byte {position}: {reason}")

    def located(self, path: str | os.PathLike, base_position: int = 0) -> "CorruptRecordError":
        """The same error, placed in `path` at `base_position + position`."""
        return type(self)(self.reason, position=base_position + self.position, path=path)


class TruncatedBatchError(CorruptRecordError):
    """The data ends inside a batch. At the end of a file this is a torn tail, not corruption."""

    @classmethod
    def at_end_of_file(cls, remaining: int, declared: int, *, position: int,
                       path: str | os.PathLike | None = None) -> "TruncatedBatchError":
        """The batch at `position` needs more than the `remaining` bytes of the file; `declared` is its declared
        size (-1 if unknown). The size is named: one far past the end is more likely a corrupt length."""
        if declared <= 0:
            return cls(f"incomplete batch at the end of the file ({remaining} bytes; a torn tail)", position=position,
                       path=path)
        return cls(f"incomplete batch at the end of the file: it declares {declared} bytes, the file has {remaining} "
                   "from here (a torn tail, or a corrupt length)", position=position, path=path)


class UnsupportedFormatError(CorruptRecordError):
    """A valid-looking batch this version cannot handle (unknown magic, compression codec 5..7)."""


class CorruptIndexError(SegmentError):
    """An index file violates its invariants (entries out of order, pointing past the log, untrimmed)."""

    def __init__(self, reason: str, *, path: str | os.PathLike, position: int) -> None:
        self.reason = reason
        self.path = os.fspath(path)
        self.position = position
        super().__init__(f"{self.path}: byte {position}: {reason}")



class CheckpointError(SegmentError):
    """A checkpoint file cannot be parsed."""

    def __init__(self, reason: str, *, path: str | os.PathLike, line: int) -> None:
        self.reason = reason
        self.path = os.fspath(path)
        self.line = line
        super().__init__(f"{self.path}: line {line}: {reason}")


class OffsetOutOfRangeError(SegmentError):
    """A read asked for an offset outside [log start, log end]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int, path: str) -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.path = path
        super().__init__(
            f"{path}: offset {offset} is out of range [{log_start_offset}, {log_end_offset}]"
        )


class LogStateError(SegmentError):
    """An operation that the log's current state does not allow (closed log, append below the end, ...)."""


class LockTimeoutError(SegmentError):
    """An advisory lock on a partition directory could not be taken in time."""


class LogDirOwnedError(SegmentError):
    """Another process holds the write lock on a log dir's `.lock`: a running Kafka broker owns the log dir.

    `holder` says who, as found from the lock itself (`pid`, when the lock tells it) and `/proc`.
    """

    def __init__(self, log_dir: str | os.PathLike, holder: str, pid: int | None) -> None:
        self.log_dir = os.fspath(log_dir)
        self.holder = holder
        self.pid = pid
        super().__init__(f"{holder} owns {self.log_dir}: stop it first")


class IndexAppendError(SegmentError, ValueError):
    """An index entry that the index's invariants do not allow: out of order, position going backwards, index full.

    The entry came from the caller, so this is first of all a programmer error (hence also a `ValueError`).
    During recovery the entries come from a log being re-read, and then it means that log is corrupt at
    `offset` (Kafka's `InvalidOffsetException`), which is why it is a typed error that carries the file.
    """

    def __init__(self, reason: str, *, path: str | os.PathLike, offset: int) -> None:
        self.reason = reason
        self.path = os.fspath(path)
        self.offset = offset
        super().__init__(f"{self.path}: offset {offset}: {reason}")


class IndexOffsetOverflowError(IndexAppendError):
    """An offset outside `[segment base, segment base + 2^31 - 1]`: it cannot be stored as a relative int32.

    Kafka's `IndexOffsetOverflowException`; old logs that hit it are split into segments during recovery.
    """


class LinkRefusedError(SegmentError):
    """A path inside a log dir (a partition directory, a segment, index, checkpoint or lock file) is a
    symbolic link. Nothing inside a log dir is followed: the link's target is never read nor written."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        super().__init__(f"{display_path(self.path)}: {LINK_REFUSED}")


class NotRegularFileError(SegmentError):
    """A path inside a log dir that logcleaner would open (a segment, index, snapshot, checkpoint or lock file)
    is not a regular file: a FIFO, socket, device or directory. It is refused before it is opened (opening a
    FIFO blocks until someone writes to it). `kind` says what it is, e.g. "a FIFO (named pipe)"."""

    def __init__(self, path: str | os.PathLike, kind: str) -> None:
        self.path = os.fspath(path)
        self.kind = kind
        super().__init__(f"{display_path(self.path)}: is {kind}, {NOT_REGULAR}")
