"""One cleaning round of one partition: survey, range, index, recopy group by group, swap, checkpoint.

Owns Kafka's `Cleaner.clean` for a single log, with no globals: everything it depends on
(settings, the offset map, the clock, the abort check, the I/O accounting) is passed in. The manager and
the thread pool (which log next, when, on which thread) live elsewhere.

Guarantees: offsets never change and records never reorder; each group is swapped in atomically (see
`segments.partition.log.PartitionLog.replace_segments`); corruption of framing, CRCs or offsets anywhere in the
inactive segments, and anything wrong in the dirty section's records, is found by the survey and the index
phase before anything is swapped, and then the round raises `CorruptRecordError` (file and position) with
the log byte-for-byte as it was. Damage under a valid CRC inside the records of the clean section (which
only the recopy decodes) is found when the recopy reaches its group: the groups before it stay swapped, each
complete, as in Kafka; that group and every later one are left as they were. An abort (`check_abort` raising) between windows removes the group's `.cleaned`
files and leaves every group old or new. The cleaner checkpoint is written only after every group swapped,
and only when it moves. A group whose output is its input byte for byte is not swapped (`cleaner.recopy`),
so a round with nothing to remove changes no file.

Delete horizons (KIP-534): the round reports the soonest horizon of a kept tombstone or marker that a later
pass may act on (`RoundResult.next_delete_horizon_ms`); with `horizon_pass`, a log whose survey finds such a
horizon passed in the segments a pass recopies (`CleanableRange.kept_delete_horizon_ms`, the figure the daemon's
selection reads from the same headers) gets that pass even with nothing dirty.

In generational mode (`cleaner.generations`) the offset map covers the younger merged generations and the
dirty head, only segments from the oldest merged generation on are recopied, and a partial round keeps every
tombstone and marker; the generation starts are recorded after the checkpoint.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from offsetmap import OffsetMap
from segments.files import faults
from segments.files.readahead import WindowRing
from segments.files.segment import LogSegment
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT
from segments.partition.log import PartitionLog

from .cleanable import CleanableRange, cleanable_range, segment_floor
from .errors import CleanerError
from .generations import GenerationPlan, load_starts, plan_round, save_starts
from .group_runs import recopy_groups
from .indexing import IndexAhead, PartThreads, build_offset_map
from .recopy import RecopyContext, RecopyStats, group_segments
from .safety import check_group
from .settings import TopicSettings
from .survey import WINDOW_BYTES, SurveyMemo, survey_log

__all__ = ["CleaningAbortedError", "RoundResult", "clean_round"]

log = logging.getLogger(__name__)

PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86_400_000


class CleaningAbortedError(CleanerError):
    """Raised by a `check_abort` callable to stop a round at the next window boundary."""


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round did (the figures of Kafka's per-round log line, and more)."""

    topic: str
    partition: int
    first_dirty: int
    end_offset: int  # the new checkpoint: the first offset not cleaned by this round
    first_uncleanable: int
    bound: str
    dry_run: bool
    map_full: bool
    map_utilization: float
    records_indexed: int
    bytes_read: int
    bytes_written: int
    records_read: int
    records_written: int
    dirty_records_read: int  # data records of the dirty section read by the recopy
    dirty_records_written: int  # ... and kept: their ratio is the round's survivorship
    batches_read: int
    batches_written: int
    batches_rebuilt: int
    batches_emptied: int
    invalid_records: int
    # The soonest delete horizon of a kept tombstone or marker below the first uncleanable offset that a later
    # pass may act on (-1: none): when a horizon pass is due.
    next_delete_horizon_ms: int
    size_before_bytes: int
    size_after_bytes: int
    groups: int
    recopy_from: int  # the first offset recopied: the log start, except in a partial generational round
    generations_merged: int  # generational mode: generations merged with the dirty head (0 otherwise)
    full_cycle: bool  # the whole log was recopied (always, outside generational mode)
    survey_bytes_read: int
    survey_s: float
    index_s: float
    recopy_s: float
    elapsed_s: float
    verified_records: int = 0  # log.cleaner.verify: latest records confirmed in the output (0 when off)
    verify_s: float = 0.0
    groups_unchanged: int = 0  # groups whose output was their input: not swapped (same files, same inodes)

    @property
    def survivorship(self) -> float | None:
        """Fraction of the dirty section's data records the round kept (None when it read none)."""
        return self.dirty_records_written / self.dirty_records_read if self.dirty_records_read else None

    @property
    def done(self) -> bool:
        """True when the dirty section is fully cleaned (no further round needed now)."""
        return self.end_offset >= self.first_uncleanable

    def as_dict(self) -> dict:
        # every field is a number, a string or a bool: a shallow copy is asdict's result, at a tenth of its cost
        # (`/status` of 10,000 partitions, issue 19)
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def log_line(self) -> str:
        mb = 1024 * 1024
        reduction = 100.0 * (1 - self.size_after_bytes / self.size_before_bytes) if self.size_before_bytes else 0.0
        return (
            f"cleaned log {self.topic}-{self.partition} (dirty section = [{self.first_dirty}, {self.end_offset}]) "
            f"{self.bytes_read / mb:.1f} MB of log processed in {self.elapsed_s:.1f} seconds "
            f"({self.bytes_read / mb / max(self.elapsed_s, 1e-9):.1f} MB/sec); "
            f"indexed {self.records_indexed} records in {self.index_s:.2f} s ({100 * self.index_s / max(self.elapsed_s, 1e-9):.0f}% of time), "
            f"buffer utilization {100 * self.map_utilization:.1f}%; "
            f"cleaned {self.records_read} records into {self.records_written} in {self.recopy_s:.2f} s; "
            f"size {self.size_before_bytes / mb:.1f} MB -> {self.size_after_bytes / mb:.1f} MB ({reduction:.1f}% size reduction); "
            f"invalid (unkeyed) records dropped: {self.invalid_records}"
        )


def clean_round(
    log_: PartitionLog,
    topic: TopicSettings,
    offset_map: OffsetMap,
    *,
    now_ms: int,
    producer_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    forced_from: int | None = None,
    forced_to: int | None = None,
    dry_run: bool = False,
    force_recopy: bool = False,
    horizon_pass: bool = False,
    seed: int | None = None,
    check_abort: Callable[[], None] = lambda: None,
    on_bytes: Callable[[int, str], None] = lambda n, direction: None,
    ring: WindowRing | None = None,
    survey_memo: SurveyMemo | None = None,
    verify: bool = False,
    direct_writes: bool = True,
    charge_io: Callable[[int], None] = lambda n: None,
    recopy_threads: int = 1,
) -> RoundResult:
    """Clean `log_` (opened in cleaner mode) once; see the module docstring.

    The map is reset with `seed` (random when None) so that a rare 128-bit hash collision does not repeat
    round after round. With `force_recopy`, a log with no dirty section still has its clean section
    recopied, so tombstones and markers whose delete horizon has passed go (Kafka never revisits such a
    log until new writes make it dirty). With `horizon_pass`, the same when the survey finds a kept
    tombstone's or marker's delete horizon passed (from the log start to the first uncleanable offset), and
    only then: what `logcleaner clean` asks. `ring` holds the read buffers of the round's windows; a cleaner
    thread passes the same one every round, as it does its map, so rounds reuse memory; likewise `survey_memo`
    (`cleaner.survey.SurveyMemo`), so that the next round of the same partition does not read its unchanged
    inactive segments' headers again. With `verify` (`log.cleaner.verify`), each group passes
    `cleaner.safety.check_group` before it is swapped in. With `direct_writes` (`log.cleaner.io.direct`) the
    `.cleaned` segments are written around the page cache (`segments.files.direct`). `charge_io(n)` is called
    before every read and write of n bytes, on the thread doing it (the device's
    I/O throttle, `cleaner.throttle`: it may block, or raise to abort); `on_bytes(n, direction)` after; both, and
    `check_abort`, may be called from several threads at once when `recopy_threads` > 1 (the groups' independent
    runs recopied at once, swapped in log order: `cleaner.group_runs`; and as many segments surveyed at once).
    Raises
    `CorruptRecordError`, `CleaningAbortedError` (from `check_abort`), `SafetyCheckError` or `OSError`; the
    log then holds every group either old or new and the checkpoint is unchanged.
    """
    started = time.monotonic()
    ring = ring if ring is not None else WindowRing(WINDOW_BYTES)
    log_.refresh(force=True)
    size_before = log_.size_bytes
    checkpoint = log_.read_log_dir_checkpoint(CLEANER_OFFSET_CHECKPOINT)
    high_watermark = log_.read_log_dir_checkpoint(REPLICATION_OFFSET_CHECKPOINT)
    map_seed = random.getrandbits(32) if seed is None else seed
    # The round's spare cores, each with read buffers of its own: they recopy groups, and all but one read and check
    # segments of the survey, whose windows this thread takes in order (the one it keeps busy: two threads survey
    # as one does, their read-ahead thread and this one; a third read-ahead thread measured slower there).
    more_rings = tuple(WindowRing(WINDOW_BYTES) for _ in range(recopy_threads - 1))
    # From four cores on, half of them fill the offset map, split into as many parts (`PartThreads`), and the other
    # half read ahead: one thread's inserts bound the survey of small records otherwise. Below that the cores
    # are busy reading ahead and inserting already: a split measured slower on two (docs/design.md, "One large
    # partition on several cores").
    part_count = max(1, recopy_threads // 2)
    with PartThreads(part_count - 1) as parts:
        ahead = None
        if forced_from is None and forced_to is None:
            ahead = _index_ahead(log_, topic, offset_map, map_seed, checkpoint, high_watermark, parts)
        survey = survey_log(log_, ring, charge_io=charge_io, on_bytes=on_bytes, index_ahead=ahead, memo=survey_memo,
                            more_rings=more_rings[part_count:])
        survey_s = time.monotonic() - started
        faults.hit("round.after_survey")
        facts = survey.facts(high_watermark)
        rng = cleanable_range(
            facts,
            topic,
            log_start_offset=log_.log_start_offset,
            now_ms=now_ms,
            checkpoint=checkpoint,
            forced_from=forced_from,
            forced_to=forced_to,
        )
        if rng.checkpoint_was_reset and not dry_run:
            log.warning(
                "resetting first dirty offset of %s-%d to log start offset %d since the checkpointed offset %s is invalid",
                log_.topic, log_.partition, rng.log_start_offset, checkpoint,
            )
            log_.write_log_dir_checkpoint(CLEANER_OFFSET_CHECKPOINT, rng.first_dirty)
        # Horizons stamped by earlier passes, as the survey sees them, in the segments a pass recopies: the rule the
        # daemon's selection applies to the same facts read without a survey (`cleaner.manager`).
        if horizon_pass and rng.horizon_passed(now_ms):
            force_recopy = True  # a kept tombstone's or marker's horizon has passed: recopy the clean section too
        if rng.empty and not (force_recopy and rng.first_dirty > rng.log_start_offset):
            return _result(log_, rng, None, None, RecopyStats(), dry_run, size_before, survey_s, 0.0, started, offset_map,
                           survey.bytes_read, None, left_horizon_ms=rng.kept_delete_horizon_ms)
        generations = _plan_generations(log_, survey, topic, rng, offset_map, force_recopy) if forced_from is None else None
        map_from = generations.map_from if generations is not None else rng.first_dirty
        recopy_from = generations.recopy_from if generations is not None else rng.log_start_offset
        index = ahead.result(rng.first_dirty, rng.first_uncleanable, map_from) if ahead is not None else None
        if index is None:  # not indexed in the survey's pass: the index phase reads the section again
            # The indexed section's offset span bounds its keys: a small section probes (and touches) a small table.
            offset_map.reset(map_seed, expected_keys=rng.first_uncleanable - map_from, parts=parts.parts)
            index = build_offset_map(
                log_, survey, offset_map, map_from, rng.first_uncleanable, check_abort=check_abort, on_bytes=on_bytes,
                ring=ring, charge_io=charge_io, parts=parts,
            )
    faults.hit("round.after_index")
    segments = log_.segments
    clean_section = [s for s in segments if s.base_offset < rng.first_dirty]
    legacy_horizon = clean_section[-1].last_modified_ns() // 1_000_000 - topic.delete_retention_ms if clean_section else 0
    ctx = RecopyContext(
        offset_map=offset_map,
        latest_offset=index.end_offset - 1,
        survey=survey,
        now_ms=now_ms,
        delete_retention_ms=topic.delete_retention_ms,
        legacy_delete_horizon_ms=legacy_horizon,
        producer_expiration_ms=producer_expiration_ms,
        superseded=index.superseded,
        dry_run=dry_run,
        partial=generations is not None and not generations.full,
        first_dirty=rng.first_dirty,
        txn_data_written=None if generations is not None and not generations.full else {},
        direct_writes=direct_writes,
    )
    stats = RecopyStats()
    groups = group_segments(
        [s for s in segments if s.base_offset >= recopy_from],
        index.end_offset,
        first_uncleanable=rng.first_uncleanable,
        segment_bytes=topic.segment_bytes,
        segment_index_bytes=topic.segment_index_bytes,
    )
    verified, verify_s = 0, 0.0

    def swap(group: list[LogSegment], cleaned: LogSegment | None) -> None:
        nonlocal verified, verify_s
        if cleaned is None:
            log.debug("group not swapped (unchanged or a dry run) dir=%s base_offset=%d", log_.directory,
                      group[0].base_offset)
            return
        if verify:
            t = time.monotonic()
            try:
                verified += check_group(group, cleaned, offset_map, survey, f"{log_.topic}-{log_.partition}",
                                        charge_io=charge_io)
            except BaseException:
                cleaned.delete_files()
                raise
            verify_s += time.monotonic() - t
        log_.replace_segments([cleaned], group)

    recopy_groups(log_, groups, ctx, stats, swap, rings=(ring, *more_rings), check_abort=check_abort,
                  on_bytes=on_bytes, charge_io=charge_io)
    if not dry_run:
        # A pass over the clean section alone leaves the checkpoint where it was: then it is not rewritten.
        if index.end_offset != (rng.first_dirty if rng.checkpoint_was_reset else checkpoint):
            faults.hit("checkpoint.before_write")
            log_.write_log_dir_checkpoint(CLEANER_OFFSET_CHECKPOINT, index.end_offset)
            faults.hit("checkpoint.after_write")
        if generations is not None:
            older = [s for s in generations.generations[1:] if s < recopy_from]
            starts = older + ([recopy_from] if recopy_from > rng.log_start_offset else [])
            if starts != load_starts(log_.directory):
                save_starts(log_.directory, starts, file_ops=log_.file_ops)
    recopied = frozenset(s.base_offset for group in groups for s in group)
    result = _result(log_, rng, index, groups, stats, dry_run, size_before, survey_s, index.elapsed_s, started, offset_map,
                     survey.bytes_read, generations, (verified, verify_s),
                     left_horizon_ms=facts.earliest_delete_horizon_ms(rng.log_start_offset, rng.first_uncleanable,
                                                                      recopied))
    log.info("%s", result.log_line())
    if result.groups_unchanged:
        log.info("%d of %d group(s) of %s-%d came out as they went in: not swapped (no rename, no fsync)",
                 result.groups_unchanged, result.groups, log_.topic, log_.partition)
    if result.invalid_records:
        log.warning("found %d invalid (unkeyed) records in %s-%d", result.invalid_records, log_.topic, log_.partition)
    return result


def _index_ahead(log_: PartitionLog, topic: TopicSettings, offset_map: OffsetMap, seed: int, checkpoint: int | None,
                 high_watermark: int | None, parts: PartThreads) -> IndexAhead | None:
    """The map filled in the survey's pass (`IndexAhead`), with the map reset for it, when the dirty section's
    bounds can be foreseen from the checkpoint, the active segment and the high watermark: not for a
    generational round (it may index below the first dirty offset) nor with `min.compaction.lag.ms` (its
    bound needs the survey's timestamps)."""
    segments = log_.segments
    if topic.cleaner_mode == "generational" or topic.min_compaction_lag_ms > 0 or len(segments) < 2:
        return None
    first_dirty = log_.log_start_offset if checkpoint is None or checkpoint < log_.log_start_offset else checkpoint
    limit = segments[-1].base_offset if high_watermark is None else min(segments[-1].base_offset, high_watermark)
    end = segment_floor([s.base_offset for s in segments], limit, log_.log_start_offset)
    if end <= first_dirty:
        return None
    offset_map.reset(seed, expected_keys=end - first_dirty, parts=parts.parts)
    return IndexAhead(offset_map, segments, first_dirty, end, parts)


def _plan_generations(log_: PartitionLog, survey, topic: TopicSettings, rng: CleanableRange,
                      offset_map: OffsetMap, force_full: bool) -> GenerationPlan | None:
    """The generational plan of this round, or None outside generational mode."""
    if topic.cleaner_mode != "generational":
        return None
    return plan_round(
        load_starts(log_.directory),
        [s.base_offset for s in survey.segments],
        [s.size_bytes for s in survey.segments],
        log_start=rng.log_start_offset,
        first_dirty=rng.first_dirty,
        first_uncleanable=rng.first_uncleanable,
        ratio=topic.cleaner_generation_ratio,
        map_capacity=offset_map.capacity,
        force_full=force_full,
    )


def _result(log_, rng: CleanableRange, index, groups, stats: RecopyStats, dry_run, size_before, survey_s, index_s, started,
            offset_map, survey_bytes, generations: GenerationPlan | None, verified=(0, 0.0), *,
            left_horizon_ms: int = -1) -> RoundResult:
    """The round's result; `left_horizon_ms` is the soonest horizon of the segments it did not recopy."""
    size_after = size_before - stats.bytes_read + stats.bytes_written if dry_run else log_.size_bytes
    horizons = [h for h in (stats.earliest_delete_horizon_ms, left_horizon_ms) if h >= 0]
    return RoundResult(
        topic=log_.topic,
        partition=log_.partition,
        first_dirty=rng.first_dirty,
        end_offset=index.end_offset if index is not None else rng.first_dirty,
        first_uncleanable=rng.first_uncleanable,
        bound=rng.bound,
        dry_run=dry_run,
        map_full=index.map_full if index is not None else False,
        map_utilization=offset_map.utilization if index is not None else 0.0,
        records_indexed=index.records_indexed if index is not None else 0,
        bytes_read=stats.bytes_read + (index.bytes_read if index is not None else 0),
        bytes_written=stats.bytes_written,
        records_read=stats.records_read,
        records_written=stats.records_written,
        dirty_records_read=stats.dirty_records_read,
        dirty_records_written=stats.dirty_records_written,
        batches_read=stats.batches_read,
        batches_written=stats.batches_written,
        batches_rebuilt=stats.batches_rebuilt,
        batches_emptied=stats.batches_emptied,
        invalid_records=stats.invalid_records,
        next_delete_horizon_ms=min(horizons, default=-1),
        size_before_bytes=size_before,
        size_after_bytes=size_after,
        groups=len(groups) if groups is not None else 0,
        recopy_from=generations.recopy_from if generations is not None else rng.log_start_offset,
        generations_merged=generations.merged if generations is not None else 0,
        full_cycle=generations is None or generations.full,
        survey_bytes_read=survey_bytes,
        survey_s=survey_s,
        index_s=index_s,
        recopy_s=stats.elapsed_s,
        elapsed_s=time.monotonic() - started,
        verified_records=verified[0],
        verify_s=verified[1],
        groups_unchanged=stats.groups_unchanged,
    )
