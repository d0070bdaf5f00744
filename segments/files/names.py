"""The file-name grammar of a partition directory's segment files: `<20-digit base offset><kind>[<state>]`.

Owns parsing those names (`parse_segment_file_name`); building one comes from `segments.codec.format`
(`offset_file_name`) and a segment's four paths from `segments.files.segment.segment_paths`. Names that are not
segment files (checkpoints, lock files, `leader-epoch-checkpoint`) parse to None.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..codec import format as fmt

__all__ = ["SegmentFileName", "parse_segment_file_name"]

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
