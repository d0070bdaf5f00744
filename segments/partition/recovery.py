"""Crash recovery of the swap protocol's leftover files, exactly as Kafka's `LogLoader` does it.

Owns passes 1-4 of `docs/format.md` section 4 over one partition directory: delete `.deleted` files and
abandoned `.cleaned`/`.swap` files, delete the old segments a complete set of `.swap` files replaces, then
drop the `.swap` suffixes and delete index files that have no `.log`. That section also says what a crash at
each step of the swap leaves and what recovery does with it (abort before every new file is `.swap`, roll
forward after).

`plan_leftover_recovery` works out what passes 1-4 would do from one listing, changing nothing:
`recover_leftovers` carries the plan out, and a reader (`segments.partition.log`, mode "reader") shows the
segments Kafka would have after recovery, and lists the leftovers, without touching a file.

Pass 5 (re-validating segments past the recovery point) belongs to `segments.partition.log`. `.cleaned` files
are only touched when `include_cleaned` is true: the caller passes false while another process holds
the cleaner lock and those files are its work in progress. It must be called with the swap lock held.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..codec import format as fmt
from ..codec.batches import peek_header
from ..codec.errors import CorruptRecordError
from ..files.fileio import DEFAULT_FILE_OPS, FileOps
from ..files.names import SegmentFileName, parse_segment_file_name

__all__ = ["LeftoverPlan", "LeftoverRecovery", "plan_leftover_recovery", "recover_leftovers"]

log = logging.getLogger(__name__)

_INDEX_SUFFIXES = (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX, fmt.TXN_INDEX_SUFFIX)


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


def _swap_log_next_offset(path: Path, base_offset: int) -> int | None:
    """Next offset after the last batch of a `.log.swap` file (None if it holds none), once its batch headers
    show it can be what the swap protocol wrote: whole batches end to end (it was fsynced before it was
    renamed to `.swap`), their offsets increasing and none below the file's base offset. Anything else (a
    stray copy, garbage) raises `CorruptRecordError` naming the file and byte: rolling it forward would
    replace good segments with it, so recovery stops before changing anything."""
    last_next = None
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            head = os.pread(f.fileno(), fmt.RECORD_BATCH_OVERHEAD, pos)
            if len(head) < fmt.HEADER_SIZE_UP_TO_MAGIC:
                raise CorruptRecordError("a .swap file ends inside a batch", position=pos, path=path)
            _, length = fmt.PREFIX.unpack_from(head)
            if length < 0 or pos + fmt.LOG_OVERHEAD + length > size:
                raise CorruptRecordError("a .swap file ends inside a batch", position=pos, path=path)
            try:
                header = peek_header(head, 0)  # the codec's one header reader: the header bytes are enough
            except CorruptRecordError as exc:
                raise exc.located(path, pos) from None
            floor = base_offset if last_next is None else last_next
            if header.base_offset < floor:
                raise CorruptRecordError(
                    f"batch offsets [{header.base_offset}, {header.last_offset}] below {floor}: not what a swap "
                    "writes (recovery would replace good segments with it); nothing was changed",
                    position=pos, path=path)
            last_next = header.next_offset
            pos += header.size_bytes
    return last_next


@dataclass(frozen=True, slots=True)
class LeftoverPlan:
    """What passes 1-4 would do in a directory, in the order they do it (file names, nothing changed yet)."""

    delete_first: tuple[str, ...]  # passes 1 and 3: .deleted, aborted .swap, .cleaned, old files a swap replaces
    rename: tuple[tuple[str, str], ...]  # pass 4: .swap -> live name
    delete_last: tuple[str, ...]  # pass 4: index files left without a .log
    aborted_swaps: tuple[str, ...]  # the .swap files among delete_first (an incomplete .cleaned -> .swap step)
    leftovers: tuple[str, ...]  # every .cleaned, .swap and .deleted file of the listing, sorted
    segments: tuple[tuple[int, str], ...]  # (base offset, state suffix of its .log now: "" or ".swap") after recovery

    @property
    def changes(self) -> bool:
        return bool(self.delete_first or self.rename or self.delete_last)


def plan_leftover_recovery(directory: str | os.PathLike, *, include_cleaned: bool = True) -> LeftoverPlan:
    """What `recover_leftovers` would do in `directory` now (passes 1-4 above), from one listing. Reads the last
    batch headers of `.log.swap` files (pass 2); changes nothing. `segments` is the segment set Kafka would
    have after recovery: each base offset with the file that holds its data today."""
    directory = Path(directory)
    files = sorted(_list(directory), key=lambda f: f.name())
    gone: set[str] = set()
    delete_first: list[str] = []

    def delete(f: SegmentFileName) -> None:
        delete_first.append(f.name())
        gone.add(f.name())

    # Pass 1.
    cleaned = [f for f in files if f.state == fmt.CLEANED_SUFFIX]
    for f in files:
        if f.state == fmt.DELETED_SUFFIX:
            delete(f)
    aborted = []
    if include_cleaned and cleaned:
        min_cleaned = min(f.offset for f in cleaned)
        for f in files:
            if f.state == fmt.SWAP_SUFFIX and f.offset >= min_cleaned:
                delete(f)
                aborted.append(f.name())
        for f in cleaned:
            delete(f)
    files = [f for f in files if f.name() not in gone]
    # Pass 2.
    swap_logs = [f for f in files if f.state == fmt.SWAP_SUFFIX and f.kind == fmt.LOG_SUFFIX]
    if swap_logs:
        min_swap = min(f.offset for f in swap_logs)
        max_swap = max((_swap_log_next_offset(directory / f.name(), f.offset) or f.offset) for f in swap_logs)
        # Pass 3.
        for f in files:
            if f.state == "" and min_swap <= f.offset < max_swap:
                delete(f)
    files = [f for f in files if f.name() not in gone]
    # Pass 4.
    renames = [(f.name(), SegmentFileName(f.offset, f.kind, "").name()) for f in files if f.state == fmt.SWAP_SUFFIX]
    after = [SegmentFileName(f.offset, f.kind, "" if f.state == fmt.SWAP_SUFFIX else f.state) for f in files]
    logs = {f.offset for f in after if f.kind == fmt.LOG_SUFFIX and f.state == ""}
    delete_last = [f.name() for f in after if f.state == "" and f.kind in _INDEX_SUFFIXES and f.offset not in logs]
    segments = sorted((f.offset, f.state) for f in files if f.kind == fmt.LOG_SUFFIX and f.state in ("", fmt.SWAP_SUFFIX))
    leftovers = sorted(f.name() for f in _list(directory) if f.state)
    return LeftoverPlan(tuple(delete_first), tuple(renames), tuple(delete_last), tuple(aborted), tuple(leftovers),
                        tuple(segments))


def recover_leftovers(
    directory: str | os.PathLike, *, include_cleaned: bool = True, file_ops: FileOps = DEFAULT_FILE_OPS
) -> LeftoverRecovery:
    """Finish or roll back an interrupted swap in `directory` (passes 1-4 above): carry out
    `plan_leftover_recovery`, step by step in its order. Idempotent."""
    directory = Path(directory)
    plan = plan_leftover_recovery(directory, include_cleaned=include_cleaned)
    report = LeftoverRecovery(aborted_swaps=list(plan.aborted_swaps))
    for name in plan.delete_first:
        file_ops.remove(directory / name)
        report.deleted.append(name)
    for old, new in plan.rename:
        file_ops.rename(directory / old, directory / new)
        report.renamed.append((old, new))
    for name in plan.delete_last:
        file_ops.remove(directory / name)
        report.deleted.append(name)
    if report.changed:
        file_ops.fsync_dir(directory)
        log.info(
            "recovered leftovers dir=%s deleted=%d renamed=%d aborted_swaps=%d",
            directory, len(report.deleted), len(report.renamed), len(report.aborted_swaps),
        )
    return report
