"""A round's `.cleaned` segments written around the page cache (`direct_writes`, `log.cleaner.io.direct`): the same
files, byte for byte, as through the page cache, on one thread and on several; their records went out in direct
writes of whole aligned blocks."""

from __future__ import annotations

import shutil

import pytest

from cleaner.round import clean_round
from cleaner.settings import Settings
from offsetmap.map import OffsetMap
from segments.codec import format as fmt
from segments.files.direct import ALIGN
from segments.partition.log import PartitionLog
from segments.tools.generate import WorkloadSpec, generate_partition

from ..segments.helpers import RecordingOps
from .test_round_safety import snapshot

SPEC = WorkloadSpec(records=8000, keys=4000, value_bytes=1000, records_per_batch=10, tombstone_fraction=0.1,
                    compression=fmt.COMPRESSION_LZ4, segment_bytes=256 * 1024)  # cleaned: ~4 MB in 4 groups
NOW_MS = SPEC.start_timestamp_ms + 10_000


def _clean(directory, *, direct: bool, threads: int) -> RecordingOps:
    ops = RecordingOps()
    topic = Settings.from_mappings({"segment.bytes": str(1024 * 1024)}).topic("t")
    with PartitionLog.open(directory, mode="cleaner", file_ops=ops) as log:
        result = clean_round(log, topic, OffsetMap(1 << 24), now_ms=NOW_MS, seed=7, direct_writes=direct,
                             recopy_threads=threads)
    assert result.groups >= 4 and result.records_written < result.records_read
    return ops


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    directory = tmp_path_factory.mktemp("direct") / "t-0"
    generate_partition(directory, SPEC)
    return directory


@pytest.mark.parametrize("threads", [1, 3])
def test_direct_writes_leave_the_same_files_as_writes_through_the_page_cache(tmp_path, template, threads):
    cleaned = {}
    for direct in (True, False):
        d = tmp_path / str(direct) / "t-0"
        shutil.copytree(template, d)
        ops = _clean(d, direct=direct, threads=threads)
        cleaned[direct] = snapshot(d)
        direct_writes = [w for w in ops.writes if w[0]]
        if direct:
            assert sum(w[2] for w in direct_writes) > 3_000_000
            assert all(position % ALIGN == 0 and length % ALIGN == 0 for _, position, length in direct_writes)
        else:
            assert not direct_writes
    assert cleaned[True] == cleaned[False]
