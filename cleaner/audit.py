"""Key audits: what a partition holds for given keys, and how its keys are spread.

Owns `audit_partition`, which reads one partition once, sequentially (the vectorised segment scan, CRCs
checked), and returns a `PartitionAudit`:

* for each key asked about (`keys`), its history: every record the log still holds for it — offset,
  timestamp, value size or tombstone, the segment file, and for transactional records whether their
  transaction committed, aborted or is still open;
* the partition summary: data records, distinct keys, tombstones, keys whose latest record is a tombstone,
  records without a key, control records, records of aborted transactions, and a histogram of records per
  key (buckets 1, 2, 3-4, 5-8, ...).

Keys are counted exactly, by their MurmurHash3 x64 128 pair (the offset map's hash; two keys sharing a pair
would be counted once — at 2^-128 per pair, never in practice), at about 33 bytes of memory per keyed record.
Records of aborted transactions are left out of the key statistics (no consumer reading committed data sees
them) and counted on their own. Records below the log start offset are not counted. Nothing is written.

A partition holding the leftovers of an interrupted clean or swap (`.cleaned`, `.swap`, `.deleted` files) is
audited as Kafka will see it once it has recovered them (the reader's view, `segments.partition.recovery`: a rolled-forward
`.swap` segment in place of the old ones), without recovering anything; the leftovers are listed.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from offsetmap import hash_key, hash_key_spans
from segments.codec.errors import CorruptRecordError
from segments.partition.log import PartitionLog

from .cli_support import megabytes

__all__ = ["KeyRecord", "PartitionAudit", "audit_partition", "histogram_buckets"]

_WINDOW_BYTES = 16 * 1024 * 1024
TXN_NONE, TXN_COMMITTED, TXN_ABORTED, TXN_OPEN = "", "committed", "aborted", "open"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One retained record of an audited key."""

    offset: int
    timestamp: int
    value_bytes: int | None  # None: a tombstone (null value)
    segment: str  # the segment's file name
    transaction: str = TXN_NONE  # "" (not transactional), "committed", "aborted" or "open"

    @property
    def tombstone(self) -> bool:
        return self.value_bytes is None


@dataclass(slots=True)
class PartitionAudit:
    """One partition's key audit (see the module docstring)."""

    partition: str
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    records: int = 0  # data records at or past the log start, aborted ones included
    unkeyed: int = 0
    control: int = 0
    aborted: int = 0  # data records of aborted transactions
    distinct_keys: int = 0
    tombstones: int = 0  # tombstone records (aborted ones left out)
    deleted_keys: int = 0  # keys whose latest record is a tombstone
    histogram: dict[str, int] = field(default_factory=dict)  # "1", "2", "3-4", ... -> number of keys
    history: dict[bytes, list[KeyRecord]] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)  # .cleaned/.swap/.deleted files recovery will handle

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in (
            "partition", "log_start_offset", "log_end_offset", "size_bytes", "records", "unkeyed", "control",
            "aborted", "distinct_keys", "tombstones", "deleted_keys", "histogram", "leftovers")}
        out["history"] = [
            {"key": display_key(key), "key_hex": key.hex(), "records": [asdict(r) for r in records]}
            for key, records in self.history.items()
        ]
        return out


def display_key(key: bytes) -> str:
    """A key as text when it is printable UTF-8, else `0x<hex>`."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + key.hex()
    return text if text.isprintable() else "0x" + key.hex()


def histogram_buckets(counts: np.ndarray) -> dict[str, int]:
    """Keys per bucket of records-per-key: 1, 2, 3-4, 5-8, ... (powers of two), empty buckets left out."""
    if not len(counts):
        return {}
    exponent = np.ceil(np.log2(counts.astype(np.float64))).astype(np.int64)  # 1→0, 2→1, 3-4→2, 5-8→3
    out = {}
    for e, n in zip(*np.unique(exponent, return_counts=True)):
        low, high = (1 << (int(e) - 1)) + 1 if e > 0 else 1, 1 << int(e)
        out[str(high) if low == high else f"{low}-{high}"] = int(n)
    return out


class _Markers:
    """COMMIT/ABORT markers per producer, to say how each transactional record's transaction ended."""

    def __init__(self) -> None:
        self._by_pid: dict[int, tuple[list[int], list[int]]] = {}

    def add(self, pid: int, offset: int, control_type: int) -> None:
        offsets, types = self._by_pid.setdefault(pid, ([], []))
        offsets.append(offset)
        types.append(control_type)

    def outcome(self, pids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Per record: 1 committed, 0 aborted, -1 open (no marker of its producer after it)."""
        out = np.full(len(pids), -1, dtype=np.int8)
        for pid in np.unique(pids):
            if int(pid) not in self._by_pid:
                continue
            marker_offsets, marker_types = (np.asarray(a, dtype=np.int64) for a in self._by_pid[int(pid)])
            mine = np.flatnonzero(pids == pid)
            at = np.searchsorted(marker_offsets, offsets[mine], side="left")
            closed = at < len(marker_offsets)
            out[mine[closed]] = marker_types[at[closed]]
        return out


def _control_type(key: bytes | None, path: Path, position: int) -> int:
    if key is None or len(key) < 4:
        raise CorruptRecordError("control record without a 4-byte key", position=position, path=path)
    return int.from_bytes(key[2:4], "big", signed=True)


def audit_partition(directory: str | os.PathLike, keys: list[bytes] | None = None) -> PartitionAudit:
    """Read the partition at `directory` once; its summary, and the history of each of `keys`."""
    path = Path(directory)
    wanted = list(dict.fromkeys(keys or []))
    wanted_h1 = np.array([hash_key(k)[0] for k in wanted], dtype=np.uint64)
    found: list[tuple[bytes, KeyRecord, int]] = []  # (key, record, producer id or -1)
    markers = _Markers()
    h1s, h2s, offsets, tombs, pids = [], [], [], [], []
    with PartitionLog.open(path, mode="reader") as plog:
        start = plog.log_start_offset
        audit = PartitionAudit(path.name, start, plog.log_end_offset, plog.size_bytes)
        if plog.leftover_plan is not None:
            audit.leftovers = list(plog.leftover_plan.leftovers)
        segments = plog.segments
        for i, segment in enumerate(segments):
            name = segment.paths.log.name
            for _, result in segment.scan_windows(window_bytes=_WINDOW_BYTES, stop_at_invalid=i == len(segments) - 1):
                if result.n_records == 0:
                    continue
                batch = result.batch_index
                live = result.offset >= start
                control = result.is_control[batch] & live
                for r in map(int, np.flatnonzero(control)):
                    b = batch[r]
                    position = int(result.batch_position[b])
                    markers.add(int(result.producer_id[b]), int(result.offset[r]),
                                _control_type(result.key_bytes(r), segment.paths.log, position))
                audit.control += int(np.count_nonzero(control))
                data = ~result.is_control[batch] & live
                keyed = data & (result.key_len >= 0)
                audit.records += int(np.count_nonzero(data))
                audit.unkeyed += int(np.count_nonzero(data & ~keyed))
                txn = result.is_transactional[batch]
                for spans in result.key_spans(keyed):
                    h1, h2 = hash_key_spans(spans.buffer, spans.key_pos, spans.key_len)
                    index = spans.record_index
                    h1s.append(h1)
                    h2s.append(h2)
                    offsets.append(result.offset[index].astype(np.int64))
                    tombs.append(result.value_len[index] < 0)
                    pids.append(np.where(txn[index], result.producer_id[batch[index]], -1).astype(np.int64))
                    if len(wanted):
                        for j in np.flatnonzero(np.isin(h1, wanted_h1)):
                            r = int(index[j])
                            key = result.key_bytes(r)
                            if key in wanted:
                                size = int(result.value_len[r])
                                found.append((key, KeyRecord(
                                    int(result.offset[r]), int(result.timestamp[r]), None if size < 0 else size, name,
                                ), int(pids[-1][j])))
    _summarise(audit, markers, h1s, h2s, offsets, tombs, pids)
    audit.history = {key: [] for key in wanted}
    if found:
        outcome = markers.outcome(np.array([p for _, _, p in found]), np.array([r.offset for _, r, _ in found]))
        names = {1: TXN_COMMITTED, 0: TXN_ABORTED, -1: TXN_OPEN}
        for (key, record, pid), ended in zip(found, outcome):
            if pid >= 0:
                record = KeyRecord(record.offset, record.timestamp, record.value_bytes, record.segment,
                                   names[int(ended)])
            audit.history[key].append(record)
        for records in audit.history.values():
            records.sort(key=lambda r: r.offset)
    return audit


def _summarise(audit: PartitionAudit, markers: _Markers, h1s, h2s, offsets, tombs, pids) -> None:
    if not h1s:
        return
    h1, h2 = np.concatenate(h1s), np.concatenate(h2s)
    offset, tomb, pid = np.concatenate(offsets), np.concatenate(tombs), np.concatenate(pids)
    transactional = np.flatnonzero(pid >= 0)
    if len(transactional):
        aborted = transactional[markers.outcome(pid[transactional], offset[transactional]) == 0]
        audit.aborted = len(aborted)
        keep = np.ones(len(h1), dtype=bool)
        keep[aborted] = False
        h1, h2, offset, tomb = h1[keep], h2[keep], offset[keep], tomb[keep]
    if not len(h1):
        return
    order = np.lexsort((offset, h2, h1))  # by key, then offset: each key's latest record ends its run
    h1, h2, tomb = h1[order], h2[order], tomb[order]
    starts = np.flatnonzero(np.concatenate(([True], (h1[1:] != h1[:-1]) | (h2[1:] != h2[:-1]))))
    ends = np.append(starts[1:], len(h1))
    audit.distinct_keys = len(starts)
    audit.tombstones = int(np.count_nonzero(tomb))
    audit.deleted_keys = int(np.count_nonzero(tomb[ends - 1]))
    audit.histogram = histogram_buckets(ends - starts)


def _iso(timestamp_ms: int) -> str:
    """Epoch milliseconds as UTC ISO 8601 (`-1`, Kafka's "no timestamp", as itself)."""
    try:
        moment = datetime.fromtimestamp(timestamp_ms // 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond year 9999: print the number
        return str(timestamp_ms)
    if timestamp_ms < 0:
        return str(timestamp_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{timestamp_ms % 1000:03d}Z"


def describe(audit: PartitionAudit, *, summary: bool) -> str:
    """The text `logcleaner audit` prints for one partition."""
    lines = []
    if summary:
        lines.append(
            f"{audit.partition}: {audit.records} records in [{audit.log_start_offset}, {audit.log_end_offset}), "
            f"{megabytes(audit.size_bytes)}: {audit.distinct_keys} distinct keys, {audit.tombstones} tombstones, "
            f"{audit.deleted_keys} keys whose latest record is a tombstone, {audit.unkeyed} without a key, "
            f"{audit.control} control, {audit.aborted} aborted"
        )
        if audit.histogram:
            lines.append("  records per key: " + ", ".join(f"{b}: {n}" for b, n in audit.histogram.items()))
    if audit.leftovers:
        lines.append(f"  {len(audit.leftovers)} leftover file(s) of an interrupted clean or swap, shown as Kafka's "
                     "recovery will leave the log (no file was changed): " + ", ".join(audit.leftovers))
    for key, records in audit.history.items():
        lines.append(f"{audit.partition}: key {display_key(key)}: {len(records)} record(s)")
        for r in records:
            value = "tombstone" if r.tombstone else f"{r.value_bytes} bytes"
            txn = f"  {r.transaction}" if r.transaction else ""
            lines.append(f"  offset {r.offset:<12} {_iso(r.timestamp):<24} {value:<14} {r.segment}{txn}")
    return "\n".join(lines)

