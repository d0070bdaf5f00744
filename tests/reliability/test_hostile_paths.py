"""Hostile paths: symbolic links inside a log dir, partition directories with odd names, files the cleaner may
not read or that belong to other users. Judged from outside, as an operator would: exit status and messages
of `logcleaner clean/verify/dump`, a real daemon's `/status`, `/metrics` and log, and the bytes and mtimes of
files outside the log dir (a link's target is never read nor written).

The permission tests need a user that permission bits apply to. As root (bits do not stop root), the
cleaner runs as `nobody` in a world-traversable temporary tree (pytest's own tmp dirs are 0700), with one
segment file owned by root and mode 0600; as any other user, the file is made mode 000. `logcleaner` cannot
simply be exec'ed as `nobody` everywhere (the interpreter may live under a 0700 home, e.g. pyenv in /root),
so `unprivileged_command` starts it as root, imports and compiles what it needs, then drops to `nobody`.
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from cleaner.cli import main as cli_main
from segments.codec import format as fmt
from segments.codec.errors import LinkRefusedError
from segments.files.pathcheck import partition_dir_name_problem
from segments.partition.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    read_offset_checkpoint,
    update_offset_checkpoint,
    write_offset_checkpoint,
)
from segments.partition.locks import CLEANER_LOCK, PartitionLock
from segments.partition.log import PartitionLog, parse_partition_dir_name, update_log_dir_checkpoint
from segments.tools.generate import WorkloadSpec, generate_partition

from ..integration.daemon_helpers import (
    DaemonProcess,
    free_port,
    latest_by_key,
    records_of,
    segment_bases,
    wait_until,
    write_config,
)

LINK_MESSAGE = "is a symbolic link; logcleaner does not follow links inside a log dir"
SMALL = WorkloadSpec(records=1200, keys=100, segment_bytes=16 * 1024)  # ten segments, then an empty active one
TIMEOUT_S = 30.0
IS_ROOT = os.geteuid() == 0


def small_partition(directory: Path, seed: int = 0) -> Path:
    """A small keyed log at `directory`; an invalid partition name is given after it was written."""
    build = directory if parse_partition_dir_name(directory.name) else directory.parent / "building-0"
    generate_partition(build, WorkloadSpec(records=SMALL.records, keys=SMALL.keys,
                                           segment_bytes=SMALL.segment_bytes, seed=seed))
    if build != directory:
        os.rename(build, directory)
    return directory


def file_states(root: Path) -> dict[str, tuple[bytes | str, int]]:
    """relative path → (content, or the link's target; mtime in ns) of everything under `root`, links not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if path.is_symlink():
                out[str(path.relative_to(root))] = (os.readlink(path), st.st_mtime_ns)
            elif path.is_file():
                try:
                    content = path.read_bytes()
                except PermissionError:  # not root: a file made unreadable on purpose; its size stands in
                    content = b"unreadable, %d bytes" % st.st_size
                out[str(path.relative_to(root))] = (content, st.st_mtime_ns)
    return out


def data_files(directory: Path) -> dict[str, tuple[bytes | str, int]]:
    """`file_states` without the lock files a cleaner creates when it opens a partition."""
    return {k: v for k, v in file_states(directory).items() if not k.startswith(".")}


def clean(*args: str):
    return CliRunner().invoke(cli_main, ["clean", "--set", "cleanup.policy=compact", *args])


def fully_cleaned(directory: Path) -> bool:
    records = records_of(directory)
    return len(records) == len(latest_by_key(records))


# ---- names --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "t-\u00b2",  # a superscript digit: str.isdigit() says yes, int() raises (used to crash discovery)
    "t-\u0661",  # an Arabic-Indic one: int() says 1, a second directory for partition t-1
    "t-01", "t-+1", "t--", "-1", "t-", "t-2147483648", "t-99999999999999999999",
    "my topic-0", "t\n-0", "t-0\n", "caf\u00e9-0", "..-0", ".-0", "a/b-0", "x" * 250 + "-0", "noparts",
])
def test_invalid_partition_directory_names_are_not_partitions(name):
    assert parse_partition_dir_name(name) is None
    assert partition_dir_name_problem(name)


@pytest.mark.parametrize("name, parsed", [
    ("t-0", ("t", 0)), ("my-topic-12", ("my-topic", 12)), ("__consumer_offsets-49", ("__consumer_offsets", 49)),
    ("a.b_c-D-2147483647", ("a.b_c-D", 2147483647)), ("t--1", ("t-", 1)), ("x" * 249 + "-0", ("x" * 249, 0)),
])
def test_kafka_topic_names_parse(name, parsed):
    assert parse_partition_dir_name(name) == parsed


# ---- links: the library ---------------------------------------------------------------------------------------


def test_checkpoint_that_is_a_link_is_neither_read_nor_written_through(tmp_path):
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.mkdir()
    target = outside / "secret"
    write_offset_checkpoint(target, {("other", 0): 42})
    before = file_states(outside)
    link = log_dir / CLEANER_OFFSET_CHECKPOINT
    link.symlink_to(target)

    with pytest.raises(LinkRefusedError, match=LINK_MESSAGE) as raised:
        read_offset_checkpoint(link)
    assert raised.value.path == str(link)
    with pytest.raises(LinkRefusedError):
        update_log_dir_checkpoint(log_dir, CLEANER_OFFSET_CHECKPOINT, ("t", 0), 7)
    with pytest.raises(LinkRefusedError):
        update_offset_checkpoint(link, {("t", 0): 7})
    # A plain write replaces the link itself (tmp + rename), never the file it points at.
    write_offset_checkpoint(link, {("t", 0): 7})
    assert not link.is_symlink() and read_offset_checkpoint(link) == {("t", 0): 7}
    assert file_states(outside) == before


def test_a_checkpoint_tmp_that_is_a_dangling_link_fails_the_write_and_creates_nothing_outside(tmp_path):
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.mkdir()
    (log_dir / (CLEANER_OFFSET_CHECKPOINT + ".tmp")).symlink_to(outside / "created-through-the-link")
    with pytest.raises(OSError) as raised:
        write_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT, {("t", 0): 7})
    assert raised.value.errno == errno.ELOOP
    assert list(outside.iterdir()) == []


def test_a_lock_file_that_is_a_dangling_link_is_refused_and_creates_nothing_outside(tmp_path):
    directory, outside = tmp_path / "t-0", tmp_path / "outside"
    directory.mkdir()
    outside.mkdir()
    (directory / CLEANER_LOCK).symlink_to(outside / "created-through-the-lock")
    with pytest.raises(LinkRefusedError, match=LINK_MESSAGE):
        PartitionLock(directory, CLEANER_LOCK).acquire(timeout_s=0)
    with pytest.raises(LinkRefusedError, match=LINK_MESSAGE):
        PartitionLog.open(directory, mode="cleaner")
    assert list(outside.iterdir()) == []


# ---- links: clean, verify, dump -------------------------------------------------------------------------------


def _link_partition_dir(log_dir: Path, outside: Path) -> tuple[Path, Path]:
    small_partition(outside / "linked-0", seed=3)
    (log_dir / "linked-0").symlink_to(outside / "linked-0", target_is_directory=True)
    return log_dir / "linked-0", log_dir / "linked-0"


def _link_segment_file(kind: str):
    def make(log_dir: Path, outside: Path) -> tuple[Path, Path]:
        directory = small_partition(log_dir / "victim-0", seed=4)
        base = segment_bases(directory)[2]
        path = directory / fmt.offset_file_name(base, kind)
        shutil.copy2(path, outside / path.name)
        path.unlink()
        path.symlink_to(outside / path.name)
        return directory, path
    return make


def _dangling_time_index(log_dir: Path, outside: Path) -> tuple[Path, Path]:
    directory = small_partition(log_dir / "victim-0", seed=4)
    path = directory / fmt.offset_file_name(segment_bases(directory)[2], fmt.TIME_INDEX_SUFFIX)
    path.unlink()
    path.symlink_to(outside / "never-created")
    return directory, path


LINK_CASES = {
    "partition-dir": _link_partition_dir,
    "segment-log": _link_segment_file(fmt.LOG_SUFFIX),
    "offset-index": _link_segment_file(fmt.INDEX_SUFFIX),
    "dangling-time-index": _dangling_time_index,
}


@pytest.mark.parametrize("case", LINK_CASES)
def test_clean_refuses_a_link_inside_the_log_dir_names_it_and_cleans_the_others(tmp_path, case):
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.mkdir()
    good = small_partition(log_dir / "good-0")
    refused_dir, link = LINK_CASES[case](log_dir, outside)
    outside_before = file_states(outside)
    refused_before = data_files(refused_dir) if not refused_dir.is_symlink() else None

    result = clean(str(log_dir))
    assert result.exit_code == 1, result.output
    line = next(ln for ln in result.output.splitlines() if refused_dir.name in ln)
    assert "FAILED" in line and str(link) in line and LINK_MESSAGE in line, line
    assert fully_cleaned(good)
    assert file_states(outside) == outside_before  # the targets: never read into, never written
    if refused_before is not None:
        assert data_files(refused_dir) == refused_before

    verified = CliRunner().invoke(cli_main, ["verify", str(log_dir)])
    assert verified.exit_code == 1 and f"{link}: byte 0: {LINK_MESSAGE}" in verified.output, verified.output
    assert file_states(outside) == outside_before


def test_clean_and_verify_pointed_at_a_linked_partition_dir_name_it(tmp_path):
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.mkdir()
    link, _ = _link_partition_dir(log_dir, outside)
    before = file_states(outside)
    for command in ("clean", "verify"):
        result = CliRunner().invoke(cli_main, [command, str(link)])
        assert result.exit_code == 1, result.output
        assert any(ln.startswith(("linked-0: FAILED: ", f"{link}: ")) and f"{link}: " in ln and LINK_MESSAGE in ln
                   for ln in result.output.splitlines()), result.output
    assert file_states(outside) == before


def test_dump_of_a_linked_segment_file_is_refused_with_its_name(tmp_path):
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.mkdir()
    _, link = _link_segment_file(fmt.LOG_SUFFIX)(log_dir, outside)
    result = CliRunner().invoke(cli_main, ["dump", str(link)])
    assert result.exit_code == 1 and f"{link}: {LINK_MESSAGE}" in result.stderr, result.output
    assert "baseOffset" not in result.stdout


def test_a_checkpoint_tmp_link_fails_the_round_naming_it_and_creates_nothing_outside(tmp_path):
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.mkdir()
    small_partition(log_dir / "t-0")
    tmp_link = log_dir / (CLEANER_OFFSET_CHECKPOINT + ".tmp")
    tmp_link.symlink_to(outside / "created-through-the-tmp")
    result = clean(str(log_dir))
    assert result.exit_code == 1 and f"{tmp_link}: {LINK_MESSAGE}" in result.output, result.output
    assert list(outside.iterdir()) == []


def test_a_log_dir_path_that_is_a_link_is_the_operators_choice(tmp_path):
    real = tmp_path / "real-logs"
    real.mkdir()
    small_partition(real / "t-0")
    (tmp_path / "logs").symlink_to(real, target_is_directory=True)
    result = clean(str(tmp_path / "logs"))
    assert result.exit_code == 0, result.output
    assert fully_cleaned(real / "t-0")


# ---- odd names: clean and verify -----------------------------------------------------------------------------


ODD_NAMES = ["my topic-0", "t-\u00b2", "t-01", "..-0", "caf\u00e9-0", "nl\n-0", "t-99999999999"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_clean_and_verify_pointed_at_an_oddly_named_partition_dir_exit_1_naming_it(tmp_path, name):
    directory = small_partition(tmp_path / name)
    before = data_files(directory)
    for command in ("clean", "verify"):
        result = CliRunner().invoke(cli_main, [command, str(directory)])
        assert result.exit_code == 1, (command, result.output)
        assert "not a partition directory (<topic>-<partition>)" in result.output, result.output
        assert partition_dir_name_problem(name) in result.output
        shown = str(directory).replace("\n", "\\n")  # names are shown on one line
        assert shown in result.output
    assert data_files(directory) == before


def test_clean_of_a_log_dir_with_oddly_named_dirs_cleans_the_partitions_and_reports_the_rest(tmp_path):
    log_dir = tmp_path / "logs"
    good = small_partition(log_dir / "good-0")
    odd = small_partition(log_dir / "t-01", seed=1)  # segment data under an invalid name: a failure
    (log_dir / "scratch").mkdir()  # no segment data: a warning
    (log_dir / "t-0.0123456789abcdef0123456789abcdef-delete").mkdir()  # Kafka's: quiet
    (log_dir / "lost+found").mkdir()
    before = data_files(odd)
    result = clean(str(log_dir))
    assert result.exit_code == 1, result.output
    assert f"t-01: FAILED: {odd}: not a partition directory" in result.stderr
    assert f"warning: ignored {log_dir / 'scratch'}: not a partition directory" in result.stderr
    assert "-delete" not in result.output and "lost+found" not in result.output
    assert fully_cleaned(good) and data_files(odd) == before


# ---- the daemon: links and odd names ---------------------------------------------------------------------------


def test_daemon_skips_links_and_odd_names_with_warnings_shows_them_in_status_and_cleans_the_rest(tmp_path):
    real_logs, outside = tmp_path / "real-logs", tmp_path / "outside"
    real_logs.mkdir()
    outside.mkdir()
    log_dir_link = tmp_path / "logs"
    log_dir_link.symlink_to(real_logs, target_is_directory=True)  # the configured path: resolved once
    good = small_partition(real_logs / "good-0")
    _link_partition_dir(real_logs, outside)
    victim, segment_link = _link_segment_file(fmt.LOG_SUFFIX)(real_logs, outside)
    odd = ["my topic-0", "t-\u00b2", "t-01", "..-0", "nl\n-0", "t-99999999999"]
    for name in odd:
        small_partition(real_logs / name, seed=2)
    os.mkdir(os.fsencode(real_logs) + b"/bad\xff-0")  # not even UTF-8
    (real_logs / "t-0.0123456789abcdef0123456789abcdef-delete").mkdir()
    outside_before = file_states(outside)
    victim_before = data_files(victim)

    port = free_port()
    config = write_config(tmp_path / "logcleaner.toml", log_dirs=[log_dir_link], port=port)
    daemon = DaemonProcess(config, port, tmp_path / "daemon.log")
    try:
        daemon.start()  # a directory named t-² used to crash discovery, and with it the start
        wait_until(lambda: fully_cleaned(good) and daemon.partition("victim-0")["uncleanable"],
                   timeout_s=TIMEOUT_S, what="good-0 cleaned and victim-0 uncleanable")
        status = daemon.status()
        assert status["daemon"]["log_dirs"] == [str(real_logs)]
        assert {p["partition"] for p in status["partitions"]} == {"good-0", "victim-0"}
        reason = daemon.partition("victim-0")["uncleanable_reason"]
        assert f"{segment_link}: {LINK_MESSAGE}" in reason, reason
        ignored = {e["path"]: e["reason"] for e in status["ignored"]}
        assert ignored[str(real_logs / "linked-0")] == LINK_MESSAGE
        for name in odd:
            shown = str(real_logs / name).replace("\n", "\\n")
            assert ignored[shown] == f"not a partition directory (<topic>-<partition>): {partition_dir_name_problem(name)}"
        assert ignored[f"{real_logs}/bad\\xff-0"].startswith("not a partition directory")
        assert len(ignored) == len(odd) + 2  # nothing else; Kafka's -delete directory is passed over quietly
        samples = [s for f in text_string_to_metric_families(daemon.metrics_text()) for s in f.samples
                   if s.name == "logcleaner_partition_dirty_ratio"]
        assert {s.labels["topic"] for s in samples} == {"good", "victim"}
        log_text = daemon.log_text()
        assert log_text.count("ignoring log dir entry") == len(ignored)  # once each, not at every discovery pass
        assert "nl\\n-0" in log_text and "nl\n-0" not in log_text  # one log line per warning
    finally:
        daemon.close()
    assert file_states(outside) == outside_before
    assert data_files(victim) == victim_before


# ---- permissions and owners ------------------------------------------------------------------------------------


NOBODY = pwd.getpwnam("nobody") if IS_ROOT else None

# Started as root; imports and compiles everything the command needs (some of the interpreter's own
# modules may be readable by root alone), then becomes `nobody`. A new lazy import of a standard-library
# module in the CLI's paths may need adding to the list.
_DROP_PRIVILEGES = textwrap.dedent("""
    import os, sys, tempfile, time
    from pathlib import Path
    import ctypes.util, difflib, encodings.idna, tomllib  # what the commands import late (this Python is root's)
    import cleaner.allocator, cleaner.cli, cleaner.daemon, cleaner.oneshot
    from cleaner.settings import Settings
    from segments.tools.generate import WorkloadSpec, generate_partition
    with tempfile.TemporaryDirectory() as tmp:  # compile the kernels a round uses while the cache is readable
        generate_partition(Path(tmp) / "warm-0", WorkloadSpec(records=200, keys=20, segment_bytes=4096))
        settings = Settings.from_mappings({"cleanup.policy": "compact"})
        assert cleaner.oneshot.clean_partition(Path(tmp) / "warm-0", settings, now_ms=int(time.time() * 1000)).ok
    uid, gid = int(sys.argv[1]), int(sys.argv[2])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    sys.argv = ["logcleaner", *sys.argv[3:]]
    cleaner.cli.main()
""")


def unprivileged_command(*args: str) -> list[str]:
    """`logcleaner ARGS` as a user that permission bits apply to: `nobody` when we are root, else ourselves."""
    if IS_ROOT:
        return [sys.executable, "-c", _DROP_PRIVILEGES, str(NOBODY.pw_uid), str(NOBODY.pw_gid), *args]
    return [sys.executable, "-m", "cleaner.cli", *args]


@pytest.fixture
def shared_tree():
    """A temporary tree every user can traverse; its `logs` belongs to the user the cleaner runs as."""
    root = Path(tempfile.mkdtemp(prefix="logcleaner-hostile-", dir="/tmp"))
    root.chmod(0o755)
    (root / "logs").mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root)


def hand_over(root: Path) -> None:
    """Give the tree under `root` to the user `unprivileged_command` runs as."""
    if not IS_ROOT:
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, NOBODY.pw_uid, NOBODY.pw_gid, follow_symlinks=False)


def make_unreadable(path: Path) -> None:
    """A file the cleaner may not read: root's with mode 0600 when we are root, else mode 000."""
    if IS_ROOT:
        os.chown(path, 0, 0)
        path.chmod(0o600)
    else:
        path.chmod(0o000)


def _two_partitions_one_unreadable(tree: Path) -> tuple[Path, Path, Path]:
    log_dir = tree / "logs"
    good = small_partition(log_dir / "good-0")
    blocked = small_partition(log_dir / "blocked-0", seed=1)
    hand_over(tree / "logs")
    unreadable = blocked / fmt.offset_file_name(segment_bases(blocked)[1], fmt.LOG_SUFFIX)
    make_unreadable(unreadable)
    return good, blocked, unreadable


def test_clean_as_a_user_who_may_not_read_a_segment_names_it_changes_nothing_and_cleans_the_rest(shared_tree):
    good, blocked, unreadable = _two_partitions_one_unreadable(shared_tree)
    before = data_files(blocked)
    done = subprocess.run(unprivileged_command("clean", "--set", "cleanup.policy=compact", str(shared_tree / "logs")),
                          capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("blocked-0"))
    assert "FAILED" in line and f"{unreadable}: permission denied" in line, line
    assert data_files(blocked) == before
    assert fully_cleaned(good)


class UnprivilegedDaemon(DaemonProcess):
    """A `logcleaner run` that runs as the user of `unprivileged_command`."""

    def start(self, *, wait: bool = True) -> "UnprivilegedDaemon":
        env = dict(os.environ)
        env.pop("LOGCLEANER_CLOCK_FILE", None)
        self._log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(unprivileged_command("run", "-c", str(self.config_path)), stdout=self._log_file,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        if wait:
            self.wait_ready()
        return self


def test_daemon_as_a_user_who_may_not_read_a_segment_marks_the_partition_uncleanable_and_cleans_the_rest(
        shared_tree, tmp_path):
    good, blocked, unreadable = _two_partitions_one_unreadable(shared_tree)
    before = data_files(blocked)
    port = free_port()
    config = write_config(shared_tree / "logcleaner.toml", log_dirs=[shared_tree / "logs"], port=port)
    config.chmod(0o644)
    daemon = UnprivilegedDaemon(config, port, tmp_path / "daemon.log")
    try:
        daemon.start()
        wait_until(lambda: fully_cleaned(good) and daemon.partition("blocked-0")["uncleanable"],
                   timeout_s=TIMEOUT_S, what="good-0 cleaned and blocked-0 uncleanable")
        reason = daemon.partition("blocked-0")["uncleanable_reason"]
        assert str(unreadable) in reason and "permission denied" in reason.lower(), reason
        assert daemon.status()["daemon"]["threads_alive"] == 1
    finally:
        daemon.close()
    assert data_files(blocked) == before


def test_cleaned_files_keep_the_owner_and_mode_of_the_segments_they_replace(tmp_path):
    directory = small_partition(tmp_path / "logs" / "owned-0")
    # As root: the log belongs to someone else (a broker's user), and a root cleaner must not take it over.
    # As anyone else: the files are group-writable, and the cleaned ones must stay so.
    uid, gid = (NOBODY.pw_uid, NOBODY.pw_gid) if IS_ROOT else (os.geteuid(), os.getegid())
    mode = 0o640 if IS_ROOT else 0o664
    for path in directory.iterdir():
        os.chown(path, uid, gid)
        path.chmod(mode)
    inodes_before = {p.name: p.stat().st_ino for p in directory.glob("*.log")}
    result = clean(str(directory))
    assert result.exit_code == 0, result.output
    replaced = [p for p in directory.glob("*.log") if inodes_before.get(p.name) != p.stat().st_ino]
    assert replaced, "nothing was cleaned"
    for log_path in replaced:
        for path in directory.glob(log_path.name[: -len(".log")] + ".*"):
            st = path.stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode), path
