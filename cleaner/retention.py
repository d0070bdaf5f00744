"""Retention of whole segments: the `delete` cleanup policy, and segments below the log start offset.

Owns Kafka's `deleteOldSegments` rules, as the daemon's retention pass and `logcleaner clean` apply them:
* segments entirely below the log start offset go, whatever the policy (KAFKA-7400);
* with `delete` in `cleanup.policy` (`delete`, or the delete half of `compact,delete`): from the oldest
  segment on, a segment whose largest timestamp is more than `retention.ms` old goes (its time index's max
  timestamp, else its file mtime, as Kafka; exactly `retention.ms` old stays), and while the log is larger
  than `retention.bytes` the oldest segments go (the whole log counts, the active segment included);
* never the active segment, and never a segment holding offsets at or past the high watermark — the log
  dir's `replication-offset-checkpoint` entry when there is one; without it everything written counts as
  committed.
Deletion itself (the `.deleted` protocol and `log-start-offset-checkpoint`) is `PartitionLog`'s.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from segments.partition.checkpoint import REPLICATION_OFFSET_CHECKPOINT
from segments.partition.log import PartitionLog

from .settings import TopicSettings

__all__ = ["RetentionResult", "apply_retention", "may_delete_below_log_start", "segments_to_delete"]


@dataclass(frozen=True, slots=True)
class RetentionResult:
    """What one retention step deleted (or, as a dry run, would delete)."""

    segments_deleted: int
    bytes_deleted: int
    log_start_offset: int  # after the deletion
    reason: str  # the rule that deleted the last segment: "retention.ms", "retention.bytes", "log start offset"
    dry_run: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _largest_timestamp(segment) -> int:
    ts = segment.max_timestamp
    return ts if ts >= 0 else os.stat(segment.paths.log).st_mtime_ns // 1_000_000


def may_delete_below_log_start(bases: list[int], log_start_offset: int) -> bool:
    """Whether the first rule of `segments_to_delete` (segments entirely below the log start offset) could
    delete a segment of a log whose segments start at `bases`: the only rule for a log whose policy has no
    `delete`, so the daemon opens such a log for retention only when this holds."""
    return len(bases) >= 2 and bases[1] <= log_start_offset


def segments_to_delete(log: PartitionLog, topic: TopicSettings, now_ms: int, *, by_size: bool = True) -> tuple[int, str]:
    """How many of the oldest segments retention removes now, and why (0, "" if none).

    `by_size=False` leaves `retention.bytes` out (`logcleaner clean` applies it after compacting, so it
    measures the compacted log).
    """
    segments = log.segments
    if len(segments) < 2:
        return 0, ""
    high_watermark = log.read_log_dir_checkpoint(REPLICATION_OFFSET_CHECKPOINT)
    log_start = log.log_start_offset
    candidates = segments[:-1]  # never the active segment

    def below_hw(i: int) -> bool:
        upper = segments[i + 1].base_offset  # the segment's offsets end below the next base
        return high_watermark is None or upper <= high_watermark

    count, reason = 0, ""
    while count < len(candidates) and segments[count + 1].base_offset <= log_start and below_hw(count):
        count, reason = count + 1, "log start offset"
    # (may_delete_below_log_start is this first rule, from the base offsets alone)
    if "delete" in topic.cleanup_policy:
        if topic.retention_ms >= 0:
            while (
                count < len(candidates)
                and now_ms - _largest_timestamp(candidates[count]) > topic.retention_ms
                and below_hw(count)
            ):
                count, reason = count + 1, "retention.ms"
        if by_size and topic.retention_bytes >= 0:
            excess = sum(s.size_bytes for s in segments[count:]) - topic.retention_bytes
            while count < len(candidates) and excess - candidates[count].size_bytes >= 0 and below_hw(count):
                excess -= candidates[count].size_bytes
                count, reason = count + 1, "retention.bytes"
    return count, reason


def apply_retention(
    log: PartitionLog, topic: TopicSettings, now_ms: int, *, by_size: bool = True, dry_run: bool = False,
) -> RetentionResult | None:
    """Delete what `segments_to_delete` names (cleaner-mode log); None when nothing is due.

    With `dry_run` nothing changes; the result says what would go.
    """
    count, reason = segments_to_delete(log, topic, now_ms, by_size=by_size)
    if not count:
        return None
    segments = log.segments
    size = sum(s.size_bytes for s in segments[:count])
    if dry_run:
        return RetentionResult(count, size, max(segments[count].base_offset, log.log_start_offset), reason, True)
    start = log.delete_oldest_segments(count, reason=reason)
    return RetentionResult(count, size, start, reason)
