"""Idle-log maintenance: roll the active segment of a compacted log nobody writes to any more.

Owns the fix for Kafka's "tombstones and duplicates in the active segment stay forever on idle topics"
(docs/kafka-cleaner.md section 4.3): Kafka rolls an active segment only when a record arrives, so a log that stops
receiving writes keeps its last segment uncompacted indefinitely. Here, when a compacted topic has a finite
`max.compaction.lag.ms`, its active segment is non-empty, its file has not changed for that long and its
first batch is that old, and no writer process holds the partition (`.writer.lock`), the daemon opens it as
the writer for a moment and rolls it. The rolled segment is then dirty and overdue, so the manager selects
it; tombstones whose horizon passes later are removed by the horizon-driven pass (`cleaner.manager`).
"""

from __future__ import annotations

import logging
import os

from segments.codec import format as fmt
from segments.codec.errors import LockTimeoutError, SegmentError
from segments.files.names import parse_segment_file_name
from segments.files.pathcheck import check_partition_dir
from segments.files.segment import read_header_at
from segments.partition.log import LogConfig, PartitionLog

__all__ = ["maintain_idle_logs", "roll_if_idle"]

log = logging.getLogger(__name__)

_LONG_MAX = 2**63 - 1


def _active_segment(directory) -> tuple[int, os.stat_result] | None:
    bases = []
    for name in os.listdir(directory):
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed.kind == fmt.LOG_SUFFIX and not parsed.state:
            bases.append(parsed.offset)
    if not bases:
        return None
    base = max(bases)
    return base, os.stat(os.path.join(directory, fmt.offset_file_name(base, fmt.LOG_SUFFIX)))


def roll_if_idle(directory, *, max_compaction_lag_ms: int, now_ms: int, config: LogConfig) -> bool:
    """Roll the active segment of the partition at `directory` if it is idle (see the module docstring)."""
    if max_compaction_lag_ms >= _LONG_MAX:
        return False
    check_partition_dir(directory)  # LinkRefusedError: nothing in a log dir is followed, not even to peek
    active = _active_segment(directory)
    if active is None or active[1].st_size == 0:
        return False
    base, st = active
    if now_ms - st.st_mtime_ns // 1_000_000 < max_compaction_lag_ms:
        return False
    path = os.path.join(directory, fmt.offset_file_name(base, fmt.LOG_SUFFIX))
    with open(path, "rb") as f:
        try:
            first_ts = read_header_at(f.fileno(), 0, path).max_timestamp
        except SegmentError:
            return False
    if first_ts >= 0 and now_ms - first_ts < max_compaction_lag_ms:
        return False
    try:
        with PartitionLog.open(directory, mode="writer", config=config) as plog:
            plog.roll(reason="idle for max.compaction.lag.ms")
    except LockTimeoutError:
        return False  # a writer owns it: its own appends will roll it
    log.info("rolled idle active segment dir=%s base=%d", directory, base)
    return True


def maintain_idle_logs(manager, now_ms: int) -> int:
    """Roll every idle compacted log the manager knows; returns how many were rolled."""
    rolled = 0
    for status in manager.idle_roll_candidates():
        if status.log_dir in manager.offline_log_dirs:
            continue
        topic = manager.topic_settings(status.topic, status.log_dir)
        if not topic.compact or topic.max_compaction_lag_ms >= _LONG_MAX:
            continue
        config = topic.log_config()
        try:
            rolled += roll_if_idle(
                status.directory, max_compaction_lag_ms=topic.max_compaction_lag_ms, now_ms=now_ms, config=config
            )
        except (OSError, SegmentError) as exc:
            log.warning("idle roll failed dir=%s error=%s", status.directory, exc)
    return rolled
