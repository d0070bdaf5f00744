"""Every command of `logcleaner`, given bad input, answers in one line: judged from outside, on real processes.

For each command of the click app there are rows of bad inputs — paths that do not exist, files where
directories are expected and the reverse, unreadable segments, indexes, checkpoints and partition directories,
garbage segment files, empty and odd directories, bad numbers, names, sizes, URLs and config files — and for
each row the test asserts what an operator must get:

* no Python traceback, on either stream;
* exactly one line on stderr (the error, or for an empty but valid directory the line saying nothing was found);
* the exit code docs/cli.md documents: 0 (nothing wrong: an empty log dir), 1 (the data: an unreadable or
  corrupt file, a daemon that cannot be reached), 2 (the command line);
* no file changed (names, sizes, modes and mtimes of the whole tree; a `clean` may leave its lock files, which
  are empty and which it creates on every run).

A command added to the app without a row fails `test_every_command_of_the_app_has_rows`.

Unreadable files need a user the permission bits apply to. As root the commands run under `setpriv` with
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped (root is then bound by the bits, as the issue reproduced it);
as anyone else the bits apply anyway.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cleaner.cli import main
from segments.codec import format as fmt
from segments.tools.generate import WorkloadSpec, generate_partition

TIMEOUT_S = 120.0
IS_ROOT = os.geteuid() == 0
_SETPRIV = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
SEGMENT = fmt.offset_file_name(0, fmt.LOG_SUFFIX)
INDEX = fmt.offset_file_name(0, fmt.INDEX_SUFFIX)


@dataclass(frozen=True)
class Row:
    """One bad input: the command line (`{name}` placeholders are paths of the tree) and its exit code."""

    command: str
    args: tuple[str, ...]
    exit_code: int
    unreadable: bool = False  # needs permission bits that apply to the user running it
    cwd: str = ""  # relative to the tree; "" is the tree itself

    def __str__(self) -> str:
        return " ".join((self.command, *self.args))


def row(command: str, *args: str, code: int, unreadable: bool = False, cwd: str = "") -> Row:
    return Row(command, args, code, unreadable, cwd)


SET_COMPACT = ("--set", "cleanup.policy=compact")

ROWS = [
    # dump FILE...
    row("dump", "{missing}", code=2),
    row("dump", "{logs}", code=2),  # a directory
    row("dump", "{text}", code=1),  # not a segment file name
    row("dump", "{garbage}/" + SEGMENT, code=1),
    row("dump", "{fifo_dir}/" + SEGMENT, code=1),
    row("dump", "{unreadable_segment}/" + SEGMENT, code=1, unreadable=True),
    # verify PATH...
    row("verify", "{missing}", code=2),
    row("verify", "{empty}", code=0),
    row("verify", "{odd}", code=0),
    row("verify", "{text}", code=1),
    row("verify", "{garbage}", code=1),
    row("verify", "{garbage}/" + SEGMENT, code=1),
    row("verify", "{corrupt}", code=1),
    row("verify", "{unreadable_segment}", code=1, unreadable=True),
    row("verify", "{unreadable_index}", code=1, unreadable=True),
    row("verify", "{unreadable_checkpoint}", code=1, unreadable=True),
    row("verify", "{unreadable_partition_dir}", code=1, unreadable=True),
    # run -c FILE
    row("run", code=2),  # -c is required
    row("run", "-c", "{missing}", code=2),
    row("run", "-c", "{logs}", code=2),
    row("run", "-c", "{text}", code=2),  # not TOML
    row("run", "-c", "{binary}", code=2),
    row("run", "-c", "{bad_value_toml}", code=2),
    row("run", "-c", "{unknown_key_toml}", code=2),
    row("run", "-c", "{good_toml}", "--server-properties", "{text}", code=2),  # no key=value line
    row("run", "-c", "{good_toml}", "--log-level", "loud", code=2),
    row("run", "-c", "{unreadable_file}", code=2, unreadable=True),
    # status
    row("status", "--url", "notaurl", code=2),
    row("status", "--url", "http://127.0.0.1:notaport", code=2),
    row("status", "--url", "ftp://127.0.0.1:21", code=2),
    row("status", "--url", "http://127.0.0.1:1", code=1),  # nothing listens there
    row("status", "-c", "{missing}", code=2),
    row("status", "-c", "{text}", code=2),
    # admin pause|resume|trigger PARTITION
    row("admin", "-c", "{good_toml}", "pause", "bad name", code=2),
    row("admin", "pause", "t-01", "--url", "http://127.0.0.1:1", code=2),
    row("admin", "explode", "t-0", code=2),
    row("admin", "pause", "t-0", "--url", "notaurl", code=2),
    row("admin", "pause", "t-0", "--token-file", "{missing}", "--url", "http://127.0.0.1:1", code=1),
    row("admin", "pause", "t-0", "-c", "{good_toml}", code=1),  # nothing listens there
    # audit PATH...
    row("audit", "{missing}", code=2),
    row("audit", "{text}", code=2),  # a file
    row("audit", "{empty}", code=0),
    row("audit", "{odd}", code=0),
    row("audit", "{garbage}", code=1),
    row("audit", "{corrupt}", code=1),
    row("audit", "{logs}", "--key-hex", "zz", code=2),
    row("audit", "{logs}", "--key-file", "{missing}", code=2),
    row("audit", "{logs}", "--key-file", "{logs}", code=2),
    row("audit", "{unreadable_segment}", code=1, unreadable=True),
    row("audit", "{unreadable_partition_dir}", code=1, unreadable=True),
    row("audit", "{logs}", "--key-file", "{unreadable_file}", code=2, unreadable=True),
    # clean PATH...
    row("clean", "{missing}", *SET_COMPACT, code=2),
    row("clean", "{text}", *SET_COMPACT, code=2),
    row("clean", "{empty}", *SET_COMPACT, code=0),
    row("clean", "{odd}", *SET_COMPACT, code=0),
    row("clean", "{logs}/t-0", "--from-offset", "25", "--to-offset", "5", code=2),
    row("clean", "{logs}/t-0", "--from-offset", "-3", code=2),
    row("clean", "{logs}/t-0", "--to-offset", "abc", code=2),
    row("clean", "{two}", "--from-offset", "3", *SET_COMPACT, code=2),  # needs one partition
    row("clean", "{logs}", "--now-ms", "-1", code=2),
    row("clean", "{logs}", "--set", "oops", code=2),
    row("clean", "{logs}", "--set", "delete.retention.ms=abc", code=2),
    row("clean", "{logs}", "--set", "log.cleaner.dedupe.buffer.size=lots", code=2),
    row("clean", "{logs}", "--set", "no.such.setting=1", code=2),
    row("clean", "{logs}", "--set", "min.cleanable.dirty.ratio=0.5", code=2),  # a daemon setting
    row("clean", "{logs}", "-c", "{text}", code=2),
    row("clean", "{logs}", "--server-properties", "{text}", *SET_COMPACT, code=2),
    row("clean", "{logs}", "--server-properties", "{binary}", *SET_COMPACT, code=2),
    row("clean", "{corrupt}", *SET_COMPACT, code=1),
    row("clean", "{unreadable_segment}", *SET_COMPACT, "--dry-run", code=1, unreadable=True),
    row("clean", "{logs}", "{two}", *SET_COMPACT, code=2),  # t-0 in two log dirs: which copy is the log?
    row("clean", "{logs}", "--server-properties", "{unreadable_file}", *SET_COMPACT, code=2, unreadable=True),
    # ingest SOURCE ... (all refused before Spark starts)
    row("ingest", "{missing}", "--topic", "t", "--partitions", "1", "--key-column", "k", "--value-column", "v",
        "--output", "{out}", code=2),
    row("ingest", "{text}", "--topic", "t", "--partitions", "0", "--key-column", "k", "--value-column", "v",
        "--output", "{out}", code=2),
    row("ingest", "{text}", "--partitions", "1", "--key-column", "k", "--value-column", "v", "--output", "{out}",
        code=2),
    row("ingest", "{text}", "--topic", "t", "--partitions", "1", "--key-column", "k", "--value-column", "v",
        "--value-format", "json", "--output", "{out}", code=2),
    row("ingest", "{text}", "--topic", "t", "--partitions", "1", "--key-column", "k", "--value-column", "v",
        "--segment-bytes", "12", "--output", "{out}", code=2),
    row("ingest", "{text}", "--topic", "t", "--partitions", "1", "--key-column", "k", "--value-column", "v",
        "--option", "nokeyvalue", "--output", "{out}", code=2),
    row("ingest", "{text}", "--topic", "bad name", "--partitions", "1", "--key-column", "k", "--value-column", "v",
        "--output", "{out}", code=2),
    # duplication PATH...
    row("duplication", "{missing}", code=2),
    row("duplication", "{empty}", code=0),
    row("duplication", "{odd}", code=0),
    row("duplication", "{garbage}", code=1),
    row("duplication", "{corrupt}", code=1),
    row("duplication", "{logs}", "--memory", "lots", code=2),
    row("duplication", "{logs}", "--memory", "12", code=2),
    row("duplication", "{logs}", "--method", "guess", code=2),
    row("duplication", "{logs}", "--method", "bloom", "--memory", "64TiB", code=2),  # more than the machine has
    row("duplication", "{logs}", "--memory", "64TiB", code=2),  # auto: checked all the same
    row("duplication", "{logs}", "--method", "exact", "--memory", "64TiB", code=2),  # exact too
    row("duplication", "{unreadable_segment}", code=1, unreadable=True),
    row("duplication", "{unreadable_partition_dir}", code=1, unreadable=True),
    # demo
    row("demo", "--keys", "0", code=2),
    row("demo", "--partitions", "0", code=2),
    row("demo", "--partitions", "-1", code=2),
    row("demo", "--records", "0", code=2),
    row("demo", "--records", "-1", code=2),
    row("demo", "--records", "many", code=2),
    row("demo", "--dir", "{odd}", code=2),  # holds files demo did not write
    row("demo", "--dir", "{logs}", code=2),  # a Kafka-looking log dir
    row("demo", "--dir", "{text}", code=2),  # a file
    row("demo", "--dir", ".", code=2, cwd="odd"),  # the current directory, not empty
]


def test_every_command_of_the_app_has_rows():
    assert {r.command for r in ROWS} == set(main.commands), "a command without rows of bad inputs (or rows of none)"


# ---- the tree every row runs against -----------------------------------------------------------------------


def _build_tree(root: Path) -> dict[str, Path]:
    names: dict[str, Path] = {}
    spec = WorkloadSpec(records=300, keys=30, segment_bytes=4096)

    def partition(log_dir: str, name: str, seed: int = 0) -> Path:
        directory = root / log_dir / name
        generate_partition(directory, dataclasses.replace(spec, seed=seed))
        return directory

    partition("logs", "t-0")
    (root / "logs" / "meta.properties").write_text("version=1\nnode.id=1\n")  # as Kafka leaves a log dir
    names["logs"] = root / "logs"
    partition("two", "t-0")
    partition("two", "t-1", seed=1)
    names["two"] = root / "two"
    names["empty"] = root / "empty"
    names["empty"].mkdir()
    odd = root / "odd"
    (odd / "not a partition").mkdir(parents=True)
    (odd / "t-01").mkdir()  # a leading zero: not a partition number
    (odd / "notes.txt").write_text("keep me\n")
    names["odd"] = odd
    garbage = root / "garbage" / "g-0"
    garbage.mkdir(parents=True)
    (garbage / SEGMENT).write_bytes(bytes(range(256)) * 3)
    names["garbage"] = garbage
    corrupt = partition("corrupt", "c-0")  # a byte flipped inside a record of its first (inactive) segment
    data = bytearray((corrupt / SEGMENT).read_bytes())
    data[200] ^= 0xFF
    (corrupt / SEGMENT).write_bytes(bytes(data))
    names["corrupt"] = corrupt
    fifo_dir = root / "fifo" / "f-0"
    fifo_dir.mkdir(parents=True)
    os.mkfifo(fifo_dir / SEGMENT)
    names["fifo_dir"] = fifo_dir
    names["text"] = root / "hostname"
    names["text"].write_text("just-a-hostname\n")
    names["binary"] = root / "binary.toml"
    names["binary"].write_bytes(b"\xff\xfe\x00garbage")
    names["good_toml"] = root / "good.toml"
    names["good_toml"].write_text(f'"log.dirs" = ["{root / "logs"}"]\n\n[server]\nlisten = "127.0.0.1:1"\n')
    names["bad_value_toml"] = root / "bad-value.toml"
    names["bad_value_toml"].write_text('"log.cleaner.threads" = 0\n')
    names["unknown_key_toml"] = root / "unknown-key.toml"
    names["unknown_key_toml"].write_text('"log.cleaner.threadz" = 2\n')
    names["missing"] = root / "no-such-path"
    names["out"] = root / "ingest-out"
    # Unreadable things, each in a log dir of its own so the other rows never meet them.
    segment_part = partition("unreadable-segment", "u-0")
    (segment_part / SEGMENT).chmod(0)
    names["unreadable_segment"] = segment_part
    index_part = partition("unreadable-index", "u-0")
    (index_part / INDEX).chmod(0)
    names["unreadable_index"] = index_part.parent
    checkpoint_dir = root / "unreadable-checkpoint"
    partition("unreadable-checkpoint", "u-0")
    (checkpoint_dir / "recovery-point-offset-checkpoint").write_text("0\n1\nu 0 0\n")
    (checkpoint_dir / "recovery-point-offset-checkpoint").chmod(0)
    names["unreadable_checkpoint"] = checkpoint_dir
    dir_part = partition("unreadable-dir", "u-0")
    dir_part.chmod(0)
    names["unreadable_partition_dir"] = dir_part.parent
    names["unreadable_file"] = root / "unreadable.toml"
    names["unreadable_file"].write_text('"log.cleaner.threads" = 1\n')
    names["unreadable_file"].chmod(0)
    for lock in root.rglob("*.lock"):  # a generated log leaves its writer's lock files; a broker's would not be ours
        lock.unlink()
    return names


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-inputs")
    names = _build_tree(root)
    yield root, names
    for dirpath, dirnames, filenames in os.walk(root):  # let pytest remove it, whoever we are
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and not stat.S_ISFIFO(os.lstat(path).st_mode):
                os.chmod(path, 0o755)
    os.chmod(root, 0o755)


def _state(root: Path, *, ignore_locks: bool) -> dict[str, tuple]:
    """Every entry under `root`: (kind and mode, size, mtime) — from `lstat` only, so nothing is read. With
    `ignore_locks`, lock files and the mtimes of directories (which a new lock file changes) are left out."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if ignore_locks and name.endswith(".lock"):
                continue
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            is_dir = stat.S_ISDIR(st.st_mode)
            out[os.path.relpath(path, root)] = (st.st_mode, 0 if is_dir else st.st_size,
                                                0 if is_dir and ignore_locks else st.st_mtime_ns)
    return out


def _command(r: Row) -> list[str]:
    prefix = []
    if r.unreadable and IS_ROOT:
        if shutil.which("setpriv") is None or subprocess.run([*_SETPRIV, "true"], capture_output=True).returncode:
            pytest.skip("as root, unreadable files need setpriv without CAP_DAC_OVERRIDE")
        prefix = _SETPRIV
    return [*prefix, sys.executable, "-m", "cleaner.cli", r.command]


@pytest.mark.parametrize("r", ROWS, ids=str)
def test_a_bad_input_gets_one_line_on_stderr_a_documented_exit_code_no_traceback_and_no_change(tree, r):
    root, names = tree
    args = [a.format(**names) for a in r.args]
    before = _state(root, ignore_locks=r.command == "clean")
    env = {k: v for k, v in os.environ.items() if k != "LOGCLEANER_ADMIN_TOKEN"}
    done = subprocess.run([*_command(r), *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=root / r.cwd, stdin=subprocess.DEVNULL, env=env)
    said = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr, said
    assert len(done.stderr.splitlines()) == 1, said
    assert done.returncode == r.exit_code, said
    assert _state(root, ignore_locks=r.command == "clean") == before, said
