"""The duplication report: exact counts equal a model's, bloom estimates lie within their bound, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cleaner.cli import main
from cleaner.duplication import estimate_partition
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch, encode_control_batch
from segments.partition.log import LogConfig, PartitionLog

TS0 = 1_700_000_000_000


def _log(directory, n, keys, *, seed, unkeyed_every=0):
    """n records over `keys` random keys (every `unkeyed_every`-th without a key) plus one commit marker;
    returns (data records, unkeyed, distinct keys)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, size=n)
    unkeyed = 0
    seen = set()
    with PartitionLog.open(directory, mode="writer", create=True, config=LogConfig(segment_bytes=64 * 1024)) as plog:
        for start in range(0, n, 50):
            records = []
            for i in range(start, min(start + 50, n)):
                key = None if unkeyed_every and i % unkeyed_every == 0 else b"key-%d" % ids[i]
                unkeyed += key is None
                if key is not None:
                    seen.add(key)
                records.append(Record(offset=i - start, timestamp=TS0 + i, key=key, value=b"v" * 20))
            plog.append_batches(encode_batch(records, base_offset=0, compression=(start // 50) % 3))
        plog.append_batches(encode_control_batch(offset=0, control_type=fmt.CONTROL_TYPE_COMMIT, timestamp=TS0,
                                                 producer_id=1, producer_epoch=0))
        plog.roll()
    return n, unkeyed, len(seen)


def test_exact_counts_equal_the_model(tmp_path):
    records, unkeyed, distinct = _log(tmp_path / "t-0", 5000, 700, seed=1, unkeyed_every=97)
    result = estimate_partition(tmp_path / "t-0", method="exact")
    assert (result.records, result.unkeyed, result.distinct_keys) == (records, unkeyed, distinct)
    assert result.removable == records - distinct
    assert result.fraction == pytest.approx((records - distinct) / records)
    assert result.method == "exact" and result.distinct_bound == 0
    assert 0 < result.bytes_freed < result.size_bytes


@pytest.mark.parametrize("keys", [200, 5000, 20000])
def test_bloom_estimate_is_within_its_bound_and_one_point(tmp_path, keys):
    records, unkeyed, distinct = _log(tmp_path / "t-0", 30000, keys, seed=keys)
    result = estimate_partition(tmp_path / "t-0", method="bloom", memory_bytes=64 * 1024)
    assert result.method == "bloom" and result.filter_bytes == 64 * 1024
    assert abs(result.distinct_keys - distinct) <= result.distinct_bound
    exact_fraction = (records - distinct) / records
    assert abs(result.fraction - exact_fraction) < 0.01


def test_auto_picks_exact_when_it_fits_and_bloom_when_not(tmp_path):
    _log(tmp_path / "t-0", 3000, 100, seed=3)
    span = 3001  # 3000 records and the commit marker
    assert estimate_partition(tmp_path / "t-0", method="auto", memory_bytes=span * 16).method == "exact"
    assert estimate_partition(tmp_path / "t-0", method="auto", memory_bytes=span * 16 - 1).method == "bloom"


def test_cli_reports_partitions_and_total_and_changes_nothing(tmp_path):
    a = _log(tmp_path / "t-0", 2000, 300, seed=4)
    b = _log(tmp_path / "t-1", 1000, 900, seed=5)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.log")}
    result = CliRunner().invoke(main, ["duplication", "--json", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [line["name"] for line in lines] == ["t-0", "t-1", "total"]
    assert lines[2]["records"] == a[0] + b[0]
    assert lines[2]["removable"] == (a[0] - a[2]) + (b[0] - b[2])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.log")} == before
    text = CliRunner().invoke(main, ["duplication", "--method", "bloom", "--memory", "65536", str(tmp_path / "t-0")])
    assert text.exit_code == 0 and "compaction would remove" in text.output and "±" in text.output

