"""The crash scenario shared by the kill and power-loss suites, and the invariants every crash must keep.

`build_scenario` writes a log dir with two partitions of topic `t`, each cleaned once already (so its
tombstones carry a delete horizon and a cleaner checkpoint exists) and then extended with more updates,
tombstones and committed and aborted transactions, in small segments: cleaning it at `NOW_MS` takes a
multi-group round per partition that drops superseded records, aborted data, spent markers and expired
tombstones.

`check_after_crash` is what a crash anywhere must leave, once the partition is reopened: every group either
all old or all new (raw batch bytes compared with the uncrashed run's), no temporary files, `logcleaner
verify` clean, and a read-committed consumer from offset 0 seeing only input offsets, in order, with the
latest value of every key.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from cleaner.cli import main as cli_main
from cleaner.settings import Settings
from segments.codec import format as fmt
from segments.codec.records import decode_control_key
from segments.partition.log import LogConfig, PartitionLog

from ..cleaner.builders import Rec, abort, batch, clean, commit, txn_batch

TOPIC = "t"
PARTITIONS = 2
T0 = 1_700_000_000_000
DELETE_RETENTION_MS = 60_000
FIRST_CLEAN_MS = T0 + 1_000
NOW_MS = FIRST_CLEAN_MS + 10 * DELETE_RETENTION_MS  # past the horizon of the first clean's tombstones
CLEAN_SETTINGS = {"segment.bytes": 4000, "delete.retention.ms": DELETE_RETENTION_MS}
PARTITION_NAMES = [f"{TOPIC}-{p}" for p in range(PARTITIONS)]
CLEAN_ARGS = (["--now-ms", str(NOW_MS), "--set", "cleanup.policy=compact"]  # a log dir's topics: never by guess
              + [a for k, v in CLEAN_SETTINGS.items() for a in ("--set", f"{k}={v}")])
COMPACT_SETTINGS = Settings.from_mappings({**CLEAN_SETTINGS, "cleanup.policy": "compact"})  # what `clean` uses
WRITE_CONFIG = LogConfig(segment_bytes=1200, index_interval_bytes=256)
TEMP_SUFFIXES = (fmt.CLEANED_SUFFIX, fmt.SWAP_SUFFIX, fmt.DELETED_SUFFIX, ".tmp")

__all__ = [
    "CLEAN_ARGS", "CLEAN_SETTINGS", "COMPACT_SETTINGS", "NOW_MS", "PARTITION_NAMES", "PARTITIONS", "TOPIC", "Snapshot",
    "build_scenario", "check_after_crash", "copy_tree", "snapshot", "temp_files",
]


def _steps(rnd: random.Random, partition: int, first_seq: int, batches: int) -> list[bytes]:
    """Keyed batches over 12 keys (every codec), tombstones, and transactions that commit or abort."""
    steps = []
    seq = first_seq
    pid = 100 + partition
    for i in range(batches):
        recs = []
        for _ in range(rnd.randint(1, 4)):
            key = b"key-%02d" % rnd.randint(0, 11)
            value = None if rnd.random() < 0.15 else b"p%d-v%05d" % (partition, seq)
            recs.append(Rec(key, value, T0 + seq))
            seq += 1
        codec = rnd.choice(list(fmt.COMPRESSION_NAMES))
        if i % 6 == 5:
            steps.append(txn_batch(recs, pid=pid, seq=seq, compression=codec))
            steps.append(abort(pid, timestamp=T0 + seq) if rnd.random() < 0.5 else commit(pid, timestamp=T0 + seq))
        else:
            steps.append(batch(recs, compression=codec))
    return steps


def _append(directory: Path, steps: list[bytes]) -> None:
    with PartitionLog.open(directory, mode="writer", create=True, config=WRITE_CONFIG, clock_ms=lambda: T0) as log:
        for step in steps:
            log.append_batches(step)
        log.roll()


def build_scenario(root: Path, seed: int = 9) -> Path:
    """The log dir `root/logs` described in the module docstring; returns it."""
    rnd = random.Random(seed)
    log_dir = root / "logs"
    for p in range(PARTITIONS):
        directory = log_dir / f"{TOPIC}-{p}"
        _append(directory, _steps(rnd, p, 0, 40))
        clean(directory, now_ms=FIRST_CLEAN_MS, settings=CLEAN_SETTINGS, config=WRITE_CONFIG)
        _append(directory, _steps(rnd, p, 10_000, 60))
    return log_dir


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.lock"))
    return dst


@dataclass(frozen=True)
class Snapshot:
    """One partition as a consumer and the swap see it: raw batches by base offset, segment bases."""

    batches: dict[int, bytes]
    bases: list[int]


def snapshot(directory: Path) -> Snapshot:
    out = {}
    with PartitionLog.open(directory, mode="reader") as log:
        bases = [s.base_offset for s in log.segments]
        for seg in log.segments:
            for pos, header in seg.iter_headers():
                out[header.base_offset] = seg.pread(pos, header.size_bytes)
    return Snapshot(out, bases)


def temp_files(log_dir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(log_dir)) for p in log_dir.rglob("*") if p.is_file() and p.name.endswith(TEMP_SUFFIXES)
    )


def committed_records(directory: Path) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every data record a read-committed consumer from offset 0 gets, in order."""
    with PartitionLog.open(directory, mode="reader") as log:
        batches = list(log.iter_batches())
    aborted: set[int] = set()
    open_batches: dict[int, list[int]] = {}
    for b in batches:
        h = b.header
        if h.is_control:
            if not b.records:
                continue  # a marker emptied by cleaning (kept for its producer, or as a group's end) ends nothing
            _, control_type = decode_control_key(b.records[0].key)
            done = open_batches.pop(h.producer_id, [])
            if control_type == fmt.CONTROL_TYPE_ABORT:
                aborted.update(done)
        elif h.is_transactional:
            open_batches.setdefault(h.producer_id, []).append(h.base_offset)
    return [
        (r.offset, r.key, r.value)
        for b in batches
        if not b.header.is_control and b.header.base_offset not in aborted
        for r in b.records
    ]


def latest_by_key(records) -> dict[bytes, bytes | None]:
    out = {}
    for _, key, value in records:
        out[key] = value
    return out


def check_after_crash(directory: Path, old: Snapshot, new: Snapshot, input_records) -> None:
    """Assert the invariants of the module docstring for one partition (reopened as a cleaner first)."""
    with PartitionLog.open(directory, mode="cleaner"):
        pass
    leftovers = [n for n in os.listdir(directory) if n.endswith(TEMP_SUFFIXES)]
    assert not leftovers, f"{directory}: temporary files after reopen: {leftovers}"
    verify = CliRunner().invoke(cli_main, ["verify", str(directory)])
    assert verify.exit_code == 0, f"{directory}: verify failed:\n{verify.output}"
    actual = snapshot(directory).batches
    # Each new segment starts one group; in [its base, the next new base) the log is all old or all new.
    bounds = new.bases + [2**63]
    for start, end in zip(bounds, bounds[1:]):
        got = {b: v for b, v in actual.items() if start <= b < end}
        was = {b: v for b, v in old.batches.items() if start <= b < end}
        now = {b: v for b, v in new.batches.items() if start <= b < end}
        assert got in (was, now), (
            f"{directory}: offsets [{start}, {end}) are neither the old nor the new group "
            f"(bases got {sorted(got)}, old {sorted(was)}, new {sorted(now)})"
        )
    seen = committed_records(directory)
    offsets = [o for o, _, _ in seen]
    assert offsets == sorted(set(offsets)), f"{directory}: offsets out of order or repeated"
    assert set(seen) <= set(input_records), f"{directory}: records that were not in the input"
    expected, got = latest_by_key(input_records), latest_by_key(seen)
    for key, value in expected.items():
        if value is None:
            assert got.get(key) is None, f"{directory}: deleted key {key!r} came back"
        else:
            assert got.get(key) == value, f"{directory}: latest value of {key!r} lost"
