"""The cleaner manager: every partition's state, and which log a free thread cleans next.

Owns what Kafka's `LogCleanerManager` owns, under one lock: discovering partition directories under the
log dirs (new and removed ones are noticed at every pass), estimating each log's cleanable range, dirty
ratio and compaction delay with the function a round uses (`cleaner.cleanable.cleanable_range`, so a log is
selected only for what a round may clean: an open transaction bounds both) from the facts segments/ reads
about its files cheaply (`segments.partition.facts`: each segment file's headers walked once while it does
not change, an active segment's only where it grew; no log is held open, no lock taken), picking the
filthiest eligible log (ratio above `min.cleanable.dirty.ratio`, or overdue by `max.compaction.lag.ms`, or
triggered by an operator, or keeping a tombstone or marker whose delete horizon has passed), and the
per-partition state machine: idle → in progress → idle, in progress → aborted → paused, paused(n) ↔
paused(n±1) with counted pauses.

Where it does better than Kafka (docs/kafka-cleaner.md section 4): an uncleanable partition is retried when
its files change or after a backoff that doubles up to a cap, instead of staying stuck until restart; a
log whose tombstones or markers wait only for a second pass is selected again once their horizon passes,
and only while one has passed; a log dir whose files raise an I/O error goes offline alone; concurrent
cleanings are spread over devices.

Delete horizons: a log's next one is the soonest its batch headers keep where a pass reaches
(`CleanableRange.kept_delete_horizon_ms`, the figure a round's horizon pass goes by), read at every pass
whoever stamped them (a `clean`, `demo`, this daemon before a restart), or the one its last round reported a
later pass can act on (`cleaner.recopy`). A kept horizon that had already passed when the partition's last
round of this run was selected is passed over: that round kept it (a batch no pass removes, e.g. a marker
another cleaner stamped while its transaction keeps data), so no log is selected again and again for it.

Selection over many partitions (docs/design.md, "Many partitions"): each partition's estimate and eligibility
are kept in memory, with the eligible logs in a heap per device, and a pass works out again only the
partitions something says changed: an outcome of this daemon (a round, an abort, a failure, retention, a
pause, a trigger), a probe of its directory and active segment that differs (`FactsCache.unchanged`; each
partition is probed at most once per `probe_interval_ms`, at most `PROBES_PER_PASS` of them per pass while there
is work, all the due ones before a thread goes idle), the clock reaching the time at which its range changes by
itself (`CleanableRange.changes_at_ms`, a retry or backoff time), a log-dir checkpoint that someone else
rewrote, new settings or metadata. The checkpoints are read once per pass, and parsed again only when their
bytes changed (`segments.partition.checkpoint`).

It never cleans and never reads or writes segment or index bytes itself: it lists and stats partition
directories, reads the log dir's checkpoint files, and asks `segments.partition.facts` about the rest; the
pool's threads clean (see `cleaner.pool`).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import heapq
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from segments.codec import format as fmt
from segments.codec.errors import SegmentError
from segments.files import pathcheck
from segments.files.names import parse_segment_file_name
from segments.partition.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    cached_offset_checkpoint,
)
from segments.partition.facts import RACY_NS, FactsCache
from segments.partition.locks import log_dir_owner
from segments.partition.log import parse_partition_dir_name, update_log_dir_checkpoint
from segments.tools.kraft import METADATA_PARTITION

from . import survivorship
from .cleanable import CleanableRange, cleanable_range, horizon_passed
from .errors import CleanerError
from .policy import (
    NEVER_TOUCHED_TOPICS,
    ClusterView,
    PolicyError,
    TopicPolicy,
    cluster_view,
    resolve_policy,
    unknown_policy_hint,
)
from .retention import RetentionResult, may_delete_below_log_start
from .round import RoundResult
from .settings import Settings, TopicSettings

__all__ = ["CleanerManager", "Candidate", "PartitionState", "PartitionStatus", "StateError"]

log = logging.getLogger(__name__)

UNCLEANABLE_RETRY_MS_DEFAULT = 60 * 60 * 1000
UNCLEANABLE_RETRY_MS_MAX = 24 * 60 * 60 * 1000
DISK_FULL_RETRY_MS_DEFAULT = 60_000  # a round that ran out of space is retried after this, doubling per failure
PROBES_PER_PASS = 256  # partitions probed by a pass that has work to hand out (~1 ms)
_SELECTION_CHECKPOINTS = (CLEANER_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT)


class PartitionState(enum.Enum):
    IDLE = "idle"
    IN_PROGRESS = "in_progress"
    ABORTED = "aborted"
    PAUSED = "paused"


class StateError(CleanerError, RuntimeError):
    """An operation the partition's state does not allow (Kafka's IllegalStateException)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A log chosen for cleaning, as handed to a thread."""

    directory: Path
    log_dir: Path
    topic: str
    partition: int
    dirty_ratio: float
    compaction_delay_ms: int
    reason: str  # "dirty ratio", "max.compaction.lag.ms", "triggered", "delete horizon"
    force_recopy: bool  # recopy even with no dirty section (to drop tombstones and markers whose horizon passed)


@dataclass(slots=True)
class PartitionStatus:
    """Everything the manager knows about one partition (what `/status` shows)."""

    directory: Path
    log_dir: Path
    topic: str
    partition: int
    state: PartitionState = PartitionState.IDLE
    pauses: int = 0
    dirty_ratio: float = 0.0
    cleanable_bytes: int = 0
    total_bytes: int = 0
    clean_bytes: int = 0  # bytes below the first dirty offset
    first_dirty: int = 0
    first_uncleanable: int = 0
    compaction_delay_ms: int = 0
    triggered: bool = False
    # The soonest delete horizon of a kept tombstone or marker, from its files and its last round (-1: none kept):
    # when a horizon pass is due.
    next_delete_horizon_ms: int = -1
    round_delete_horizon_ms: int = -1  # the one its last round of this run reported (-1: none)
    selected_at_ms: int = -1  # the clock when its running (or last) round was selected
    horizons_seen_ms: int = -1  # when its last finished round was selected: kept horizons up to then were its own
    uncleanable_reason: str | None = None
    uncleanable_fingerprint: tuple = ()
    uncleanable_retry_at_ms: int = 0
    uncleanable_failures: int = 0
    busy_until_ms: int = 0  # another process held its cleaner lock, or its disk was full: passed over until then
    disk_full_failures: int = 0
    survivorship: float | None = None  # smoothed, from the log dir's survivorship checkpoint (survivorship policy)
    last_result: RoundResult | None = None
    last_error: str | None = None
    rounds: int = 0
    policy: TopicPolicy | None = None  # resolved at discovery (`cleaner.policy`); None until then
    log_start_offset: int | None = None  # after the last retention that deleted segments
    retention_segments_deleted: int = 0  # by this daemon since it started
    retention_bytes_deleted: int = 0
    last_retention: RetentionResult | None = None

    def as_dict(self) -> dict:
        out = {
            "partition": f"{self.topic}-{self.partition}",
            "directory": str(self.directory),
            "log_dir": str(self.log_dir),
            "state": self.state.value,
            "pauses": self.pauses,
            "dirty_ratio": round(self.dirty_ratio, 6),
            "cleanable_bytes": self.cleanable_bytes,
            "total_bytes": self.total_bytes,
            "first_dirty": self.first_dirty,
            "first_uncleanable": self.first_uncleanable,
            "compaction_delay_ms": self.compaction_delay_ms,
            "uncleanable": self.uncleanable_reason is not None,
            "uncleanable_reason": self.uncleanable_reason,
            "rounds": self.rounds,
            "last_error": self.last_error,
            "disk_full_failures": self.disk_full_failures,
            "survivorship": self.survivorship,
            "next_delete_horizon_ms": self.next_delete_horizon_ms,
            "cleanup_policy": ",".join(self.policy.policy or ()) if self.policy is not None else "",
            "policy_known": self.policy is not None and self.policy.known,
            "policy_source": None if self.policy is None else self.policy.source,
            "log_start_offset": self.log_start_offset,
            "retention_segments_deleted": self.retention_segments_deleted,
            "retention_bytes_deleted": self.retention_bytes_deleted,
            "last_retention": None if self.last_retention is None else self.last_retention.as_dict(),
            "last_round": None if self.last_result is None else self.last_result.as_dict(),
        }
        return out


def _fingerprint(directory: Path) -> tuple:
    """What changes when a partition's inactive segment files change (names, sizes, mtimes).

    The active segment is left out: its writer appends to it all the time, and a cleaning failure comes
    from the inactive segments, so only a change there is a reason to retry at once.
    """
    parsed = [(name, p) for name in os.listdir(directory) if (p := parse_segment_file_name(name)) is not None]
    logs = [p.offset for _, p in parsed if p.kind == fmt.LOG_SUFFIX and not p.state]
    active = max(logs) if logs else None
    out = []
    for name, p in sorted(parsed):
        if p.offset == active and not p.state:
            continue
        st = os.lstat(directory / name)  # a link is never followed, not even to stat it
        out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _metadata_signature(log_dir: Path, settings: Settings) -> tuple:
    """What changes when a metadata log that could serve `log_dir` changes (names, sizes, mtimes)."""
    out: list[tuple] = []
    for base in [log_dir, settings.cleaner.metadata_log_dir, *settings.cleaner.log_dirs]:
        if not base:
            continue
        directory = Path(base) / METADATA_PARTITION
        try:
            with os.scandir(directory) as entries:
                stats = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
        except OSError:
            continue
        out.append((str(directory), tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))))
    out.append(("meta.properties", os.path.exists(log_dir / "meta.properties")))
    return tuple(out)


class _CheckpointReads:
    """The log dirs' checkpoint files as read during one selection pass: each file once, not once per partition
    (and parsed again only when its bytes changed: `cached_offset_checkpoint`)."""

    def __init__(self) -> None:
        self._read: dict[tuple[Path, str], tuple] = {}

    def read(self, log_dir: Path, name: str):
        """`(entries, version, foreign version)` of `name` in `log_dir` (see `cached_offset_checkpoint`)."""
        found = self._read.get((log_dir, name))
        if found is None:
            found = self._read[(log_dir, name)] = cached_offset_checkpoint(log_dir / name)
        return found


class CleanerManager:
    """Partition states and selection; every public method is thread-safe."""

    def __init__(
        self,
        log_dirs: Iterable[str | os.PathLike],
        settings: Settings,
        *,
        clock_ms: Callable[[], int],
        uncleanable_retry_ms: int = UNCLEANABLE_RETRY_MS_DEFAULT,
        disk_full_retry_ms: int = DISK_FULL_RETRY_MS_DEFAULT,
        probe_interval_ms: int = 0,
    ) -> None:
        """`probe_interval_ms`: how long a partition's probe holds (see the module docstring); the daemon's is
        `log.cleaner.backoff.ms`, 0 probes every partition at every pass."""
        self._lock = threading.Condition()
        self.probe_interval_ms = probe_interval_ms
        self.disk_full_retry_ms = disk_full_retry_ms
        self.log_dirs = [Path(d) for d in log_dirs]
        self.settings = settings
        self.clock_ms = clock_ms
        self.uncleanable_retry_ms = uncleanable_retry_ms
        self.partitions: dict[Path, PartitionStatus] = {}
        self.offline_log_dirs: dict[Path, str] = {}
        self.owned_log_dirs: set[Path] = set()  # offline because a Kafka broker holds their .lock (rechecked)
        self.views: dict[Path, ClusterView] = {}  # per log dir: its cluster's metadata and the settings from it
        self._view_keys: dict[Path, tuple] = {}  # what each view was built from (settings, metadata files)
        self._settings_generation = 0  # bumped by reconfigure: every view is built again
        self.ignored: dict[Path, str] = {}  # log dir entries passed over by discovery, and why
        self.last_selection_ms: int | None = None
        self._facts = FactsCache()  # each segment file's facts, read once while it does not change
        # Selection state (see the module docstring); the containers are changed under self._lock.
        self._select_lock = threading.Lock()  # one selection pass at a time
        self._stale: set[Path] = set()  # to be worked out again at the next pass
        self._rechecks: list[tuple[int, str, Path]] = []  # heap of (clock ms, name, directory): stale then
        self._recheck_at: dict[Path, int] = {}
        # (time.monotonic() of its last probe, directory), oldest probe first
        self._probe_order: collections.deque[tuple[float, Path]] = collections.deque()
        self._eligible: dict[Path, tuple[int, Candidate]] = {}  # directory -> (its heap entry's number, candidate)
        self._heaps: dict[int, list[tuple[tuple, str, int, Path]]] = {}  # device -> heap of (rank, name, number, dir)
        self._entries = 0
        self._devices: dict[Path, int] = {}  # log dir -> st_dev
        self._foreign: dict[tuple[Path, str], int] = {}  # checkpoint -> its foreign version at the last pass
        self._topics: dict[tuple[str, Path | None], TopicSettings] = {}  # topic_settings, until settings change
        self._last_now: int | None = None
        self._last_pick: Path | None = None
        self._listed: dict[Path, tuple] = {}  # discovery: what each log dir's listing was made from
        self._found: dict[Path, dict[Path, tuple[Path, str, int]]] = {}  # ... and the partitions it found
        self._ignored_by_dir: dict[Path, dict[Path, str]] = {}
        self._online_last: list[Path] | None = None  # the log dirs the last discovery listed
        self._rollable: list[PartitionStatus] | None = None  # idle_roll_candidates, until partitions or settings change

    # ---- discovery ----------------------------------------------------------------------------------

    def discover(self) -> None:
        """Add new partition directories and drop removed ones, across every online log dir.

        Entries of a log dir that are not partitions are passed over: files, and Kafka's `-delete`,
        `-future`, `-stray` directories and `lost+found`, quietly; symbolic links (never followed) and
        directories whose names are not `<topic>-<partition>` (`segments.files.pathcheck`) with a warning,
        logged once while the entry stays, and an entry in `ignored` (shown by `/status`).

        A log dir whose directory (inode, mtime) is as at its last listing, that listing not racy
        (`segments.partition.facts.RACY_NS`), under the same settings and cluster view, is not listed again.
        """
        self._check_owners()
        changed = False
        online: list[Path] = []
        for log_dir in self.log_dirs:
            if log_dir in self.offline_log_dirs:
                continue
            self._refresh_view(log_dir)
            try:
                st = os.stat(log_dir)
                key = (self._settings_generation, self._view_keys.get(log_dir), st.st_ino, st.st_mtime_ns)
                if self._listed.get(log_dir) == key and log_dir in self._found:
                    online.append(log_dir)
                    continue
                listed_ns = time.time_ns()
                with os.scandir(log_dir) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
            except OSError as exc:
                self.mark_log_dir_offline(log_dir, f"cannot list: {exc}")
                continue
            online.append(log_dir)
            changed = True
            self._found[log_dir], self._ignored_by_dir[log_dir] = self._list_log_dir(log_dir, entries)
            self._listed[log_dir] = key if listed_ns - st.st_mtime_ns >= RACY_NS else ()  # racy: list it again
        if not changed and online == self._online_last:
            return
        self._online_last = online
        self._rollable = None
        found: dict[Path, tuple[Path, str, int]] = {}
        ignored: dict[Path, str] = {}
        for log_dir in online:
            found.update(self._found[log_dir])
            ignored.update(self._ignored_by_dir[log_dir])
        with self._lock:
            for path, reason in ignored.items():
                if self.ignored.get(path) != reason:
                    log.warning("ignoring log dir entry path=%s reason=%s", pathcheck.display_path(path), reason)
            self.ignored = ignored
            for directory in list(self.partitions):
                if self.partitions[directory].log_dir in self.offline_log_dirs:
                    continue  # not listed while offline; still shown (an offline log dir's partitions are not gone)
                if directory not in found and self.partitions[directory].state != PartitionState.IN_PROGRESS:
                    log.info("partition removed dir=%s", directory)
                    del self.partitions[directory]
                    self._facts.forget(directory)
                    self._withdraw(directory)
                    self._recheck_at.pop(directory, None)
            for directory, (log_dir, topic, partition) in found.items():
                if directory not in self.partitions:
                    log.info("partition discovered dir=%s", directory)
                    self.partitions[directory] = PartitionStatus(directory, log_dir, topic, partition)
                    self._probe_order.append((time.monotonic(), directory))
                    self._stale.add(directory)
                status = self.partitions[directory]
                view = self.views.get(log_dir)
                policy = resolve_policy(topic, view) if view is not None else TopicPolicy(
                    topic, None, "the cluster's metadata could not be read (see the log)")
                if policy != status.policy and not policy.known:
                    hint = "" if policy.never else f"; decide it with {unknown_policy_hint(topic, daemon=True)}"
                    log.warning("partition left as it is dir=%s %s%s", pathcheck.display_path(directory),
                                policy.describe(), hint)
                if policy != status.policy:
                    self._stale.add(directory)
                status.policy = policy

    @staticmethod
    def _list_log_dir(log_dir: Path, entries: list[os.DirEntry]) -> tuple[dict[Path, tuple[Path, str, int]],
                                                                          dict[Path, str]]:
        """The partition directories among a log dir's entries, and the entries passed over with a warning."""
        found: dict[Path, tuple[Path, str, int]] = {}
        ignored: dict[Path, str] = {}
        for entry in entries:
            child = log_dir / entry.name
            try:
                if entry.is_symlink():
                    ignored[child] = "is a symbolic link; logcleaner does not follow links inside a log dir"
                    continue
                if not entry.is_dir(follow_symlinks=False):
                    continue
            except OSError:
                continue  # gone since the listing
            parsed = parse_partition_dir_name(entry.name)
            if parsed is None:
                if not pathcheck.is_known_non_partition_dir(entry.name):
                    problem = pathcheck.partition_dir_name_problem(entry.name)
                    ignored[child] = f"not a partition directory (<topic>-<partition>): {problem}"
                continue
            if parsed[0] in NEVER_TOUCHED_TOPICS:
                continue
            found[child] = (log_dir, parsed[0], parsed[1])
        return found, ignored

    def _check_owners(self) -> None:
        """Take log dirs a running Kafka broker owns offline, and bring them back once it has gone."""
        for log_dir in self.log_dirs:
            owner = log_dir_owner(log_dir)
            with self._lock:
                if owner is not None and log_dir not in self.offline_log_dirs:
                    log.warning("log dir offline: %s; checked again every discovery interval", owner)
                    self.offline_log_dirs[log_dir] = str(owner)
                    self.owned_log_dirs.add(log_dir)
                elif owner is None and log_dir in self.owned_log_dirs:
                    log.info("log dir back online: no Kafka broker holds its .lock any more dir=%s", log_dir)
                    self.owned_log_dirs.discard(log_dir)
                    self.offline_log_dirs.pop(log_dir, None)
                    self._invalidate_log_dir(log_dir)

    def broker_owns(self, log_dir: Path, error: BaseException) -> None:
        """A round found `log_dir`'s .lock held by a broker: offline until discovery sees it free."""
        with self._lock:
            if log_dir not in self.offline_log_dirs:
                log.warning("log dir offline: %s; checked again every discovery interval", error)
            self.offline_log_dirs[log_dir] = str(error)
            self.owned_log_dirs.add(log_dir)

    def _refresh_view(self, log_dir: Path) -> None:
        """Re-read `log_dir`'s cluster view when the settings or the metadata log's files changed."""
        key = (self._settings_generation, _metadata_signature(log_dir, self.settings))
        if self._view_keys.get(log_dir) == key:
            return
        try:
            view = cluster_view(log_dir, self.settings)
        except PolicyError as exc:
            log.error("no topic of this log dir is cleaned until its cluster's metadata can be read dir=%s error=%s",
                      log_dir, exc)
            self.views.pop(log_dir, None)
        else:
            log.info("cluster view dir=%s %s", log_dir, view.describe())
            self.views[log_dir] = view
        self._view_keys[log_dir] = key
        with self._lock:
            self._topics.clear()
            self._rollable = None
            self._invalidate_log_dir(log_dir)

    def mark_log_dir_offline(self, log_dir: Path, reason: str) -> None:
        with self._lock:
            if log_dir not in self.offline_log_dirs:
                log.error("log dir offline dir=%s reason=%s", log_dir, reason)
            self.offline_log_dirs[log_dir] = reason

    def topic_settings(self, topic: str, log_dir: Path | None = None) -> TopicSettings:
        """`topic`'s settings in `log_dir`'s cluster view, with its resolved cleanup policy (empty when
        unknown: then nothing is compacted and retention deletes nothing but what lies below the log start)."""
        found = self._topics.get((topic, log_dir))
        if found is not None:
            return found
        view = self.views.get(log_dir) if log_dir is not None else None
        settings = view.settings if view is not None else self.settings
        policy = resolve_policy(topic, view) if view is not None else None
        found = dataclasses.replace(settings.topic(topic), cleanup_policy=(policy.policy or ()) if policy else ())
        self._topics[(topic, log_dir)] = found  # until the settings or the view change
        return found

    def reconfigure(self, settings: Settings, log_dirs: Iterable[str | os.PathLike]) -> None:
        with self._lock:
            self.settings = settings
            self.log_dirs = [Path(d) for d in log_dirs]
            self._settings_generation += 1
            self._topics.clear()
            self._rollable = None
            self._stale.update(self.partitions)
        self.discover()  # new settings may decide topics differently: resolve every policy again now

    # ---- estimating -----------------------------------------------------------------------------------

    def _estimate(self, status: PartitionStatus, now_ms: int, checkpoints: _CheckpointReads) -> CleanableRange | None:
        """Refresh a partition's cleanable range, dirty ratio and compaction delay: `cleanable_range`, the
        function a round uses, over the cheap facts `segments.partition.facts` reads of its files (None: no
        segment)."""
        topic = self.topic_settings(status.topic, status.log_dir)
        root = status.log_dir
        key = (status.topic, status.partition)
        # Links are not followed, and a FIFO, socket or device named like a segment file is not opened (opening a
        # FIFO blocks the selecting thread for good): the partition becomes uncleanable, naming the file.
        facts = self._facts.read(status.directory,
                                 high_watermark=checkpoints.read(root, REPLICATION_OFFSET_CHECKPOINT)[0].get(key))
        status.total_bytes = facts.size_bytes
        if not facts.segments:
            status.dirty_ratio, status.cleanable_bytes, status.clean_bytes, status.compaction_delay_ms = 0.0, 0, 0, 0
            status.next_delete_horizon_ms = -1
            return None
        log_start = max(facts.segments[0].base_offset,
                        checkpoints.read(root, LOG_START_OFFSET_CHECKPOINT)[0].get(key, 0))
        checkpoint = checkpoints.read(root, CLEANER_OFFSET_CHECKPOINT)[0].get(key)
        rng = cleanable_range(facts, topic, log_start_offset=log_start, now_ms=now_ms, checkpoint=checkpoint)
        if rng.checkpoint_was_reset:
            # Kafka repairs an invalid checkpoint at once, even if the log is not selected (KAFKA-6266).
            log.warning("resetting invalid cleaner checkpoint dir=%s checkpoint=%d log_start=%d log_end=%d",
                        status.directory, checkpoint, log_start, facts.segments[-1].next_offset)
            update_log_dir_checkpoint(root, CLEANER_OFFSET_CHECKPOINT, key, rng.first_dirty)
        status.first_dirty = rng.first_dirty
        status.first_uncleanable = rng.first_uncleanable
        status.cleanable_bytes = rng.cleanable_bytes
        status.clean_bytes = rng.clean_bytes
        status.dirty_ratio = rng.dirty_ratio
        status.compaction_delay_ms = rng.compaction_delay_ms
        # The horizons its files keep where a pass reaches (what the round's horizon pass goes by), but not one
        # that had passed when its last round was selected: that round kept it, and would keep it again.
        kept = rng.kept_delete_horizon_ms if rng.kept_delete_horizon_ms > status.horizons_seen_ms else -1
        status.next_delete_horizon_ms = min((h for h in (kept, status.round_delete_horizon_ms) if h >= 0), default=-1)
        return rng

    # ---- selection ------------------------------------------------------------------------------------

    def grab_filthiest(self, *, busy_devices: Iterable[int] = ()) -> Candidate | None:
        """The eligible log with the highest dirty ratio (overdue, triggered or horizon-due logs first),
        now marked in progress; None if there is none. Logs on `busy_devices` are passed over while
        another eligible log on an idle device exists.

        Only partitions that may have changed are worked out again (see the module docstring); when none is
        eligible, every partition whose probe is due is probed before giving up."""
        now = self.clock_ms()
        busy = set(busy_devices)
        with self._select_lock:
            with self._lock:
                self.last_selection_ms = now
            probed_at = time.monotonic()
            self._refresh(now, probed_at, PROBES_PER_PASS)
            candidate = self._take(now, busy)
            if candidate is None:
                self._refresh(now, probed_at, None)
                candidate = self._take(now, busy)
            return candidate

    def _refresh(self, now: int, probed_at: float, probes_max: int | None) -> None:
        """Work out again every partition that may have changed since the last pass (see the module docstring)."""
        checkpoints = _CheckpointReads()
        with self._lock:
            if self._last_now is not None and now < self._last_now:
                self._stale.update(self.partitions)  # the clock went back: what it had made due may not be
            self._last_now = now
            online = [d for d in self.log_dirs if d not in self.offline_log_dirs]
        for log_dir in online:  # a checkpoint someone else rewrote: its partitions are worked out again
            for name in _SELECTION_CHECKPOINTS:
                try:
                    foreign = checkpoints.read(log_dir, name)[2]
                except (OSError, SegmentError):
                    continue  # reported per partition by the estimate, which reads it again
                if self._foreign.get((log_dir, name)) != foreign:
                    self._foreign[(log_dir, name)] = foreign
                    with self._lock:
                        self._invalidate_log_dir(log_dir)
        with self._lock:
            while self._rechecks and self._rechecks[0][0] <= now:
                at, _, directory = heapq.heappop(self._rechecks)
                if self._recheck_at.get(directory) == at:
                    del self._recheck_at[directory]
                    self._stale.add(directory)
        self._probe(probed_at, probes_max)
        with self._lock:
            stale, self._stale = self._stale, set()
            statuses = [self.partitions[d] for d in sorted(stale) if d in self.partitions]
        for status in statuses:
            self._evaluate(status, now, checkpoints)

    def _probe(self, now: float, probes_max: int | None) -> None:
        """Probe the partitions whose last probe is older than `probe_interval_ms` at `now` (and not made by this
        pass), oldest first, at most `probes_max` (None: all of them); a changed one is stale."""
        due = now - self.probe_interval_ms / 1000.0
        order = self._probe_order
        partitions = self.partitions
        unchanged = self._facts.unchanged
        changed = []
        for _ in range(len(order) if probes_max is None else min(probes_max, len(order))):
            probed_at, directory = order[0]
            if probed_at > due or probed_at == now:
                break  # in probe order: the others were probed later still (or by this pass)
            order.popleft()
            status = partitions.get(directory)
            if status is None:
                continue  # removed
            order.append((now, directory))
            if (status.state == PartitionState.IDLE and status.policy is not None
                    and "compact" in (status.policy.policy or ()) and not unchanged(directory)):
                changed.append(directory)
        if changed:
            with self._lock:
                self._stale.update(changed)

    def _evaluate(self, status: PartitionStatus, now: int, checkpoints: _CheckpointReads) -> None:
        """Work out a stale partition's estimate and eligibility again; an eligible one goes on its device's heap."""
        directory = status.directory
        with self._lock:
            self._withdraw(directory)
            if status.state != PartitionState.IDLE or status.log_dir in self.offline_log_dirs:
                return  # its outcome (or a resume, or the log dir's return) makes it stale again
        if status.policy is None or "compact" not in (status.policy.policy or ()):
            return  # never compacted by guess (cleaner.policy)
        if status.uncleanable_reason is not None and not self._retry_due(status, now):
            self._schedule(directory, status.uncleanable_retry_at_ms)
            return
        if now < status.busy_until_ms:
            self._schedule(directory, status.busy_until_ms)
            return
        topic = self.topic_settings(status.topic, status.log_dir)
        try:
            rng = self._estimate(status, now, checkpoints)
        except (OSError, SegmentError) as exc:
            reason = pathcheck.describe_os_error(exc) if isinstance(exc, OSError) else str(exc)
            self.mark_uncleanable(directory, f"cannot estimate: {reason}")
            self._schedule(directory, status.uncleanable_retry_at_ms)
            return
        score = status.dirty_ratio
        ratio_gate = status.dirty_ratio > topic.min_cleanable_dirty_ratio
        if self.settings.cleaner.selection_policy == "survivorship":
            status.survivorship = survivorship.lookup(status.log_dir, status.topic, status.partition)
            s = status.survivorship or 0.0
            clean = status.clean_bytes
            score = survivorship.freed_per_io_byte(clean, status.cleanable_bytes, s)
            ratio_gate = survivorship.eligible(
                clean, status.cleanable_bytes, s, min_ratio=topic.min_cleanable_dirty_ratio,
                backstop_ratio=self.settings.cleaner.survivorship_backstop_ratio,
            )
        horizon_due = horizon_passed(status.next_delete_horizon_ms, now)
        changes = [rng.changes_at_ms if rng is not None else -1]
        if status.next_delete_horizon_ms > now:
            changes.append(status.next_delete_horizon_ms)
        self._schedule(directory, min((t for t in changes if t >= 0), default=-1))
        has_dirty = status.cleanable_bytes > 0 and status.first_uncleanable > status.first_dirty
        if status.triggered:
            reason = "triggered"
        elif status.compaction_delay_ms > 0 and has_dirty:
            reason = "max.compaction.lag.ms"
        elif has_dirty and ratio_gate:
            reason = "dirty ratio"
        elif horizon_due:
            reason = "delete horizon"
        else:
            return
        device = self._device(status.log_dir)
        rank = (reason not in ("triggered", "max.compaction.lag.ms"), -score)
        candidate = Candidate(
            directory, status.log_dir, status.topic, status.partition, status.dirty_ratio,
            status.compaction_delay_ms, reason, force_recopy=(reason in ("delete horizon", "triggered")),
        )
        with self._lock:
            if status.state != PartitionState.IDLE:
                return
            self._entries += 1
            self._eligible[directory] = (self._entries, candidate)
            heapq.heappush(self._heaps.setdefault(device, []), (rank, str(directory), self._entries, directory))

    def _take(self, now: int, busy: set[int]) -> Candidate | None:
        """The best eligible log (an idle device's first), now marked in progress; None if there is none."""
        with self._lock:
            best: tuple | None = None
            for device, heap in self._heaps.items():
                while heap:
                    _, _, number, directory = heap[0]
                    entry = self._eligible.get(directory)
                    status = self.partitions.get(directory)
                    if (entry is not None and entry[0] == number and status is not None
                            and status.state == PartitionState.IDLE and status.log_dir not in self.offline_log_dirs):
                        break
                    heapq.heappop(heap)  # outdated: the partition was worked out again, or is busy, gone, offline
                    if entry is not None and entry[0] == number:
                        del self._eligible[directory]
                if heap and (best is None or (device in busy, heap[0][:2]) < best[0]):
                    best = ((device in busy, heap[0][:2]), device)
            if best is None:
                return None
            directory = heapq.heappop(self._heaps[best[1]])[3]
            candidate = self._eligible.pop(directory)[1]
            chosen = self.partitions[directory]
            chosen.state = PartitionState.IN_PROGRESS
            chosen.triggered = False
            chosen.selected_at_ms = now
            self._last_pick = directory
            return candidate

    def _device(self, log_dir: Path) -> int:
        device = self._devices.get(log_dir)
        if device is None:
            device = self._devices[log_dir] = os.stat(log_dir).st_dev
        return device

    def _schedule(self, directory: Path, at_ms: int) -> None:
        """Work the partition out again when the clock reaches `at_ms` (-1: no such time)."""
        with self._lock:
            if at_ms < 0:
                self._recheck_at.pop(directory, None)
            elif self._recheck_at.get(directory) != at_ms:
                self._recheck_at[directory] = at_ms
                heapq.heappush(self._rechecks, (at_ms, str(directory), directory))

    def _withdraw(self, directory: Path) -> None:
        """Not eligible until worked out again (its heap entry is dropped when met). Under self._lock."""
        self._eligible.pop(directory, None)

    def _invalidate(self, directory: Path) -> None:
        """Work the partition out again at the next pass. Under self._lock."""
        self._stale.add(directory)
        self._eligible.pop(directory, None)

    def _invalidate_log_dir(self, log_dir: Path) -> None:
        """Work out every partition of `log_dir` again at the next pass. Under self._lock."""
        for directory, status in self.partitions.items():
            if status.log_dir == log_dir:
                self._stale.add(directory)

    @property
    def max_dirty_percent(self) -> float:
        """The highest dirty ratio among the logs the last selection could hand out, × 100."""
        return 100.0 * max((s.dirty_ratio for s in self._selectable()), default=0.0)

    @property
    def max_compaction_delay_ms(self) -> int:
        """How far past `max.compaction.lag.ms` the most overdue of them is."""
        return max((s.compaction_delay_ms for s in self._selectable()), default=0)

    def _selectable(self) -> list[PartitionStatus]:
        """The compacted partitions a selection may hand out (idle, online, not waiting for a retry or a
        backoff), and the one the last selection handed out; as last worked out."""
        now = self._last_now or 0
        with self._lock:
            return [s for s in self.partitions.values()
                    if (s.state == PartitionState.IDLE or s.directory == self._last_pick)
                    and s.log_dir not in self.offline_log_dirs and s.policy is not None
                    and "compact" in (s.policy.policy or ()) and now >= s.busy_until_ms
                    and (s.uncleanable_reason is None or now >= s.uncleanable_retry_at_ms)]

    def _retry_due(self, status: PartitionStatus, now: int) -> bool:
        if now >= status.uncleanable_retry_at_ms:
            return True
        try:
            return _fingerprint(status.directory) != status.uncleanable_fingerprint
        except OSError:
            return False

    # ---- outcomes ----------------------------------------------------------------------------------

    def done_cleaning(self, directory: Path, result: RoundResult, next_delete_horizon_ms: int = -1) -> None:
        """A round finished (checkpoint already written by the round). Aborted → paused(1)."""
        with self._lock:
            status = self.partitions.get(directory)
            if status is None:
                return
            status.last_result = result
            status.rounds += 1
            status.last_error = None
            status.uncleanable_reason = None
            status.uncleanable_failures = 0
            status.disk_full_failures = 0
            status.round_delete_horizon_ms = status.next_delete_horizon_ms = next_delete_horizon_ms
            status.horizons_seen_ms = status.selected_at_ms
            if not result.done:
                status.triggered = True  # the map filled: continue at once with the next round
            self._finish(status)

    def aborted(self, directory: Path) -> None:
        """A round stopped by an abort (shutdown, pause): no checkpoint change, no failure."""
        with self._lock:
            status = self.partitions.get(directory)
            if status is not None:
                self._finish(status)

    def busy_elsewhere(self, directory: Path, backoff_ms: int) -> None:
        """Another process holds the partition's cleaner lock: pass it over for `backoff_ms`."""
        with self._lock:
            status = self.partitions.get(directory)
            if status is not None:
                status.busy_until_ms = self.clock_ms() + backoff_ms
                self._finish(status)

    def failed(self, directory: Path, error: BaseException) -> None:
        """A round raised: the partition becomes uncleanable, retried after a doubling backoff."""
        self.mark_uncleanable(directory, f"{type(error).__name__}: {error}")
        with self._lock:
            status = self.partitions.get(directory)
            if status is not None:
                self._finish(status)

    def disk_full(self, directory: Path, error: OSError) -> None:
        """A round ran out of space (ENOSPC/EDQUOT; its `.cleaned` files are already gone): not the
        partition's fault, so it is not marked uncleanable; it is retried after `disk_full_retry_ms`,
        doubling per consecutive failure up to `uncleanable_retry_ms`."""
        with self._lock:
            status = self.partitions.get(directory)
            if status is None:
                return
            status.disk_full_failures += 1
            backoff = min(self.disk_full_retry_ms * 2 ** (status.disk_full_failures - 1),
                          max(self.uncleanable_retry_ms, self.disk_full_retry_ms))
            status.busy_until_ms = self.clock_ms() + backoff
            status.last_error = f"disk full: {error}"
            log.warning("cleaning ran out of disk space dir=%s retry_in_ms=%d error=%s", directory, backoff, error)
            self._finish(status)

    def mark_uncleanable(self, directory: Path, reason: str) -> None:
        now = self.clock_ms()
        with self._lock:
            status = self.partitions.get(directory)
            if status is None:
                return
            status.uncleanable_failures += 1
            backoff = min(self.uncleanable_retry_ms * 2 ** (status.uncleanable_failures - 1), UNCLEANABLE_RETRY_MS_MAX)
            status.uncleanable_reason = reason
            status.last_error = reason
            status.uncleanable_retry_at_ms = now + backoff
            try:
                status.uncleanable_fingerprint = _fingerprint(directory)
            except OSError:
                status.uncleanable_fingerprint = ()
            log.error("partition uncleanable dir=%s retry_in_ms=%d reason=%s", directory, backoff, reason)

    def _finish(self, status: PartitionStatus) -> None:
        self._invalidate(status.directory)  # what its round, retention or failure changed is worked out again
        if status.state == PartitionState.ABORTED:
            status.state = PartitionState.PAUSED
            status.pauses = 1
        elif status.state == PartitionState.IN_PROGRESS:
            status.state = PartitionState.IDLE
        self._lock.notify_all()

    def begin_maintenance(self, directory: Path) -> bool:
        """Reserve an idle partition for retention work (no cleaning meanwhile); False if not idle.

        A paused partition, one on an offline log dir, and one marked uncleanable whose retry is not due
        are passed over: retention changes the log as cleaning does.
        """
        with self._lock:
            status = self.partitions.get(directory)
            if status is None or status.state != PartitionState.IDLE or status.log_dir in self.offline_log_dirs:
                return False
            if status.uncleanable_reason is not None and not self._retry_due(status, self.clock_ms()):
                return False
            status.state = PartitionState.IN_PROGRESS
            return True

    def end_maintenance(self, directory: Path) -> None:
        with self._lock:
            status = self.partitions.get(directory)
            if status is not None:
                self._finish(status)

    def retained(self, directory: Path, result: RetentionResult) -> None:
        """Retention deleted segments of a partition (a retention pass, or after a `compact,delete` round)."""
        with self._lock:
            status = self.partitions.get(directory)
            if status is None:
                return
            status.last_retention = result
            status.log_start_offset = result.log_start_offset
            status.retention_segments_deleted += result.segments_deleted
            status.retention_bytes_deleted += result.bytes_deleted

    # ---- pause / resume / abort / trigger ------------------------------------------------------------------

    def is_aborted(self, directory: Path) -> bool:
        with self._lock:
            status = self.partitions.get(directory)
            return status is None or status.state == PartitionState.ABORTED

    def abort_and_pause(self, directory: Path, *, timeout_s: float | None = None) -> None:
        """Pause cleaning of a partition, aborting a running round and waiting for it to stop."""
        with self._lock:
            status = self._get(directory)
            if status.state == PartitionState.IDLE:
                status.state, status.pauses = PartitionState.PAUSED, 1
            elif status.state == PartitionState.IN_PROGRESS:
                status.state = PartitionState.ABORTED
                if not self._lock.wait_for(lambda: status.state != PartitionState.ABORTED, timeout=timeout_s):
                    raise StateError(f"{directory}: the running round did not stop in time")
            elif status.state == PartitionState.PAUSED:
                status.pauses += 1
            else:
                raise StateError(f"{directory}: already being aborted")

    def resume(self, directory: Path) -> None:
        with self._lock:
            status = self._get(directory)
            if status.state != PartitionState.PAUSED:
                raise StateError(f"{directory}: cannot resume a partition that is {status.state.value}")
            status.pauses -= 1
            if status.pauses == 0:
                status.state = PartitionState.IDLE
                self._invalidate(directory)

    def trigger(self, directory: Path) -> None:
        """Clean this partition next, whatever its dirty ratio (and clear an uncleanable mark)."""
        with self._lock:
            status = self._get(directory)
            status.triggered = True
            status.uncleanable_retry_at_ms = 0
            self._invalidate(status.directory)

    def abort_all(self) -> None:
        """Mark every running round aborted (shutdown); threads see it at their next window."""
        with self._lock:
            for status in self.partitions.values():
                if status.state == PartitionState.IN_PROGRESS:
                    status.state = PartitionState.ABORTED

    def _get(self, directory: Path) -> PartitionStatus:
        status = self.partitions.get(Path(directory))
        if status is None:
            raise StateError(f"{directory}: no such partition")
        return status

    def find(self, name: str) -> Path:
        """The directory of partition `name` (`<topic>-<partition>` or a path)."""
        with self._lock:
            for directory in self.partitions:
                if directory.name == name or str(directory) == name:
                    return directory
        raise StateError(f"{name}: no such partition")

    def statuses(self) -> list[PartitionStatus]:
        """Every partition's live status (not copies: read them, do not change them)."""
        with self._lock:
            return list(self.partitions.values())

    def idle_roll_candidates(self) -> list[PartitionStatus]:
        """The partitions of compacted topics with a finite `max.compaction.lag.ms` (`cleaner.idle` may roll
        them); worked out again only when the partitions, the settings or a cluster view change."""
        rollable = self._rollable
        if rollable is None:
            rollable = [s for s in self.statuses() if (topic := self.topic_settings(s.topic, s.log_dir)).compact
                        and topic.max_compaction_lag_ms < 2**63 - 1]
            self._rollable = rollable
        return rollable

    def retention_candidates(self) -> list[PartitionStatus]:
        """The partitions a retention pass must open: all but the compacted logs without `delete` in their
        policy whose segments, as last read, have none entirely below the log start offset
        (`cleaner.retention.may_delete_below_log_start`), so that an idle daemon does not open every log."""
        starts: dict[Path, Mapping] = {}
        out = []
        for status in self.statuses():
            policy = status.policy.policy if status.policy is not None else None
            if policy is not None and "compact" in policy and "delete" not in policy:
                bases = self._facts.bases(status.directory)
                if bases is None:  # not read yet (the pass at start-up): its facts, which selection reads next
                    try:
                        bases = [s.base_offset for s in self._facts.read(status.directory).segments]
                    except (OSError, SegmentError):
                        bases = None  # opening the log reports it
                if bases is not None:
                    if status.log_dir not in starts:
                        try:
                            starts[status.log_dir] = cached_offset_checkpoint(
                                status.log_dir / LOG_START_OFFSET_CHECKPOINT)[0]
                        except (OSError, SegmentError):
                            starts[status.log_dir] = {}  # opening the log reports it
                    start = starts[status.log_dir].get((status.topic, status.partition), 0)
                    if not may_delete_below_log_start(bases, start):
                        continue
            out.append(status)
        return out

    # ---- reporting ----------------------------------------------------------------------------------

    def snapshot(self) -> list[PartitionStatus]:
        with self._lock:
            out = [PartitionStatus(**{f: getattr(s, f) for f in PartitionStatus.__dataclass_fields__})
                   for s in self.partitions.values()]
            return out

    def ignored_entries(self) -> list[dict[str, str]]:
        """The log dir entries discovery passed over with a warning, printable (for `/status`)."""
        with self._lock:
            return [{"path": pathcheck.display_path(path), "reason": reason}
                    for path, reason in sorted(self.ignored.items())]

    def uncleanable_by_log_dir(self) -> dict[Path, tuple[int, int]]:
        """(count, cleanable bytes) of uncleanable partitions per log dir."""
        out: dict[Path, tuple[int, int]] = {d: (0, 0) for d in self.log_dirs}
        with self._lock:
            for s in self.partitions.values():
                if s.uncleanable_reason is not None:
                    count, size = out.get(s.log_dir, (0, 0))
                    out[s.log_dir] = (count + 1, size + s.cleanable_bytes)
        return out
