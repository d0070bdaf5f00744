"""One partition's round on several threads (`cleaner.group_runs`): the same files as one thread, byte for byte,
swaps in log order, and a failure or an abort leaves each group old or new with nothing left behind."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cleaner import launch
from cleaner.group_runs import independent_runs
from cleaner.round import CleaningAbortedError
from cleaner.survey import LogSurvey, TransactionTable
from segments.files.fileio import FileOps
from segments.files.names import parse_segment_file_name
from segments.partition.log import PartitionLog
from segments.tools.verify import verify_paths

from .builders import DAY_MS, T0, clean, random_log
from .test_round_safety import (
    build_log,
    latest_per_key,
    read_all,
    reference_round,
    run_round,
    snapshot,
    temp_files,
)

TIMINGS = {"elapsed_s", "survey_s", "index_s", "recopy_s", "verify_s"}
SMALL_GROUPS = {"segment.bytes": 400}  # a group a segment or two: many groups, many runs


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")}


def _cleaned_on(tmp_path: Path, seed: int, thread_counts: tuple[int, ...], passes: list[dict], **kwargs) -> dict:
    """Per thread count: (every file's digest, each pass's round counters) of random log `seed` cleaned once for
    each settings of `passes` on that many threads (a copy each)."""
    src = tmp_path / "src" / "t-0"
    random_log(src, seed, batches_max=80, offset_gap=3 if seed % 3 == 0 else 0)
    outcomes = {}
    for threads in thread_counts:
        run = tmp_path / f"threads-{threads}" / "t-0"
        shutil.copytree(src, run)
        facts = []
        for settings in passes:
            result = clean(run, now_ms=T0 + 2 * DAY_MS, settings=settings, recopy_threads=threads, **kwargs)
            facts.append({k: v for k, v in result.as_dict().items() if k not in TIMINGS})
        outcomes[threads] = (_digests(run), facts)
    return outcomes


@pytest.mark.parametrize("seed", range(24))
def test_several_threads_write_the_same_files_and_counters_as_one(tmp_path, seed):
    """Seeded random logs (every codec, transactions committed and aborted across segment rolls, tombstones,
    offset gaps), cleaned twice (the second pass removes tombstones and markers): the same files and the same
    round counters with 1 and 3 threads. Starting every group afresh instead of keeping a transaction's groups
    together breaks this for 59 of 60 such logs (tried while writing `independent_runs`)."""
    outcomes = _cleaned_on(tmp_path, seed, (1, 3), [SMALL_GROUPS, {**SMALL_GROUPS, "delete.retention.ms": 0}])
    assert outcomes[1][1][0]["groups"] > 2
    assert outcomes[3] == outcomes[1]


@pytest.mark.parametrize("map_bytes", [1 << 20, 3_000], ids=["whole-rounds", "partial-rounds"])
@pytest.mark.parametrize("seed", range(8))
def test_a_map_in_parts_filled_on_three_threads_cleans_as_one_thread_does(tmp_path, monkeypatch, seed, map_bytes):
    """A round on six threads splits the offset map's regions into three parts, each filled on a thread of its
    own (`OffsetMap.reset(parts=...)`, `cleaner.indexing.PartThreads`), here from a first region of 48 slots so that
    these small logs grow through split regions: the same files and counters as one thread, with rounds that
    index the whole section, and with a map of 125 slots that fills mid-section (its windows go in input order in
    one part, so every round stops where one thread's does)."""
    from offsetmap import map as map_module

    monkeypatch.setattr(map_module, "_REGION_START_SLOTS", 48)
    seen = []
    original = map_module.OffsetMap._insert_parts
    monkeypatch.setattr(map_module.OffsetMap, "_insert_parts",
                        lambda self, *args: seen.append(self.parts) or original(self, *args))
    passes = [SMALL_GROUPS, SMALL_GROUPS, {**SMALL_GROUPS, "delete.retention.ms": 0}]
    outcomes = _cleaned_on(tmp_path, seed, (1, 6), passes, map_bytes=map_bytes)
    assert outcomes[6] == outcomes[1]
    assert set(seen) == {3}  # only the six threads' rounds split their maps, in three parts


def _survey(first: list[int], marker: list[int]) -> LogSurvey:
    n = len(first)
    column = np.array
    table = TransactionTable(column([1] * n, dtype=np.int64), column(first, dtype=np.int64),
                             column(marker, dtype=np.int64), column([0] * n, dtype=np.int64),
                             column([1] * n, dtype=np.int64))
    return LogSurvey([], {}, table)


class _Seg:
    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset


def test_a_transaction_across_a_group_boundary_keeps_both_groups_in_one_run():
    groups = [[_Seg(0)], [_Seg(100)], [_Seg(200)], [_Seg(300)]]
    # one transaction from 150 to its marker at 250 spans the boundary at 200; one inside a group spans none;
    # one still open (no marker) never joins groups, nor does one whose marker is the boundary's offset - 1
    survey = _survey([150, 10, 280, 50], [250, 20, -1, 99])
    assert independent_runs(groups, survey, carried=True) == [[0], [1, 2], [3]]
    # a marker at the boundary itself: its transaction's data is in the group before
    assert independent_runs(groups, _survey([90], [100]), carried=True) == [[0, 1], [2], [3]]
    # a partial round decides markers from the survey alone: nothing is carried, every group is a run
    assert independent_runs(groups, survey, carried=False) == [[0], [1], [2], [3]]
    assert independent_runs([], survey, carried=True) == []


def test_the_threads_recopy_groups_at_the_same_time(tmp_path):
    """Two recopy threads each take groups, and their work overlaps in time."""
    d = tmp_path / "t-0"
    build_log(d, batches=400)
    seen: dict[str, list[float]] = {}
    lock = threading.Lock()

    def on_bytes(n: int, direction: str) -> None:
        with lock:
            seen.setdefault(threading.current_thread().name, []).append(time.monotonic())
        time.sleep(0.002)  # a window's work takes time: long enough for the other thread to be seen beside it

    result = run_round(d, recopy_threads=2, on_bytes=on_bytes)
    assert result.groups > 4
    recopy = {name: times for name, times in seen.items() if name.startswith("logcleaner-recopy-")}
    assert len(recopy) == 2, sorted(seen)
    (a_first, a_last), (b_first, b_last) = ((min(t), max(t)) for t in recopy.values())
    assert a_first < b_last and b_first < a_last  # the two threads' spans overlap


class _FullDiskAt(FileOps):
    """The disk fills at the `writes`-th write (0-based) to a `.cleaned` file of the group starting at `base`: from
    then on every write fails with ENOSPC."""

    def __init__(self, base: int, writes: int = 0) -> None:
        self.prefix = f"{base:020d}."
        self.writes_left = writes
        self.full = False

    def pwrite_all(self, fd, data, position) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if not self.full and name.startswith(self.prefix) and name.endswith(".cleaned"):
            self.full = self.writes_left == 0
            self.writes_left -= 1
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        super().pwrite_all(fd, data, position)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("writes", [0, 1], ids=["at-its-first-write", "at-its-index-after-its-records"])
def test_a_group_that_fails_leaves_the_groups_before_it_swapped_and_every_later_one_as_it_was(tmp_path, threads,
                                                                                              writes):
    """A full disk in the fourth group, at its first write or at its index once its records are written: nothing
    of it is left behind (removing it must not write its index entries first, which fails on a full disk).

    On one thread the groups before it are swapped. On three, a group before it may still be writing when the disk
    fills, and then fails too (a full disk fails every write): the groups before the fourth are then each old or
    new, the new ones first, in log order (a CI run on a loaded machine saw the second group fail so)."""
    old, new, new_bases = reference_round(tmp_path)
    victim = new_bases[3]  # the fourth group's output segment starts at its first segment's base
    d = tmp_path / "t-0"
    build_log(d)
    with PartitionLog.open(d, mode="reader") as log:
        later = {s.paths.log.name: s.paths.log.read_bytes() for s in log.segments if s.base_offset >= victim}
    with pytest.raises(OSError) as info:
        run_round(d, file_ops=_FullDiskAt(victim, writes), recopy_threads=threads)
    assert info.value.errno == errno.ENOSPC
    assert temp_files(d) == []
    assert not verify_paths([d]).problems
    got = read_all(d)
    if threads == 1:
        assert [r for r in got if r[0] < victim] == [r for r in new if r[0] < victim]  # swapped
    else:
        states = []
        for lo, hi in zip(new_bases[:3], new_bases[1:4]):
            part = [r for r in got if lo <= r[0] < hi]
            assert part in ([r for r in new if lo <= r[0] < hi], [r for r in old if lo <= r[0] < hi]), lo
            states.append(part == [r for r in new if lo <= r[0] < hi])
        assert states == sorted(states, reverse=True), states  # swapped in log order: the new ones first
    assert [r for r in got if r[0] >= victim] == [r for r in old if r[0] >= victim]  # as they were
    with PartitionLog.open(d, mode="reader") as log:
        assert {s.paths.log.name: s.paths.log.read_bytes() for s in log.segments if s.base_offset >= victim} == later
    assert latest_per_key(got) == latest_per_key(old)


def test_an_abort_during_a_parallel_recopy_removes_every_unswapped_output(tmp_path):
    d = tmp_path / "t-0"
    build_log(d, batches=400)
    before = read_all(d)
    calls = [0]
    lock = threading.Lock()

    def check_abort() -> None:
        with lock:
            calls[0] += 1
            if calls[0] > 12:
                raise CleaningAbortedError("aborted by test")

    with pytest.raises(CleaningAbortedError):
        run_round(d, check_abort=check_abort, recopy_threads=3)
    after = read_all(d)
    assert temp_files(d) == []
    assert not verify_paths([d]).problems
    assert latest_per_key(after) == latest_per_key(before)
    assert set(after) <= set(before)
    assert run_round(d).first_dirty == 0  # the checkpoint did not move


def test_spare_cores_takes_only_free_cores_and_gives_them_back(monkeypatch):
    monkeypatch.setattr(launch, "CORES", threading.BoundedSemaphore(3))
    with launch.core():
        with launch.spare_cores(5) as spare:
            assert spare == 2
            with launch.spare_cores(1) as none_left:
                assert none_left == 0
        with launch.spare_cores(1) as again:
            assert again == 1
    for _ in range(3):
        assert launch.CORES.acquire(blocking=False)


def test_clean_with_two_threads_and_one_partition_recopies_it_on_both(tmp_path, monkeypatch):
    """`clean LOGDIR` with more threads than partitions gives each partition's rounds the threads left over
    (at most the cores); with threads=1, one. The one partition's map is the whole dedupe buffer either way (a
    buffer of 20 slots: half of it would need more rounds for the log's 15 keys), so the files are the same."""
    from click.testing import CliRunner

    from cleaner import cli
    from cleaner import round as round_module

    monkeypatch.setattr(launch, "cores", lambda: 2)
    asked = []
    real = round_module.recopy_groups

    def recorded(*args, rings, **kwargs):
        asked.append(len(rings))
        return real(*args, rings=rings, **kwargs)

    monkeypatch.setattr(round_module, "recopy_groups", recorded)
    logs = tmp_path / "logs"
    build_log(logs / "t-0")
    files, rounds = {}, {}
    for threads in (1, 2):
        run = tmp_path / f"threads-{threads}"
        shutil.copytree(logs, run)
        result = CliRunner().invoke(cli.main, [
            "clean", str(run), "--now-ms", str(1_800_000_000_000), "--set", "cleanup.policy=compact",
            "--set", "segment.bytes=3000", "--set", f"log.cleaner.threads={threads}",
            "--set", f"log.cleaner.dedupe.buffer.size={24 * 20}", "--json"])
        assert result.exit_code == 0, result.output
        files[threads] = snapshot(run / "t-0")
        rounds[threads] = [json.loads(line)["rounds"] for line in result.output.splitlines() if line.startswith("{")]
    assert asked[0] == 1 and set(asked[1:]) == {2}
    assert rounds[2] == rounds[1] == [1]
    assert files[2] == files[1]


def test_a_temp_file_name_is_a_segment_name_in_a_state(tmp_path):
    """`temp_files` (used above) sees a `.cleaned` file: the checks of leftovers are not vacuous."""
    d = tmp_path / "t-0"
    build_log(d)
    (d / f"{0:020d}.log.cleaned").write_bytes(b"")
    assert temp_files(d) == [f"{0:020d}.log.cleaned"]
    assert parse_segment_file_name(f"{0:020d}.log.cleaned").state
