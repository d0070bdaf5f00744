"""Builders for the cleaner rule tests: small logs with explicit offsets, keys, producers and clocks.

A test describes a partition as a list of steps (encoded batches, `ROLL`, or raw bytes via
`write_raw_segment`), runs rounds with `clean` (a `cleaner.round.clean_round` in cleaner mode, with
settings given by their Kafka names), and reads the outcome back with `batches`, `raw_batches`,
`records` and `segment_bases`. Offsets are assigned by the log from its end, as a broker does; a
batch's own lastOffsetDelta is kept, so offset gaps are made with `last_offset_delta`.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cleaner.round import RoundResult, clean_round
from cleaner.settings import Settings
from offsetmap import OffsetMap
from segments.codec import format as fmt
from segments.codec.records import Header, Record, RecordBatch, encode_batch, encode_control_batch
from segments.partition.checkpoint import update_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000  # record timestamps start here (ms)
DAY_MS = 86_400_000
TOPIC = "t"
ROLL = "roll"  # a step of `build_log`: make the active segment inactive
BIG_MAP_BYTES = 24 * 4096  # 4096 slots: more than any test log has keys

__all__ = [
    "BIG_MAP_BYTES", "DAY_MS", "ROLL", "T0", "TOPIC",
    "Rec", "abort", "batch", "batches", "build_log", "clean", "commit", "file_digests", "full_records",
    "partition_dir", "random_log", "raw_batches", "records", "segment_bases", "set_high_watermark", "txn_batch",
    "write_raw_segment",
]


@dataclass(frozen=True)
class Rec:
    """A record to build: key, value (None = tombstone), timestamp, headers, and its offset delta in the batch."""

    key: bytes | None
    value: bytes | None
    timestamp: int = T0
    headers: tuple[Header, ...] = ()
    delta: int | None = None  # offset delta inside its batch; default: its index


def _records(recs: Sequence[Rec | tuple]) -> list[Record]:
    out = []
    for i, r in enumerate(recs):
        if isinstance(r, tuple):
            r = Rec(*r)
        out.append(Record(offset=i if r.delta is None else r.delta, timestamp=r.timestamp, key=r.key,
                          value=r.value, headers=r.headers))
    return out


def batch(recs: Sequence[Rec | tuple], **kwargs) -> bytes:
    """One v2 batch of `recs` (Rec or (key, value[, timestamp])) with base offset 0; `kwargs` go to encode_batch."""
    return encode_batch(_records(recs), base_offset=0, **kwargs)


def txn_batch(recs: Sequence[Rec | tuple], *, pid: int, epoch: int = 0, seq: int = 0, **kwargs) -> bytes:
    """A transactional data batch of producer `pid`."""
    return batch(recs, is_transactional=True, producer_id=pid, producer_epoch=epoch, base_sequence=seq, **kwargs)


def commit(pid: int, *, epoch: int = 0, timestamp: int = T0) -> bytes:
    return encode_control_batch(offset=0, control_type=fmt.CONTROL_TYPE_COMMIT, timestamp=timestamp,
                                producer_id=pid, producer_epoch=epoch)


def abort(pid: int, *, epoch: int = 0, timestamp: int = T0) -> bytes:
    return encode_control_batch(offset=0, control_type=fmt.CONTROL_TYPE_ABORT, timestamp=timestamp,
                                producer_id=pid, producer_epoch=epoch)


def partition_dir(tmp_path: Path, name: str = f"{TOPIC}-0") -> Path:
    return tmp_path / "logs" / name


def build_log(directory: Path, steps: Iterable[bytes | str], *, config: LogConfig | None = None,
              roll_at_end: bool = True) -> list[int]:
    """Append each step (batch bytes, or ROLL) with a writer; returns the first offset of each batch step.

    With `roll_at_end` the log ends with an empty active segment, so everything appended is cleanable.
    """
    firsts = []
    with PartitionLog.open(directory, mode="writer", create=True, config=config or LogConfig(),
                           clock_ms=lambda: T0) as log:
        for step in steps:
            if isinstance(step, str):
                assert step == ROLL, step
                log.roll()
            else:
                firsts.append(log.append_batches(step).first_offset)
        if roll_at_end:
            log.roll()
    return firsts


def write_raw_segment(directory: Path, base_offset: int, data: bytes) -> Path:
    """Write `data` as segment `<base_offset>.log` by hand (its indexes are rebuilt at the next open)."""
    path = directory / fmt.offset_file_name(base_offset, fmt.LOG_SUFFIX)
    path.write_bytes(data)
    for suffix in (fmt.INDEX_SUFFIX, fmt.TIME_INDEX_SUFFIX):
        (directory / fmt.offset_file_name(base_offset, suffix)).unlink(missing_ok=True)
    return path


def set_high_watermark(directory: Path, offset: int) -> None:
    update_offset_checkpoint(directory.parent / "replication-offset-checkpoint", {(TOPIC, 0): offset})


def clean(directory: Path, *, now_ms: int, settings: dict | None = None, map_bytes: int = BIG_MAP_BYTES,
          config: LogConfig | None = None, **kwargs) -> RoundResult:
    """One cleaning round of the partition at `directory`; `settings` by Kafka names."""
    values = {"delete.retention.ms": DAY_MS}
    values.update(settings or {})
    topic = Settings.from_mappings(values).topic(TOPIC)
    with PartitionLog.open(directory, mode="cleaner", config=config or LogConfig()) as log:
        return clean_round(log, topic, OffsetMap(map_bytes), now_ms=now_ms, seed=kwargs.pop("seed", 7), **kwargs)


def batches(directory: Path) -> list[RecordBatch]:
    """Every batch of the log, decoded (CRC checked), in file order."""
    with PartitionLog.open(directory, mode="reader") as log:
        return list(log.iter_batches())


def raw_batches(directory: Path) -> dict[int, bytes]:
    """The raw bytes of every batch, by base offset (the offset field for legacy entries)."""
    out = {}
    with PartitionLog.open(directory, mode="reader") as log:
        for seg in log.segments:
            for pos, header in seg.iter_headers():
                out[header.base_offset] = seg.pread(pos, header.size_bytes)
    return out


def records(directory: Path) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record a consumer from the log start sees."""
    with PartitionLog.open(directory, mode="reader") as log:
        return [(r.offset, r.key, r.value) for _, r in log.iter_records()]


def full_records(directory: Path) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record, control records included."""
    with PartitionLog.open(directory, mode="reader") as log:
        return [(r.offset, r.timestamp, r.key, r.value, r.headers) for _, r in log.iter_records()]


def segment_bases(directory: Path) -> list[int]:
    with PartitionLog.open(directory, mode="reader") as log:
        return [s.base_offset for s in log.segments]


def file_digests(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root` (lock files excluded: opening a log may create them)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if name.endswith(".lock"):
                continue
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out



def random_log(directory: Path, seed: int, *, batches_max: int = 40, offset_gap: int = 0,
               end_transactions: bool = True) -> None:
    """A seeded random log over 7 keys: plain, idempotent and transactional batches of every codec, commits
    and aborts, tombstones, unkeyed records, shuffled timestamps and random rolls; every transaction ends
    (with `end_transactions` False, those still open are left open, before a last plain batch).
    With `offset_gap`, `offset_gap` unused offsets follow every data record (as after an earlier compaction)."""
    rnd = random.Random(seed)
    stride = offset_gap + 1
    steps: list[bytes | str] = []
    open_txns: set[int] = set()
    sequences: dict[int, int] = {}
    for i in range(batches_max):
        recs = []
        for _ in range(rnd.randint(1, 4)):
            key = None if rnd.random() < 0.05 else b"k%d" % rnd.randint(0, 6)
            value = None if rnd.random() < 0.2 else b"v%d" % i
            recs.append(Rec(key, value, T0 + i + rnd.randint(-3, 3), delta=len(recs) * stride))
        codec = rnd.choice(list(fmt.COMPRESSION_NAMES))
        if offset_gap:
            codec = {"compression": codec, "last_offset_delta": len(recs) * stride - 1}
        else:
            codec = {"compression": codec}
        kind = rnd.random()
        if kind < 0.3:
            pid = rnd.choice([1, 2, 3])
            steps.append(txn_batch(recs, pid=pid, seq=sequences.get(pid, 0), **codec))
            sequences[pid] = sequences.get(pid, 0) + len(recs)
            open_txns.add(pid)
        elif kind < 0.45 and open_txns:
            pid = rnd.choice(sorted(open_txns))
            open_txns.discard(pid)
            steps.append(commit(pid, timestamp=T0 + i) if rnd.random() < 0.5 else abort(pid, timestamp=T0 + i))
        elif kind < 0.6:
            pid = 10 + rnd.randint(0, 2)
            steps.append(batch(recs, producer_id=pid, producer_epoch=0, base_sequence=sequences.get(pid, 0),
                               **codec))
            sequences[pid] = sequences.get(pid, 0) + len(recs)
        else:
            steps.append(batch(recs, **codec))
        if rnd.random() < 0.15:
            steps.append(ROLL)
    if end_transactions:
        for pid in sorted(open_txns):
            steps.append(commit(pid, timestamp=T0 + batches_max))
    else:
        steps.append(batch([Rec(b"k0", b"last", T0 + batches_max)]))
    build_log(directory, steps)
