"""Staged pieces and the ordered commit of a bulk write: order, append, overwrite, partition count, cleanup."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pyarrow as pa
import pytest

from segments.codec.errors import LockTimeoutError, LogStateError
from segments.partition.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
)
from segments.partition.locks import WRITER_LOCK, PartitionLock
from segments.partition.log import LogConfig, PartitionLog, update_log_dir_checkpoint
from segments.spark.arrow_records import encode_table
from segments.spark.bulk_write import (
    STAGING_PREFIX,
    PieceWriter,
    commit_job,
    new_job_id,
    staging_dir,
)
from segments.tools.verify import verify_paths

from .helpers import read_all

TS0 = 1_700_000_000_000


def _stage(log_dir, job, task, rows, partitions, *, attempt=0, per_batch=3):
    """Stage `rows` [(key, value)] of one task; a row's partition is int(key) % partitions."""
    keys = pa.array([k for k, _ in rows])
    values = pa.array([v for _, v in rows])
    parts = np.array([int(k) % partitions for k, _ in rows], dtype=np.int32)
    encoded = encode_table(keys, values, np.arange(len(rows)) + TS0, parts, records_per_batch=per_batch)
    writer = PieceWriter(log_dir, job, task, attempt)
    writer.append(encoded.data, encoded.records)
    return writer.finish()


def _kv(directory):
    return [(k, v) for _, k, v, _ in read_all(directory)]


def test_commit_appends_pieces_in_task_order_and_leaves_verifiable_partitions(tmp_path):
    job = new_job_id()
    tasks = {t: [(b"%d" % i, b"t%d-%d" % (t, i)) for i in range(t, 30, 2)] for t in (2, 0, 1)}
    pieces = [p for t, rows in tasks.items() for p in _stage(tmp_path, job, t, rows, 3)]
    summary = commit_job(tmp_path, job, "orders", 3, pieces, config=LogConfig(segment_bytes=300))
    assert summary.total_records == sum(len(r) for r in tasks.values())
    for p in range(3):
        expected = [(k, v) for t in sorted(tasks) for k, v in tasks[t] if int(k) % 3 == p]
        assert _kv(tmp_path / f"orders-{p}") == expected
        with PartitionLog.open(tmp_path / f"orders-{p}", mode="reader") as plog:
            assert len(plog.segments) > 2  # rolled at segment.bytes
            assert plog.active_segment.size_bytes == 0  # everything written is cleanable
            assert summary.log_end_offset[p] == plog.log_end_offset == len(expected)
    assert not verify_paths([tmp_path]).problems
    assert not staging_dir(tmp_path, job).exists()
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT)[("orders", 1)] == summary.log_end_offset[1]


def test_only_the_attempts_named_in_the_commit_are_used(tmp_path):
    job = new_job_id()
    _stage(tmp_path, job, 0, [(b"1", b"failed attempt")], 1, attempt=0)
    good = _stage(tmp_path, job, 0, [(b"1", b"retry")], 1, attempt=1)
    commit_job(tmp_path, job, "t", 1, good)
    assert _kv(tmp_path / "t-0") == [(b"1", b"retry")]


def test_append_goes_after_the_log_end_and_keeps_existing_records(tmp_path):
    first = new_job_id()
    commit_job(tmp_path, first, "t", 2, _stage(tmp_path, first, 0, [(b"%d" % i, b"a") for i in range(10)], 2))
    update_log_dir_checkpoint(tmp_path, "replication-offset-checkpoint", ("t", 0), 5)
    second = new_job_id()
    summary = commit_job(tmp_path, second, "t", 2, _stage(tmp_path, second, 0, [(b"%d" % i, b"b") for i in range(4)], 2))
    rows = read_all(tmp_path / "t-0")
    assert [o for o, *_ in rows] == list(range(7))
    assert [v for _, _, v, _ in rows] == [b"a"] * 5 + [b"b"] * 2
    assert summary.log_end_offset == {0: 7, 1: 7}
    hw = read_offset_checkpoint(tmp_path / "replication-offset-checkpoint")
    assert hw[("t", 0)] == 7  # the high watermark on record moved to the new log end


def test_a_topic_another_job_creates_meanwhile_is_appended_to_not_replaced(tmp_path, monkeypatch):
    # two ingests of a new topic at once: the second one's commit finds the partitions it built made by the
    # first (between its look and its move into place) and appends after them; nothing is lost
    import segments.spark.bulk_write as bulk_write

    first, second = new_job_id(), new_job_id()
    first_pieces = _stage(tmp_path, first, 0, [(b"%d" % i, b"a") for i in range(6)], 2)
    second_pieces = _stage(tmp_path, second, 0, [(b"%d" % i, b"b") for i in range(4)], 2)
    build = bulk_write._build_partition
    started = []

    def build_then_let_the_other_job_commit(staging, *args):
        built = build(staging, *args)
        if second in staging.name and not started:
            started.append(True)
            commit_job(tmp_path, first, "t", 2, first_pieces)
        return built

    monkeypatch.setattr(bulk_write, "_build_partition", build_then_let_the_other_job_commit)
    summary = commit_job(tmp_path, second, "t", 2, second_pieces)
    assert [v for _, v in _kv(tmp_path / "t-0")] == [b"a"] * 3 + [b"b"] * 2
    assert [v for _, v in _kv(tmp_path / "t-1")] == [b"a"] * 3 + [b"b"] * 2
    assert summary.records == {0: 2, 1: 2} and summary.log_end_offset == {0: 5, 1: 5}
    assert not verify_paths([tmp_path]).problems


def test_empty_partitions_exist_after_a_commit(tmp_path):
    job = new_job_id()
    commit_job(tmp_path, job, "t", 4, _stage(tmp_path, job, 0, [(b"0", b"x")], 4))
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["t-0", "t-1", "t-2", "t-3"]
    assert read_all(tmp_path / "t-3") == []
    assert not verify_paths([tmp_path]).problems


def test_a_different_partition_count_is_refused_on_append(tmp_path):
    job = new_job_id()
    commit_job(tmp_path, job, "t", 2, _stage(tmp_path, job, 0, [(b"0", b"x")], 2))
    job = new_job_id()
    with pytest.raises(LogStateError, match=r"has partitions \[0, 1\]; appending with 3"):
        commit_job(tmp_path, job, "t", 3, _stage(tmp_path, job, 0, [(b"0", b"x")], 3))
    assert not any(p.name.startswith(STAGING_PREFIX) for p in tmp_path.iterdir())


def test_overwrite_replaces_the_topic_and_resets_its_checkpoints(tmp_path):
    job = new_job_id()
    commit_job(tmp_path, job, "t", 3, _stage(tmp_path, job, 0, [(b"%d" % i, b"old") for i in range(9)], 3))
    assert not (tmp_path / CLEANER_OFFSET_CHECKPOINT).exists()  # a new topic has no entry to remove
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT)[("t", 2)] == 3
    job = new_job_id()
    commit_job(tmp_path, job, "other", 1, _stage(tmp_path, job, 0, [(b"1", b"keep")], 1))
    update_log_dir_checkpoint(tmp_path, CLEANER_OFFSET_CHECKPOINT, ("t", 0), 3)
    old_inode = os.stat(tmp_path / "t-0").st_ino
    job = new_job_id()
    commit_job(tmp_path, job, "t", 2, _stage(tmp_path, job, 0, [(b"%d" % i, b"new") for i in range(4)], 2), overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["other-0", "t-0", "t-1"]
    assert _kv(tmp_path / "t-0") == [(b"0", b"new"), (b"2", b"new")]
    assert os.stat(tmp_path / "t-0").st_ino != old_inode
    assert _kv(tmp_path / "other-0") == [(b"1", b"keep")]
    assert ("t", 0) not in read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    assert ("t", 2) not in read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT)  # the removed partition
    assert not verify_paths([tmp_path]).problems


def test_append_waits_for_and_respects_the_writer_lock(tmp_path, monkeypatch):
    import segments.spark.bulk_write as bulk

    job = new_job_id()
    commit_job(tmp_path, job, "t", 1, _stage(tmp_path, job, 0, [(b"0", b"x")], 1))
    monkeypatch.setattr(bulk, "_LOCK_TIMEOUT_S", 0.2)
    job = new_job_id()
    pieces = _stage(tmp_path, job, 0, [(b"0", b"y")], 1)
    with PartitionLock(tmp_path / "t-0", WRITER_LOCK).acquire():
        with pytest.raises(LockTimeoutError):
            commit_job(tmp_path, job, "t", 1, pieces)
    assert _kv(tmp_path / "t-0") == [(b"0", b"x")]


def test_a_torn_piece_is_reported_and_the_partition_left_alone(tmp_path):
    job = new_job_id()
    commit_job(tmp_path, job, "t", 1, _stage(tmp_path, job, 0, [(b"0", b"x")], 1))
    job = new_job_id()
    (piece,) = _stage(tmp_path, job, 0, [(b"0", b"y"), (b"1", b"z")], 1, per_batch=1)
    with open(piece.path, "r+b") as f:
        f.truncate(os.path.getsize(piece.path) - 3)
    with pytest.raises(LogStateError, match="its task wrote"):
        commit_job(tmp_path, job, "t", 1, [piece])
    job = new_job_id()
    (piece,) = _stage(tmp_path, job, 0, [(b"0", b"y"), (b"1", b"z")], 1, per_batch=1)
    with open(piece.path, "r+b") as f:
        f.truncate(os.path.getsize(piece.path) - 3)
    torn = dataclasses.replace(piece, bytes=piece.bytes - 3)
    with pytest.raises(LogStateError, match="incomplete or invalid batch at position"):
        commit_job(tmp_path, job, "t", 1, [torn])
    assert _kv(tmp_path / "t-0") == [(b"0", b"x")]
    assert not staging_dir(tmp_path, job).exists()


def test_an_aborted_job_removes_the_log_dir_it_created_with_the_commits_lock_files(tmp_path):
    from segments.partition.locks import KAFKA_LOCK
    from segments.partition.log import CHECKPOINT_LOCK
    from segments.spark.bulk_write import abort_job, missing_dirs

    log_dir = tmp_path / "a" / "logs"
    created = missing_dirs(log_dir)
    staging_dir(log_dir, "job").mkdir(parents=True)
    for name in (KAFKA_LOCK, CHECKPOINT_LOCK):  # what a commit that failed leaves
        (log_dir / name).touch()
    abort_job(log_dir, "job", created_dirs=created)
    assert list(tmp_path.iterdir()) == []

    kept = tmp_path / "kept"  # a log dir that was there, or that holds anything else, stays
    (kept / "t-0").mkdir(parents=True)
    (kept / KAFKA_LOCK).touch()
    abort_job(kept, "job", created_dirs=(str(kept),))
    assert sorted(e.name for e in kept.iterdir()) == [KAFKA_LOCK, "t-0"]


def test_a_task_that_starts_after_an_abort_does_not_make_the_staging_directory_again(tmp_path):
    with pytest.raises(FileNotFoundError):
        PieceWriter(tmp_path, "job", 0, 0, staging_made=True)
    assert list(tmp_path.iterdir()) == []


def test_staging_directories_are_no_partition_worth_a_warning(tmp_path):
    from segments.files.pathcheck import find_partition_dirs, is_known_non_partition_dir

    assert is_known_non_partition_dir(staging_dir(tmp_path, new_job_id()).name)
    assert not is_known_non_partition_dir(".logsegments-staging-x")
    staging_dir(tmp_path, "job").mkdir()
    (tmp_path / "t-0").mkdir()
    partitions, refused = find_partition_dirs([tmp_path])
    assert [p.name for p in partitions] == ["t-0"] and refused == []
