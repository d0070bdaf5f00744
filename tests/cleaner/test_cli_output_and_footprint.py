"""What a user meets in the first minutes, judged from outside: a command whose output pipe closes early
ends as `cat` does; a read-only command says in one sentence that it rebuilt an untrimmed index in memory;
and a read-only command leaves a partition directory exactly as it found it (no lock files).

The pipe tests run the real CLI as a subprocess with a real pipe whose reading end is closed early.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cleaner.cli import main as cli_main
from cleaner.cli_support import BROKEN_PIPE_EXIT
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from segments.partition.locks import SWAP_LOCK, PartitionLock
from segments.partition.log import IndexRebuild, PartitionLog
from segments.tools.generate import WorkloadSpec, generate_partition

from ..integration.daemon_helpers import logcleaner_command

PIPE_TIMEOUT_S = 120.0
UNTRIMMED_NOTE = ("has no trimmed end (as Kafka leaves an active segment's); it was rebuilt in memory, "
                  "the file was not changed")
PREALLOCATED_SLOTS = 1024  # Kafka preallocates segment.index.bytes (10 MiB) of whole slots; any zero tail is alike


def kafka_like_partition(directory: Path, *, batches: int = 40, preallocate: bool = True) -> Path:
    """A partition whose active (last) segment holds data and, with `preallocate`, index files that end in
    zero slots, as a broker leaves them while the segment is active; no lock file in it or its log dir."""
    with PartitionLog.open(directory, mode="writer", create=True) as log:
        for b in range(batches):
            records = [Record(offset=i, timestamp=1_700_000_000_000 + b * 10 + i, key=b"k%d" % (i % 7),
                              value=b"v%d-%d" % (b, i) * 20) for i in range(5)]
            log.append_batches(encode_batch(records, base_offset=0))
        active = log.active_segment.base_offset
    if preallocate:
        for suffix, entry in ((fmt.INDEX_SUFFIX, fmt.OFFSET_INDEX_ENTRY), (fmt.TIME_INDEX_SUFFIX, fmt.TIME_INDEX_ENTRY)):
            with open(directory / fmt.offset_file_name(active, suffix), "ab") as f:
                f.write(b"\0" * (PREALLOCATED_SLOTS * entry.size))
    remove_lock_files(directory.parent)
    return directory


def remove_lock_files(log_dir: Path) -> None:
    for path in [*log_dir.glob(".*lock"), *log_dir.glob("*/.*lock")]:
        path.unlink()


def listing(*directories: Path) -> dict[str, tuple[int, int]]:
    """name → (size, mtime ns) of every entry of the directories, links not followed."""
    out = {}
    for d in directories:
        for entry in os.scandir(d):
            st = entry.stat(follow_symlinks=False)
            out[f"{d.name}/{entry.name}"] = (st.st_size, st.st_mtime_ns)
    return out


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*logcleaner_command(), *args], capture_output=True, text=True, timeout=PIPE_TIMEOUT_S)


# ---- a closed pipe ----------------------------------------------------------------------------------------------


def test_dump_into_a_pipe_closed_after_the_first_line_exits_141_without_a_word(tmp_path):
    log_dir = tmp_path / "logs"
    generate_partition(log_dir / "t-0", WorkloadSpec(records=20_000, keys=500, segment_bytes=16 * 1024 * 1024))
    segment = log_dir / "t-0" / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    proc = subprocess.Popen([*logcleaner_command(), "dump", "--deep-iteration", str(segment)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = proc.stdout.readline()  # what `head -1` reads, then it exits
        proc.stdout.close()
        stderr = proc.stderr.read()
        code = proc.wait(timeout=PIPE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first.startswith(b"Dumping ")
    assert stderr == b""  # no "error: [Errno 32] Broken pipe", no "Exception ignored"
    assert code == BROKEN_PIPE_EXIT == 141


@pytest.mark.parametrize("args", [
    ["verify", "{log_dir}"], ["verify", "--json", "{log_dir}"], ["audit", "{log_dir}"],
    ["audit", "--json", "{partition}"], ["dump", "--json", "{segment}"], ["duplication", "{log_dir}"],
    ["clean", "--json", "{partition}"],
])
def test_any_command_whose_reader_is_gone_before_it_writes_exits_141_without_a_word(tmp_path, args):
    log_dir = tmp_path / "logs"
    partition = kafka_like_partition(log_dir / "t-0", preallocate=False)
    names = {"log_dir": log_dir, "partition": partition, "segment": partition / fmt.offset_file_name(0, fmt.LOG_SUFFIX)}
    proc = subprocess.Popen([*logcleaner_command(), *(a.format(**names) for a in args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdout.close()  # the only reading end: whatever the command writes meets a closed pipe
        stderr = proc.stderr.read()
        code = proc.wait(timeout=PIPE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert stderr == b"", stderr.decode()
    assert code == BROKEN_PIPE_EXIT


@pytest.mark.parametrize("args", [
    ["--help"], ["verify", "{log_dir}"], ["audit", "--json", "{partition}"], ["dump", "{segment}"],
    ["clean", "--json", "{partition}"],
])
def test_any_command_whose_output_cannot_be_written_says_so_in_one_line_and_exits_1(tmp_path, args):
    """stdout on /dev/full (every write fails with ENOSPC, as on a full disk): one line on stderr naming the
    output, exit 1, never a traceback; a clean still cleaned (its work is done before it reports)."""
    log_dir = tmp_path / "logs"
    partition = kafka_like_partition(log_dir / "t-0", preallocate=False)
    names = {"log_dir": log_dir, "partition": partition, "segment": partition / fmt.offset_file_name(0, fmt.LOG_SUFFIX)}
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([*logcleaner_command(), *(a.format(**names) for a in args)], stdout=full,
                              stderr=subprocess.PIPE, timeout=PIPE_TIMEOUT_S)
    stderr = proc.stderr.decode()
    assert stderr == "Error: cannot write the output to standard output: No space left on device\n", stderr
    assert proc.returncode == 1


def test_a_command_that_is_not_cut_short_still_exits_as_before(tmp_path):
    partition = kafka_like_partition(tmp_path / "logs" / "t-0", preallocate=False)
    result = run("verify", "--json", str(partition))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["partitions"] == 1 and result.stderr == ""


# ---- an untrimmed index, rebuilt in memory ------------------------------------------------------------------------


def test_audit_of_a_kafka_active_segment_says_once_in_a_sentence_that_its_index_was_rebuilt_in_memory(tmp_path):
    partition = kafka_like_partition(tmp_path / "logs" / "t-0")
    index = sorted(partition.glob("*.index"))[-1]
    before = index.read_bytes()
    result = run("audit", str(partition))
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"note: {index.name} in t-0 {UNTRIMMED_NOTE}\n"
    assert "rebuilding index" not in result.stderr and "reason=" not in result.stderr
    assert result.stdout.startswith("t-0: 200 records")
    assert index.read_bytes() == before


def test_several_untrimmed_indexes_make_one_note_for_the_whole_run(tmp_path):
    log_dir = tmp_path / "logs"
    for p in range(5):
        kafka_like_partition(log_dir / f"t-{p}")
    for command in (["audit", str(log_dir)], ["duplication", str(log_dir)]):
        result = CliRunner().invoke(cli_main, command)
        assert result.exit_code == 0, result.output
        notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
        assert notes == [result.stderr.strip()]  # one line, nothing else on stderr
        assert notes[0].startswith("note: 5 index files have no trimmed end (as Kafka leaves an active segment's): ")
        assert " and 2 more; they were rebuilt in memory, the files were not changed" in notes[0]


def test_an_index_wrong_in_another_way_gets_its_own_note_naming_the_byte(tmp_path):
    partition = kafka_like_partition(tmp_path / "logs" / "t-0", preallocate=False)
    index = partition / fmt.offset_file_name(0, fmt.INDEX_SUFFIX)
    data = bytearray(index.read_bytes())
    assert len(data) >= 16
    data[8:16] = data[0:8]  # the second entry repeats the first: offsets stop increasing, no zero slot
    index.write_bytes(bytes(data))
    result = CliRunner().invoke(cli_main, ["audit", str(partition)])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"note: {index.name} in t-0 does not match its log (byte 8: ")
    assert result.stderr.endswith("); it was rebuilt in memory, the file was not changed\n")
    assert result.stderr.count("\n") == 1


def test_the_library_still_logs_the_rebuild_as_a_key_value_warning_with_its_facts(tmp_path, caplog):
    partition = kafka_like_partition(tmp_path / "logs" / "t-0")
    with caplog.at_level(logging.WARNING, logger="segments.partition.log"):
        PartitionLog.open(partition, mode="reader").close()
    [record] = [r for r in caplog.records if hasattr(r, "index_rebuild")]
    event = record.index_rebuild
    assert isinstance(event, IndexRebuild) and event.untrimmed and event.in_memory
    assert record.getMessage().startswith("rebuilding index dir=")
    assert "untrimmed=True in_memory=True" in record.getMessage()


# ---- no footprint -------------------------------------------------------------------------------------------------


def test_read_only_commands_leave_the_partition_and_log_dir_listings_unchanged(tmp_path):
    log_dir = tmp_path / "logs"
    partition = kafka_like_partition(log_dir / "t-0")
    before = listing(log_dir, partition)
    assert not [name for name in before if name.endswith(".lock")]
    segment = str(partition / fmt.offset_file_name(0, fmt.LOG_SUFFIX))
    for command in (["dump", segment], ["verify", str(partition)], ["verify", str(log_dir)], ["audit", str(partition)],
                    ["audit", "--key", "k1", str(log_dir)], ["duplication", str(partition)]):
        result = CliRunner().invoke(cli_main, command)
        assert result.exit_code == 0, (command, result.output)
        assert listing(log_dir, partition) == before, command


def test_a_reader_creates_no_swap_lock_but_still_waits_for_a_swap_where_the_file_exists(tmp_path):
    partition = kafka_like_partition(tmp_path / "logs" / "t-0", preallocate=False)
    PartitionLog.open(partition, mode="reader").close()
    assert not (partition / SWAP_LOCK).exists()

    swap = PartitionLock(partition, SWAP_LOCK).acquire(timeout_s=0)  # a swap in progress (creates the file)
    opened = threading.Event()

    def open_reader() -> None:
        PartitionLog.open(partition, mode="reader").close()
        opened.set()

    reader = threading.Thread(target=open_reader, daemon=True)
    reader.start()
    try:
        time.sleep(0.3)  # long enough for an open that does not wait to be done
        assert not opened.is_set()
    finally:
        swap.release()
    assert opened.wait(timeout=30)
    reader.join(timeout=30)


# ---- the progress bar on a terminal ------------------------------------------------------------------------------


def test_on_a_terminal_the_bar_reaches_100_and_no_partition_line_is_written_over_it(tmp_path):
    """`clean` with stdout and stderr on a terminal (a pty) and more than 64 MB to clean draws its bar: each
    partition's line starts on a blanked line (never after the bar's text), and the bar ends at 100%."""
    import pty

    log_dir = tmp_path / "logs"
    for name, seed in (("a-0", 1), ("b-0", 2)):
        generate_partition(log_dir / name, WorkloadSpec(records=35_000, keys=500, value_bytes=1000,
                                                        records_per_batch=500, segment_bytes=8 << 20, seed=seed))
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([*logcleaner_command(), "clean", "--set", "cleanup.policy=compact", "--now-ms",
                             "1800000000000", str(log_dir)], stdout=terminal, stderr=terminal, stdin=subprocess.DEVNULL)
    os.close(terminal)
    seen = b""
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the last holder of the terminal closed it
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(controller)
        code = proc.wait(timeout=PIPE_TIMEOUT_S)
    text = seen.decode(errors="replace")
    assert code == 0, text
    assert "cleaning" in text and "100%" in text.rsplit("cleaning", 1)[1], text[-300:]
    for name in ("a-0", "b-0"):
        before = text[: text.index(f"{name}: cleaned")]
        assert before.endswith("\r\x1b[K"), repr(before[-80:])  # the bar's line blanked first


def test_a_warning_logged_while_the_bar_is_shown_starts_on_a_blanked_line(capsys, monkeypatch):
    """The first run's "compiling the cleaner's kernels" warning (logged, so written by logging's last resort)
    is not written over the bar: its line is blanked first, as before a partition's line; and the last resort
    is logging's own again once the bar is gone."""
    import logging

    from cleaner.cli import _Bar

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in `clean`: none configured (pytest adds its own)
    before = logging.lastResort
    with _Bar(100 << 20) as bar:
        bar.update(1 << 20)
        logging.getLogger("cleaner.kernel_cache").warning("compiling the cleaner's kernels")
    assert logging.lastResort is before
    err = capsys.readouterr().err
    assert "\r\x1b[Kcompiling the cleaner's kernels\n" in err, repr(err)
