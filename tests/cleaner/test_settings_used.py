"""No setting is accepted and then ignored: every name of the settings table changes what a command does, or
the command refuses it with one line.

`HOW` names, for every setting of `BROKER_SETTINGS` and `TOPIC_SETTINGS`, the mechanism that shows it:

* a `clean` scenario: the same log cleaned with two values of the setting (and nothing else changed) comes
  out differently — rounds (also as the thread count shares the offset-map memory; that the threads clean
  at once is `test_clean_threads.py`'s), segments, indexes, what retention deleted, tombstones, producers' batches,
  bytes recopied, the survivorship recorded, time under the I/O budget, where the topic policy came from;
* the daemon (`logcleaner run`, built in this process): its selection (`CleanerManager.grab_filthiest`) or
  its threads' loop decides differently with two values; these settings `clean` refuses;
* settings no part of logcleaner uses: `clean --set` refuses them (a config file or `server.properties`
  may hold them, as a broker's file holds many; they are read and checked there, not refused).

A test checks that `HOW` covers the table exactly, so a new setting cannot be added without saying how it is
used; the scenarios are parametrized by mechanism and run each broker synonym as well as the topic name.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cleaner import launch, survivorship
from cleaner.cli import main
from cleaner.daemon import Daemon
from cleaner.oneshot import clean_partition
from cleaner.setting_use import CLEAN_REFUSES, DAEMON_ONLY, UNUSED, refusal_for_clean
from cleaner.settings import BROKER_SETTINGS, TOPIC_SETTINGS, Settings
from cleaner.throttle import WINDOW_S
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, update_offset_checkpoint
from segments.partition.log import PartitionLog
from segments.tools.generate import WorkloadSpec, generate_partition

from ..integration.daemon_helpers import free_port, write_config
from ..kraft_builders import topic, topic_config, write_kraft_log_dir
from ..segments.helpers import in_memory_file_system, resident_pages
from .builders import batch, build_log, raw_batches, records

T_DATA = 1_700_000_000_000  # the generated records' timestamps start here (ms), 1 ms apart
SOON = T_DATA + 10_000  # just after the data was written
LATER = T_DATA + 10 * 86_400_000  # ten days on: past Kafka's 7-day retention
SPEC = WorkloadSpec(records=4000, keys=300, segment_bytes=16 * 1024, tombstone_fraction=0.1)
MANY_KEYS = WorkloadSpec(records=4000, keys=3000, segment_bytes=16 * 1024)  # cleaned, still ~400 KB
LONG_MAX = str(2**63 - 1)

# ---- the table ----------------------------------------------------------------------------------------

HOW: dict[str, str] = {
    # clean: the same log cleaned with two values
    "log.cleaner.dedupe.buffer.size": "clean:rounds",
    "log.cleaner.io.buffer.load.factor": "clean:rounds",
    "log.cleaner.threads": "clean:threads",  # and the daemon's thread count
    "log.cleaner.io.max.bytes.per.second": "clean:throttle",
    "producer.id.expiration.ms": "clean:producer-expiry",
    "log.cleaner.verify": "clean:verify",
    "log.cleaner.io.direct": "clean:direct",
    "log.cleaner.mode": "clean:generational",
    "cleaner.mode": "clean:generational",
    "log.cleaner.generation.ratio": "clean:generational",
    "cleaner.generation.ratio": "clean:generational",
    "log.cleaner.survivorship.alpha": "clean:survivorship",
    "log.cleanup.policy": "clean:policy",
    "cleanup.policy": "clean:policy",
    "log.retention.ms": "clean:retention-time",
    "retention.ms": "clean:retention-time",
    "log.retention.minutes": "clean:retention-time",
    "log.retention.hours": "clean:retention-time",
    "log.retention.bytes": "clean:retention-size",
    "retention.bytes": "clean:retention-size",
    "log.cleaner.min.compaction.lag.ms": "clean:min-lag",
    "min.compaction.lag.ms": "clean:min-lag",
    "log.cleaner.delete.retention.ms": "clean:tombstones",
    "delete.retention.ms": "clean:tombstones",
    "log.segment.bytes": "clean:segments",
    "segment.bytes": "clean:segments",
    "log.index.size.max.bytes": "clean:segments",
    "segment.index.bytes": "clean:segments",
    "log.index.interval.bytes": "clean:index-interval",
    "index.interval.bytes": "clean:index-interval",
    "metadata.log.dir": "clean:kraft-metadata",
    "log.dirs": "clean:kraft-metadata",  # and the daemon's log dirs, in every daemon test
    # the daemon: clean refuses them
    "log.cleaner.enable": "daemon:enable",
    "log.cleaner.backoff.ms": "daemon:backoff",
    "log.retention.check.interval.ms": "daemon:retention-interval",
    "log.cleanup.interval.mins": "daemon:retention-interval",
    "log.cleaner.min.cleanable.ratio": "daemon:selection",
    "min.cleanable.dirty.ratio": "daemon:selection",
    "log.cleaner.max.compaction.lag.ms": "daemon:selection",
    "max.compaction.lag.ms": "daemon:selection",
    "log.cleaner.selection.policy": "daemon:selection",
    "log.cleaner.survivorship.backstop.ratio": "daemon:selection",
    # nothing uses them: clean refuses them
    "log.cleaner.io.buffer.size": "unused",
    "message.max.bytes": "unused",
    "max.message.bytes": "unused",
    "log.roll.ms": "unused",
    "segment.ms": "unused",
    "log.segment.delete.delay.ms": "unused",
    "file.delete.delay.ms": "unused",
    "log.preallocate": "unused",
    "preallocate": "unused",
}


def _names(mechanism: str) -> list[str]:
    return sorted(name for name, how in HOW.items() if how == mechanism)


def test_every_setting_of_the_table_says_how_it_is_used():
    table = set(BROKER_SETTINGS) | set(TOPIC_SETTINGS)
    assert set(HOW) == table, f"missing: {sorted(table - set(HOW))}; not settings: {sorted(set(HOW) - table)}"
    refused = {n for n, how in HOW.items() if how.startswith("daemon:") or how == "unused"}
    assert refused == set(CLEAN_REFUSES), "clean must refuse exactly the settings it does not use"
    assert {n for n, how in HOW.items() if how == "unused"} == set(UNUSED)
    assert {n for n, how in HOW.items() if how.startswith("daemon:")} == set(DAEMON_ONLY)


# ---- helpers --------------------------------------------------------------------------------------------


def _text(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def _valid_value(name: str) -> str:
    """A value the setting accepts (its default, or its low bound when it has no default)."""
    setting = BROKER_SETTINGS[name] if name in BROKER_SETTINGS else TOPIC_SETTINGS[name][0]
    if setting.default is not None:
        return _text(setting.default)
    return str(int(setting.low)) if setting.low is not None else "x"


def _template(root: Path, spec: WorkloadSpec, name: str = "t-0") -> Path:
    directory = root / "template" / name
    if not directory.exists():
        generate_partition(directory, spec)
    return directory


def _copy(template: Path, root: Path, label: str) -> Path:
    target = root / label / template.name
    shutil.copytree(template, target)
    return target


def _clean(*args: str) -> list[dict]:
    """`logcleaner clean --json ARGS`; one summary per partition (the command must succeed)."""
    result = CliRunner().invoke(main, ["clean", "--json", *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]


def _sets(**values: str) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k.replace('_', '.')}={v}")]


def _set(name: str, value: str) -> list[str]:
    return ["--set", f"{name}={value}"]


def _digests(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# ---- clean: two values, two outcomes ---------------------------------------------------------------------


@pytest.mark.parametrize("name", _names("clean:rounds"))
def test_clean_takes_more_rounds_with_a_smaller_offset_map(tmp_path, name):
    template = _template(tmp_path, SPEC)
    values = {"log.cleaner.dedupe.buffer.size": ("2400", "128MiB"),  # 100 slots against 300 keys
              "log.cleaner.io.buffer.load.factor": ("0.3", "1.0")}[name]
    extra = [] if name == "log.cleaner.dedupe.buffer.size" else _set("log.cleaner.dedupe.buffer.size", str(24 * 400))
    rounds = [_clean(*_set(name, v), *extra, "--now-ms", str(SOON), str(_copy(template, tmp_path, v)))[0]["rounds"]
              for v in values]
    assert rounds[0] > rounds[1] >= 1


@pytest.mark.skipif(launch.cores() < 2, reason="two partitions are cleaned at once only with two cores")
def test_clean_shares_the_offset_map_memory_among_its_threads(tmp_path):
    # Kafka's division: each of the threads that clean partitions at once gets dedupe.buffer.size / threads, so
    # the same buffer (400 slots against 300 keys) takes one round a partition with one thread and more with two
    # (200 slots each), two partitions keeping both threads busy. One partition keeps the whole buffer whatever
    # the thread count (tests/cleaner/test_group_runs.py).
    template = _template(tmp_path, SPEC)
    rounds = {}
    for threads in ("2", "1"):
        log_dir = _copy(template, tmp_path, threads).parent
        shutil.copytree(log_dir / "t-0", log_dir / "t-1")
        summaries = _clean(*_set("log.cleaner.threads", threads), *_set("log.cleaner.dedupe.buffer.size", str(24 * 400)),
                           *_set("cleanup.policy", "compact"),
                           "--now-ms", str(SOON), str(log_dir))
        rounds[threads] = [s["rounds"] for s in summaries]
    assert min(rounds["2"]) > 1 and rounds["1"] == [1, 1]


@pytest.mark.parametrize("name", _names("clean:policy"))
def test_clean_compacts_or_only_applies_retention_by_the_policy(tmp_path, name):
    template = _template(tmp_path, SPEC)
    compact, delete = (_clean(*_set(name, v), "--now-ms", str(SOON), str(_copy(template, tmp_path, v)))[0]
                       for v in ("compact", "delete"))
    assert compact["cleanup_policy"] == "compact" and compact["records_written"] < compact["records_read"]
    assert delete["cleanup_policy"] == "delete" and delete["rounds"] == 0


@pytest.mark.parametrize("name", _names("clean:retention-time"))
def test_clean_deletes_expired_segments_by_the_retention_time(tmp_path, name):
    template = _template(tmp_path, SPEC)
    deleted = [_clean(*_set(name, v), *_set("cleanup.policy", "delete"), "--now-ms", str(LATER),
                      str(_copy(template, tmp_path, v)))[0].get("segments_deleted", 0) for v in ("1", "-1")]
    assert deleted[0] > 0 and deleted[1] == 0


@pytest.mark.parametrize("name", _names("clean:retention-size"))
def test_clean_deletes_the_oldest_segments_by_the_retention_size(tmp_path, name):
    template = _template(tmp_path, SPEC)
    deleted = [_clean(*_set(name, v), *_set("cleanup.policy", "delete"), "--now-ms", str(SOON),
                      str(_copy(template, tmp_path, v)))[0].get("segments_deleted", 0) for v in ("0", "-1")]
    assert deleted[0] > 0 and deleted[1] == 0


@pytest.mark.parametrize("name", _names("clean:min-lag"))
def test_clean_leaves_records_younger_than_the_minimum_compaction_lag(tmp_path, name):
    template = _template(tmp_path, SPEC)
    removed = []
    for v in ("86400000", "0"):
        s = _clean(*_set(name, v), "--now-ms", str(SOON), str(_copy(template, tmp_path, v)))[0]
        removed.append(s.get("records_read", 0) - s.get("records_written", 0))
    assert removed[0] == 0 and removed[1] > 0


@pytest.mark.parametrize("name", _names("clean:tombstones"))
def test_clean_removes_tombstones_once_their_delete_retention_has_passed(tmp_path, name):
    template = _template(tmp_path, SPEC)
    left = []
    for v in ("0", "86400000"):
        d = _copy(template, tmp_path, v)
        _clean(*_set(name, v), "--now-ms", str(SOON), str(d))  # stamps each tombstone's delete horizon
        _clean(*_set(name, v), "--now-ms", str(SOON + 1000), "--from-offset", "0", str(d))  # a second pass
        left.append(sum(1 for _, key, value in records(d) if value is None))
    assert left[0] == 0 and left[1] > 0


@pytest.mark.parametrize("name", _names("clean:segments"))
def test_clean_groups_segments_by_the_segment_and_index_size_limits(tmp_path, name):
    template = _template(tmp_path, MANY_KEYS)
    small = {"log.segment.bytes": "16384", "segment.bytes": "16384",
             "log.index.size.max.bytes": "60", "segment.index.bytes": "60"}[name]  # one input segment's indexes
    counts = []
    for v in (small, "1073741824" if "segment.bytes" in name else "10485760"):
        d = _copy(template, tmp_path, v)
        _clean(*_set(name, v), "--now-ms", str(SOON), str(d))
        counts.append(len(list(d.glob("*.log"))))
    assert counts[0] > counts[1]


@pytest.mark.parametrize("name", _names("clean:index-interval"))
def test_clean_writes_offset_index_entries_every_index_interval(tmp_path, name):
    template = _template(tmp_path, MANY_KEYS)
    sizes = []
    for v in ("0", "100000000"):
        d = _copy(template, tmp_path, v)
        _clean(*_set(name, v), "--now-ms", str(SOON), str(d))
        sizes.append(sum(p.stat().st_size for p in d.glob("*.index")))
    assert sizes[0] > sizes[1]


def test_clean_keeps_a_producers_last_batch_until_the_producer_expires(tmp_path):
    outcomes = []
    for v in ("100", "86400000"):
        d = tmp_path / v / "t-0"
        build_log(d, [
            batch([(b"a", b"a1", T_DATA)], producer_id=9, producer_epoch=0, base_sequence=0),  # 0
            batch([(b"a", b"a2", T_DATA + 1)]),  # 1: supersedes it
            batch([(b"z", b"z1", T_DATA + 2)]),  # 2
        ])
        _clean(*_set("producer.id.expiration.ms", v), "--now-ms", str(SOON), str(d))
        outcomes.append(sorted(raw_batches(d)))
    assert outcomes == [[1, 2], [0, 1, 2]]  # expired: its batch goes; active: kept (as an empty header)


def test_clean_checks_each_group_before_the_swap_only_with_verify(tmp_path):
    template = _template(tmp_path, SPEC)
    verified = []
    for v in ("true", "false"):
        settings = Settings.from_mappings({"cleanup.policy": "compact", "log.cleaner.verify": v})
        outcome = clean_partition(_copy(template, tmp_path, v), settings, now_ms=SOON)  # what `clean` runs
        assert outcome.ok, outcome.error
        verified.append(sum(r.verified_records for r in outcome.rounds))
    assert verified[0] > 0 and verified[1] == 0


def test_clean_writes_its_segments_around_the_page_cache_only_with_direct_io(tmp_path):
    if kind := in_memory_file_system(tmp_path):
        pytest.skip(f"the test's directory is on {kind}: its files are all in memory, however they are written")
    template = _template(tmp_path, MANY_KEYS)  # cleaned, ~400 KB
    resident = {}
    for v in ("true", "false"):
        d = _copy(template, tmp_path, v)
        _clean(*_set("log.cleaner.io.direct", v), "--now-ms", str(SOON), str(d))
        counts = [resident_pages(p) for p in sorted(d.glob("*.log"))[:-1]]  # the cleaned ones (not the active)
        resident[v] = sum(r for r, _ in counts) / sum(n for _, n in counts)
    assert resident["true"] < 0.2 and resident["false"] == 1.0, resident


def _append_updates(directory: Path, keys: list[bytes], timestamp_ms: int) -> None:
    build_log(directory, [batch([(k, b"new-" + k, timestamp_ms) for k in keys])])


@pytest.mark.parametrize("name", _names("clean:generational"))
def test_clean_recopies_less_in_generational_mode_by_the_generation_ratio(tmp_path, name):
    template = _template(tmp_path, SPEC)
    values = {"log.cleaner.mode": ("generational", "full"), "cleaner.mode": ("generational", "full"),
              "log.cleaner.generation.ratio": ("1.0", "1000000"), "cleaner.generation.ratio": ("1.0", "1000000")}[name]
    extra = [] if name.endswith("mode") else _set("cleaner.mode", "generational")
    recopied = []
    for v in values:
        d = _copy(template, tmp_path, v)
        _clean(*_set(name, v), *extra, "--now-ms", str(SOON), str(d))  # the log is now one generation
        _append_updates(d, [b"key-%08d" % i for i in range(5)], SOON)
        recopied.append(_clean(*_set(name, v), *extra, "--now-ms", str(SOON), str(d))[0]["bytes_read"])
    assert recopied[0] < recopied[1] / 4  # the small dirty head alone, against the whole log


def test_clean_smooths_the_recorded_survivorship_by_alpha(tmp_path):
    template = _template(tmp_path, SPEC)
    recorded = []
    for v in ("1.0", "0.01"):
        d = _copy(template, tmp_path, v)
        _clean(*_set("log.cleaner.survivorship.alpha", v), "--now-ms", str(SOON), str(d))  # mostly superseded
        _append_updates(d, [b"new-key-%d" % i for i in range(50)], SOON)  # then inserts only: all survive
        _clean(*_set("log.cleaner.survivorship.alpha", v), "--now-ms", str(SOON), str(d))
        recorded.append(survivorship.read_all(d.parent)[("t", 0)])
    assert recorded[0] == pytest.approx(1.0) and recorded[1] < 0.5


def test_clean_holds_its_io_to_the_budget(tmp_path):
    # Lower bounds only: throttled, the rounds take at least their I/O over the budget less the one window
    # banked; unthrottled, the same work beats that budget (so the bound is the budget's doing).
    template = _template(tmp_path, SPEC)
    rate = 400_000
    throttled = _clean(*_set("log.cleaner.io.max.bytes.per.second", str(rate)), "--now-ms", str(SOON),
                       str(_copy(template, tmp_path, "throttled")))[0]
    free = _clean("--now-ms", str(SOON), str(_copy(template, tmp_path, "free")))[0]
    io = throttled["survey_bytes_read"] + throttled["bytes_read"] + throttled["bytes_written"]  # all charged
    assert io >= 2 * rate
    assert throttled["elapsed_s"] >= (io - rate * WINDOW_S) / rate
    assert (free["survey_bytes_read"] + free["bytes_read"] + free["bytes_written"]) / free["elapsed_s"] > rate


@pytest.mark.parametrize("name", _names("clean:kraft-metadata"))
def test_clean_reads_topic_policies_from_the_kraft_metadata_the_setting_points_at(tmp_path, name):
    meta = write_kraft_log_dir(tmp_path / "controller", [topic("users"), topic_config("users", "cleanup.policy", "delete")])
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    outcomes = []
    for where in (meta, empty):
        log_dir = tmp_path / f"logs-{where.name}"
        generate_partition(log_dir / "users-0", SPEC)
        result = CliRunner().invoke(main, ["clean", "--json", *_set(name, str(where)), "--now-ms", str(SOON),
                                           str(log_dir)])
        outcomes.append((result.exit_code, result.output))
    (found_code, found), (missing_code, missing) = outcomes
    assert found_code == 0 and json.loads(found.splitlines()[-1])["cleanup_policy"] == "delete"
    assert "KRaft metadata" in json.loads(found.splitlines()[-1])["policy_source"]
    assert missing_code == 2 and "unknown" in missing


# ---- settings clean refuses ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CLEAN_REFUSES))
def test_clean_refuses_a_setting_it_does_not_use_with_one_line_and_changes_nothing(tmp_path, name):
    d = _copy(_template(tmp_path, SPEC), tmp_path, "refused")
    before = _digests(d)
    result = CliRunner().invoke(main, ["clean", *_set(name, _valid_value(name)), "--now-ms", str(SOON), str(d)])
    refusal = refusal_for_clean(name)
    assert result.exit_code == 2, result.output
    assert "\n" not in refusal and f"Error: {refusal}" in result.output.splitlines()
    assert ("a daemon setting (logcleaner run) that clean does not use" in refusal) == (name in DAEMON_ONLY)
    assert ("not used by logcleaner" in refusal) == (name in UNUSED)
    assert _digests(d) == before


def test_a_config_file_may_hold_settings_clean_does_not_use(tmp_path):
    # A broker's file holds many settings: clean reads and checks them, and refuses only --set.
    d = _copy(_template(tmp_path, SPEC), tmp_path, "file")
    properties = tmp_path / "server.properties"
    properties.write_text("".join(f"{n}={_valid_value(n)}\n" for n in sorted(CLEAN_REFUSES) if n in BROKER_SETTINGS))
    assert _clean("--server-properties", str(properties), "--now-ms", str(SOON), str(d))[0]["status"] == "ok"


# ---- the daemon: two values, two decisions ---------------------------------------------------------------


def _daemon(tmp_path: Path, settings: dict, *, topics: dict | None = None, clock_ms=None) -> Daemon:
    log_dir = tmp_path / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    config = write_config(tmp_path / f"daemon-{len(list(tmp_path.glob('daemon-*')))}.toml", log_dirs=[log_dir],
                          port=free_port(), settings=settings, topics=topics)
    return Daemon(config, clock_ms=clock_ms or (lambda: LATER))


def _close(daemon: Daemon) -> None:
    daemon.http.httpd.server_close()  # built, never started


def _half_dirty(tmp_path: Path, name: str = "t-0") -> Path:
    """A partition whose checkpoint sits at the middle segment: a dirty ratio of about one half."""
    d = tmp_path / "logs" / name
    if not d.exists():
        generate_partition(d, SPEC)
        with PartitionLog.open(d, mode="reader") as log:
            middle = log.segments[len(log.segments) // 2].base_offset
        update_offset_checkpoint(d.parent / CLEANER_OFFSET_CHECKPOINT, {("t", 0): middle})
    return d


def _selected(tmp_path: Path, settings: dict, topics: dict | None = None, *, survivorship_of: float | None = None):
    """Whether the daemon's selection takes the half-dirty partition with `settings`."""
    d = _half_dirty(tmp_path)
    if survivorship_of is not None:
        survivorship.record(d.parent, "t", 0, survivorship_of, alpha=1.0)
    daemon = _daemon(tmp_path, settings, topics=topics)
    try:
        daemon.manager.discover()
        candidate = daemon.manager.grab_filthiest()
        return candidate is not None and candidate.directory == d
    finally:
        _close(daemon)


@pytest.mark.parametrize("name", _names("daemon:selection"))
def test_the_daemons_selection_changes_with_the_setting(tmp_path, name):
    low = {"min.cleanable.dirty.ratio": 0.1}  # the half-dirty log is above it
    survivorship_policy = {**low, "log.cleaner.selection.policy": "survivorship"}
    cases = {  # (settings where it is selected, settings where it is not)
        "min.cleanable.dirty.ratio": ({"min.cleanable.dirty.ratio": 0.1}, {"min.cleanable.dirty.ratio": 0.9}),
        "log.cleaner.min.cleanable.ratio": ({"log.cleaner.min.cleanable.ratio": 0.1},
                                            {"log.cleaner.min.cleanable.ratio": 0.9}),
        "max.compaction.lag.ms": ({"min.cleanable.dirty.ratio": 0.9, "max.compaction.lag.ms": 1},
                                  {"min.cleanable.dirty.ratio": 0.9, "max.compaction.lag.ms": 2**63 - 1}),
        "log.cleaner.max.compaction.lag.ms": ({"min.cleanable.dirty.ratio": 0.9, "log.cleaner.max.compaction.lag.ms": 1},
                                              {"min.cleanable.dirty.ratio": 0.9,
                                               "log.cleaner.max.compaction.lag.ms": 2**63 - 1}),
        # an insert-only log (survivorship 1): Kafka's ranking cleans it, the survivorship policy does not
        "log.cleaner.selection.policy": ({**low, "log.cleaner.selection.policy": "dirty-ratio"},
                                         {**low, "log.cleaner.selection.policy": "survivorship"}),
        # ... unless its plain dirty ratio reaches the backstop
        "log.cleaner.survivorship.backstop.ratio": (
            {**survivorship_policy, "log.cleaner.survivorship.backstop.ratio": 0.1},
            {**survivorship_policy, "log.cleaner.survivorship.backstop.ratio": 0.9}),
    }
    insert_only = 1.0 if name in ("log.cleaner.selection.policy", "log.cleaner.survivorship.backstop.ratio") else None
    yes, no = cases[name]
    assert _selected(tmp_path / "yes", yes, survivorship_of=insert_only)
    assert not _selected(tmp_path / "no", no, survivorship_of=insert_only)


def test_the_daemon_runs_as_many_cleaner_threads_as_log_cleaner_threads(tmp_path):
    for threads in (1, 3):
        daemon = _daemon(tmp_path, {"log.cleaner.threads": threads})
        daemon.start()
        try:
            assert daemon.pool.threads_alive == threads
        finally:
            assert daemon.shutdown() == 0


class _RecordingEvent(threading.Event):
    """The pool's stop event, recording how long its threads wait on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout=None):
        if timeout is not None:
            self.waits.append(timeout)
        return super().wait(min(timeout, 0.005) if timeout is not None else None)  # keep the test quick


def _run_loops(daemon: Daemon, until, timeout_s: float = 60.0) -> None:
    """Start `daemon`'s threads with a recording stop event until `until()` holds; then stop them."""
    daemon.pool._stopping = _RecordingEvent()
    daemon.manager.discover()
    daemon.pool.start()
    try:
        deadline = time.monotonic() + timeout_s  # a hang guard, not a measurement
        while not until():
            assert time.monotonic() < deadline, "the daemon's threads did not get there"
            time.sleep(0.005)
    finally:
        daemon.pool.stop(timeout_s=30)
        _close(daemon)


def test_the_daemon_waits_log_cleaner_backoff_ms_when_nothing_is_cleanable(tmp_path):
    for backoff_ms in (20, 70):
        daemon = _daemon(tmp_path / str(backoff_ms), {"log.cleaner.backoff.ms": backoff_ms})
        _run_loops(daemon, lambda: len(daemon.pool._stopping.waits) >= 3)
        assert set(daemon.pool._stopping.waits) == {backoff_ms / 1000.0}


@pytest.mark.parametrize("name", _names("daemon:retention-interval"))
def test_the_daemons_retention_passes_follow_the_check_interval(tmp_path, name):
    passes = []
    for minutes in (1, 30_000):
        ticks = iter(range(10**9))
        clock_ms = lambda: T_DATA + 60_000 * next(ticks)  # noqa: E731 - a clock a minute faster at every call
        value = minutes * 60_000 if name == "log.retention.check.interval.ms" else minutes
        root = tmp_path / str(minutes)
        _half_dirty(root)
        # compact,delete: a retention pass opens the log every time (a compacted-only log with nothing below
        # its log start is not opened at all: `CleanerManager.retention_candidates`)
        daemon = _daemon(root, {name: value, "log.cleaner.enable": False, "cleanup.policy": "compact,delete"},
                         clock_ms=clock_ms)
        count = []
        original = daemon.manager.begin_maintenance
        daemon.manager.begin_maintenance = lambda directory: count.append(directory) or original(directory)
        _run_loops(daemon, lambda: len(daemon.pool._stopping.waits) >= 5)
        passes.append(len(count))
    assert passes[0] >= 4 and passes[1] == 1


def test_the_daemon_compacts_nothing_with_log_cleaner_enable_false_but_still_runs_retention(tmp_path):
    outcomes = []
    for enable in (True, False):
        root = tmp_path / str(enable)
        _half_dirty(root)
        daemon = _daemon(root, {"log.cleaner.enable": enable, "min.cleanable.dirty.ratio": 0.1})
        grabbed = []
        original = daemon.manager.grab_filthiest
        daemon.manager.grab_filthiest = lambda **kw: grabbed.append(1) or original(**kw)
        retention = []
        original_pass = daemon.pool._retention_if_due
        daemon.pool._retention_if_due = lambda interval: retention.append(1) or original_pass(interval)
        _run_loops(daemon, lambda: len(retention) >= 3 and (not enable or daemon.manager.snapshot()[0].rounds >= 1))
        outcomes.append((len(grabbed) > 0, daemon.manager.snapshot()[0].rounds))
    assert outcomes[0][0] and outcomes[0][1] >= 1  # enabled: selected and cleaned
    assert outcomes[1] == (False, 0)  # disabled: never selected; the retention passes went on
