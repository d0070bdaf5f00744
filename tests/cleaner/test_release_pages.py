"""A round frees the page cache of the segments it replaces while it goes on (`BackgroundRemover.release`).

The recopy hands each old segment to the log's remover once it has read it to its end; the remover drops its
cached pages (`posix_fadvise(DONTNEED)`). Checked: the pages really go (counted with `mincore(2)`) and the
file's bytes stay; a round releases exactly the segments it recopied, each after its last read and before the
swap removes it; a dry run and a verified round (which reads the group once more) release nothing; the files
a round leaves are the same with a remover as without.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import threading

import numpy as np
import pytest

from cleaner.round import clean_round
from cleaner.settings import Settings
from offsetmap import OffsetMap
from segments.files.fileio import BackgroundRemover
from segments.partition.log import PartitionLog

from .builders import BIG_MAP_BYTES, DAY_MS, T0, TOPIC, file_digests, partition_dir, random_log

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]


def resident_pages(path) -> int:
    """How many of the file's pages are in the page cache (mincore of a read-only mapping)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(m, dtype=np.uint8)  # a read-only map exports no writable buffer: numpy gives its address
        try:
            if _libc.mincore(view.ctypes.data, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del view
        return sum(v & 1 for v in vec)


def test_release_drops_the_files_cached_pages_and_keeps_its_bytes(tmp_path):
    path = tmp_path / "segment.log"
    data = os.urandom(4 << 20)
    path.write_bytes(data)
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # clean pages: DONTNEED leaves dirty ones to writeback
        assert f.read() == data
    assert resident_pages(path) > 0
    remover = BackgroundRemover()
    remover.release(path)
    remover.release(tmp_path / "gone.log")  # a file already gone is no error
    remover.drain()
    assert resident_pages(path) == 0
    assert path.read_bytes() == data


class RecordingRemover(BackgroundRemover):
    """The real remover, noting each release (file name, the asking thread, whether the file still existed) and
    each removal, in the order asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, str, str, bool]] = []

    def release(self, path) -> None:
        self.asked.append(("release", path.name, threading.current_thread().name, path.exists()))
        super().release(path)

    def remove(self, paths) -> None:
        self.asked.extend(("remove", path.name, threading.current_thread().name, path.exists()) for path in paths)
        super().remove(paths)

    def released(self) -> list[str]:
        return [name for what, name, _, _ in self.asked if what == "release"]


def _round(directory, remover, **kwargs):
    topic = Settings.from_mappings({"delete.retention.ms": DAY_MS}).topic(TOPIC)
    with PartitionLog.open(directory, mode="cleaner", remover=remover) as log:
        before = [s.paths.log.name for s in log.segments]
        result = clean_round(log, topic, OffsetMap(BIG_MAP_BYTES), now_ms=T0 + 2 * DAY_MS, seed=7, **kwargs)
    if remover is not None:
        remover.drain()
    return before, result


@pytest.mark.parametrize("seed", range(6))
def test_a_round_releases_each_segment_it_recopied_once_read_and_leaves_the_same_files(tmp_path, seed):
    plain, released = partition_dir(tmp_path / "plain"), partition_dir(tmp_path / "released")
    random_log(plain, seed)
    shutil.copytree(plain, released)
    _round(plain, None)
    remover = RecordingRemover()
    before, result = _round(released, remover)
    assert file_digests(released) == file_digests(plain)
    names = remover.released()
    assert names, "the case must recopy something"
    # The old segments from where the recopy starts, each once, in the log's order, none of the active one.
    assert names == [n for n in before[:len(names)] if int(n.split(".")[0]) >= result.recopy_from]
    assert before[-1] not in names
    # On the recopy's read-ahead thread, while the files were still the log's: before the swap removed them.
    assert all(thread == "recopy-read-ahead" and existed for what, _, thread, existed in remover.asked if what == "release")
    removed = [name for what, name, _, _ in remover.asked if what == "remove" and name.endswith(".log.deleted")]
    assert removed
    for name in removed:
        original = name.removesuffix(".deleted")
        assert remover.asked.index(("release", original, "recopy-read-ahead", True)) < [
            n for _, n, _, _ in remover.asked].index(name)


@pytest.mark.parametrize("kwargs", [{"dry_run": True}, {"verify": True}], ids=["dry-run", "verify"])
def test_a_dry_run_and_a_verified_round_release_nothing(tmp_path, kwargs):
    directory = partition_dir(tmp_path / "p")
    random_log(directory, 3)
    remover = RecordingRemover()
    _round(directory, remover, **kwargs)
    assert remover.released() == []
