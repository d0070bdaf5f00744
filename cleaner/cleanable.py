"""Where a partition may be cleaned: the first dirty offset, the first uncleanable offset, the dirty ratio.

Owns Kafka's `LogCleanerManager.cleanableOffsets` and `LogToClean` arithmetic for one partition: the first
dirty offset (the checkpoint, reset to the log start when out of range), the bounds past which nothing may
be cleaned (the active segment, the high watermark, the first open transaction, segments still inside
`min.compaction.lag.ms`), rounded down to a segment base, the clean/cleanable byte counts whose ratio
ranks logs (clean bytes: the segments below the first dirty offset; cleanable bytes: those of
[first dirty, first uncleanable); ratio = cleanable / (clean + cleanable)), and how overdue the log is by
`max.compaction.lag.ms`; and the soonest delete horizon (KIP-534) kept in the segments a round recopies
([log start, first uncleanable)): once it has passed, a pass over the log removes what it keeps (a tombstone,
a marker), dirty or not; and `changes_at_ms`, the first time at which the same facts give another range or
delay (the clock is the one input that moves by itself), so a caller keeping ranges in memory knows when to
work one out again. One function, `cleanable_range`, for the daemon's selection (`cleaner.manager`,
from the facts `segments.partition.facts` reads cheaply) and for every round (`cleaner.round`, from its
survey's facts), so that a log is selected only for what a round may clean. Pure arithmetic over
`LogFacts`; no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from segments.partition.facts import LogFacts

from .settings import TopicSettings

__all__ = ["CleanableRange", "cleanable_range", "horizon_passed"]

_LONG_MAX = 2**63 - 1  # max.compaction.lag.ms unset


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
    compaction_delay_ms: int = 0  # how long past max.compaction.lag.ms its oldest cleanable dirty batch is (0: not)
    # The soonest delete horizon kept in the segments a round recopies, [log start, first uncleanable) (-1: none)
    kept_delete_horizon_ms: int = -1
    # The first time at which the same facts and checkpoint give another range, delay or due horizon (-1: never)
    changes_at_ms: int = -1

    def horizon_passed(self, now_ms: int) -> bool:
        """True when a kept tombstone's or marker's delete horizon has passed: a horizon pass is due."""
        return horizon_passed(self.kept_delete_horizon_ms, now_ms)

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.cleanable_bytes
        return self.cleanable_bytes / total if total else 0.0

    @property
    def empty(self) -> bool:
        return self.first_uncleanable <= self.first_dirty


def horizon_passed(horizon_ms: int, now_ms: int) -> bool:
    """True when `horizon_ms` (a delete horizon, -1: none) has passed at `now_ms`: what it keeps may go."""
    return 0 <= horizon_ms <= now_ms


def cleanable_range(
    facts: LogFacts,
    topic: TopicSettings,
    *,
    log_start_offset: int,
    now_ms: int,
    checkpoint: int | None,
    forced_from: int | None = None,
    forced_to: int | None = None,
) -> CleanableRange:
    """The dirty section of a log given its facts (segments, high watermark, first unstable offset),
    settings, clock and checkpoint.

    `forced_from`/`forced_to` replace the checkpoint and add an upper bound (`--from-offset`,
    `--to-offset`); the safety bounds (active segment, high watermark, open transactions) still apply,
    `min.compaction.lag.ms` does not.
    """
    segments = facts.segments
    high_watermark = facts.high_watermark
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
    changes: list[int] = []  # times at which the clock alone changes the outcome
    if segments:
        bounds.append((segments[-1].base_offset, "active segment"))
    if high_watermark is not None:
        bounds.append((high_watermark, "high watermark"))
    unstable = facts.first_unstable_offset
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
                changes.append(largest + topic.min_compaction_lag_ms)  # it leaves the lag then
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
    delay = 0
    if topic.max_compaction_lag_ms < _LONG_MAX:  # Kafka's maxCompactionDelay, over the cleanable dirty segments
        firsts = [s.first_batch_timestamp for s, after in zip(segments, segments[1:])
                  if after.base_offset > first_dirty and s.base_offset < first_uncleanable and s.first_batch_timestamp > 0]
        if firsts:
            overdue_at = topic.max_compaction_lag_ms + min(firsts)
            delay = max(0, now_ms - overdue_at)
            changes.append(now_ms + 1 if delay else overdue_at + 1)  # overdue, the delay grows with the clock
    kept_horizon = facts.earliest_delete_horizon_ms(log_start_offset, first_uncleanable)
    if kept_horizon > now_ms:
        changes.append(kept_horizon)
    return CleanableRange(
        log_start_offset, first_dirty, first_uncleanable, clean_bytes, cleanable_bytes, reset, bound, delay,
        kept_horizon, min(changes, default=-1),
    )


def segment_floor(bases: list[int], offset: int, log_start_offset: int) -> int:
    """The base of the segment holding `offset` (`bases` ascending), or the log start below the first: a
    cleanable range ends at a segment's base, the segment holding its bound staying uncleanable."""
    i = bisect.bisect_right(bases, offset) - 1
    return bases[i] if i >= 0 else log_start_offset
