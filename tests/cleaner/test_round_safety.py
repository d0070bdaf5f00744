"""A round never loses or half-applies anything: corrupt input, aborts and crashes at every swap step."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest

from cleaner.round import CleaningAbortedError, clean_round
from cleaner.settings import Settings
from offsetmap import OffsetMap
from segments.codec.errors import CorruptRecordError
from segments.files.fileio import FileOps
from segments.files.names import parse_segment_file_name
from segments.partition.log import LogConfig, PartitionLog
from segments.tools.verify import verify_paths

from ..segments.helpers import Crash, CrashingFileOps, keyed_batch, read_all

NOW_MS = 1_800_000_000_000
TOPIC = Settings.from_mappings({"segment.bytes": 3000, "delete.retention.ms": 1000}).topic("t")


def build_log(d, batches=120, keys=15):
    """Keyed records over `keys` keys with some tombstones, in ~1.5 KB segments (many groups)."""
    config = LogConfig(segment_bytes=1500, index_interval_bytes=200)
    seq = 0
    with PartitionLog.open(d, mode="writer", create=True, config=config) as log:
        for _ in range(batches):
            pairs = []
            for _ in range(4):
                value = None if seq % 11 == 0 else b"value-%06d" % seq
                pairs.append((b"key-%02d" % (seq % keys), value))
                seq += 1
            log.append_batches(keyed_batch(pairs, timestamp_ms=1_700_000_000_000 + seq))
        log.roll()
    return seq


def snapshot(d):
    return {n: hashlib.sha256((d / n).read_bytes()).hexdigest() for n in sorted(os.listdir(d)) if not n.endswith(".lock")}


def latest_per_key(records):
    out = {}
    for offset, key, value, _ in records:
        out[key] = (offset, value)
    return out


def run_round(d, file_ops=None, **kwargs):
    log = PartitionLog.open(d, mode="cleaner", file_ops=file_ops or FileOps(), config=LogConfig(index_interval_bytes=200))
    try:
        return clean_round(log, TOPIC, OffsetMap(1 << 16), now_ms=NOW_MS, seed=7, **kwargs)
    finally:
        log.close()


def temp_files(d):
    return [n for n in os.listdir(d) if (p := parse_segment_file_name(n)) is not None and p.state]


def test_round_keeps_latest_value_of_every_key_and_only_input_offsets(tmp_path):
    d = tmp_path / "t-0"
    build_log(d)
    before = read_all(d)
    result = run_round(d)
    after = read_all(d)
    assert result.groups > 2
    assert latest_per_key(after) == latest_per_key(before)
    assert [r[0] for r in after] == sorted(r[0] for r in after)
    assert set(after) <= set(before)
    assert len(after) < len(before) / 3
    assert not verify_paths([d]).problems


@pytest.mark.parametrize("where", ["first segment", "middle segment", "last inactive segment"])
def test_corrupt_batch_aborts_round_and_leaves_log_byte_for_byte(tmp_path, where):
    d = tmp_path / "t-0"
    build_log(d)
    with PartitionLog.open(d, mode="reader") as log:
        segs = log.segments[:-1]
    victim = {"first segment": segs[0], "middle segment": segs[len(segs) // 2], "last inactive segment": segs[-1]}[where]
    data = bytearray(victim.paths.log.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.paths.log.write_bytes(bytes(data))
    before = snapshot(d)
    with pytest.raises(CorruptRecordError) as info:
        run_round(d)
    assert info.value.path == str(victim.paths.log)
    assert 0 <= info.value.position < len(data)
    assert snapshot(d) == before
    assert temp_files(d) == []


def test_abort_from_another_thread_leaves_every_group_old_or_new(tmp_path):
    d = tmp_path / "t-0"
    build_log(d, batches=400)
    before = read_all(d)
    stop = threading.Event()
    reached = threading.Event()
    windows = []

    def check_abort():
        windows.append(1)
        if len(windows) == 5:
            reached.set()
            stop.wait(timeout=30)  # let the other thread decide, as an operator's abort would
        if stop.is_set():
            raise CleaningAbortedError("aborted by test")

    def abort_soon():
        if reached.wait(timeout=30):
            stop.set()

    t = threading.Thread(target=abort_soon)
    t.start()
    with pytest.raises(CleaningAbortedError):
        run_round(d, check_abort=check_abort)
    t.join()
    after = read_all(d)
    assert temp_files(d) == []
    assert latest_per_key(after) == latest_per_key(before)
    assert set(after) <= set(before)
    assert not verify_paths([d]).problems
    # The checkpoint did not advance, so the next round redoes the whole dirty section.
    assert run_round(d).first_dirty == 0


def count_round_renames(tmp_path) -> int:
    d = tmp_path / "probe" / "t-0"
    build_log(d)
    ops = CrashingFileOps(10**9)
    run_round(d, file_ops=ops)
    return ops.renames


def reference_round(tmp_path):
    """A one-thread round of `build_log`'s log: its records before and after, and the cleaned segments' bases (one
    a group)."""
    reference = tmp_path / "reference" / "t-0"
    build_log(reference)
    old = read_all(reference)
    run_round(reference)
    new = read_all(reference)
    with PartitionLog.open(reference, mode="reader") as log:
        return old, new, [s.base_offset for s in log.segments]


@pytest.mark.slow
def test_crash_at_every_swap_rename_of_a_multi_group_round_leaves_each_group_old_or_new(tmp_path):
    total = count_round_renames(tmp_path)
    old, new, new_bases = reference_round(tmp_path)
    assert total > 20
    for crash_at in range(0, total, max(1, total // 40)):
        d = tmp_path / f"crash{crash_at}" / "t-0"
        build_log(d)
        with pytest.raises(Crash):
            run_round(d, file_ops=CrashingFileOps(crash_at))
        with PartitionLog.open(d, mode="writer"):
            pass  # recovery at open
        got = read_all(d)
        assert temp_files(d) == [], crash_at
        assert not verify_paths([d]).problems, crash_at
        assert latest_per_key(got) == latest_per_key(old), crash_at
        # Group by group (the reference round's output segments), the records are the old or the new ones.
        bounds = new_bases + [old[-1][0] + 1]
        for lo, hi in zip(bounds, bounds[1:]):
            part = [r for r in got if lo <= r[0] < hi]
            assert part in ([r for r in old if lo <= r[0] < hi], [r for r in new if lo <= r[0] < hi]), (crash_at, lo)
