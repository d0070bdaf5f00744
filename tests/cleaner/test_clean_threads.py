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

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
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


def _cleaner_lock_holders(logs: Path) -> dict[str, int]:
    """Which partitions' `.cleaner.lock` are held right now, and by which process (from /proc/locks)."""
    by_inode = {}
    for lock in logs.glob("*/.cleaner.lock"):
        by_inode[lock.stat().st_ino] = lock.parent.name
    held = {}
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and "->" not in fields:
            inode = int(fields[5].rsplit(":", 1)[1])
            if inode in by_inode:
                held[by_inode[inode]] = int(fields[4])
    return held


def _start_slow_clean(logs: Path, *extra: str, bytes_per_second: int = 100_000,
                      new_session: bool = False, job: bool = False, nohup: bool = False) -> subprocess.Popen:
    """`logcleaner clean LOGDIR` on two threads under a small I/O budget (100 kB/s: minutes of work for the
    tests' partitions, so only what the test does ends it early). `job`: in a process group of its own in this
    session, as a shell's job (a new session's group would be orphaned: the kernel ignores a Ctrl-Z there).
    `nohup`: started with SIGHUP ignored (otherwise every stop signal has its default action: tests/conftest.py)."""
    args = ["clean", "--set", "cleanup.policy=compact", "--set", "log.cleaner.threads=2", "--now-ms", str(NOW),
            "--set", f"log.cleaner.io.max.bytes.per.second={bytes_per_second}", *extra, str(logs)]
    with _sighup_ignored() if nohup else contextlib.nullcontext():
        return subprocess.Popen([sys.executable, "-m", "cleaner.cli", *args], cwd=ROOT,
                                start_new_session=new_session, process_group=0 if job else None,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _sighup_ignored() -> Iterator[None]:
    """SIGHUP ignored in this process meanwhile, as `nohup` does: a child started meanwhile keeps it ignored."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def _state_and_parent(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc (None: no such process)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def _gone(pid: int) -> bool:
    found = _state_and_parent(pid)
    return found is None or found[0] == "Z"


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if (found := _state_and_parent(int(p.name))) is not None and found[1] == pid]


@contextlib.contextmanager
def _reaped(child: subprocess.Popen) -> Iterator[None]:
    """The test's block; then, if it left `child` running (a failed assertion), kill and reap it."""
    try:
        yield
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()


def _until(condition, what: str, child: subprocess.Popen | None = None, every_s: float = 0.02):
    """Poll `condition()` until it returns something true, and return that; fail, saying `what` never happened,
    past the hang guard, or as soon as `child` (if given) has ended."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not (found := condition()):
        if child is not None:
            assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(every_s)
    return found


def _wait_for_two_rounds(child: subprocess.Popen, logs: Path) -> dict[str, int]:
    """Poll until two partitions are locked for cleaning at once; their holders."""
    return _until(lambda: held if len(held := _cleaner_lock_holders(logs)) >= 2 else None,
                  "two partitions were never cleaned at once", child)


@pytest.mark.skipif(launch.cores() < 2, reason="two threads clean at once only with two cores")
def test_two_threads_clean_two_partitions_at_once_one_in_a_worker_process(tmp_path):
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0", "c-0"):
        generate_partition(logs / name, WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    child = _start_slow_clean(logs)
    try:
        held = _wait_for_two_rounds(child, logs)
        # the first thread cleans in the command's process, the second in a worker process of its own: a fork of
        # the command (its command line), made before the command started a thread
        assert child.pid in held.values()
        (worker,) = set(held.values()) - {child.pid}
        assert Path(f"/proc/{worker}/cmdline").read_bytes() == Path(f"/proc/{child.pid}/cmdline").read_bytes()
        assert _state_and_parent(worker)[1] == child.pid  # its parent
        assert os.getpgid(worker) == worker != os.getpgid(child.pid)  # a process group of its own
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=HANG_GUARD_S)
    assert child.returncode == -signal.SIGTERM
    assert _gone(worker)


def test_a_worker_process_has_its_threads_share_of_the_dedupe_buffer(tmp_path):
    """Kafka divides `log.cleaner.dedupe.buffer.size` among the threads; a worker's map is its thread's share."""
    from cleaner.settings import Settings
    from cleaner.workers import WorkerContext
    from segments.files.fileio import BackgroundRemover

    cleaner = Settings.from_mappings({"log.cleaner.threads": 2, "log.cleaner.dedupe.buffer.size": 24 * 100_000}).cleaner
    context = WorkerContext(throttle=None, check_abort=lambda: None, on_bytes=lambda n, d: None,  # type: ignore[arg-type]
                            remover=BackgroundRemover())
    first = context.offset_map(cleaner)
    assert first.memory_bytes == 24 * 100_000 // 2 == launch.thread_map_bytes(cleaner)
    assert context.offset_map(cleaner) is first  # reused from partition to partition


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

@pytest.mark.skipif(launch.cores() < 2, reason="two threads clean at once only with two cores")
@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False),
                                             (signal.SIGHUP, True)],
                         ids=["SIGINT", "SIGINT-to-the-process-group", "SIGTERM", "SIGHUP-of-a-closed-terminal"])
def test_a_stop_signal_aborts_the_running_rounds_and_ends_as_before(tmp_path, signum, to_group):
    """Ctrl-C in a terminal signals the foreground process group: the command's, not its workers' (each has a
    group of its own), so the command decides, aborts every running round, its own and its workers', and ends
    as it always did, with no traceback from a worker however early the signal comes. A closed terminal's SIGHUP
    stops it as SIGTERM does (it killed the command outright before), and the command dies of it."""
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0", "c-0"):
        generate_partition(logs / name, WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    before = {p: p.read_bytes() for p in logs.rglob("*.log")}
    child = _start_slow_clean(logs, new_session=True)
    with _reaped(child):
        held = _wait_for_two_rounds(child, logs)
        if to_group:
            os.killpg(child.pid, signum)  # what a terminal's Ctrl-C does: the job's process group
        else:
            child.send_signal(signum)
        out, err = child.communicate(timeout=HANG_GUARD_S)
    if signum == signal.SIGINT:  # click's end of a Ctrl-C, as before the threads
        assert child.returncode == 1 and "Aborted!" in err, err
    else:  # killed by the signal, as before the threads (143 or 129 in a shell)
        assert child.returncode == -signum, err
    assert "Traceback" not in err
    assert out == ""  # no partition finished
    assert "c-0" not in held  # never taken
    assert all(_gone(pid) for pid in held.values())  # no worker outlives the command
    assert {p: p.read_bytes() for p in logs.rglob("*.log")} == before  # aborted: left as they were
    assert not [p for p in logs.rglob("*") if p.name.endswith((".cleaned", ".swap"))]


def test_a_closed_terminals_sighup_mid_recopy_removes_the_rounds_files_before_the_command_dies_of_it(tmp_path):
    """SIGHUP (the terminal closed) while a round writes its `.cleaned` segment: the round aborts and removes it,
    the log is left as it was, and the command then dies of SIGHUP (it died at once before, leaving the file for
    the next clean's recovery). Under `nohup`, the next test."""
    logs = tmp_path / "logs"
    generate_partition(logs / "a-0", WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    before = {p: p.read_bytes() for p in logs.rglob("*.log")}
    child = _start_slow_clean(logs, "--set", "log.cleaner.threads=1", bytes_per_second=2_000_000, new_session=True)
    with _reaped(child):
        _until(lambda: list(logs.rglob("*.cleaned")), "the round never wrote a .cleaned segment", child, every_s=0.005)
        os.killpg(child.pid, signal.SIGHUP)
        out, err = child.communicate(timeout=HANG_GUARD_S)
    assert child.returncode == -signal.SIGHUP, err
    assert "Traceback" not in err and out == ""
    assert {p: p.read_bytes() for p in logs.rglob("*.log")} == before
    assert not [p for p in logs.rglob("*") if p.name.endswith((".cleaned", ".swap"))]


def test_under_nohup_a_sighup_leaves_the_clean_running(tmp_path):
    """Started under `nohup` (SIGHUP ignored), the command keeps SIGHUP ignored: a closed terminal's SIGHUP in the
    middle of a round's writing leaves the clean to finish, and the partition is cleaned."""
    logs = tmp_path / "logs"
    generate_partition(logs / "a-0", WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    child = _start_slow_clean(logs, "--set", "log.cleaner.threads=1", "--json", bytes_per_second=2_000_000,
                              new_session=True, nohup=True)
    with _reaped(child):
        _until(lambda: list(logs.rglob("*.log.cleaned")), "the round never wrote a .cleaned segment", child,
               every_s=0.005)
        os.killpg(child.pid, signal.SIGHUP)
        out, err = child.communicate(timeout=HANG_GUARD_S)
    assert child.returncode == 0, err
    assert "Traceback" not in err
    assert [(s["partition"], s["status"]) for s in _summaries(out)] == [("a-0", "ok")]
    assert not [p for p in logs.rglob("*") if p.name.endswith((".cleaned", ".swap"))]


@pytest.mark.skipif(launch.cores() < 2, reason="a worker process is used only with two cores")
@pytest.mark.parametrize("delay_s", [0.0, 0.1])
def test_ctrl_c_while_the_workers_start_ends_as_any_ctrl_c(tmp_path, delay_s):
    """A Ctrl-C while the worker processes start (`delay_s` after the first appears, still importing): no
    traceback, no partition failed, nothing changed."""
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0", "c-0"):
        generate_partition(logs / name, WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    before = {p: p.read_bytes() for p in logs.rglob("*.log")}
    child = _start_slow_clean(logs, new_session=True)
    with _reaped(child):
        _until(lambda: _children(child.pid), "no worker process started", child, every_s=0.001)
        time.sleep(delay_s)
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=HANG_GUARD_S)
    assert child.returncode == 1 and "Aborted!" in err, err
    assert "Traceback" not in err and "FAILED" not in err and out == ""
    assert {p: p.read_bytes() for p in logs.rglob("*.log")} == before


@pytest.mark.skipif(launch.cores() < 2, reason="a worker process is used only with two cores")
@pytest.mark.parametrize(("signame", "said"), [
    # the OOM killer, say: the command recovers what the killed round left
    ("SIGKILL", "was ended by SIGKILL while cleaning it; what its round left was recovered"),
    # `kill WORKER`, not the command: the round aborts, leaving the partition as it was
    ("SIGTERM", "was sent SIGTERM; the partition was left as it was"),
    ("SIGINT", "was sent SIGINT; the partition was left as it was"),
])
def test_a_worker_process_signalled_mid_round_fails_its_partition_and_the_others_finish(tmp_path, signame, said):
    """The partition the worker was cleaning fails, naming how the worker ended; no other partition is blamed
    for it; a new worker takes the next one; the command exits 1; no `.cleaned` file waits for the next clean,
    which cleans that partition."""
    logs = tmp_path / "logs"
    for name, records in (("a-0", 20_000), ("b-0", 20_000), ("c-0", 2_000), ("d-0", 2_000)):
        generate_partition(logs / name, WorkloadSpec(records=records, keys=300, segment_bytes=256 * 1024))
    # 2 MB/s: the two 2.4 MB partitions, taken first, are in their rounds for seconds; the whole takes ~5 s
    child = _start_slow_clean(logs, "--json", bytes_per_second=2_000_000)
    with _reaped(child):
        held = _wait_for_two_rounds(child, logs)
        (victim_partition, worker), = [(name, pid) for name, pid in held.items() if pid != child.pid]
        before = {p.name: p.read_bytes() for p in (logs / victim_partition).glob("*.log")}
        os.kill(worker, getattr(signal, signame))
        out, err = child.communicate(timeout=600)
    assert child.returncode == 1, err
    assert "Traceback" not in err
    summaries = {s["partition"]: s for s in _summaries(out)}
    assert sorted(summaries) == ["a-0", "b-0", "c-0", "d-0"]
    failed = summaries.pop(victim_partition)
    assert failed["status"] == "failed"
    assert f"the worker process {worker} {said}" in failed["error"]
    assert all(s["status"] == "ok" for s in summaries.values()), summaries
    assert not [p for p in logs.rglob("*") if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    if signame != "SIGKILL":  # nothing was swapped
        assert {p.name: p.read_bytes() for p in (logs / victim_partition).glob("*.log")} == before
    code, output = _clean("--json", str(logs / victim_partition))
    assert code == 0, output
    assert not [p for p in logs.rglob("*") if p.name.endswith((".cleaned", ".swap", ".deleted"))]


def _wait_for_state(pid: int, states: str) -> None:
    _until(lambda: (found := _state_and_parent(pid)) is not None and found[0] in states,
           f"process {pid} never reached state {states}", every_s=0.01)


@pytest.mark.skipif(launch.cores() < 2, reason="a worker process is used only with two cores")
def test_ctrl_z_stops_the_workers_with_the_command_and_fg_continues_them(tmp_path):
    """A terminal's Ctrl-Z reaches the command's process group, not its workers' own groups: the command stops
    its workers too, and continues them when it is continued; the clean then finishes as usual."""
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0"):
        generate_partition(logs / name, WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    child = _start_slow_clean(logs, "--json", bytes_per_second=2_000_000, job=True)
    with _reaped(child):
        held = _wait_for_two_rounds(child, logs)
        (worker,) = set(held.values()) - {child.pid}
        os.killpg(child.pid, signal.SIGTSTP)
        _wait_for_state(child.pid, "T")
        _wait_for_state(worker, "T")
        os.killpg(child.pid, signal.SIGCONT)
        _wait_for_state(worker, "RSD")
        out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    assert [s["status"] for s in _summaries(out)] == ["ok", "ok"]


@pytest.mark.skipif(launch.cores() < 2, reason="a worker process is used only with two cores")
def test_threads_clean_with_stdout_closed_as_one_thread_does(tmp_path):
    """`logcleaner clean ... >&-`: Python has no sys.stdout then; the fork of a worker must not need one."""
    run, logs = _clean_two_partitions(tmp_path, ">&-", "--set log.cleaner.threads=2")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert set(read_offset_checkpoint(logs / CLEANER_OFFSET_CHECKPOINT)) == {("a", 0), ("b", 0)}  # both cleaned


def _clean_two_partitions(tmp_path, redirections: str, settings: str = ""):
    """(the finished process, the log dir) of `logcleaner clean` over two generated partitions, run by bash with
    `redirections` (e.g. `>&-`) applied to it."""
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0"):
        generate_partition(logs / name, SPEC)
    command = (f'exec "{sys.executable}" -m cleaner.cli clean --set cleanup.policy=compact --now-ms {NOW} '
               f'{settings} "{logs}" {redirections}')
    return subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=600), logs


def _python_with_stdin_and_stdout_closed(script: str):
    """`python -c script`, started by bash with descriptors 0 and 1 closed (`<&- >&-`)."""
    command = f'exec "{sys.executable}" -c "{script}" <&- >&-'
    return subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(launch.cores() < 2, reason="a worker process is used only with two cores")
def test_ctrl_c_while_a_worker_waits_for_a_busy_partition_ends_its_wait(tmp_path):
    """The worker waits for a partition another clean holds: Ctrl-C ends that wait at once (it is neither waited
    out to the lock's timeout nor killed), and the recovery after it does not wait for the busy lock either."""
    logs = tmp_path / "logs"
    for name in ("a-0", "b-0"):
        generate_partition(logs / name, WorkloadSpec(records=20_000, keys=300, segment_bytes=256 * 1024))
    holder = _start_slow_clean(logs / "b-0")  # holds b-0 for minutes
    with _reaped(holder):
        _until(lambda: "b-0" in _cleaner_lock_holders(logs), "the first clean never took b-0", holder)
        child = _start_slow_clean(logs, new_session=True)  # a-0 on one thread, b-0 on the other, which waits
        with _reaped(child):
            _until(lambda: _cleaner_lock_holders(logs).get("a-0") in (child.pid, *_children(child.pid)),
                   "the second clean never took a-0", child)
            time.sleep(0.5)  # its worker is in b-0's lock wait by now
            os.killpg(child.pid, signal.SIGINT)
            out, err = child.communicate(timeout=HANG_GUARD_S)
        assert child.returncode == 1 and "Aborted!" in err, err
        assert "did not stop within" not in err and "waited 30" not in err and "Traceback" not in err, err
        holder.send_signal(signal.SIGTERM)
        holder.communicate(timeout=HANG_GUARD_S)


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


def test_a_forked_worker_keeps_its_pipes_when_they_got_descriptors_0_and_1(tmp_path):
    """A process started with stdin and stdout closed gives its first pipe descriptors 0 and 1; the fork of a
    worker sets its 0 and 1 to /dev/null, which must not cut that pipe (it did: the worker read an end of input
    and exited 0 before its first job, a flaky failure of the test above). `logcleaner` itself also occupies
    closed standard descriptors at start (`cli_support.occupy_closed_standard_fds`)."""
    script = ("import os, sys, time\n"
              "from cleaner.workers import WorkerProcess\n"
              "worker = WorkerProcess(fork=True)\n"
              "time.sleep(0.5)\n"
              "alive = worker.alive()\n"
              "os.kill(worker.pid, 9)\n"
              "sys.stderr.write(f'forked={worker.forked} alive={alive}')\n")
    run = _python_with_stdin_and_stdout_closed(script)
    assert run.stderr.strip() == "forked=True alive=True", run.stderr


def test_logcleaner_points_closed_standard_descriptors_at_dev_null(tmp_path):
    """So that no segment, lock or pipe it opens gets descriptor 0, 1 or 2 (a write meant for stdout would
    land in it)."""
    script = ("import os, sys\n"
              "from cleaner.cli_support import occupy_closed_standard_fds\n"
              "occupy_closed_standard_fds()\n"
              "print('written into /dev/null')\n"
              "os.write(2, ' '.join(os.readlink(f'/proc/self/fd/{fd}') for fd in (0, 1)).encode())\n"
              "os.write(2, f' {sys.stdin.read()!r}'.encode())\n")
    run = _python_with_stdin_and_stdout_closed(script)
    assert run.stderr == "/dev/null /dev/null ''"
    assert run.returncode == 0


@pytest.mark.parametrize("closed", ["2>&-", ">&-", "<&-", "<&- >&- 2>&-"])
def test_clean_with_a_standard_stream_closed_cleans_and_exits_0(tmp_path, closed):
    """`2>&-` used to end `clean` with exit 1 and nothing said (an AttributeError on `sys.stderr`, None, with
    nowhere to print its traceback); each closed stream now behaves as /dev/null."""
    run, logs = _clean_two_partitions(tmp_path, closed)
    assert run.returncode == 0, run.stderr
    assert set(read_offset_checkpoint(logs / CLEANER_OFFSET_CHECKPOINT)) == {("a", 0), ("b", 0)}  # both cleaned
