"""Appends around the page cache (`segments.files.direct`, `LogSegment.write_directly`): the file ends up holding
exactly the bytes appended, whatever their sizes; every direct write is whole aligned blocks; a filesystem that
refuses direct writes gets ordinary ones; and a segment's reads, fsync and close see every appended byte."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from segments.codec.records import Record, encode_batch
from segments.files import direct
from segments.files.direct import ALIGN, STAGE_BYTES, DirectAppender
from segments.files.fileio import FileOps
from segments.files.segment import LogSegment

from .helpers import RecordingOps, in_memory_file_system, resident_pages


def _new_file(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "out.bin"
    return path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)


def _sizes() -> list[int]:
    fixed = [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, STAGE_BYTES - 1, STAGE_BYTES, STAGE_BYTES + 1, 3 * STAGE_BYTES + 17]
    rng = np.random.default_rng(5)
    return fixed + [int(n) for n in rng.integers(0, 3 * ALIGN, 40)] + [int(n) for n in rng.integers(0, 2 * STAGE_BYTES, 6)]


def test_the_file_holds_every_appended_byte_and_each_direct_write_is_whole_aligned_blocks(tmp_path):
    path, fd = _new_file(tmp_path)
    ops = RecordingOps()
    appender = DirectAppender(path, fd, ops)
    assert appender.direct, "this test's filesystem takes no O_DIRECT writes"
    rng = np.random.default_rng(1)
    expected = bytearray()
    try:
        for i, size in enumerate(_sizes()):
            chunk = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            appender.append(chunk)
            expected += chunk
            if i % 7 == 3:  # drained mid-way, appended to again: the partial block is written again, whole
                appender.drain()
                assert os.pread(fd, len(expected) + 10, 0) == bytes(expected)
        appender.drain()
        assert os.pread(fd, len(expected) + 10, 0) == bytes(expected)
    finally:
        appender.close()
        os.close(fd)
    direct = [(position, length) for is_direct, position, length in ops.writes if is_direct]
    assert sum(length for _, length in direct) > len(expected) * 0.9  # nearly everything went around the cache
    assert all(position % ALIGN == 0 and length % ALIGN == 0 for position, length in direct)
    assert all(length <= STAGE_BYTES for _, length in direct)
    ordinary = [(position, length) for is_direct, position, length in ops.writes if not is_direct]
    assert all(length < ALIGN and position % ALIGN == 0 for position, length in ordinary)  # the partial blocks only


def test_a_direct_write_the_filesystem_refuses_is_made_again_through_the_page_cache_and_so_are_the_later_ones(
        tmp_path):
    path, fd = _new_file(tmp_path)
    ops = RecordingOps(refuse=errno.EINVAL)
    appender = DirectAppender(path, fd, ops)
    data = np.random.default_rng(2).integers(0, 256, 3 * STAGE_BYTES + 5, dtype=np.uint8).tobytes()
    try:
        appender.append(data)
        assert not appender.direct
        appender.drain()
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        appender.close()
        os.close(fd)
    assert [w[0] for w in ops.writes].count(True) == 1  # one refusal, then ordinary writes only


def test_another_error_of_a_direct_write_is_raised_naming_the_file(tmp_path):
    path, fd = _new_file(tmp_path)

    class FullDisk(FileOps):
        def pwrite_all(self, fd, data, position) -> None:
            raise OSError(errno.ENOSPC, "No space left on device", os.readlink(f"/proc/self/fd/{fd}"))

    appender = DirectAppender(path, fd, FullDisk())
    try:
        with pytest.raises(OSError) as caught:
            appender.append(bytes(STAGE_BYTES))
        assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    finally:
        appender.close()
        os.close(fd)


def test_no_direct_writes_when_the_path_names_another_file_than_the_open_one(tmp_path):
    path, fd = _new_file(tmp_path)
    os.rename(path, tmp_path / "moved.bin")
    path.write_bytes(b"")  # someone else's file now has the name
    ops = RecordingOps()
    appender = DirectAppender(path, fd, ops)
    try:
        assert not appender.direct
        appender.append(bytes(range(256)) * 40)
        appender.drain()
    finally:
        appender.close()
        os.close(fd)
    assert not any(w[0] for w in ops.writes)
    assert (tmp_path / "moved.bin").read_bytes() == bytes(range(256)) * 40 and path.read_bytes() == b""


def test_direct_appends_start_only_at_an_empty_file(tmp_path):
    path, fd = _new_file(tmp_path)
    os.write(fd, b"x")
    try:
        with pytest.raises(ValueError, match="empty file"):
            DirectAppender(path, fd, FileOps())
    finally:
        os.close(fd)


def _batches(count: int, value_bytes: int, first: int = 0) -> list[tuple[bytes, int, int]]:
    """(batch bytes, last offset, max timestamp) of `count` one-record batches at offsets first, first + 1, ..."""
    out = []
    for offset in range(first, first + count):
        value = bytes([offset % 251]) * value_bytes
        data = encode_batch([Record(offset=offset, timestamp=1000 + offset, key=b"k%d" % offset, value=value)],
                            base_offset=offset)
        out.append((data, offset, 1000 + offset))
    return out


def _append(segment: LogSegment, batches: list[tuple[bytes, int, int]]) -> None:
    data = b"".join(b for b, _, _ in batches)
    positions = np.cumsum([0] + [len(b) for b, _, _ in batches[:-1]])
    segment.append_batches(data, positions, np.array([o for _, o, _ in batches]), np.array([t for _, _, t in batches]))


def test_a_segment_written_directly_reads_back_every_batch_before_its_fsync(tmp_path):
    segment = LogSegment(tmp_path, 0, suffix=".cleaned", writable=True, create=True)
    assert segment.write_directly()
    batches = _batches(300, 5000)  # ~1.5 MB: whole stages, then a partial block
    _append(segment, batches[:200])
    _append(segment, batches[200:])
    expected = b"".join(b for b, _, _ in batches)
    assert segment.size_bytes == len(expected)
    assert segment.pread(0, len(expected)) == expected  # a read sees what is still staged
    assert [pos for pos, _ in segment.iter_headers()] == list(np.cumsum([0] + [len(b) for b, _, _ in batches[:-1]]))
    assert sum(result.n_batches for _, result in segment.scan_windows()) == 300
    segment.finalise()
    segment.close()
    reopened = LogSegment(tmp_path, 0, suffix=".cleaned")
    try:
        assert [batch.records[0].offset for _, batch in reopened.batches()] == list(range(300))
    finally:
        reopened.close()


def test_a_segment_closed_without_its_fsync_gets_every_byte_and_one_deleted_with_bytes_staged_is_gone(tmp_path):
    kept = LogSegment(tmp_path, 0, suffix=".cleaned", writable=True, create=True)
    kept.write_directly()
    batches = _batches(50, 3000)
    _append(kept, batches)
    kept.close()
    if not in_memory_file_system(tmp_path):  # (on tmpfs every page of a file is in memory)
        resident, pages = resident_pages(kept.paths.log)
        assert pages > 30 and resident <= 1  # around the page cache: only the partial last block went through it
    assert kept.paths.log.read_bytes() == b"".join(b for b, _, _ in batches)
    dropped = LogSegment(tmp_path, 1000, suffix=".cleaned", writable=True, create=True)
    dropped.write_directly()
    _append(dropped, _batches(1, 10, first=1000))  # under a block: staged, not yet in the file
    dropped.delete_files()
    assert not any(path.exists() for path in dropped.paths.all())


def test_a_filesystem_that_refuses_direct_io_is_reported_once_as_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(direct, "_refused_on", set())
    for name in ("a.bin", "b.bin"):
        path = tmp_path / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        appender = DirectAppender(path, fd, RecordingOps(refuse=errno.EINVAL))
        try:
            with caplog.at_level("WARNING", logger=direct.__name__):
                appender.append(bytes(STAGE_BYTES))
                appender.drain()
        finally:
            appender.close()
            os.close(fd)
        assert path.read_bytes() == bytes(STAGE_BYTES)
    warnings = [r.getMessage() for r in caplog.records if r.name == direct.__name__]
    assert len(warnings) == 1, warnings  # once per filesystem and process
    assert str(tmp_path / "a.bin") in warnings[0] and "refuses direct I/O" in warnings[0]
    assert "log.cleaner.io.direct=false" in warnings[0]


def test_a_segment_cut_back_while_written_directly_takes_later_appends_after_the_cut(tmp_path):
    segment = LogSegment(tmp_path, 0, suffix=".cleaned", writable=True, create=True)
    segment.write_directly()
    batches = _batches(40, 3000)
    _append(segment, batches[:30])
    segment.truncate_to(20)  # the last 10 batches go; what the appender staged of them must not come back
    _append(segment, batches[20:])
    segment.close()
    kept = LogSegment(tmp_path, 0, suffix=".cleaned")
    try:
        assert [batch.records[0].offset for _, batch in kept.batches()] == list(range(40))
        assert kept.paths.log.read_bytes() == b"".join(b for b, _, _ in batches)
    finally:
        kept.close()
