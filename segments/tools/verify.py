"""Read-only verification of log directories, partition directories and segment files.

Owns the checks behind `logcleaner verify`: every batch's CRC and framing (records included, and the keys of
control records), offsets strictly increasing within and across segments and inside each segment's range
(from its base, below the next segment's base, within base + 2^31-1), indexes
consistent with the log (sanity and every entry pointing at a batch start whose predecessor ends before
the entry's offset; the time index ending with the segment's max timestamp), transaction indexes,
readable checkpoints, and no leftover temporary files (`.cleaned`, `.swap`, `.deleted`, `.tmp`).
Paths are classified as `segments.files.pathcheck.find_partition_dirs` does: a symbolic link inside a log dir
(a partition directory, a segment, index or checkpoint file) is a problem and is never followed, and so
is a directory of segment files whose name is not `<topic>-<partition>` (the cleaner would ignore it).
A FIFO, socket, device or directory under a name the cleaner opens (`segments.files.pathcheck`, "Regular files
only") is a problem and is never opened (opening a FIFO blocks).

It never writes, creates or renames anything. Each problem is one `Problem` naming the file and the
byte position. A missing `.index`/`.timeindex` is not a problem (open rebuilds them, as Kafka does). A file
or directory that cannot be read (permission denied) is a problem naming it and what was denied; the rest
is still checked.

`scan_log_file` is the one reader of a whole `.log` file for the tools: `verify` and `dump` both walk a file
with it, so they give one diagnosis of the same bytes (the scan's: `segments.codec.scan`, Kafka's order of checks).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..codec import format as fmt
from ..codec.errors import (
    LINK_REFUSED,
    NOT_REGULAR,
    CheckpointError,
    CorruptIndexError,
    CorruptRecordError,
    LinkRefusedError,
    NotRegularFileError,
    TruncatedBatchError,
    display_path,
)
from ..codec.records import decode_control_key
from ..files.index import OffsetIndex, TimeIndex
from ..files.names import parse_segment_file_name
from ..files.pathcheck import (
    describe_file_kind,
    find_partition_dirs,
    is_partition_file_name,
    os_error_reason,
)
from ..files.txnindex import TransactionIndex
from ..partition.checkpoint import read_offset_checkpoint

if TYPE_CHECKING:
    from ..codec.scan import ScanResult

__all__ = ["Problem", "VerifySummary", "scan_log_file", "verify_paths"]

_READ_CHUNK_BYTES = 8 * 1024 * 1024
_ROOT_CHECKPOINTS = (
    "cleaner-offset-checkpoint",
    "recovery-point-offset-checkpoint",
    "replication-offset-checkpoint",
    "log-start-offset-checkpoint",
)


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    position: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: byte {self.position}: {self.reason}"


@dataclass(slots=True)
class VerifySummary:
    """Counts of what was checked, and the problems found."""

    partitions: int = 0
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    problems: list[Problem] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.problems is None:
            self.problems = []


@dataclass(frozen=True, slots=True)
class _SegmentScan:
    positions: np.ndarray
    base_offsets: np.ndarray
    last_offsets: np.ndarray
    max_timestamps: np.ndarray
    records: int
    valid_bytes: int


def verify_paths(paths: list[str | os.PathLike]) -> VerifySummary:
    """Verify each path: a log dir (its partition dirs), a partition dir, or one `.log`/index file."""
    summary = VerifySummary()
    for path in paths:
        path = Path(path)
        if path.is_dir():
            partitions, refused = find_partition_dirs([path])
            if not (len(partitions) == 1 and partitions[0] == path) and not any(r.path == path for r in refused):
                _verify_checkpoints(path.resolve() if path.is_symlink() else path, summary)  # a log dir
            for item in refused:
                if item.failed:
                    summary.problems.append(Problem(display_path(item.path), 0, item.reason))
            for partition in partitions:
                _verify_partition(partition, summary)
        elif _is_link(path, summary) or _is_special(path, summary):
            continue
        elif path.is_file():
            _verify_file(path, summary)
        else:
            summary.problems.append(Problem(str(path), 0, "no such file or directory"))
    return summary


def _os_problem(exc: OSError, path: Path) -> Problem:
    """A file or directory that cannot be opened or listed, as a problem: its path and what was denied."""
    return Problem(display_path(exc.filename if exc.filename is not None else path), 0, os_error_reason(exc))


def _is_link(path: Path, summary: VerifySummary) -> bool:
    """Whether `path` is a symbolic link (then a problem is recorded and it must not be opened)."""
    if not path.is_symlink():
        return False
    summary.problems.append(Problem(display_path(path), 0, LINK_REFUSED))
    return True


def _is_special(path: Path, summary: VerifySummary) -> bool:
    """Whether `path` exists and is not a regular file (then a problem is recorded and it must not be opened)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    if stat.S_ISREG(mode):
        return False
    summary.problems.append(Problem(display_path(path), 0, f"is {describe_file_kind(mode)}, {NOT_REGULAR}"))
    return True


def _regular(path: Path) -> bool:
    """Whether `path` is a regular file (not a link, FIFO, socket, device or directory): safe to open."""
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _verify_checkpoints(root: Path, summary: VerifySummary) -> None:
    for name in _ROOT_CHECKPOINTS:
        try:
            read_offset_checkpoint(root / name)
        except CheckpointError as exc:
            summary.problems.append(Problem(exc.path, 0, f"line {exc.line}: {exc.reason}"))
        except LinkRefusedError as exc:
            summary.problems.append(Problem(display_path(exc.path), 0, LINK_REFUSED))
        except NotRegularFileError as exc:
            summary.problems.append(Problem(display_path(exc.path), 0, f"is {exc.kind}, {NOT_REGULAR}"))
        except OSError as exc:
            summary.problems.append(_os_problem(exc, root / name))
        if (root / (name + ".tmp")).exists():
            summary.problems.append(Problem(str(root / (name + ".tmp")), 0, "leftover temporary checkpoint file"))


def _verify_file(path: Path, summary: VerifySummary) -> None:
    parsed = parse_segment_file_name(path.name)
    if parsed is None:
        summary.problems.append(Problem(str(path), 0, "not a segment file name (<20-digit offset>.<kind>)"))
        return
    if parsed.kind == fmt.LOG_SUFFIX:
        summary.segments += 1
        scan = _scan_log(path, summary, allow_torn_tail=False)
        if scan is not None:
            _check_batch_offsets(path, parsed.offset, scan, None, summary)
    elif parsed.kind in (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX):
        log_path = path.with_name(fmt.offset_file_name(parsed.offset, fmt.LOG_SUFFIX))
        scan = _scan_log(log_path, VerifySummary(), allow_torn_tail=True) if _regular(log_path) else None
        _check_indexes(path.parent, parsed.offset, scan, summary, only=parsed.kind, is_active=False)
    elif parsed.kind == fmt.TXN_INDEX_SUFFIX:
        _check_txn_index(path, parsed.offset, summary)


def _verify_partition(directory: Path, summary: VerifySummary) -> None:
    summary.partitions += 1
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        summary.problems.append(_os_problem(exc, directory))
        return
    bases = []
    for name in names:
        if _is_link(directory / name, summary):
            continue
        if is_partition_file_name(name) and _is_special(directory / name, summary):
            continue  # never opened; a .log of that name is not a segment
        if name.endswith(".tmp"):
            summary.problems.append(Problem(str(directory / name), 0, "leftover temporary file"))
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        if parsed.state:
            summary.problems.append(
                Problem(str(directory / name), 0, f"leftover {parsed.state} file of an interrupted clean or swap")
            )
        elif parsed.kind == fmt.LOG_SUFFIX:
            bases.append(parsed.offset)
    bases.sort()
    previous_next = None
    for i, base in enumerate(bases):
        path = directory / fmt.offset_file_name(base, fmt.LOG_SUFFIX)
        is_active = i == len(bases) - 1
        summary.segments += 1
        scan = _scan_log(path, summary, allow_torn_tail=False)
        if scan is None:
            previous_next = None
            continue
        _check_batch_offsets(path, base, scan, previous_next, summary)
        if not is_active and len(scan.last_offsets) and scan.last_offsets.max() >= bases[i + 1]:
            first = int(np.argmax(scan.last_offsets >= bases[i + 1]))
            summary.problems.append(
                Problem(
                    str(path), int(scan.positions[first]),
                    f"batch last offset {int(scan.last_offsets[first])} is not below the next segment's base {bases[i + 1]}",
                )
            )
        if len(scan.last_offsets):
            previous_next = int(scan.last_offsets[-1]) + 1
        elif previous_next is not None:
            previous_next = max(previous_next, base)
        _check_indexes(directory, base, scan, summary, only=None, is_active=is_active)
        txn = directory / fmt.offset_file_name(base, fmt.TXN_INDEX_SUFFIX)
        if _regular(txn):
            _check_txn_index(txn, base, summary)


def scan_log_file(fd: int, path: str | os.PathLike) -> Iterator["ScanResult"]:
    """The scan of every whole batch of the open `.log` file `fd` (named `path` in errors), window by window.

    Requires a regular file open for reading. Each result is valid until the next one is asked for. Checks
    every batch as `segments.codec.scan` does (framing, CRC, records) and the keys of control records. Raises, with
    `path` and the file position: `CorruptRecordError` at the first invalid batch; `TruncatedBatchError` when
    the file ends inside a batch (a torn tail: whether that is expected is the caller's call — after a crash,
    in the active segment, it is; `reason` says "a torn tail"). `OSError` if the file cannot be read.
    """
    # numba (the scan's kernels) is imported only when a scan runs: start-up of the CLI stays fast
    from ..codec.scan import scan as scan_buffer

    size = os.fstat(fd).st_size
    pos = 0
    while pos < size:
        window = os.pread(fd, min(_READ_CHUNK_BYTES, size - pos), pos)
        try:
            result = scan_buffer(window, base_position=pos, verify_crc=True)
            if result.n_batches == 0 and result.torn_tail and len(window) < result.torn_batch_bytes <= size - pos:
                window = os.pread(fd, result.torn_batch_bytes, pos)  # one batch larger than a window
                result = scan_buffer(window, base_position=pos, verify_crc=True)
        except CorruptRecordError as exc:
            raise exc.located(path) from None
        bad_control = _first_bad_control_key(result)
        if bad_control is not None:
            raise bad_control.located(path) from None
        if result.n_batches == 0:
            raise TruncatedBatchError.at_end_of_file(size - pos, result.torn_batch_bytes, position=pos, path=path)
        yield result
        pos = result.end_position


def _scan_log(path: Path, summary: VerifySummary, *, allow_torn_tail: bool) -> _SegmentScan | None:
    """Scan a whole `.log` in bounded windows (`scan_log_file`), validating every batch; None after a problem
    other than a torn tail (which is one unless `allow_torn_tail`, and leaves the batches before it checked)."""
    if _is_link(path, summary):
        return None
    positions, bases, lasts, max_ts = [], [], [], []
    records = 0
    pos = 0
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            try:
                for result in scan_log_file(f.fileno(), path):
                    positions.append(result.batch_position.copy())
                    bases.append(result.base_offset.copy())
                    lasts.append(result.last_offset.copy())
                    max_ts.append(result.max_timestamp.copy())
                    records += result.n_records
                    pos = result.end_position
            except TruncatedBatchError as exc:
                if not allow_torn_tail:
                    summary.problems.append(Problem(str(path), exc.position, exc.reason))
            except CorruptRecordError as exc:
                summary.problems.append(Problem(str(path), exc.position, exc.reason))
                return None
    except OSError as exc:
        summary.problems.append(_os_problem(exc, path))
        return None
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    scan = _SegmentScan(cat(positions), cat(bases), cat(lasts), cat(max_ts), records, pos)
    summary.batches += len(scan.positions)
    summary.records += records
    summary.bytes += size
    return scan


def _first_bad_control_key(result) -> CorruptRecordError | None:
    """The error of the first control record whose key Kafka cannot parse (shorter than 4 bytes, negative
    version), placed at its batch; None if there is none. The scan checks framing, not what control keys hold."""
    for i in np.flatnonzero(result.is_control).tolist():
        for r in range(int(result.record_start[i]), int(result.record_start[i + 1])):
            try:
                decode_control_key(result.key_bytes(r), position=int(result.batch_position[i]))
            except CorruptRecordError as exc:
                return exc
    return None


def _check_batch_offsets(path: Path, base: int, scan: _SegmentScan, previous_next: int | None, summary: VerifySummary) -> None:
    if not len(scan.positions):
        return
    if scan.base_offsets[0] < base:
        summary.problems.append(
            Problem(str(path), int(scan.positions[0]), f"batch offset {int(scan.base_offsets[0])} is below the segment base {base}")
        )
    if previous_next is not None and scan.base_offsets[0] < previous_next:
        summary.problems.append(
            Problem(
                str(path), int(scan.positions[0]),
                f"batch offset {int(scan.base_offsets[0])} overlaps the previous segment, which ends at {previous_next - 1}",
            )
        )
    bad = np.nonzero(scan.base_offsets[1:] <= scan.last_offsets[:-1])[0]
    for i in bad[:10].tolist():
        summary.problems.append(
            Problem(
                str(path), int(scan.positions[i + 1]),
                f"batch base offset {int(scan.base_offsets[i + 1])} does not follow the previous batch's last offset "
                f"{int(scan.last_offsets[i])}",
            )
        )
    # A v0 wrapper's offset field (outside its CRC) is its last offset; below its inner messages' it is corrupt.
    backwards = np.nonzero(scan.last_offsets < scan.base_offsets)[0]
    if len(backwards):
        i = int(backwards[0])
        summary.problems.append(
            Problem(
                str(path), int(scan.positions[i]),
                f"batch last offset {int(scan.last_offsets[i])} is below its first offset {int(scan.base_offsets[i])}",
            )
        )
    too_far = np.nonzero(scan.last_offsets - base > fmt.RELATIVE_OFFSET_MAX)[0]
    if len(too_far):
        i = int(too_far[0])
        summary.problems.append(
            Problem(str(path), int(scan.positions[i]), f"offset {int(scan.last_offsets[i])} is beyond 2^31-1 of base {base}")
        )


def _check_indexes(directory: Path, base: int, scan: _SegmentScan | None, summary: VerifySummary, *, only: str | None, is_active: bool) -> None:
    index_path = directory / fmt.offset_file_name(base, fmt.INDEX_SUFFIX)
    time_path = directory / fmt.offset_file_name(base, fmt.TIME_INDEX_SUFFIX)
    log_size = scan.valid_bytes if scan is not None else None
    if index_path.is_symlink() or time_path.is_symlink():
        return  # reported with the partition's listing (or by `_verify_file`), never opened
    if only in (None, fmt.INDEX_SUFFIX) and _regular(index_path):  # a FIFO etc. was reported with the listing
        try:
            index = OffsetIndex(index_path, base, read_only=True)
        except OSError as exc:
            summary.problems.append(_os_problem(exc, index_path))
        else:
            _check_offset_index(index, index_path, scan, log_size, summary, is_active=is_active)
    if only in (None, fmt.TIME_INDEX_SUFFIX) and _regular(time_path):
        try:
            time_index = TimeIndex(time_path, base, read_only=True)
        except OSError as exc:
            summary.problems.append(_os_problem(exc, time_path))
        else:
            _check_time_index(time_index, time_path, scan, summary, is_active=is_active)


def _check_offset_index(index, index_path: Path, scan: _SegmentScan | None, log_size: int | None,
                        summary: VerifySummary, *, is_active: bool) -> None:
    """Sanity and entries of an open offset index (closed here)."""
    try:
        if is_active:
            index.truncate_to_entries(_entries_before_preallocation(index_path, fmt.OFFSET_INDEX_ENTRY.size))
        try:
            index.sanity_check(log_size)
        except CorruptIndexError as exc:
            summary.problems.append(Problem(exc.path, exc.position, exc.reason))
        else:
            if scan is not None:
                _check_offset_entries(index_path, index, scan, summary)
    except OSError as exc:
        summary.problems.append(_os_problem(exc, index_path))
    finally:
        index.close()


def _check_time_index(index, time_path: Path, scan: _SegmentScan | None, summary: VerifySummary, *,
                      is_active: bool) -> None:
    """Sanity and entries of an open time index (closed here)."""
    try:
        if is_active:
            index.truncate_to_entries(_entries_before_preallocation(time_path, fmt.TIME_INDEX_ENTRY.size))
        try:
            index.sanity_check()
        except CorruptIndexError as exc:
            summary.problems.append(Problem(exc.path, exc.position, exc.reason))
        else:
            if scan is not None:
                _check_time_entries(time_path, index, scan, summary, is_active=is_active)
    except OSError as exc:
        summary.problems.append(_os_problem(exc, time_path))
    finally:
        index.close()


def _entries_before_preallocation(path: Path, entry_bytes: int) -> int:
    """Entries before the trailing all-zero slots of an index Kafka preallocated for its active segment.

    Kafka trims those slots when the segment stops being active; until then (or after an unclean stop)
    they are expected in the active segment's index files, and open rebuilds such an index.
    """
    data = np.fromfile(path, dtype=np.uint8)
    whole = len(data) - len(data) % entry_bytes
    rows = data[:whole].reshape(-1, entry_bytes)
    nonzero = np.nonzero(rows.any(axis=1))[0]
    return int(nonzero[-1]) + 1 if len(nonzero) else 0


def _check_offset_entries(path: Path, index, scan: _SegmentScan, summary: VerifySummary) -> None:
    entry_size = fmt.OFFSET_INDEX_ENTRY.size
    for i in range(index.entries):
        offset, position = index.entry(i)
        j = int(np.searchsorted(scan.positions, position))
        if j >= len(scan.positions) or scan.positions[j] != position:
            summary.problems.append(Problem(str(path), i * entry_size, f"entry ({offset}, {position}) does not point at a batch start"))
            return
        if j > 0 and scan.last_offsets[j - 1] >= offset:
            summary.problems.append(
                Problem(str(path), i * entry_size, f"entry offset {offset} is not past the batch before position {position}")
            )
            return
        if offset > scan.last_offsets[-1]:
            summary.problems.append(Problem(str(path), i * entry_size, f"entry offset {offset} is past the segment's last offset"))
            return


def _check_time_entries(path: Path, index, scan: _SegmentScan, summary: VerifySummary, *, is_active: bool) -> None:
    entry_size = fmt.TIME_INDEX_ENTRY.size
    if not len(scan.positions):
        return
    segment_max = int(scan.max_timestamps.max())
    last_offset = int(scan.last_offsets[-1])
    for i in range(index.entries):
        ts, offset = index.entry(i)
        if ts > segment_max or offset > last_offset:
            summary.problems.append(
                Problem(str(path), i * entry_size, f"entry ({ts}, {offset}) is past the segment's max timestamp or last offset")
            )
            return
    if not is_active and segment_max >= 0:
        last_ts = index.last_entry[0] if index.entries else fmt.NO_TIMESTAMP
        if last_ts != segment_max:
            summary.problems.append(
                Problem(
                    str(path), max(0, index.entries - 1) * entry_size,
                    f"last entry's timestamp {last_ts} is not the segment's max timestamp {segment_max}",
                )
            )


def _check_txn_index(path: Path, base: int, summary: VerifySummary) -> None:
    if path.is_symlink():
        return  # reported with the partition's listing, never opened
    try:
        index = TransactionIndex(path, base, read_only=True)
    except OSError as exc:
        summary.problems.append(_os_problem(exc, path))
        return
    try:
        index.sanity_check()
    except CorruptIndexError as exc:
        summary.problems.append(Problem(exc.path, exc.position, exc.reason))
    except OSError as exc:
        summary.problems.append(_os_problem(exc, path))
    finally:
        index.close()


def iter_problem_lines(summary: VerifySummary) -> Iterator[str]:
    for problem in summary.problems:
        yield str(problem)
