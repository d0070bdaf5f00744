"""Crash recovery of the swap protocol's leftover files, exactly as Kafka's `LogLoader` does it.

Owns passes 1-4 of `docs/format.md` section 4 over one partition directory:

1. delete every `*.deleted`; collect `*.cleaned` and let `minCleaned` be their smallest offset; delete
   every `*.swap` whose offset ≥ `minCleaned` (an incomplete `.cleaned → .swap` step); delete every
   `*.cleaned`;
2. for the remaining `*.log.swap`: `minSwap` = smallest base, `maxSwap` = largest next offset;
3. delete every non-swap file (log, indexes, snapshot) whose offset lies in `[minSwap, maxSwap)`: the old
   segments that had not yet been renamed to `.deleted`;
4. drop the `.swap` suffix of every remaining swap file, and delete index files that have no `.log`.

What a crash at each step of the swap leaves, and what this does with it:
* during writing `.cleaned` → only `.cleaned` files: deleted; the old segments are intact (abort);
* part-way through `.cleaned → .swap` → `.swap` files with `.cleaned` at or below them: deleted (abort);
* all `.swap`, old files partly renamed to `.deleted` → old files removed, swaps renamed (roll forward);
* part-way through `.swap → ""` → the remaining swaps are renamed (roll forward).

Pass 5 (re-validating segments past the recovery point) belongs to `segments.log`. `.cleaned` files
are only touched when `include_cleaned` is true: the caller passes false while another process holds
the cleaner lock and those files are its work in progress. It must be called with the swap lock held.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from . import format as fmt
from .fileio import DEFAULT_FILE_OPS, FileOps

__all__ = ["LeftoverRecovery", "recover_leftovers", "parse_segment_file_name"]

log = logging.getLogger(__name__)

_INDEX_SUFFIXES = (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX, fmt.TXN_INDEX_SUFFIX)
_STATE_SUFFIXES = (fmt.CLEANED_SUFFIX, fmt.SWAP_SUFFIX, fmt.DELETED_SUFFIX)


@dataclass(frozen=True, slots=True)
class SegmentFileName:
    """A file name of the form `<20-digit offset><kind>[<state>]`, e.g. `...42.index.swap`."""

    offset: int
    kind: str  # ".log", ".index", ".timeindex", ".txnindex", ".snapshot"
    state: str  # "", ".cleaned", ".swap", ".deleted"

    def name(self) -> str:
        return fmt.offset_file_name(self.offset, self.kind) + self.state


def parse_segment_file_name(name: str) -> SegmentFileName | None:
    """Parse a segment-related file name; None for anything else (checkpoints, lock files, ...)."""
    digits, dot, rest = name.partition(".")
    if not dot or len(digits) != fmt.OFFSET_DIGITS or not digits.isdigit():
        return None
    rest = "." + rest
    state = ""
    for suffix in _STATE_SUFFIXES:
        if rest.endswith(suffix):
            state = suffix
            rest = rest[: -len(suffix)]
            break
    if rest not in fmt.SEGMENT_FILE_SUFFIXES and rest != fmt.SNAPSHOT_SUFFIX:
        return None
    return SegmentFileName(int(digits), rest, state)


@dataclass(slots=True)
class LeftoverRecovery:
    """What `recover_leftovers` did, for logs and tests."""

    deleted: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    aborted_swaps: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.deleted or self.renamed)


def _list(directory: Path) -> list[SegmentFileName]:
    out = []
    for name in os.listdir(directory):
        parsed = parse_segment_file_name(name)
        if parsed is not None:
            out.append(parsed)
    return out


def _next_offset_of_log(path: Path) -> int | None:
    """Next offset after the last whole batch of a `.log` file, or None if it holds none."""
    from .segment import peek_header

    last_next = None
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos + fmt.HEADER_SIZE_UP_TO_MAGIC < size:
            head = os.pread(f.fileno(), fmt.RECORD_BATCH_OVERHEAD, pos)
            _, length = fmt.PREFIX.unpack_from(head)
            if length < 0 or pos + fmt.LOG_OVERHEAD + length > size:
                break
            if head[fmt.MAGIC_OFFSET] != fmt.MAGIC_V2:
                head = os.pread(f.fileno(), fmt.LOG_OVERHEAD + length, pos)
            header = peek_header(head, 0)
            last_next = header.next_offset
            pos += header.size_bytes
    return last_next


def recover_leftovers(
    directory: str | os.PathLike, *, include_cleaned: bool = True, file_ops: FileOps = DEFAULT_FILE_OPS
) -> LeftoverRecovery:
    """Finish or roll back an interrupted swap in `directory` (passes 1-4 above). Idempotent."""
    directory = Path(directory)
    report = LeftoverRecovery()

    def delete(f: SegmentFileName) -> None:
        file_ops.remove(directory / f.name())
        report.deleted.append(f.name())

    files = _list(directory)
    # Pass 1.
    cleaned = [f for f in files if f.state == fmt.CLEANED_SUFFIX]
    for f in files:
        if f.state == fmt.DELETED_SUFFIX:
            delete(f)
    if include_cleaned and cleaned:
        min_cleaned = min(f.offset for f in cleaned)
        for f in files:
            if f.state == fmt.SWAP_SUFFIX and f.offset >= min_cleaned:
                delete(f)
                report.aborted_swaps.append(f.name())
        for f in cleaned:
            delete(f)
    files = _list(directory)
    # Pass 2.
    swap_logs = [f for f in files if f.state == fmt.SWAP_SUFFIX and f.kind == fmt.LOG_SUFFIX]
    if swap_logs:
        min_swap = min(f.offset for f in swap_logs)
        max_swap = max(
            (_next_offset_of_log(directory / f.name()) or f.offset) for f in swap_logs
        )
        # Pass 3.
        for f in files:
            if f.state == "" and min_swap <= f.offset < max_swap:
                delete(f)
    # Pass 4.
    for f in _list(directory):
        if f.state == fmt.SWAP_SUFFIX:
            target = SegmentFileName(f.offset, f.kind, "")
            file_ops.rename(directory / f.name(), directory / target.name())
            report.renamed.append((f.name(), target.name()))
    files = _list(directory)
    logs = {f.offset for f in files if f.kind == fmt.LOG_SUFFIX and f.state == ""}
    for f in files:
        if f.state == "" and f.kind in _INDEX_SUFFIXES and f.offset not in logs:
            delete(f)
    if report.changed:
        file_ops.fsync_dir(directory)
        log.info(
            "recovered leftovers dir=%s deleted=%d renamed=%d aborted_swaps=%d",
            directory, len(report.deleted), len(report.renamed), len(report.aborted_swaps),
        )
    return report
