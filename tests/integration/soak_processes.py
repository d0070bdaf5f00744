"""The processes of the soak test (`test_soak.py`): a writer and readers sharing partitions with the daemon.

Run as `python -m tests.integration.soak_processes writer|reader ...` from the repository root. Each process
is a plain user of `segments.PartitionLog`, as a producer or a consumer of our files would be.

What makes every record provable is the `Plan`: a seeded, deterministic schedule of batches per partition.
The log gives a fresh partition offsets 0, 1, 2, ... in append order, so the plan knows, for every offset,
exactly what was appended there: a plain or transactional data record (its key, its value, which spells the
key and the offset, or a tombstone) or a COMMIT/ABORT marker of a given producer. The writer appends the
plan's batches in order and checks that the log assigned the planned offsets; a reader rebuilds the same plan
and checks every record it fetches against it. So "a record that was never written" is any record that
differs from the plan at its offset, and the writer's last write per key is the plan's committed state.

`CommittedView` is what a read_committed consumer makes of records in offset order: the latest value per key,
transactional data held back until its producer's marker (dropped on ABORT), a tombstone or a missing key
both meaning "no value". Writer, readers and the test all judge a log through it.

Reader roles (`--role`):

* `tail`: passes from offset 0 with fetches (`PartitionLog.read`, Kafka's fetch semantics), tailing at the
  end for a while, reopening the log every few passes. When a pass reaches the log end within half of
  `delete.retention.ms` (Kafka's bound for a consumer to see every tombstone), its view must equal the
  plan's committed state at that offset: compaction may drop superseded records, never the latest.
* `fetch`: fetches from a random offset in [log start, log end] up to that log end.
* `iter`: `PartitionLog.iter_records` from a random offset to the end of the segments it listed.

Every reader checks, within a pass, that offsets strictly increase (batch by batch and record by record),
that a fetch never starts below the requested offset, and that every record is the plan's. Violations,
counters and the largest offset seen go to a JSON file, rewritten every few seconds and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from segments.codec import format as fmt
from segments.codec.batches import iter_batches
from segments.codec.errors import SegmentError
from segments.codec.records import (
    Record,
    RecordBatch,
    decode_control_key,
    encode_batch,
    encode_control_batch,
)
from segments.partition.log import AppendInfo, LogConfig, PartitionLog

# ---- the partitions and their plans ---------------------------------------------------------------------

SEGMENT_BYTES = 32 * 1024  # tiny segments: the writer rolls several times a second
INDEX_INTERVAL_BYTES = 1024  # dense offset indexes: positions change a lot when a segment is cleaned
KEYS = 400  # per partition; skewed, so the hot keys are superseded over and over
TOMBSTONE_FRACTION = 0.06
TXN_PRODUCER_IDS = (7001, 7002)
VALUE_PAD_BYTES_MAX = 90
WRITE_BATCH_RECORDS_MAX = 10
TXN_BATCH_RECORDS_MAX = 6
MARKER_CHANCE = 0.12  # per batch, while a transaction is open
TXN_BATCH_CHANCE = 0.30
ABORT_FRACTION = 0.3
CODECS = (fmt.COMPRESSION_GZIP, fmt.COMPRESSION_SNAPPY, fmt.COMPRESSION_LZ4, fmt.COMPRESSION_ZSTD)


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    name: str  # the <topic>-<partition> directory name
    seed: int
    compressed: bool  # data batches take a codec from CODECS, chosen per batch


PARTITIONS = (
    PartitionSpec("soak-0", seed=1, compressed=False),
    PartitionSpec("soak-1", seed=2, compressed=True),
)

KIND_PLAIN = "plain"
KIND_TXN = "txn"
KIND_MARKER = "marker"


@dataclass(frozen=True, slots=True)
class PlannedRecord:
    offset: int
    kind: str  # KIND_PLAIN, KIND_TXN, KIND_MARKER
    key: bytes | None  # None for a marker (its key is the control key)
    value: bytes | None  # None for a tombstone or a marker
    producer_id: int  # -1 for plain records
    control_type: int  # fmt.CONTROL_TYPE_COMMIT / _ABORT for a marker, -1 otherwise


@dataclass(frozen=True, slots=True)
class PlannedBatch:
    first_offset: int
    records: tuple[PlannedRecord, ...]
    kind: str
    producer_id: int
    control_type: int
    compression: int
    base_sequence: int
    open_txns_after: int  # transactions still open once this batch is appended


def value_of(key: bytes, offset: int) -> bytes:
    """The value the writer stores at `offset` for `key`: both spelled out, then padding that varies in length."""
    return b"%s@%d:" % (key, offset) + b"." * (offset * 7919 % VALUE_PAD_BYTES_MAX)


class Plan:
    """The deterministic schedule of one partition's batches, generated lazily as far as it is asked about.

    `batch(i)` is the i-th batch to append; `record(offset)` is what was appended at `offset`. Every batch
    takes `len(records)` consecutive offsets (markers one), so offsets and batches line up without gaps.
    """

    def __init__(self, spec: PartitionSpec) -> None:
        self.spec = spec
        self._rnd = random.Random(spec.seed)
        self._batches: list[PlannedBatch] = []
        self._records: list[PlannedRecord] = []
        self._open: dict[int, int] = {}  # producer id → first offset of its open transaction
        self._sequences = {pid: 0 for pid in TXN_PRODUCER_IDS}

    def batch(self, i: int) -> PlannedBatch:
        while len(self._batches) <= i:
            self._extend()
        return self._batches[i]

    def record(self, offset: int) -> PlannedRecord:
        while len(self._records) <= offset:
            self._extend()
        return self._records[offset]

    def records(self, start: int, end: int) -> Iterable[PlannedRecord]:
        for offset in range(start, end):
            yield self.record(offset)

    def aborted_offsets(self, end: int) -> set[int]:
        """Offsets below `end` of data records in transactions the plan aborts (with markers below `end`)."""
        if end > 0:
            self.record(end - 1)
        out: set[int] = set()
        held: dict[int, list[int]] = {}
        for batch in self._batches:
            if batch.first_offset >= end:
                break
            if batch.kind == KIND_TXN:
                held.setdefault(batch.producer_id, []).extend(r.offset for r in batch.records)
            elif batch.kind == KIND_MARKER:
                offsets = held.pop(batch.producer_id, [])
                if batch.control_type == fmt.CONTROL_TYPE_ABORT:
                    out.update(offsets)
        return out

    def _key(self) -> bytes:
        # u**3 puts most writes on a few hot keys and leaves a long tail of rarely updated ones.
        return b"k%04d" % int(KEYS * self._rnd.random() ** 3)

    def _extend(self) -> None:
        rnd = self._rnd
        first = len(self._records)
        draw = rnd.random()
        if self._open and draw < MARKER_CHANCE:
            pid = rnd.choice(sorted(self._open))
            del self._open[pid]
            control = fmt.CONTROL_TYPE_ABORT if rnd.random() < ABORT_FRACTION else fmt.CONTROL_TYPE_COMMIT
            records = (PlannedRecord(first, KIND_MARKER, None, None, pid, control),)
            self._add(PlannedBatch(first, records, KIND_MARKER, pid, control, fmt.COMPRESSION_NONE, -1, len(self._open)))
            return
        if draw < TXN_BATCH_CHANCE:
            kind, pid, count = KIND_TXN, rnd.choice(TXN_PRODUCER_IDS), rnd.randint(1, TXN_BATCH_RECORDS_MAX)
            self._open.setdefault(pid, first)
            sequence = self._sequences[pid]
            self._sequences[pid] += count
        else:
            kind, pid, count = KIND_PLAIN, -1, rnd.randint(1, WRITE_BATCH_RECORDS_MAX)
            sequence = -1
        records = []
        for offset in range(first, first + count):
            key = self._key()
            value = None if rnd.random() < TOMBSTONE_FRACTION else value_of(key, offset)
            records.append(PlannedRecord(offset, kind, key, value, pid, -1))
        codec = rnd.choice(CODECS) if self.spec.compressed else fmt.COMPRESSION_NONE
        self._add(PlannedBatch(first, tuple(records), kind, pid, -1, codec, sequence, len(self._open)))

    def _add(self, batch: PlannedBatch) -> None:
        self._batches.append(batch)
        self._records.extend(batch.records)


class CommittedView:
    """What a read_committed consumer knows after records fed in offset order: the latest value per key.

    Transactional data waits for its producer's marker: COMMIT applies it, ABORT drops it. A record only
    replaces a key's value if its offset is higher (a committed transaction's data can be older than a
    plain record that came between it and the marker).
    """

    def __init__(self) -> None:
        self.latest: dict[bytes, tuple[int, bytes | None]] = {}
        self._pending: dict[int, list[tuple[int, bytes, bytes | None]]] = {}

    def data(self, offset: int, key: bytes, value: bytes | None, *, producer_id: int, transactional: bool) -> None:
        if transactional:
            self._pending.setdefault(producer_id, []).append((offset, key, value))
        else:
            self._put(offset, key, value)

    def marker(self, producer_id: int, control_type: int) -> None:
        held = self._pending.pop(producer_id, [])
        if control_type == fmt.CONTROL_TYPE_COMMIT:
            for offset, key, value in held:
                self._put(offset, key, value)

    def planned(self, record: PlannedRecord) -> None:
        if record.kind == KIND_MARKER:
            self.marker(record.producer_id, record.control_type)
        else:
            self.data(record.offset, record.key, record.value, producer_id=record.producer_id,
                      transactional=record.kind == KIND_TXN)

    def _put(self, offset: int, key: bytes, value: bytes | None) -> None:
        current = self.latest.get(key)
        if current is None or offset > current[0]:
            self.latest[key] = (offset, value)

    def values(self) -> dict[bytes, bytes]:
        """key → latest committed value; keys whose latest record is a tombstone are left out."""
        return {k: v for k, (_, v) in self.latest.items() if v is not None}

    @property
    def open_producers(self) -> list[int]:
        return sorted(pid for pid, held in self._pending.items() if held)


def view_differences(expected: dict[bytes, bytes], actual: dict[bytes, bytes], *, limit: int = 5) -> list[str]:
    """Up to `limit` keys whose values differ, as text (empty: the views agree)."""
    out = []
    for key in sorted(set(expected) | set(actual)):
        if expected.get(key) != actual.get(key):
            out.append(f"{key!r}: expected {expected.get(key)!r:.60} found {actual.get(key)!r:.60}")
            if len(out) >= limit:
                break
    return out


def read_view(directory: Path) -> tuple[CommittedView, int, int]:
    """The committed view of a whole partition read from its log start; also (records, aborted-data records)
    where the second counts data records the plan says belong to an aborted transaction."""
    spec = next(s for s in PARTITIONS if s.name == directory.name)
    view = CommittedView()
    records = 0
    aborted_left = 0
    with PartitionLog.open(directory, mode="reader") as plog:
        aborted = Plan(spec).aborted_offsets(plog.log_end_offset)
        for batch in plog.iter_batches():
            for record in batch.records:
                records += 1
                _feed(view, batch, record)
                aborted_left += record.offset in aborted
    return view, records, aborted_left


def _feed(view: CommittedView, batch: RecordBatch, record) -> None:
    header = batch.header
    if header.is_control:
        _, control_type = decode_control_key(record.key)
        view.marker(header.producer_id, control_type)
    else:
        view.data(record.offset, record.key, record.value, producer_id=header.producer_id,
                  transactional=header.is_transactional)


# ---- helpers shared by the processes ----------------------------------------------------------------------


def write_json_atomically(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _wait_for_directory(directory: Path, stop_file: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not (directory / fmt.offset_file_name(0, fmt.LOG_SUFFIX)).exists():
        if stop_file.exists() or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---- the writer -------------------------------------------------------------------------------------------

WRITER_FLUSH_INTERVAL_S = 0.5
PROGRESS_INTERVAL_S = 0.02


def run_writer(args: argparse.Namespace) -> int:
    """Append the plans' batches to every partition at `--rate` records/s for `--seconds`, then end the open
    transactions (by following the plan until none is open), roll, and write what was written as JSON."""
    log_dir = Path(args.log_dir)
    config = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=INDEX_INTERVAL_BYTES)
    plans = [Plan(spec) for spec in PARTITIONS]
    logs = [PartitionLog.open(log_dir / spec.name, mode="writer", create=True, config=config) for spec in PARTITIONS]
    views = [CommittedView() for _ in PARTITIONS]
    stats = [{"batches": 0, "bytes": 0, "records": 0, "tombstones": 0, "commits": 0, "aborts": 0,
              "aborted_records": 0, "rolls": 0} for _ in PARTITIONS]
    next_batch = [0 for _ in PARTITIONS]
    active_bases = [0 for _ in PARTITIONS]
    started = time.monotonic()
    deadline = started + args.seconds
    last_flush = last_progress = started
    progress = Path(args.progress) if args.progress else None
    written = 0
    try:
        stopping = False
        while True:
            for p, (plan, plog, view, st) in enumerate(zip(plans, logs, views, stats)):
                if stopping and (next_batch[p] == 0 or plan.batch(next_batch[p] - 1).open_txns_after == 0):
                    continue
                batch = plan.batch(next_batch[p])
                info, size_bytes = _append_planned(plog, batch)
                if (info.first_offset, info.last_offset) != (batch.first_offset, batch.records[-1].offset):
                    raise AssertionError(f"{plog.directory}: planned offsets {batch.first_offset}.."
                                         f"{batch.records[-1].offset}, the log assigned {info.first_offset}.."
                                         f"{info.last_offset}")
                st["rolls"] += info.segment_base_offset != active_bases[p]
                active_bases[p] = info.segment_base_offset
                st["batches"] += 1
                st["bytes"] += size_bytes
                for record in batch.records:
                    view.planned(record)
                if batch.kind == KIND_MARKER:
                    st["commits" if batch.control_type == fmt.CONTROL_TYPE_COMMIT else "aborts"] += 1
                else:
                    st["records"] += len(batch.records)
                    st["tombstones"] += sum(r.value is None for r in batch.records)
                    written += len(batch.records)
                next_batch[p] += 1
            now = time.monotonic()
            if progress is not None and now - last_progress >= PROGRESS_INTERVAL_S:
                # Appended bytes are visible to every process as soon as the append returned (no fsync
                # needed): a reader that reads this afterwards must be able to fetch up to these offsets.
                write_json_atomically(progress, {spec.name: plog.log_end_offset for spec, plog in zip(PARTITIONS, logs)})
                last_progress = now
            if now - last_flush >= WRITER_FLUSH_INTERVAL_S:
                for plog in logs:
                    plog.flush()
                last_flush = now
            if not stopping and (now >= deadline or (args.stop_file and Path(args.stop_file).exists())):
                stopping = True
            if stopping and all(n == 0 or plan.batch(n - 1).open_txns_after == 0 for plan, n in zip(plans, next_batch)):
                break
            ahead_s = written / args.rate - (time.monotonic() - started)
            if ahead_s > 0:
                time.sleep(ahead_s)
        out = {"elapsed_s": time.monotonic() - started, "partitions": {}}
        for spec, plan, plog, view, st in zip(PARTITIONS, plans, logs, views, stats):
            plog.roll(reason="writer done")  # everything written becomes cleanable
            plog.flush()
            st["log_end_offset"] = plog.log_end_offset
            st["aborted_records"] = len(plan.aborted_offsets(plog.log_end_offset))
            st["size_bytes"] = plog.size_bytes
            if view.open_producers:
                raise AssertionError(f"{spec.name}: transactions of {view.open_producers} still open at the end")
            out["partitions"][spec.name] = {
                **st,
                "latest": {k.decode(): v.decode() for k, v in view.values().items()},
                "keys_deleted": sum(v is None for _, v in view.latest.values()),
            }
    finally:
        for plog in logs:
            plog.close()
    write_json_atomically(Path(args.out), out)
    print("writer done", json.dumps({k: {x: y for x, y in v.items() if x != "latest"}
                                     for k, v in out["partitions"].items()}), flush=True)
    return 0


def _append_planned(plog: PartitionLog, batch: PlannedBatch) -> tuple[AppendInfo, int]:
    """Append one planned batch; returns where it went and its size in bytes."""
    now_ms = plog.clock_ms()
    if batch.kind == KIND_MARKER:
        data = encode_control_batch(offset=0, control_type=batch.control_type, timestamp=now_ms,
                                    producer_id=batch.producer_id, producer_epoch=0)
    else:
        records = [Record(i, now_ms, r.key, r.value) for i, r in enumerate(batch.records)]
        transactional = batch.kind == KIND_TXN
        data = encode_batch(records, base_offset=0, compression=batch.compression,
                            producer_id=batch.producer_id if transactional else fmt.NO_PRODUCER_ID,
                            producer_epoch=0 if transactional else fmt.NO_PRODUCER_EPOCH,
                            base_sequence=batch.base_sequence, is_transactional=transactional)
    return plog.append_batches(data), len(data)


# ---- the readers ------------------------------------------------------------------------------------------

FETCH_BYTES_MAX = 16 * 1024  # small fetches: many of them per pass, each one a chance to meet a swap
VIOLATIONS_KEPT_MAX = 50
TAIL_PASS_S = 2.0  # how long a tail pass follows the log end before starting again from 0
TAIL_POLL_S = 0.02
REOPEN_EVERY_PASSES = 3
REPORT_INTERVAL_S = 2.0
PASS_PAUSE_S = 0.01  # between passes: readers share two cores with the writer and the daemon
PASS_FETCHES_MAX = 1_000_000  # a pass that never reaches its end is a bug in itself


class ReaderState:
    """Counters and violations of one reader process, by partition."""

    def __init__(self, role: str, out: Path) -> None:
        self.role = role
        self.out = out
        self.counts: dict[str, dict[str, int]] = {}
        self.violation_count = 0
        self.violations: list[str] = []
        self._reported = time.monotonic()

    def count(self, partition: str, what: str, n: int = 1) -> None:
        c = self.counts.setdefault(partition, {})
        c[what] = c.get(what, 0) + n

    def high(self, partition: str, what: str, value: int) -> None:
        c = self.counts.setdefault(partition, {})
        c[what] = max(c.get(what, -1), value)

    def violation(self, partition: str, text: str) -> None:
        self.violation_count += 1
        if len(self.violations) < VIOLATIONS_KEPT_MAX:
            self.violations.append(f"{partition}: {text}")
        print(f"VIOLATION {partition}: {text}", file=sys.stderr, flush=True)

    def report(self, *, final: bool = False) -> None:
        if final or time.monotonic() - self._reported >= REPORT_INTERVAL_S:
            write_json_atomically(self.out, {"role": self.role, "final": final, "counts": self.counts,
                                             "violation_count": self.violation_count,
                                             "violations": self.violations})
            self._reported = time.monotonic()


@dataclass
class Pass:
    """One consumer pass over a partition: where it is and what it has seen so far."""

    partition: str
    start: int
    started_s: float = field(default_factory=time.monotonic)
    position: int = 0  # the next offset to fetch
    last_batch_offset: int = -1  # last offset of the last batch seen
    last_record_offset: int = -1
    view: CommittedView | None = None

    def __post_init__(self) -> None:
        self.position = self.start


class Reader:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.log_dir = Path(args.log_dir)
        self.stop_file = Path(args.stop_file)
        self.progress = Path(args.progress) if args.progress else None
        self.state = ReaderState(args.role, Path(args.out))
        self.rnd = random.Random(args.seed)
        self.plans = {spec.name: Plan(spec) for spec in PARTITIONS}
        self.logs: dict[str, PartitionLog] = {}
        # The plan's committed state, advanced as far as a tail pass has reached (offsets only grow).
        self.plan_views = {spec.name: CommittedView() for spec in PARTITIONS}
        self.plan_view_ends = {spec.name: 0 for spec in PARTITIONS}

    def written_log_end(self, name: str) -> int:
        """The log end offset the writer last published for `name` (-1 if nothing was published yet)."""
        if self.progress is None:
            return -1
        try:
            return json.loads(self.progress.read_text()).get(name, -1)
        except FileNotFoundError:
            return -1

    def stopped(self) -> bool:
        return self.stop_file.exists()

    def log(self, name: str, *, reopen: bool = False) -> PartitionLog:
        if reopen and name in self.logs:
            self.logs.pop(name).close()
            self.state.count(name, "reopens")
        if name not in self.logs:
            self.logs[name] = PartitionLog.open(self.log_dir / name, mode="reader")
        return self.logs[name]

    def run(self) -> int:
        for spec in PARTITIONS:
            if not _wait_for_directory(self.log_dir / spec.name, self.stop_file, timeout_s=60.0):
                self.state.report(final=True)
                return 0
        passes = 0
        try:
            while not self.stopped():
                for spec in PARTITIONS:
                    try:
                        self.one_pass(spec.name, reopen=passes % REOPEN_EVERY_PASSES == 0)
                    except SegmentError as exc:
                        # A reader of a consistent log never meets corruption, a closed log or an offset
                        # out of range: each one is a violation. The next pass starts from a fresh open.
                        self.state.violation(spec.name, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
                        stale = self.logs.pop(spec.name, None)
                        if stale is not None:
                            stale.close()
                    self.state.report()
                    if self.stopped():
                        break
                    time.sleep(PASS_PAUSE_S)
                passes += 1
        finally:
            for plog in self.logs.values():
                plog.close()
        self.state.report(final=True)
        return 0

    def one_pass(self, name: str, *, reopen: bool) -> None:
        plog = self.log(name, reopen=reopen)
        plog.refresh()
        role = self.args.role
        if role == "tail":
            self.tail_pass(plog, Pass(name, 0, view=CommittedView()))
        else:
            low, high = plog.log_start_offset, plog.log_end_offset
            start = self.rnd.randint(low, high)
            if role == "fetch":
                self.fetch_until(plog, Pass(name, start), end=high)
            else:
                self.iter_pass(plog, Pass(name, start))
        self.state.count(name, "passes")
        self.state.count(name, f"passes_{role}")

    def tail_pass(self, plog: PartitionLog, p: Pass) -> None:
        reached = self.fetch_until(plog, p, end=None)
        elapsed_ms = (time.monotonic() - p.started_s) * 1000
        if elapsed_ms < self.args.delete_retention_ms / 2:
            self.check_view(p.partition, p.view, reached)
        else:
            self.state.count(p.partition, "view_checks_skipped_slow_pass")
        follow_until = time.monotonic() + TAIL_PASS_S
        while time.monotonic() < follow_until and not self.stopped():
            time.sleep(TAIL_POLL_S)
            self.fetch_until(plog, p, end=None)

    def fetch_until(self, plog: PartitionLog, p: Pass, *, end: int | None) -> int:
        """Fetch from `p.position` until a fetch comes back empty (the log end) or `end` is reached."""
        for _ in range(PASS_FETCHES_MAX):
            if end is not None and p.position >= end:
                return p.position
            written_end = self.written_log_end(p.partition) if end is None else -1
            fetched = plog.read(p.position, FETCH_BYTES_MAX)
            self.state.count(p.partition, "fetches")
            if not fetched.data:
                self.state.count(p.partition, "fetches_empty")
                if written_end > p.position:
                    self.state.violation(p.partition, f"fetch at {p.position} came back empty although the writer "
                                                      f"had appended up to {written_end} before it began")
                return p.position
            log_end = plog.log_end_offset
            first = True
            for _, batch in iter_batches(fetched.data):
                if first and batch.header.last_offset < p.position:
                    self.state.violation(p.partition, f"fetch at {p.position} returned a batch ending at "
                                                      f"{batch.header.last_offset}")
                first = False
                self.take_batch(p, batch, log_end)
                p.position = max(p.position, batch.header.last_offset + 1)
            if first:
                self.state.violation(p.partition, f"fetch at {p.position} returned {len(fetched.data)} bytes "
                                                  f"without a whole batch")
                return p.position
        self.state.violation(p.partition, f"pass from {p.start} did not reach the log end in {PASS_FETCHES_MAX} fetches")
        return p.position

    def iter_pass(self, plog: PartitionLog, p: Pass) -> None:
        log_end = plog.log_end_offset
        for batch in plog.iter_batches(p.start):
            # The iteration refreshes the log when it starts (the writer's appends since the line above are in
            # it), so the log end to check a batch against is the one read after the batch, never before it.
            log_end = max(log_end, plog.log_end_offset)
            self.take_batch(p, batch, log_end)
            p.position = max(p.position, batch.header.last_offset + 1)
        self.state.count(p.partition, "iterations")

    def take_batch(self, p: Pass, batch: RecordBatch, log_end: int) -> None:
        header = batch.header
        name = p.partition
        if header.base_offset <= p.last_batch_offset:
            self.state.violation(name, f"batch at {header.base_offset}..{header.last_offset} after a batch that "
                                       f"ended at {p.last_batch_offset} (pass from {p.start})")
        p.last_batch_offset = max(p.last_batch_offset, header.last_offset)
        self.state.count(name, "batches")
        plan = self.plans[name]
        for record in batch.records:
            if record.offset < p.start:
                continue  # a consumer discards the records of the first batch below its position
            if record.offset <= p.last_record_offset:
                self.state.violation(name, f"offset {record.offset} after {p.last_record_offset} "
                                           f"(pass from {p.start})")
            p.last_record_offset = max(p.last_record_offset, record.offset)
            self.state.count(name, "records")
            self.state.high(name, "max_offset", record.offset)
            if not header.base_offset <= record.offset <= header.last_offset:
                self.state.violation(name, f"record {record.offset} outside its batch {header.base_offset}.."
                                           f"{header.last_offset}")
            if record.offset >= log_end:
                self.state.violation(name, f"record {record.offset} at or past the log end {log_end}")
                continue
            problem = self.check_record(plan.record(record.offset), header, record)
            if problem is not None:
                self.state.violation(name, f"offset {record.offset}: {problem}")
            elif p.view is not None:
                _feed(p.view, batch, record)

    @staticmethod
    def check_record(planned: PlannedRecord, header, record) -> str | None:
        if planned.kind == KIND_MARKER:
            if not header.is_control:
                return f"a data record {record.key!r}={record.value!r:.40} where a marker was written"
            _, control_type = decode_control_key(record.key)
            if (header.producer_id, control_type) != (planned.producer_id, planned.control_type):
                return (f"marker of producer {header.producer_id} type {control_type}, written: producer "
                        f"{planned.producer_id} type {planned.control_type}")
            return None
        if header.is_control:
            return "a control record where data was written"
        if (record.key, record.value) != (planned.key, planned.value):
            return f"{record.key!r}={record.value!r:.40}, written: {planned.key!r}={planned.value!r:.40}"
        transactional = planned.kind == KIND_TXN
        if header.is_transactional != transactional or (transactional and header.producer_id != planned.producer_id):
            return (f"transactional={header.is_transactional} producer {header.producer_id}, written: "
                    f"transactional={transactional} producer {planned.producer_id}")
        return None

    def check_view(self, name: str, view: CommittedView, end: int) -> None:
        """The committed state a pass from 0 saw up to `end` must be the plan's committed state at `end`."""
        plan_view = self.plan_views[name]
        if end < self.plan_view_ends[name]:
            plan_view = self.plan_views[name] = CommittedView()
            self.plan_view_ends[name] = 0
        for record in self.plans[name].records(self.plan_view_ends[name], end):
            plan_view.planned(record)
        self.plan_view_ends[name] = end
        diffs = view_differences(plan_view.values(), view.values())
        self.state.count(name, "view_checks")
        if diffs:
            self.state.violation(name, f"a pass from 0 to {end} saw a different latest value: " + "; ".join(diffs))


def run_reader(args: argparse.Namespace) -> int:
    return Reader(args).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak_processes")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--log-dir", required=True)
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--rate", type=float, required=True, help="records per second over all partitions")
    w.add_argument("--out", required=True)
    w.add_argument("--stop-file", default=None)
    w.add_argument("--progress", default=None, help="JSON file (outside the log dir) of the log end offsets written")
    r = sub.add_parser("reader")
    r.add_argument("--log-dir", required=True)
    r.add_argument("--role", choices=("tail", "fetch", "iter"), required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--delete-retention-ms", type=int, required=True)
    r.add_argument("--stop-file", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--progress", default=None, help="the writer's --progress file")
    args = parser.parse_args(argv)
    return run_writer(args) if args.command == "writer" else run_reader(args)


if __name__ == "__main__":
    sys.exit(main())
