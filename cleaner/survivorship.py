"""Survivorship-aware scheduling: how much of a log's dirty section survives cleaning, and what a round is worth.

Owns the estimate arithmetic (pure, shared with `bench/scheduling_sim.py`) and the checkpoint file. Every round
records the survivorship of the dirty section it cleaned, `records written / records read`, smoothed per
partition (`log.cleaner.survivorship.alpha`) and kept in `<log dir>/logcleaner-survivorship-checkpoint`, so a
restart keeps it. With `log.cleaner.selection.policy = survivorship` a log is ranked by the bytes a round is
expected to free per byte of cleaning I/O:

    freed = dirty × (1 − s)        io = (clean + dirty) read + (clean + dirty × s) written

and is eligible when `freed / (clean + dirty)` exceeds `min.cleanable.dirty.ratio`, or when its plain dirty
ratio reaches `log.cleaner.survivorship.backstop.ratio`. A partition with no history has s = 0, Kafka's
behaviour; `dirty-ratio` (the default) is Kafka's policy unchanged. Why, and the checkpoint's format: see
docs/design.md, "Survivorship-aware scheduling".
"""

from __future__ import annotations

import os
from pathlib import Path

from segments.codec.errors import CheckpointError
from segments.partition.checkpoint import SURVIVORSHIP_CHECKPOINT, cached_offset_checkpoint, read_offset_checkpoint
from segments.partition.log import update_log_dir_checkpoint

__all__ = [
    "POLICIES", "PPM", "SURVIVORSHIP_CHECKPOINT", "eligible", "expected_freed_fraction", "freed_per_io_byte", "lookup",
    "read_all",
    "record", "record_round", "smoothed",
]

POLICIES = ("dirty-ratio", "survivorship")
PPM = 1_000_000  # the checkpoint's unit: parts per million


def smoothed(previous: float | None, observed: float, alpha: float) -> float:
    return observed if previous is None else alpha * observed + (1 - alpha) * previous


def record(log_dir: str | os.PathLike, topic: str, partition: int, observed: float, alpha: float) -> float:
    """Fold one round's survivorship into the partition's smoothed value and persist it; returns the new value."""
    previous = lookup(log_dir, topic, partition)
    value = min(max(smoothed(previous, observed, alpha), 0.0), 1.0)
    # A scheduling hint: not fsynced, and an unreadable file is replaced (docs/design.md, "Survivorship-aware
    # scheduling"); the cleaner checkpoint, which safety depends on, is written durably by the round.
    update_log_dir_checkpoint(log_dir, SURVIVORSHIP_CHECKPOINT, (topic, partition), round(value * PPM), hint=True)
    return value


def record_round(directory: str | os.PathLike, result, alpha: float) -> float | None:
    """After a round (a `cleaner.round.RoundResult`) of the partition at `directory`: fold in its survivorship."""
    if result.dry_run or result.survivorship is None:
        return None
    return record(Path(directory).parent, result.topic, result.partition, result.survivorship, alpha)


def read_all(log_dir: str | os.PathLike) -> dict[tuple[str, int], float]:
    """Every partition's smoothed survivorship in `log_dir` (missing or unreadable file: none)."""
    try:
        entries = read_offset_checkpoint(Path(log_dir) / SURVIVORSHIP_CHECKPOINT)
    except CheckpointError:
        return {}
    return {tp: v / PPM for tp, v in entries.items()}


def lookup(log_dir: str | os.PathLike, topic: str, partition: int) -> float | None:
    """One partition's smoothed survivorship in `log_dir` (None: no history, or the file is unreadable)."""
    try:
        ppm = cached_offset_checkpoint(Path(log_dir) / SURVIVORSHIP_CHECKPOINT)[0].get((topic, partition))
    except CheckpointError:
        return None
    return None if ppm is None else ppm / PPM


def expected_freed_fraction(clean_bytes: int, dirty_bytes: int, survivorship: float) -> float:
    total = clean_bytes + dirty_bytes
    return dirty_bytes * (1 - survivorship) / total if total else 0.0


def freed_per_io_byte(clean_bytes: int, dirty_bytes: int, survivorship: float) -> float:
    """Expected bytes a round frees per byte it reads and writes (the survivorship policy's rank)."""
    io = (clean_bytes + dirty_bytes) + (clean_bytes + dirty_bytes * survivorship)
    return dirty_bytes * (1 - survivorship) / io if io else 0.0


def eligible(clean_bytes: int, dirty_bytes: int, survivorship: float, *, min_ratio: float, backstop_ratio: float) -> bool:
    """Whether the survivorship policy would clean this log now (see the module docstring)."""
    total = clean_bytes + dirty_bytes
    if dirty_bytes <= 0 or total <= 0:
        return False
    return expected_freed_fraction(clean_bytes, dirty_bytes, survivorship) > min_ratio or (
        dirty_bytes / total >= backstop_ratio
    )
