"""Every real-broker fixture partition opens as a `PartitionLog`, serves its records, and verifies after."""

from __future__ import annotations

import pytest

from segments.partition.log import PartitionLog
from segments.tools.verify import verify_paths

from .helpers import copy_fixture

# (fixture dir, partition dir name to give it, batches, records) from tests/fixtures/kafka/README.md
CASES = [
    ("kafka-2.4-c2/raw", "c2-0", 57, 2000),
    ("kafka-2.4-c2/kafka-cleaned", "c2-0", None, 54),
    ("public/__consumer_offsets-39", "__consumer_offsets-39", 683, 1241),
    ("public/__consumer_offsets-36", "__consumer_offsets-36", 1, 1),
    ("public/first-0", "first-0", 8, 9),
    ("public/test-0", "test-0", 28, 97),
    ("public/__cluster_metadata-0", "__cluster_metadata-0", 2560, 2563),
]


@pytest.mark.parametrize("fixture,name,batches,records", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["reader", "writer"])
def test_fixture_partition_opens_and_serves_every_record(tmp_path, fixture, name, batches, records, mode):
    d = copy_fixture(fixture, tmp_path)
    d = d.rename(d.parent / name)
    with PartitionLog.open(d, mode=mode) as log:
        got_batches = list(log.iter_batches())
        got = [r for b in got_batches for r in b.records]
        end = log.log_end_offset
    assert len(got) == records
    if batches is not None:
        assert len(got_batches) == batches
    offsets = [r.offset for r in got]
    assert offsets == sorted(set(offsets))
    assert end == got_batches[-1].header.next_offset
    assert not verify_paths([d]).problems


def test_kafka_preallocated_active_index_is_rebuilt_trimmed_by_the_writer(tmp_path):
    d = copy_fixture("kafka-2.4-c2/raw", tmp_path).rename(tmp_path / "c2-0")
    index = d / "00000000000000001996.index"
    assert index.stat().st_size == 10 * 1024 * 1024
    with PartitionLog.open(d, mode="writer") as log:
        assert log.read(1998).data
    assert index.stat().st_size % 8 == 0 and index.stat().st_size < 1024
    assert (d / "00000000000000001996.timeindex").stat().st_size < 1024


def test_reader_never_writes_to_a_fixture(tmp_path):
    d = copy_fixture("kafka-2.4-c2/raw", tmp_path).rename(tmp_path / "c2-0")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with PartitionLog.open(d, mode="reader") as log:
        assert sum(1 for _ in log.iter_records()) == 2000
        assert log.read(1999).data
    after = {p.name: p.read_bytes() for p in d.iterdir() if not p.name.endswith(".lock")}
    assert after == before


def test_reader_opens_a_directory_it_cannot_write(tmp_path, monkeypatch):
    import os

    import segments.partition.locks

    d = copy_fixture("public/first-0", tmp_path)
    real_open = os.open

    def refusing_open(path, flags, *args):
        if str(path).endswith(".lock"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(segments.partition.locks.os, "open", refusing_open)
    with PartitionLog.open(d, mode="reader") as log:
        assert sum(1 for _ in log.iter_records()) == 9
    with pytest.raises(PermissionError):
        PartitionLog.open(d, mode="cleaner")
