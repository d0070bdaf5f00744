"""Checkpoint files: exact bytes, round trips, rejection with line numbers, and the tmp-then-rename discipline."""

from __future__ import annotations

import base64
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segments.codec.errors import CheckpointError
from segments.files.fileio import FileOps
from segments.partition import checkpoint as cp

from ..kafka_fixtures import KAFKA_FIXTURES

SPEC_EXAMPLE = b"0\n2\nmy-topic 0 1234\nmy-topic 1 99\n"


class RecordingFileOps(FileOps):
    """Real operations, recording each call and, at the fsync of the tmp file, what the tmp file holds."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def fsync_fd(self, fd):
        # The fd is write-only; read what it holds through its path (Linux).
        tmp = Path(os.readlink(f"/proc/self/fd/{fd}"))
        self.calls.append(("fsync_fd", tmp.name, tmp.read_bytes()))
        super().fsync_fd(fd)

    def rename(self, src, dst):
        self.calls.append(("rename", Path(src).name, Path(dst).name))
        super().rename(src, dst)

    def fsync_dir(self, path):
        self.calls.append(("fsync_dir", Path(path)))
        super().fsync_dir(path)


class CrashBeforeRename(FileOps):
    """Writes and fsyncs the tmp file, then 'crashes' instead of renaming it."""

    def rename(self, src, dst):
        raise OSError("injected crash before rename")


class CrashAtFsync(FileOps):
    def fsync_fd(self, fd):
        raise OSError("injected crash at fsync")


# ---- exact bytes and round trips -------------------------------------------------------------------------------


def test_writer_produces_the_spec_example_bytes(tmp_path):
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    cp.write_offset_checkpoint(path, {("my-topic", 1): 99, ("my-topic", 0): 1234})
    assert path.read_bytes() == SPEC_EXAMPLE
    assert cp.read_offset_checkpoint(path) == {("my-topic", 0): 1234, ("my-topic", 1): 99}


def test_entries_are_sorted_by_topic_then_numeric_partition():
    data = cp.encode_offset_checkpoint({("b", 10): 1, ("b", 2): 2, ("a-x", 0): 3, ("a.x", 0): 4})
    assert data == b"0\n4\na-x 0 3\na.x 0 4\nb 2 2\nb 10 1\n"


def test_empty_checkpoint_is_version_and_zero_count():
    assert cp.encode_offset_checkpoint({}) == b"0\n0\n"
    assert cp.decode_offset_checkpoint(b"0\n0\n") == {}


topics = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    entries=st.dictionaries(
        st.tuples(topics, st.integers(0, 2**31 - 1)), st.integers(-(2**63), 2**63 - 1), max_size=50
    )
)
def test_offset_checkpoint_round_trips(entries):
    data = cp.encode_offset_checkpoint(entries)
    assert cp.decode_offset_checkpoint(data) == entries
    assert data.count(b"\n") == len(entries) + 2
    assert data.split(b"\n")[1] == str(len(entries)).encode()  # the count line equals the entries


def test_many_partitions_with_dashes_and_dots_round_trip_through_files(tmp_path):
    entries = {(f"topic.{t}-with-dash_{t % 3}", p): t * 1000 + p for t in range(40) for p in range(50)}
    path = tmp_path / cp.RECOVERY_POINT_CHECKPOINT
    cp.write_offset_checkpoint(path, entries)
    assert cp.read_offset_checkpoint(path) == entries


def test_reader_splits_on_any_whitespace_and_accepts_crlf():
    assert cp.decode_offset_checkpoint(b"0\r\n1\r\nmy-topic\t3   42\r\n") == {("my-topic", 3): 42}


def test_missing_or_empty_file_reads_as_no_entries(tmp_path):
    assert cp.read_offset_checkpoint(tmp_path / "nope") == {}
    (tmp_path / "empty").write_bytes(b"")
    assert cp.read_offset_checkpoint(tmp_path / "empty") == {}
    assert cp.read_leader_epoch_checkpoint(tmp_path / "nope") == []


# ---- rejections --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, line, words",
    [
        (b"1\n0\n", 1, "expected version 0, found 1"),
        (b"x\n0\n", 1, "decimal integer"),
        (b"0\nfour\n", 2, "entry count"),
        (b"0\n-1\n", 2, "entry count"),
        (b"0\n3\nt 0 1\nt 1 2\n", 5, "expected 3 entries, found 2"),
        (b"0\n1\nt 0 1\nt 1 2\n", 4, "expected 1 entries, found 2"),
        (b"0\n2\nt 0 1\nt 1\n", 4, "expected 3 fields"),
        (b"0\n2\nt 0 1\n\nt 1 2\n", 4, "expected 3 fields"),
        (b"0\n1\nt 0 1 9\n", 3, "expected 3 fields"),
        (b"0\n1\nt zero 1\n", 3, "the partition"),
        (b"0\n1\nt -1 1\n", 3, "the partition -1 is outside"),
        (b"0\n1\nt 0 1_000\n", 3, "the offset"),
        (b"0\n1\nt 0 9223372036854775808\n", 3, "outside"),
        (b"0\n3\nt 0 1\nu 0 2\nt 0 3\n", 5, "t-0 is listed twice"),
        (b"0\n1\nt\xff 0 1\n", 3, "not UTF-8"),
    ],
)
def test_malformed_offset_checkpoints_are_rejected_with_their_line(tmp_path, data, line, words):
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        cp.read_offset_checkpoint(path)
    assert info.value.line == line
    assert words in info.value.reason
    assert info.value.path == str(path) and f"line {line}" in str(info.value)


def test_checkpoint_above_the_size_limit_is_rejected_as_a_whole(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"0\n1\nt 0 1\n" + b" " * 100)
    with pytest.raises(CheckpointError) as info:
        cp.read_offset_checkpoint(path, checkpoint_bytes_max=50)
    assert info.value.line == 0


@pytest.mark.parametrize(
    "entries",
    [{("has space", 0): 1}, {("", 0): 1}, {("t", -1): 1}, {("t", True): 1}, {("t", 0): 2**63}, {("t\n", 0): 1}],
)
def test_writer_rejects_entries_that_cannot_be_read_back(tmp_path, entries):
    path = tmp_path / "cp"
    with pytest.raises(ValueError):
        cp.write_offset_checkpoint(path, entries)
    assert not path.exists() and not (tmp_path / "cp.tmp").exists()


# ---- the tmp-then-rename discipline -------------------------------------------------------------------------------


def test_write_goes_to_tmp_then_fsync_then_rename_then_directory_fsync(tmp_path):
    ops = RecordingFileOps()
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    cp.write_offset_checkpoint(path, {("my-topic", 0): 1234, ("my-topic", 1): 99}, file_ops=ops)
    assert ops.calls == [
        ("fsync_fd", "cleaner-offset-checkpoint.tmp", SPEC_EXAMPLE),
        ("rename", "cleaner-offset-checkpoint.tmp", "cleaner-offset-checkpoint"),
        ("fsync_dir", tmp_path),
    ]
    assert not (tmp_path / "cleaner-offset-checkpoint.tmp").exists()


@pytest.mark.parametrize("ops", [CrashBeforeRename(), CrashAtFsync()], ids=["before-rename", "at-fsync"])
def test_a_crash_during_the_write_leaves_the_old_checkpoint_intact(tmp_path, ops):
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    cp.write_offset_checkpoint(path, {("my-topic", 0): 1234, ("my-topic", 1): 99})
    with pytest.raises(OSError, match="injected"):
        cp.write_offset_checkpoint(path, {("my-topic", 0): 5000}, file_ops=ops)
    assert path.read_bytes() == SPEC_EXAMPLE
    assert cp.read_offset_checkpoint(path) == {("my-topic", 0): 1234, ("my-topic", 1): 99}


def test_update_removes_then_sets_and_writes_atomically(tmp_path):
    ops = RecordingFileOps()
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    cp.write_offset_checkpoint(path, {("a", 0): 1, ("a", 1): 2, ("b", 0): 3})
    written = cp.update_offset_checkpoint(
        path, {("a", 1): 20, ("c", 0): 30}, removals=[("b", 0), ("a", 1), ("zz", 9)], file_ops=ops
    )
    assert written == {("a", 0): 1, ("a", 1): 20, ("c", 0): 30}
    assert cp.read_offset_checkpoint(path) == written
    assert [c[0] for c in ops.calls] == ["fsync_fd", "rename", "fsync_dir"]


def test_update_creates_a_missing_checkpoint(tmp_path):
    path = tmp_path / cp.LOG_START_OFFSET_CHECKPOINT
    cp.update_offset_checkpoint(path, {("t", 0): 7})
    assert path.read_bytes() == b"0\n1\nt 0 7\n"


def test_update_of_a_corrupt_checkpoint_raises_and_writes_nothing(tmp_path):
    path = tmp_path / cp.CLEANER_OFFSET_CHECKPOINT
    path.write_bytes(b"0\n2\nt 0 1\n")
    with pytest.raises(CheckpointError):
        cp.update_offset_checkpoint(path, {("t", 1): 5})
    assert path.read_bytes() == b"0\n2\nt 0 1\n"


# ---- leader epochs -------------------------------------------------------------------------------------------------


def test_kafka_written_leader_epoch_checkpoint_reads():
    assert cp.read_leader_epoch_checkpoint(KAFKA_FIXTURES / "kafka-2.4-c2" / "raw" / cp.LEADER_EPOCH_CHECKPOINT) == [(0, 0)]


@settings(max_examples=100, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=30))
def test_leader_epoch_checkpoint_round_trips_in_order(entries):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / cp.LEADER_EPOCH_CHECKPOINT
        cp.write_leader_epoch_checkpoint(path, entries)
        assert cp.read_leader_epoch_checkpoint(path) == entries
        assert path.read_bytes().startswith(b"0\n%d\n" % len(entries))


@pytest.mark.parametrize(
    "data, line", [(b"0\n1\n0 0 0\n", 3), (b"0\n2\n0 0\n", 4), (b"1\n0\n", 1), (b"0\n1\n0 x\n", 3)]
)
def test_malformed_leader_epoch_checkpoints_are_rejected_with_their_line(data, line):
    with pytest.raises(CheckpointError) as info:
        cp.decode_leader_epoch_checkpoint(data, path="leader-epoch-checkpoint")
    assert info.value.line == line


# ---- partition.metadata ---------------------------------------------------------------------------------------------


def _topic_id(u: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()


@pytest.mark.parametrize("tail", [b"", b"\n"])
def test_partition_metadata_parses_version_and_topic_id(tmp_path, tail):
    u = uuid.UUID("1f4a8c2e-9b3d-4e5f-8a6b-7c8d9e0f1a2b")
    path = tmp_path / cp.PARTITION_METADATA_FILE
    path.write_bytes(b"version: 0\ntopic_id: " + _topic_id(u).encode() + tail)
    meta = cp.read_partition_metadata(path)
    assert meta == cp.PartitionMetadata(0, _topic_id(u))
    assert meta.topic_id_bytes == u.bytes


def test_missing_partition_metadata_is_none(tmp_path):
    assert cp.read_partition_metadata(tmp_path / cp.PARTITION_METADATA_FILE) is None


@pytest.mark.parametrize(
    "data, line",
    [
        (b"version: 1\ntopic_id: cXVpY2sgYnJvd24gZm94IQ\n", 1),
        (b"version 0\ntopic_id: cXVpY2sgYnJvd24gZm94IQ\n", 1),
        (b"version: 0\n", 2),
        (b"version: 0\ntopic_id: not-a-uuid\n", 2),
        (b"version: 0\ntopic-id: cXVpY2sgYnJvd24gZm94IQ\n", 2),
        (b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n", 2),
        (b"version: 0\ntopic_id: cXVpY2sgYnJvd24gZm94IQ\nextra\n", 3),
    ],
)
def test_malformed_partition_metadata_is_rejected_with_its_line(data, line):
    with pytest.raises(CheckpointError) as info:
        cp.decode_partition_metadata(data, path="partition.metadata")
    assert info.value.line == line


def test_standard_file_names():
    assert (
        cp.CLEANER_OFFSET_CHECKPOINT,
        cp.RECOVERY_POINT_CHECKPOINT,
        cp.REPLICATION_OFFSET_CHECKPOINT,
        cp.LOG_START_OFFSET_CHECKPOINT,
        cp.LEADER_EPOCH_CHECKPOINT,
    ) == (
        "cleaner-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "replication-offset-checkpoint",
        "log-start-offset-checkpoint",
        "leader-epoch-checkpoint",
    )


# ---- the parsed checkpoint kept per path (issue 19: a log dir of many partitions) ---------------------------------


def test_an_update_parses_the_file_only_when_its_bytes_changed_and_writes_what_a_full_encode_would(tmp_path,
                                                                                                     monkeypatch):
    path = tmp_path / "cleaner-offset-checkpoint"
    cp.write_offset_checkpoint(path, {("t", p): 7 for p in range(100)})
    parses = []
    decode = cp.decode_offset_checkpoint
    monkeypatch.setattr(cp, "decode_offset_checkpoint", lambda data, **kw: parses.append(1) or decode(data, **kw))
    model = {("t", p): 7 for p in range(100)}
    for p in range(100, 0, -7):
        cp.update_offset_checkpoint(path, {("t", p): p, ("u", p): 1}, removals=[("t", p + 1)])
        model.pop(("t", p + 1), None)
        model.update({("t", p): p, ("u", p): 1})
        assert path.read_bytes() == cp.encode_offset_checkpoint(model)
        assert cp.read_offset_checkpoint(path) == model
    assert len(parses) == 1  # the file as first found; every later read found the bytes this process wrote
    # someone else rewrites it (another process, an operator): it is parsed again, and the update starts from it
    path.write_bytes(b"0\n2\nt  3  30\r\nv 1 10\n")
    cp.update_offset_checkpoint(path, {("w", 0): 5})
    assert len(parses) == 2
    assert path.read_bytes() == b"0\n3\nt 3 30\nv 1 10\nw 0 5\n"


def test_random_updates_over_foreign_rewrites_always_leave_the_canonical_bytes(tmp_path):
    import random

    path = tmp_path / "checkpoint"
    rng = random.Random(19)
    topics = ["a", "ab", "a.b", "b", "b-1", "t_x"]
    model: dict = {}
    for _ in range(1500):
        if rng.random() < 0.05:  # a rewrite by someone else, in a form of the grammar that is not ours
            model = {(rng.choice(topics), rng.randrange(30)): rng.randrange(10**12) for _ in range(rng.randrange(5))}
            path.write_bytes(cp.encode_offset_checkpoint(model).replace(b" ", b"  "))
        updates = {(rng.choice(topics), rng.randrange(30)): rng.randrange(10**12) for _ in range(rng.randrange(3))}
        removals = [(rng.choice(topics), rng.randrange(30)) for _ in range(rng.randrange(2))]
        for key in removals:
            model.pop(key, None)
        model.update(updates)
        assert cp.update_offset_checkpoint(path, updates, removals) == model
        assert path.read_bytes() == cp.encode_offset_checkpoint(model)


def test_two_threads_updating_one_checkpoint_at_once_lose_neither_update(tmp_path, monkeypatch):
    """Two cleaner threads finish rounds of two partitions of one log dir at the same moment: each reads the
    file, then updates it. A read taken outside the cache's lock, before the other thread's write, would be
    taken as the newer content: the other partition's checkpoint lost (and that partition cleaned again)."""
    from segments.partition import checkpoint as module

    path = tmp_path / "cleaner-offset-checkpoint"
    module.update_offset_checkpoint(path, {("t", 0): 1, ("t", 1): 1})
    real_read = module._read_limited
    slow = threading.Event()

    def read_then_pause(p, bytes_max):
        data = real_read(p, bytes_max)
        if threading.current_thread().name == "slow" and not slow.is_set():
            slow.set()
            time.sleep(0.2)  # the other thread's update runs now, unless this read holds the cache's lock
        return data

    monkeypatch.setattr(module, "_read_limited", read_then_pause)
    first = threading.Thread(target=module.update_offset_checkpoint, args=(path, {("t", 0): 100}), name="slow")
    first.start()
    assert slow.wait(5)
    second = threading.Thread(target=module.update_offset_checkpoint, args=(path, {("t", 1): 200}))
    second.start()
    first.join(5)
    second.join(5)
    assert module.read_offset_checkpoint(path) == {("t", 0): 100, ("t", 1): 200}
    assert dict(module.cached_offset_checkpoint(path)[0]) == {("t", 0): 100, ("t", 1): 200}
