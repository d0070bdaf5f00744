"""`logcleaner clean LOGDIR` on `log.cleaner.threads` threads (`cleaner.oneshot.clean_planned`).

The rounds of two partitions run at once with two threads (a barrier in the wrapped `launch.launch_round` lets
no first round go on until two are in flight, so one thread after another fails rather than hangs); each
thread's offset map holds its share of `log.cleaner.dedupe.buffer.size`, as Kafka divides it; a failed
partition still lets the others finish (exit 1); the partitions are taken the largest dirty section first and
reported in the order of their names; two threads leave the same files and say the same as one; Ctrl-C and
SIGTERM abort the running rounds (the partitions left as they were) and end as they always did. No assertion
on time: the deadlines are hang guards.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cleaner import launch
from cleaner.cli import main
from cleaner.oneshot import dirty_section_bytes
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from segments.tools.generate import WorkloadSpec, generate_partition

from ..segments.helpers import write_log

ROOT = Path(__file__).resolve().parents[2]
T_DATA = 1_700_000_000_000
NOW = T_DATA + 10_000
SPEC = WorkloadSpec(records=3000, keys=300, segment_bytes=16 * 1024, tombstone_fraction=0.1)
TIMINGS = ("survey_s", "index_s", "recopy_s", "elapsed_s")
HANG_GUARD_S = 60.0


def _clean(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["clean", "--set", "cleanup.policy=compact", "--now-ms", str(NOW), *args])
    return result.exit_code, result.output


def _summaries(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def _files(log_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(log_dir)): p.read_bytes() for p in sorted(log_dir.rglob("*")) if p.is_file()}


@pytest.fixture
def rounds(monkeypatch):
    """Every `launch.launch_round` call (directory, offset map, start and end), run for real; the first two
    wait at a barrier until both are in flight."""
    calls: list[dict] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2, timeout=HANG_GUARD_S)
    real = launch.launch_round

    def launch_round(log_, topic, cleaner, offset_map, *args, **kwargs):
        with lock:
            call = {"directory": log_.directory.name, "offset_map": offset_map, "thread": threading.get_ident()}
            calls.append(call)
            first_two = len(calls) <= 2
        if first_two:
            barrier.wait()  # BrokenBarrierError (the round fails) when no second round comes in time
        call["start"] = time.monotonic()
        try:
            return real(log_, topic, cleaner, offset_map, *args, **kwargs)
        finally:
            call["end"] = time.monotonic()

    monkeypatch.setattr(launch, "launch_round", launch_round)
    return calls


def test_two_threads_clean_two_partitions_at_once_each_with_half_the_dedupe_buffer(tmp_path, rounds, monkeypatch):
    maps = []
    real_map = launch.thread_offset_map
    monkeypatch.setattr(launch, "thread_offset_map", lambda cleaner: maps.append(real_map(cleaner)) or maps[-1])
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0", "c-0"):
        generate_partition(logs / name, SPEC)
    total = 24 * 100_000
    code, output = _clean("--json", "--set", "log.cleaner.threads=2", "--set", f"log.cleaner.dedupe.buffer.size={total}",
                          str(logs))
    assert code == 0, output
    assert [s["status"] for s in _summaries(output)] == ["ok"] * 3
    first, second = rounds[0], rounds[1]
    assert first["directory"] != second["directory"] and first["thread"] != second["thread"]
    assert max(first["start"], second["start"]) < min(first["end"], second["end"]), "the two rounds did not overlap"
    # one map per thread, reused from partition to partition, each of half the buffer (Kafka's division)
    assert len(maps) == 2 and all(m.memory_bytes == total // 2 for m in maps)
    assert {id(call["offset_map"]) for call in rounds} == {id(m) for m in maps}


def test_a_failed_partition_lets_the_others_finish_and_exits_1(tmp_path):
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0", "c-0", "d-0"):
        write_log(logs / name, 60)
    seg = sorted((logs / "b-0").glob("*.log"))[0]
    data = bytearray(seg.read_bytes())
    data[200] ^= 1
    seg.write_bytes(bytes(data))
    code, output = _clean("--set", "log.cleaner.threads=2", str(logs))
    assert code == 1, output
    assert f"b-0: FAILED: {seg}: byte " in output
    for name in ("a-0", "c-0", "d-0"):
        assert f"{name}: cleaned" in output
    assert seg.read_bytes() == bytes(data)


def test_partitions_are_taken_largest_dirty_section_first_and_reported_in_name_order(tmp_path, monkeypatch):
    taken: list[str] = []
    real = launch.launch_round
    monkeypatch.setattr(launch, "launch_round",
                        lambda log_, *a, **k: taken.append(log_.directory.name) or real(log_, *a, **k))
    logs = tmp_path / "logs"
    for name, records in (("a-0", 1000), ("b-0", 4000), ("c-0", 2500)):
        generate_partition(logs / name, WorkloadSpec(records=records, keys=100, segment_bytes=16 * 1024))
    code, output = _clean("--json", str(logs))  # one thread: the order is the order taken
    assert code == 0, output
    assert list(dict.fromkeys(taken)) == ["b-0", "c-0", "a-0"]
    assert [s["partition"] for s in _summaries(output)] == ["a-0", "b-0", "c-0"]


def test_the_dirty_section_is_sized_from_the_checkpoint_without_opening_a_file(tmp_path):
    d = tmp_path / "logs" / "t-0"
    generate_partition(d, SPEC)
    segments = sorted(d.glob("*.log"))
    sizes = [p.stat().st_size for p in segments]
    assert dirty_section_bytes(d, None) == sum(sizes[:-1])  # every inactive segment; the active one never
    third = int(segments[2].name.split(".")[0])
    assert dirty_section_bytes(d, third) == sum(sizes[2:-1])
    assert dirty_section_bytes(d, third + 1) == sum(sizes[2:-1])  # the segment holding the checkpoint is dirty
    assert dirty_section_bytes(tmp_path / "missing", None) == 0
    _clean(str(d))
    checkpoint = read_offset_checkpoint(d.parent / CLEANER_OFFSET_CHECKPOINT)[("t", 0)]
    assert dirty_section_bytes(d, checkpoint) == 0  # cleaned: nothing dirty below the active segment


def test_two_threads_leave_the_same_files_and_say_the_same_as_one(tmp_path):
    template = tmp_path / "template"
    for name, records, seed in (("a-0", 3000, 1), ("b-0", 6000, 2), ("c-0", 1500, 3), ("d-0", 4500, 4)):
        generate_partition(template / name, WorkloadSpec(records=records, keys=300, segment_bytes=16 * 1024,
                                                         tombstone_fraction=0.1, seed=seed))
    outcomes = {}
    per_thread = 24 * 200  # 200 slots against 300 keys; with both thread counts each thread's map is the same: the same rounds
    for threads in (1, 2):
        logs = tmp_path / f"threads-{threads}"
        shutil.copytree(template, logs)
        code, output = _clean("--json", "--set", f"log.cleaner.threads={threads}",
                              "--set", f"log.cleaner.dedupe.buffer.size={per_thread * threads}", str(logs))
        assert code == 0, output
        summaries = [{k: v for k, v in s.items() if k not in TIMINGS and k != "directory"} for s in _summaries(output)]
        outcomes[threads] = (_files(logs), summaries)
    assert [s["partition"] for s in outcomes[2][1]] == ["a-0", "b-0", "c-0", "d-0"]
    assert any(s["rounds"] > 1 for s in outcomes[1][1])  # the small maps made several rounds
    assert outcomes[2][0] == outcomes[1][0]
    assert outcomes[2][1] == outcomes[1][1]
    # The swaps' `.deleted` files are removed off the threads, and gone when the command returns.
    assert not [name for name in outcomes[2][0] if name.endswith((".deleted", ".swap", ".cleaned"))]


def test_clean_accepts_log_cleaner_threads(tmp_path):
    logs = tmp_path / "logs"
    write_log(logs / "a-0", 60)
    code, output = _clean("--set", "log.cleaner.threads=4", str(logs))  # more threads than partitions
    assert code == 0, output
    assert "a-0: cleaned" in output


# ---- stopping: Ctrl-C and SIGTERM --------------------------------------------------------------------------

# `logcleaner clean` whose rounds each touch started-<partition> in the directory argv[1] as they begin.
_CHILD = """
import sys
from pathlib import Path
from cleaner import launch
from cleaner.cli import main
real = launch.launch_round
def launch_round(log_, *args, **kwargs):
    (Path(sys.argv[1]) / ("started-" + log_.directory.name)).touch()
    return real(log_, *args, **kwargs)
launch.launch_round = launch_round
main(sys.argv[2:], prog_name="logcleaner")
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_aborts_the_running_rounds_and_ends_as_before(tmp_path, signum):
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0", "c-0"):
        generate_partition(logs / name, WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    before = {p: p.read_bytes() for p in logs.rglob("*.log")}
    markers = tmp_path / "markers"
    markers.mkdir()
    # 100 kB/s shared by the threads: cleaning the 2 MB partitions would take minutes, so only an abort ends it
    args = ["clean", "--set", "cleanup.policy=compact", "--set", "log.cleaner.threads=2", "--now-ms", str(NOW),
            "--set", "log.cleaner.io.max.bytes.per.second=100000", str(logs)]
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(markers), *args], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while len(list(markers.iterdir())) < 2:
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "two rounds never started"
            time.sleep(0.02)
        child.send_signal(signum)
        out, err = child.communicate(timeout=HANG_GUARD_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    if signum == signal.SIGINT:  # click's end of a Ctrl-C, as before the threads
        assert child.returncode == 1 and "Aborted!" in err, err
    else:  # killed by the signal, as before the threads (143 in a shell)
        assert child.returncode == -signal.SIGTERM, err
    assert out == ""  # no partition finished
    assert sorted(p.name for p in markers.iterdir()) == ["started-a-0", "started-b-0"]  # c-0 never taken
    assert {p: p.read_bytes() for p in logs.rglob("*.log")} == before  # aborted: left as they were
    assert not [p for p in logs.rglob("*") if p.name.endswith((".cleaned", ".swap"))]


def test_clean_returns_once_the_swaps_deleted_files_are_gone(tmp_path, monkeypatch):
    """The remover thread is slow here: `clean` still returns only after it removed every `.deleted` file."""
    from segments.files import fileio

    real_remove = fileio.FileOps.remove

    def slow_remove(self, path):
        if threading.current_thread().name == "logcleaner-remover":
            time.sleep(0.01)
        real_remove(self, path)

    monkeypatch.setattr(fileio.FileOps, "remove", slow_remove)
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0"):
        generate_partition(logs / name, SPEC)
    code, output = _clean("--set", "log.cleaner.threads=2", str(logs))
    assert code == 0, output
    assert not [name for name in _files(logs) if name.endswith(".deleted")]
