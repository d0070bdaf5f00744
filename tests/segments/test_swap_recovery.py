"""The swap protocol and its crash recovery (docs/format.md section 4), at every step.

A `FileOps` that fails at the N-th rename stands in for a crash there; reopening must then show, for the
group being replaced, either all the old segments or the new one, never neither and never both, with no
temporary files left.
"""

from __future__ import annotations

import os
import threading

import pytest

from segments.codec import format as fmt
from segments.files.fileio import BackgroundRemover, FileOps
from segments.files.names import parse_segment_file_name
from segments.partition.log import PartitionLog
from segments.partition.recovery import recover_leftovers
from segments.tools.verify import verify_paths

from .helpers import Crash, CrashingFileOps, read_all, write_log


def build_cleaned_group(log: PartitionLog, group):
    """A `.cleaned` segment replacing `group`, keeping only the last batch of each segment in it."""
    cleaned = log.new_cleaned_segment(group[0].base_offset)
    for seg in group:
        last_pos, last = list(seg.iter_headers())[-1]
        data = seg.pread(last_pos, last.size_bytes)
        cleaned.append(data, largest_offset=last.last_offset, max_timestamp=last.max_timestamp, shallow_offset=last.last_offset)
    cleaned.finalise()
    cleaned.set_last_modified_ns(group[-1].last_modified_ns())
    return cleaned


def leftovers(directory):
    return sorted(
        n for n in os.listdir(directory) if (p := parse_segment_file_name(n)) is not None and p.state
    )


def setup_log(tmp_path):
    d = tmp_path / "t-0"
    write_log(d, 60, segment_bytes=1500)
    old = read_all(d)
    with PartitionLog.open(d, mode="cleaner") as log:
        group = log.segments[0:3]
        kept_last = [list(s.iter_headers())[-1][1] for s in group]
    kept = set()
    for h in kept_last:
        kept.update(range(h.base_offset, h.last_offset + 1))
    group_end = kept_last[-1].last_offset
    new = [r for r in old if r[0] > group_end or r[0] in kept]
    return d, old, new


def count_renames(tmp_path) -> int:
    d, _, _ = setup_log(tmp_path / "probe")
    ops = CrashingFileOps(crash_at=10**9)
    with PartitionLog.open(d, mode="cleaner", file_ops=ops) as log:
        group = log.segments[0:3]
        log.replace_segments([build_cleaned_group(log, group)], group)
    return ops.renames


def test_swap_replaces_group_and_leaves_no_temp_files(tmp_path):
    d, old, new = setup_log(tmp_path)
    with PartitionLog.open(d, mode="cleaner") as log:
        group = log.segments[0:3]
        log.replace_segments([build_cleaned_group(log, group)], group)
        assert log.segments[0].base_offset == 0
    assert read_all(d) == new
    assert leftovers(d) == []
    assert not verify_paths([d]).problems


SWAP_RENAMES = 15  # 3 files of the new segment to .swap, 3 old segments x 3 files to .deleted, 3 back


def test_swap_of_three_segments_into_one_does_fifteen_renames(tmp_path):
    assert count_renames(tmp_path) == SWAP_RENAMES


def _crash_mid_swap(tmp_path, crash_at: int):
    """A log whose swap of its first three segments into one crashed at rename `crash_at`; (dir, old, new)."""
    d, old, new = setup_log(tmp_path)
    log = PartitionLog.open(d, mode="cleaner", file_ops=CrashingFileOps(crash_at))
    group = log.segments[0:3]
    with pytest.raises(Crash):
        log.replace_segments([build_cleaned_group(log, group)], group)
    log.close()  # the process "dies": its locks go with it
    return d, old, new


@pytest.mark.parametrize("crash_at", range(SWAP_RENAMES))
def test_crash_at_every_rename_of_the_swap_leaves_old_or_new_group(tmp_path, crash_at):
    d, old, new = _crash_mid_swap(tmp_path, crash_at)
    with PartitionLog.open(d, mode="writer"):
        pass
    got = read_all(d)
    assert got in (old, new)
    # Until every .cleaned file became .swap the swap must roll back; after that it must roll forward.
    renames_to_swap = 3  # log, index, timeindex of the one new segment
    assert got == (old if crash_at < renames_to_swap else new)
    assert leftovers(d) == []
    assert not verify_paths([d]).problems


def _files(directory) -> dict[str, tuple[int, int]]:
    return {e.name: (e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(directory)}


@pytest.mark.parametrize("crash_at", range(SWAP_RENAMES))
def test_a_reader_after_a_crash_at_every_rename_sees_what_recovery_will_make_of_it_and_changes_nothing(
        tmp_path, crash_at):
    d, old, new = _crash_mid_swap(tmp_path, crash_at)
    before = _files(d)
    with PartitionLog.open(d, mode="reader") as reader:
        seen = [(r.offset, r.key, r.value, r.timestamp) for _, r in reader.iter_records()]
        assert list(reader.leftover_plan.leftovers) == leftovers(d) != []
    assert _files(d) == before  # a reader recovers nothing
    assert seen == (old if crash_at < 3 else new)  # what the next writer's recovery makes of it
    with PartitionLog.open(d, mode="writer"):
        pass
    assert read_all(d) == seen


def test_crash_while_writing_cleaned_files_rolls_back(tmp_path):
    d, old, _ = setup_log(tmp_path)
    log = PartitionLog.open(d, mode="cleaner")
    group = log.segments[0:3]
    cleaned = build_cleaned_group(log, group)
    # Cut the cleaned log short, as if the process died mid-write.
    os.truncate(cleaned.paths.log, cleaned.size_bytes // 2)
    log.close()
    with PartitionLog.open(d, mode="writer"):
        pass
    assert read_all(d) == old
    assert leftovers(d) == []


def test_writer_open_leaves_cleaned_files_of_a_running_cleaner_alone(tmp_path):
    d, old, new = setup_log(tmp_path)
    with PartitionLog.open(d, mode="cleaner") as cleaner:
        group = cleaner.segments[0:3]
        cleaned = build_cleaned_group(cleaner, group)
        with PartitionLog.open(d, mode="writer"):
            pass
        assert cleaned.paths.log.exists()
        cleaner.replace_segments([cleaned], group)
    assert read_all(d) == new


# ---- hand-built leftover states, one per row of the recovery table -----------------------------------


def _rename_all(d, base, frm, to, kinds=(".log", ".index", ".timeindex")):
    for kind in kinds:
        src = d / (fmt.offset_file_name(base, kind) + frm)
        if src.exists():
            os.replace(src, d / (fmt.offset_file_name(base, kind) + to))


@pytest.mark.parametrize(
    "state",
    [
        "only_cleaned",
        "log_swapped_indexes_cleaned",
        "all_swap",
        "all_swap_first_old_partly_deleted",
        "all_swap_all_old_deleted",
        "new_log_renamed_indexes_still_swap",
        "done_with_deleted_left",
    ],
)
def test_recovery_of_each_leftover_combination(tmp_path, state):
    d, old, new = setup_log(tmp_path)
    with PartitionLog.open(d, mode="cleaner") as log:
        group = log.segments[0:3]
        bases = [s.base_offset for s in group]
        build_cleaned_group(log, group)
    c = bases[0]
    # Old segment 0 shares its base with the new one; its files must go to .deleted before the swap lands.
    if state == "only_cleaned":
        expect = old
    elif state == "log_swapped_indexes_cleaned":
        _rename_all(d, c, ".cleaned", ".swap", kinds=(".log",))
        expect = old
    else:
        _rename_all(d, c, ".cleaned", ".swap")
        expect = new
        if state == "all_swap_first_old_partly_deleted":
            os.replace(d / fmt.offset_file_name(bases[1], ".log"), d / (fmt.offset_file_name(bases[1], ".log") + ".deleted"))
        elif state in ("all_swap_all_old_deleted", "new_log_renamed_indexes_still_swap", "done_with_deleted_left"):
            for b in bases:
                _rename_all(d, b, "", ".deleted")
            if state == "new_log_renamed_indexes_still_swap":
                _rename_all(d, c, ".swap", "", kinds=(".log",))
            elif state == "done_with_deleted_left":
                _rename_all(d, c, ".swap", "")
    report = recover_leftovers(d)
    assert report.changed
    assert leftovers(d) == []
    assert read_all(d) == expect
    assert not verify_paths([d]).problems


@pytest.mark.parametrize("content", ["copy of segment 0", "garbage", "torn"])
def test_a_swap_file_no_swap_could_have_written_stops_recovery_before_anything_changes(tmp_path, content):
    """A stray `.swap` (someone's copy, garbage, a torn file) is refused: rolling it forward would replace a
    good segment with it. Every open that recovers fails naming it; every file stays as it was."""
    from segments.codec.errors import CorruptRecordError

    d = tmp_path / "t-0"
    write_log(d, 30)
    with PartitionLog.open(d, mode="reader") as log:
        second = log.segments[1].base_offset
    first_bytes = (d / fmt.offset_file_name(0, ".log")).read_bytes()
    stray = d / (fmt.offset_file_name(second, ".log") + ".swap")
    stray.write_bytes({"copy of segment 0": first_bytes, "garbage": bytes(range(200)),
                       "torn": (d / fmt.offset_file_name(second, ".log")).read_bytes()[:-7]}[content])
    before = _files(d)
    for mode in ("cleaner", "writer", "reader"):
        with pytest.raises(CorruptRecordError) as info:
            PartitionLog.open(d, mode=mode).close()
        assert info.value.path == str(stray), (mode, info.value)
    assert _files(d) == before


class _GatedFileOps(FileOps):
    """Removals wait until `gate` is set: what a swap leaves for its remover is seen before it goes."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.removed: list[str] = []

    def remove(self, path) -> None:
        self.gate.wait(10)
        self.removed.append(os.path.basename(path))
        super().remove(path)


def test_with_a_remover_the_swap_hands_the_deleted_files_over_and_the_log_is_already_the_new_one(tmp_path):
    d, old, new = setup_log(tmp_path)
    ops = _GatedFileOps()
    remover = BackgroundRemover(ops)
    with PartitionLog.open(d, mode="cleaner", remover=remover) as log:
        group = log.segments[0:3]
        log.replace_segments([build_cleaned_group(log, group)], group)
        # The swap is done: the log is the new one while the old files still wait for the remover.
        assert read_all(d) == new
        pending = leftovers(d)
        assert pending and all(n.endswith(fmt.DELETED_SUFFIX) for n in pending)
    ops.gate.set()
    remover.drain()
    assert leftovers(d) == [] and not verify_paths([d]).problems
    assert set(pending) <= set(ops.removed)
    assert read_all(d) == new


def test_deleted_files_a_process_never_removed_go_at_the_next_open(tmp_path):
    d, old, new = setup_log(tmp_path)
    ops = _GatedFileOps()  # never opened: the process "ends" with the files still handed over
    with PartitionLog.open(d, mode="cleaner", remover=BackgroundRemover(ops)) as log:
        group = log.segments[0:3]
        log.replace_segments([build_cleaned_group(log, group)], group)
    assert leftovers(d)
    with PartitionLog.open(d, mode="cleaner"):
        pass
    assert leftovers(d) == [] and read_all(d) == new
    ops.gate.set()


def test_a_removal_that_fails_is_logged_and_the_remover_goes_on(tmp_path, caplog):
    class Failing(FileOps):
        def remove(self, path) -> None:
            if str(path).endswith("a"):
                raise PermissionError(13, "Permission denied", str(path))
            super().remove(path)

    (tmp_path / "a").write_text("x")
    (tmp_path / "b").write_text("x")
    remover = BackgroundRemover(Failing())
    remover.remove([tmp_path / "a", tmp_path / "b", tmp_path / "missing"])
    remover.drain()
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert "could not remove" in caplog.text and "next open of its log removes it" in caplog.text


def test_the_remover_unlinks_several_files_at_once(tmp_path):
    """Its threads take the files in turn: two removals are under way together (a barrier of two that a single
    thread could never pass), and every file goes."""
    barrier = threading.Barrier(2, timeout=10)

    class Paired(FileOps):
        def remove(self, path) -> None:
            barrier.wait()
            super().remove(path)

    paths = [tmp_path / f"f{i}" for i in range(4)]
    for path in paths:
        path.write_text("x")
    remover = BackgroundRemover(Paired())
    remover.remove(paths)
    remover.drain()
    assert not any(path.exists() for path in paths)
