"""What logcleaner accepts inside a log dir: partition directory names, no symbolic links, only regular files.

Owns these rules and the helpers that enforce them; it reads directory entries (`lstat`, `scandir`) and
never reads or writes a file's content.

* Names: a partition directory is `<topic>-<partition>` as Kafka names them, one canonical name per
  partition; Kafka's `-delete`, `-future`, `-stray` directories and `lost+found` are passed over quietly,
  any other directory is reported by callers (`partition_dir_name_problem`).
* Links: nothing inside a log dir that is a symbolic link is followed (`check_partition_dir`,
  `LinkRefusedError`, before anything is opened; `open_no_follow` for opens that create or truncate).
* Regular files only: an entry under a name logcleaner opens (`is_partition_file_name`) that is a FIFO,
  socket, device or directory is refused from the listing (`NotRegularFileError`), never opened.
* Owners: files written in place of a segment's take its mode, and as root its owner (`copy_ownership`).

They guard against links and special files left by operators, tools and backups, not against an attacker with
write access to the log dir. `display_path` renders any name on one printable line. The rules in full, and
their limits: see docs/design.md, "Paths inside a log dir".
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..codec.errors import LINK_REFUSED, LinkRefusedError, LogStateError, NotRegularFileError, display_path
from .names import parse_segment_file_name

__all__ = [
    "PARTITION_MAX",
    "RefusedPath",
    "STAGING_PREFIX",
    "STAGING_SUFFIX",
    "TOPIC_NAME_CHARS_MAX",
    "topic_name_problem",
    "check_not_link",
    "check_partition_dir",
    "check_regular_fd",
    "check_regular_file",
    "copy_ownership",
    "describe_os_error",
    "describe_file_kind",
    "find_partition_dirs",
    "is_partition_file_name",
    "is_known_non_partition_dir",
    "open_no_follow",
    "os_error_reason",
    "parse_partition_dir_name",
    "partition_dir_name_problem",
]

# Files of a partition directory that are not segment-named but that logcleaner opens (`segments.partition.checkpoint`,
# `segments.partition.locks`, `cleaner.generations`); spelled here because those modules import this one.
_PARTITION_FILE_NAMES = frozenset({
    "leader-epoch-checkpoint", "partition.metadata", ".logcleaner-generations",
    ".writer.lock", ".cleaner.lock", ".swap.lock",
})
TOPIC_NAME_CHARS_MAX = 249  # Kafka's Topic.MAX_NAME_LENGTH
PARTITION_MAX = 2**31 - 1  # partitions are int32 on the wire and in checkpoints
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION = re.compile(r"0|[1-9][0-9]*")
# Kafka's directories of a partition being deleted, moved between log dirs, or left over (KIP-858).
_KAFKA_NON_PARTITION = re.compile(r"[A-Za-z0-9._-]+-[0-9]+\.[A-Za-z0-9]+-(delete|future|stray)")
_NON_PARTITION_NAMES = frozenset({"lost+found"})  # fsck's directory at the root of an ext* filesystem
# A bulk ingest's staging area, `<log dir>/.logsegments-staging-<job>.tmp/` (`segments.spark.bulk_write`): not a
# partition, and not worth a warning while the ingest runs; one a killed ingest left is removed by hand.
STAGING_PREFIX = ".logsegments-staging-"
STAGING_SUFFIX = ".tmp"


def partition_dir_name_problem(name: str) -> str | None:
    """Why `name` is not a valid partition directory name (one line, no need to quote), or None if it is."""
    topic, dash, partition = name.rpartition("-")
    if not dash:
        return "not <topic>-<partition>: no '-'"
    if not _PARTITION.fullmatch(partition):
        return "the partition after the last '-' is not a non-negative decimal integer without leading zeros"
    if int(partition) > PARTITION_MAX:
        return f"partition {partition} is larger than {PARTITION_MAX}"
    if not topic:
        return "the topic before the last '-' is empty"
    return topic_name_problem(topic)


def topic_name_problem(topic: str) -> str | None:
    """Why Kafka would refuse `topic` as a topic name (one line), or None if it is valid: 1 to 249 ASCII
    letters, digits, '.', '_' and '-', and not '.' or '..' (Kafka's `Topic.validate`)."""
    if not topic:
        return "the topic is empty"
    if len(topic) > TOPIC_NAME_CHARS_MAX:
        return f"the topic is {len(topic)} characters long; Kafka allows at most {TOPIC_NAME_CHARS_MAX}"
    if topic in (".", ".."):
        return f"the topic may not be {topic!r}"
    if not _TOPIC.fullmatch(topic):
        return "the topic has characters other than ASCII letters, digits, '.', '_' and '-'"
    return None


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a valid `<topic>-<partition>` directory name; None for any other name."""
    if partition_dir_name_problem(name) is not None:
        return None
    topic, _, partition = name.rpartition("-")
    return topic, int(partition)


def is_known_non_partition_dir(name: str) -> bool:
    """Kafka's `-delete`/`-future`/`-stray` directories and `lost+found`: not partitions, not worth a warning."""
    return (name in _NON_PARTITION_NAMES or _KAFKA_NON_PARTITION.fullmatch(name) is not None
            or (name.startswith(STAGING_PREFIX) and name.endswith(STAGING_SUFFIX)))


def check_not_link(path: str | os.PathLike) -> os.stat_result:
    """`lstat(path)`; raises `LinkRefusedError` if it is a symbolic link (`OSError` if it cannot be stat'ed)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise LinkRefusedError(path)
    return st


def describe_file_kind(mode: int) -> str:
    """What a file of `st_mode` is, with its article: "a FIFO (named pipe)", "a socket", "a directory", ..."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return kind
    return "a special file"


def is_partition_file_name(name: str) -> bool:
    """Whether logcleaner may open a file of this name in a partition directory: a segment, index, snapshot
    (any `.cleaned`/`.swap`/`.deleted` state), checkpoint, metadata or lock file, or one of their `.tmp` files."""
    name = name.removesuffix(".tmp")
    return name in _PARTITION_FILE_NAMES or parse_segment_file_name(name) is not None


def check_regular_file(path: str | os.PathLike) -> os.stat_result:
    """`lstat(path)` of a regular file, without opening it.

    Raises `LinkRefusedError` for a symbolic link, `NotRegularFileError` (naming what it is) for a FIFO,
    socket, device or directory, `OSError` if it cannot be stat'ed (`FileNotFoundError` if it is missing).
    """
    st = check_not_link(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(path, describe_file_kind(st.st_mode))
    return st


def check_regular_fd(fd: int, path: str | os.PathLike) -> os.stat_result:
    """Raise `NotRegularFileError` (naming `path` and what it is) unless the open `fd` is a regular file; its
    `fstat` otherwise.

    For a file opened without a listing check: open it with `O_NONBLOCK` (so a FIFO is not waited on) and
    check it here before reading from it. The caller closes `fd` either way.
    """
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(path, describe_file_kind(st.st_mode))
    return st


def check_partition_dir(directory: str | os.PathLike) -> None:
    """Require `directory` to be a real directory holding no symbolic link and, under the names logcleaner
    opens (`is_partition_file_name`), only regular files, before anything in it is opened.

    Raises `LinkRefusedError` naming the directory or the first link found in it, `NotRegularFileError`
    naming the first FIFO, socket, device or directory found under such a name, `LogStateError` if it is
    not a directory, `OSError` if it cannot be listed (e.g. `PermissionError`). Nothing in it is opened.
    """
    st = check_not_link(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise LogStateError(f"{display_path(directory)}: not a directory")
    with os.scandir(os.fspath(directory)) as entries:
        for entry in entries:
            if entry.is_symlink():
                raise LinkRefusedError(Path(directory) / entry.name)
            if is_partition_file_name(entry.name) and not entry.is_file(follow_symlinks=False):
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except FileNotFoundError:
                    continue  # removed since the listing (a swap's old files): nothing to open
                raise NotRegularFileError(Path(directory) / entry.name, describe_file_kind(mode))


def open_no_follow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """`os.open(path, flags | O_NOFOLLOW, mode)`; a symbolic link raises `LinkRefusedError`, not ELOOP."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefusedError(path) from None
        raise


def describe_os_error(exc: OSError) -> str:
    """A one-line message for an `OSError` about a file: the path first, then what went wrong.

    A permission problem says what the file's mode denies to whom (`_permission_denied`); ELOOP from an
    `O_NOFOLLOW` open is a refused link.
    """
    if exc.filename is None:
        return exc.strerror or str(exc)
    path = display_path(exc.filename)
    if exc.errno == errno.ELOOP:
        return f"{path}: {LINK_REFUSED}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path}: permission denied: {_permission_denied(exc.filename)}"
    return f"{path}: {exc.strerror or exc}"


def _permission_denied(path: str | bytes | os.PathLike) -> str:
    """What the mode of `path` denies to the user logcleaner runs as: which class of its bits applies (owner,
    group or others, and why) and which of read/write (a directory: list/enter) that class lacks.

    The operation that failed is not known here, so every missing permission a command may need is named.
    Root is bound by the bits only without CAP_DAC_OVERRIDE (e.g. under `setpriv --bounding-set`), which is
    said; when the bits allow everything, the refusal comes from elsewhere (an ACL, a security module, an
    immutable attribute), which is said too.
    """
    uid, gid = os.geteuid(), os.getegid()
    try:
        st = os.lstat(path)
    except PermissionError:
        return f"a directory above it does not let uid {uid}, gid {gid} (the user logcleaner runs as) enter it"
    except OSError:
        return f"logcleaner runs as uid {uid}, gid {gid}"
    mode = stat.S_IMODE(st.st_mode)
    if uid == st.st_uid:
        who, bits = f"its owner (uid {uid}, the user logcleaner runs as)", mode >> 6
    elif st.st_gid == gid or st.st_gid in os.getgroups():
        who, bits = f"its group (gid {st.st_gid}, a group of uid {uid}, the user logcleaner runs as)", mode >> 3
    else:
        who, bits = (f"others (it belongs to uid {st.st_uid}, gid {st.st_gid}; logcleaner runs as uid {uid}, "
                     f"gid {gid})"), mode
    wanted = (("list", 4), ("enter", 1)) if stat.S_ISDIR(st.st_mode) else (("read", 4), ("write", 2))
    missing = [verb for verb, bit in wanted if not bits & bit]
    root = "; logcleaner runs as root without CAP_DAC_OVERRIDE, so the mode applies to it" if uid == 0 else ""
    if missing:
        return f"mode {mode:04o} does not let {who} {' or '.join(missing)} it{root}"
    return (f"mode {mode:04o} lets {who} {' and '.join(v for v, _ in wanted)} it, so something else refuses: "
            "an ACL, a security module (SELinux, AppArmor), an immutable attribute or a parent directory")


def copy_ownership(
    paths: Iterable[str | os.PathLike], reference: os.stat_result, *, fsync_fd: Callable[[int], None]
) -> None:
    """Give each existing file of `paths` the permission bits of `reference` and, as root, its owner and group.

    Requires files the caller created (never links: they are opened with `O_NOFOLLOW`). A file whose
    metadata changed is fsynced through `fsync_fd`, so the change is as durable as its data; files that
    already match are left alone (the usual case: the cleaner runs as the log's owner).
    """
    mode = stat.S_IMODE(reference.st_mode)
    as_root = os.geteuid() == 0
    for path in paths:
        try:
            fd = open_no_follow(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            st = os.fstat(fd)
            changed = False
            if as_root and (st.st_uid, st.st_gid) != (reference.st_uid, reference.st_gid):
                os.fchown(fd, reference.st_uid, reference.st_gid)
                changed = True
            if changed or stat.S_IMODE(st.st_mode) != mode:  # chown clears set-id bits: set the mode after it
                os.fchmod(fd, mode)
                changed = True
            if changed:
                fsync_fd(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class RefusedPath:
    """A path that `find_partition_dirs` does not hand out as a partition, and why.

    `failed`: it is (or looks like) a partition that is refused, which a command counts as a failure;
    otherwise it is simply not a partition, worth a warning.
    """

    path: Path
    reason: str
    failed: bool

    def __str__(self) -> str:
        return f"{display_path(self.path)}: {self.reason}"


def _segment_names(directory: Path) -> tuple[bool, bool]:
    """(holds segment files, holds nothing but files of a partition) of a directory that is not a link.

    The second is true for an empty directory, and for one left with only lock, checkpoint or metadata files
    (`is_partition_file_name`): a partition without segments, as a clean of an empty partition leaves it."""
    names = os.listdir(directory)
    return (any(parse_segment_file_name(n) is not None for n in names),
            all(is_partition_file_name(n) for n in names))


def find_partition_dirs(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[RefusedPath]]:
    """The partition directories named by `paths`, each one a partition or a log dir of them; and what is refused.

    The one discovery rule of every command (`verify`, `audit`, `clean`, `duplication`, `demo`). A path given
    with a valid partition name that holds segment files, or nothing but files of a partition (none at all:
    an empty partition), is a partition. Any other directory is a log dir, which may itself be a symbolic
    link (resolved once); its children are partitions by the same rule. Finding no partition is not an
    error here: an empty but valid log dir simply has none (the commands say so and exit 0). Refused
    as failures: a path with a partition's name that is a link (given, or inside a log dir); a directory
    with an invalid name that holds segment files; a directory that cannot be listed. Refused as warnings:
    other links and other directories with invalid names inside a log dir. Kafka's `-delete`, `-future`
    and `-stray` directories, `lost+found` and plain files are passed over quietly. Nothing is followed
    but a given log dir link. A directory reached twice (named twice, or named and inside a named log dir) is
    taken once, where it is first reached.
    """
    partitions: list[Path] = []
    refused: list[RefusedPath] = []

    def wanted(holds: bool, only_partition_files: bool) -> bool:
        return holds or only_partition_files

    for raw in paths:
        path = Path(raw)
        problem = partition_dir_name_problem(path.name)
        try:
            if os.path.islink(path):
                if problem is None:
                    refused.append(RefusedPath(path, LINK_REFUSED, True))
                    continue
                root = path.resolve()  # a log dir given as a link: the operator's choice, resolved once
            else:
                holds, bare = _segment_names(path)
                if problem is None and wanted(holds, bare):
                    partitions.append(path)
                    continue
                if problem is not None and holds:
                    reason = f"not a partition directory (<topic>-<partition>): {problem}"
                    refused.append(RefusedPath(path, reason, True))
                    continue
                root = path
            with os.scandir(root) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            refused.append(RefusedPath(path, os_error_reason(exc), True))
            continue
        for entry in entries:
            child = root / entry.name
            child_problem = partition_dir_name_problem(entry.name)
            try:
                if entry.is_symlink():
                    refused.append(RefusedPath(child, LINK_REFUSED, child_problem is None))
                    continue
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if child_problem is None:
                    try:
                        holds, bare = _segment_names(child)
                    except PermissionError:
                        holds, bare = True, False  # a partition nobody may list: cleaning it reports why
                    if wanted(holds, bare):
                        partitions.append(child)
                    continue
                if is_known_non_partition_dir(entry.name):
                    continue
                holds, _ = _segment_names(child)
            except OSError as exc:
                refused.append(RefusedPath(child, os_error_reason(exc), False))
                continue
            reason = f"not a partition directory (<topic>-<partition>): {child_problem}"
            refused.append(RefusedPath(child, reason, holds))
    return _once(partitions, _identity), _once(refused, lambda item: (_identity(item.path), item.reason))


def _identity(path: Path) -> object:
    """What tells two spellings of one directory apart from two directories: its device and inode (the link
    itself for a link), else its normalized absolute path."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return os.path.normpath(os.path.abspath(path))
    return (st.st_dev, st.st_ino)


_T = TypeVar("_T")


def _once(items: list[_T], key: Callable[[_T], object]) -> list[_T]:
    """`items` without the later ones whose `key` an earlier one has, in their order."""
    seen: set[object] = set()
    out: list[_T] = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def os_error_reason(exc: OSError) -> str:
    """`describe_os_error` without the path (a `RefusedPath` names it already)."""
    text = describe_os_error(exc)
    prefix = display_path(exc.filename) + ": " if exc.filename is not None else ""
    return text[len(prefix):] if prefix and text.startswith(prefix) else text
