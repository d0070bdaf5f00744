"""Mapped reads (`segments.files.mapped`): the same bytes and scan results as `preadv`, a window the file no longer
covers is read with `preadv` instead (its usual error, never SIGBUS), and only a cleaner-mode log's inactive
segments are mapped, by a round's three phases."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from cleaner.cli import main
from segments.codec.errors import CorruptRecordError
from segments.files import mapped, segment
from segments.partition.log import PartitionLog

from .helpers import write_log

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or mapped._MADV_POPULATE_READ is None,
                                reason="mapped reads need Linux's MADV_POPULATE_READ")


def _results(seg, **kwargs):
    return [(bytes(window), r.start_position, r.end_position, r.offset.tolist(), r.key_pos.tolist(),
             r.value_len.tolist()) for window, r in seg.scan_windows(window_bytes=4096, **kwargs)]


def test_a_mapped_window_is_the_file_s_bytes(tmp_path):
    path = tmp_path / "f"
    data = os.urandom(3 * 4096 + 100)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for position, size in ((0, 1), (5000, 3000), (4096, 4096), (len(data) - 7, 7), (0, len(data))):
            assert bytes(mapped.mapped_window(fd, position, size)) == data[position:position + size]
        assert mapped.mapped_window(fd, len(data) - 7, 8) is None  # past the end of the file
        assert mapped.mapped_window(fd, 0, 0) is None
    finally:
        os.close(fd)


def test_a_window_cut_off_by_a_truncate_is_not_handed_out(tmp_path, monkeypatch):
    """Touching a mapped page past the end of the file kills the process (SIGBUS); a window is populated before
    it is handed out, and one the file no longer covers is not (the caller reads with preadv instead)."""
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * 4096))
    fd = os.open(path, os.O_RDWR)
    real_map = mapped._map

    def map_then_truncate(*args):  # the file shrinks between the mapping and its population
        address = real_map(*args)
        os.ftruncate(fd, 4096)
        return address

    try:
        monkeypatch.setattr(mapped, "_map", map_then_truncate)
        assert mapped.mapped_window(fd, 5000, 3000) is None
        monkeypatch.setattr(mapped, "_map", real_map)
        assert mapped.mapped_window(fd, 5000, 3000) is None  # past the end now: not even mapped
        assert mapped.mapped_window(fd, 100, 3000) is not None
    finally:
        os.close(fd)


def test_a_window_is_read_only_and_unmapped_when_its_last_view_goes(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * 4096))
    unmapped: list[tuple[int, int]] = []
    real_unmap = mapped._unmap
    monkeypatch.setattr(mapped, "_unmap", lambda address, length: (unmapped.append((address, length)),
                                                                   real_unmap(address, length)))
    fd = os.open(path, os.O_RDONLY)
    try:
        window = mapped.mapped_window(fd, 5000, 3000)
        assert window is not None and window.readonly and window.format == "B" and window[0] == path.read_bytes()[5000]
        part = window[10:20]
        del window
        assert unmapped == []  # a slice of it still lives
        assert bytes(part) == path.read_bytes()[5010:5020]
        part.release()
        del part
        assert unmapped == [(unmapped[0][0], 5000 + 3000 - 4096)]  # the pages from the granule holding 5000
    finally:
        os.close(fd)


def test_mapped_scans_equal_copied_scans(tmp_path):
    d = tmp_path / "t-0"
    write_log(d, 600, segment_bytes=64 * 1024, value_bytes=300)
    with PartitionLog.open(d, mode="cleaner") as log:
        inactive = log.segments[:-1]
        assert len(inactive) >= 2
        for seg in inactive:
            assert log.reads_mapped(seg)
            copied = _results(seg)
            assert _results(seg, mapped=True) == copied and len(copied) > 3
        assert not log.reads_mapped(log.segments[-1])
    with PartitionLog.open(d, mode="reader") as log:
        assert not any(log.reads_mapped(seg) for seg in log.segments)


def test_a_segment_truncated_under_a_mapped_walk_gets_the_usual_error(tmp_path):
    d = tmp_path / "t-0"
    write_log(d, 600, segment_bytes=64 * 1024, value_bytes=300)
    with PartitionLog.open(d, mode="cleaner") as log:
        seg = log.segments[0]
        walk = seg.scan_windows(window_bytes=4096, mapped=True)
        next(walk)
        os.truncate(seg.paths.log, 6000)  # what no process may do to a locked partition: an error, not SIGBUS
        with pytest.raises(CorruptRecordError, match="incomplete batch|truncated|torn"):
            for _ in walk:
                pass


def test_a_round_maps_its_inactive_segments_and_nothing_else(tmp_path, monkeypatch):
    d = tmp_path / "t-0"
    write_log(d, 600, segment_bytes=64 * 1024, value_bytes=300)
    with PartitionLog.open(d, mode="reader") as log:
        inactive = sorted(str(s.paths.log) for s in log.segments[:-1])
        active = str(log.segments[-1].paths.log)
    mapped_paths: list[str] = []
    real = mapped.mapped_window

    def spy(fd, position, size):
        if position == 0:  # once per walk of a segment
            mapped_paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd, position, size)

    monkeypatch.setattr(segment, "mapped_window", spy)
    done = CliRunner().invoke(main, ["clean", str(d), "--json", "--now-ms", "1900000000000"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.strip().splitlines()[-1])["records_written"] > 0
    # the survey and the recopy each walk every inactive segment mapped (the index is filled by the survey)
    assert len(inactive) >= 2 and active not in mapped_paths
    assert sorted(set(mapped_paths)) == inactive and all(mapped_paths.count(p) >= 2 for p in inactive)
    mapped_paths.clear()
    assert CliRunner().invoke(main, ["verify", str(d)]).exit_code == 0
    assert mapped_paths == []  # a reader-mode walk copies


@pytest.mark.parametrize("mapped_read", [False, True])
def test_a_segment_cut_mid_walk_is_named_as_changed_not_as_corrupt(tmp_path, mapped_read):
    """A walk that finds bad bytes in a file whose size changed since it began says so, in both read paths
    (a cut mid-page reads as zeros through a mapping, which would otherwise look like corrupt records)."""
    d = tmp_path / "t-0"
    write_log(d, 600, segment_bytes=64 * 1024, value_bytes=300)
    with PartitionLog.open(d, mode="cleaner") as log:
        seg = log.segments[0]
        size = seg.size_bytes
        walk = seg.scan_windows(window_bytes=4096, mapped=mapped_read)
        next(walk)
        os.truncate(seg.paths.log, size // 2 + 123)
        with pytest.raises(CorruptRecordError, match=f"changed size while it was read, from {size} to {size // 2 + 123}"):
            for _ in walk:
                pass
