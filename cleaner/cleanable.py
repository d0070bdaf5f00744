"""Where a round may clean: the first dirty offset, the first uncleanable offset, and the dirty ratio.

Owns Kafka's `LogCleanerManager.cleanableOffsets` and `LogToClean` arithmetic for one partition: the first
dirty offset (the checkpoint, reset to the log start when out of range), the bounds past which nothing may
be cleaned (the active segment, the high watermark, the first open transaction, segments still inside
`min.compaction.lag.ms`), rounded down to a segment base, and the clean/cleanable byte counts whose ratio
ranks logs. Pure arithmetic over a `LogSurvey`; no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .settings import TopicSettings
from .survey import LogSurvey

__all__ = ["CleanableRange", "cleanable_range"]


@dataclass(frozen=True, slots=True)
class CleanableRange:
    """The dirty section [first_dirty, first_uncleanable) of one partition, and its byte accounting."""

    log_start_offset: int
    first_dirty: int
    first_uncleanable: int  # a segment base (or first_dirty when nothing is cleanable)
    clean_bytes: int
    cleanable_bytes: int
    checkpoint_was_reset: bool
    bound: str  # what set first_uncleanable: "active segment", "high watermark", ...

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def empty(self) -> bool:
        return self.first_uncleanable <= self.first_dirty


def cleanable_range(
    survey: LogSurvey,
    topic: TopicSettings,
    *,
    log_start_offset: int,
    now_ms: int,
    checkpoint: int | None,
    high_watermark: int | None = None,
    forced_from: int | None = None,
    forced_to: int | None = None,
) -> CleanableRange:
    """The dirty section of a log given its survey, settings, clock, checkpoint and high watermark.

    `forced_from`/`forced_to` replace the checkpoint and add an upper bound (`--from-offset`,
    `--to-offset`); the safety bounds (active segment, high watermark, open transactions) still apply,
    `min.compaction.lag.ms` does not.
    """
    segments = survey.segments
    log_end = segments[-1].next_offset if segments else log_start_offset
    reset = False
    if forced_from is not None:
        first_dirty = forced_from
    elif checkpoint is None:
        first_dirty = log_start_offset
    elif checkpoint < log_start_offset or checkpoint > log_end:
        first_dirty, reset = log_start_offset, True
    else:
        first_dirty = checkpoint
    first_dirty = max(first_dirty, log_start_offset)
    bounds: list[tuple[int, str]] = []
    if segments:
        bounds.append((segments[-1].base_offset, "active segment"))
    if high_watermark is not None:
        bounds.append((high_watermark, "high watermark"))
    unstable = survey.first_unstable_offset(high_watermark)
    if unstable is not None:
        bounds.append((unstable, "open transaction"))
    if forced_to is not None:
        bounds.append((forced_to, "--to-offset"))
    elif topic.min_compaction_lag_ms > 0:
        horizon = now_ms - topic.min_compaction_lag_ms
        for seg in segments[:-1]:
            if seg.next_offset <= first_dirty:
                continue
            largest = seg.largest_timestamp if seg.largest_timestamp >= 0 else seg.last_modified_ms
            if largest > horizon:
                bounds.append((seg.base_offset, "min.compaction.lag.ms"))
                break
    limit, bound = min(bounds) if bounds else (log_end, "log end")
    bases = [s.base_offset for s in segments]
    # Round down to the base of the segment holding `limit` (that whole segment stays uncleanable).
    i = bisect.bisect_right(bases, limit) - 1
    aligned = bases[i] if i >= 0 else log_start_offset
    if limit >= log_end and segments:
        aligned = min(aligned, segments[-1].base_offset)
    first_uncleanable = max(first_dirty, aligned)
    clean_bytes = sum(s.size_bytes for s in segments if s.base_offset < first_dirty and s.next_offset > log_start_offset)
    cleanable_bytes = sum(
        s.size_bytes for s in segments if s.base_offset < first_uncleanable and s.next_offset > first_dirty
    )
    return CleanableRange(
        log_start_offset, first_dirty, first_uncleanable, clean_bytes, cleanable_bytes, reset, bound
    )
