"""`logcleaner audit`: key histories and partition summaries, checked on a small log and against kafka-python."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from click.testing import CliRunner
from kafka.record.memory_records import MemoryRecords

from cleaner.audit import audit_partition, histogram_buckets
from cleaner.cli import main
from segments.partition.checkpoint import update_offset_checkpoint
from segments.partition.log import PartitionLog

from .builders import ROLL, T0, abort, batch, build_log, commit, partition_dir, random_log, txn_batch


def small_log(tmp_path):
    """Offsets: 0 a=1, 1 b=22, 2 a=333 | 3 a=tombstone, 4 c=x, 5 (no key) | 6-7 txn pid 7 (a, d), 8 ABORT |
    9 txn pid 8 (d), 10 COMMIT | 11 txn pid 9 (e), never ended."""
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1", T0), (b"b", b"22", T0 + 1), (b"a", b"333", T0 + 2)]),
        ROLL,
        batch([(b"a", None, T0 + 10), (b"c", b"x", T0 + 11), (None, b"nokey", T0 + 12)]),
        ROLL,
        txn_batch([(b"a", b"aborted", T0 + 20), (b"d", b"aborted", T0 + 21)], pid=7),
        abort(7, timestamp=T0 + 22),
        txn_batch([(b"d", b"dd", T0 + 30)], pid=8),
        commit(8, timestamp=T0 + 31),
        txn_batch([(b"e", b"open", T0 + 40)], pid=9),
    ])
    return d


def audit_cli(*args):
    return CliRunner().invoke(main, ["audit", *map(str, args)])


def test_summary_of_a_small_log(tmp_path):
    d = small_log(tmp_path)
    out = audit_cli(d)
    assert out.exit_code == 0, out.output
    size_mb = sum(f.stat().st_size for f in d.glob("*.log")) / 1e6
    assert out.output == (
        f"t-0: 10 records in [0, 12), {size_mb:.2f} MB: 5 distinct keys, 1 tombstones, "
        "1 keys whose latest record is a tombstone, 1 without a key, 2 control, 2 aborted\n"
        "  records per key: 1: 4, 3-4: 1\n"
    )
    # a, b, c, d (committed), e (open): a has 3 visible records (its aborted one is left out), the rest 1


def test_history_of_keys_with_transactions_tombstones_and_a_missing_key(tmp_path):
    d = small_log(tmp_path)
    out = audit_cli(d, "--key", "a", "--key-hex", "64", "--key", "e", "--key", "nope")
    assert out.exit_code == 0, out.output
    seg = ["00000000000000000000.log", "00000000000000000003.log", "00000000000000000006.log"]
    assert out.output.splitlines() == [
        "t-0: key a: 4 record(s)",
        f"  offset 0            2023-11-14T22:13:20.000Z 1 bytes        {seg[0]}",
        f"  offset 2            2023-11-14T22:13:20.002Z 3 bytes        {seg[0]}",
        f"  offset 3            2023-11-14T22:13:20.010Z tombstone      {seg[1]}",
        f"  offset 6            2023-11-14T22:13:20.020Z 7 bytes        {seg[2]}  aborted",
        "t-0: key e: 1 record(s)",
        f"  offset 11           2023-11-14T22:13:20.040Z 4 bytes        {seg[2]}  open",
        "t-0: key nope: 0 record(s)",
        "t-0: key d: 2 record(s)",  # (--key-hex keys follow the --key ones)
        f"  offset 7            2023-11-14T22:13:20.021Z 7 bytes        {seg[2]}  aborted",
        f"  offset 9            2023-11-14T22:13:20.030Z 2 bytes        {seg[2]}  committed",
    ]
    as_json = json.loads(audit_cli(d, "--key", "a", "--json").output)
    assert as_json["history"][0]["key"] == "a" and as_json["history"][0]["key_hex"] == "61"
    assert [r["value_bytes"] for r in as_json["history"][0]["records"]] == [1, 3, None, 7]
    assert as_json["distinct_keys"] == 5 and as_json["histogram"] == {"1": 4, "3-4": 1}


def test_records_below_the_log_start_are_not_counted(tmp_path):
    d = small_log(tmp_path)
    update_offset_checkpoint(d.parent / "log-start-offset-checkpoint", {("t", 0): 3})
    audit = audit_partition(d, [b"a", b"b"])
    assert [r.offset for r in audit.history[b"a"]] == [3, 6]
    assert audit.history[b"b"] == []
    assert (audit.records, audit.distinct_keys, audit.log_start_offset) == (7, 4, 3)


def test_histogram_buckets_are_powers_of_two():
    counts = np.array([1, 1, 2, 3, 4, 5, 8, 9, 1000])
    assert histogram_buckets(counts) == {"1": 2, "2": 1, "3-4": 2, "5-8": 2, "9-16": 1, "513-1024": 1}
    assert histogram_buckets(np.array([], dtype=np.int64)) == {}


def kafka_python_model(d):
    """The same figures from kafka-python's record reader (an independent decoder) and plain Python."""
    visible: dict[bytes, list] = defaultdict(list)
    pending: dict[int, list] = defaultdict(list)  # producer id -> records of its open transaction
    records = unkeyed = control = aborted = 0
    for log_file in sorted(d.glob("*.log")):
        data = MemoryRecords(log_file.read_bytes())
        while data.has_next():
            kbatch = data.next_batch()
            if kbatch.is_control_batch:
                for r in kbatch:
                    control += 1
                    ended = pending.pop(kbatch.producer_id, [])
                    if int.from_bytes(r.key[2:4], "big") == 0:
                        aborted += len(ended)
                    else:
                        for key, offset, value in ended:
                            visible[key].append((offset, value))
                continue
            for r in kbatch:
                records += 1
                if r.key is None:
                    unkeyed += 1
                elif kbatch.is_transactional:
                    pending[kbatch.producer_id].append((r.key, r.offset, r.value))
                else:
                    visible[r.key].append((r.offset, r.value))
    for ended in pending.values():  # open transactions count as visible to the audit (not aborted)
        for key, offset, value in ended:
            visible[key].append((offset, value))
    per_key = {k: sorted(v) for k, v in visible.items()}
    return {
        "records": records, "unkeyed": unkeyed, "control": control, "aborted": aborted,
        "distinct_keys": len(per_key),
        "tombstones": sum(1 for v in per_key.values() for _, value in v if value is None),
        "deleted_keys": sum(1 for v in per_key.values() if v[-1][1] is None),
        "histogram": dict(Counter(len(v) for v in per_key.values())),
        "history": per_key,
    }


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_audit_agrees_with_a_kafka_python_model_on_random_logs(tmp_path, seed):
    d = partition_dir(tmp_path)
    random_log(d, seed)  # every codec, transactions committed and aborted, tombstones, unkeyed records
    model = kafka_python_model(d)
    keys = sorted(model["history"])
    audit = audit_partition(d, keys)
    for name in ("records", "unkeyed", "control", "aborted", "distinct_keys", "tombstones", "deleted_keys"):
        assert getattr(audit, name) == model[name], name
    assert audit.histogram == histogram_buckets(np.array(sorted(
        n for n, c in model["histogram"].items() for _ in range(c)), dtype=np.int64))
    with PartitionLog.open(d, mode="reader") as log:
        timestamps = {r.offset: r.timestamp for _, r in log.iter_records()}
    for key in keys:
        visible = [(r.offset, r.value_bytes) for r in audit.history[key] if r.transaction != "aborted"]
        assert visible == [(o, None if v is None else len(v)) for o, v in model["history"][key]], key
        assert all(r.timestamp == timestamps[r.offset] for r in audit.history[key])


def test_a_corrupt_segment_fails_with_the_file_and_byte_and_other_partitions_are_still_audited(tmp_path):
    good = small_log(tmp_path)
    bad = partition_dir(tmp_path, "t-1")
    build_log(bad, [batch([(b"a", b"1")]), ROLL, batch([(b"b", b"2")])])
    first = bad / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # a flipped byte inside the record: the CRC no longer matches
    first.write_bytes(bytes(data))
    out = audit_cli(tmp_path / "logs")
    assert out.exit_code == 1
    assert "t-0: 10 records" in out.stdout
    assert f"t-1: FAILED: {first}: byte 17: CRC-32C mismatch in the batch at byte 0" in out.stderr
    assert good.exists()


def test_usage_errors(tmp_path):
    d = small_log(tmp_path)
    bad_hex = audit_cli(d, "--key-hex", "zz")
    assert bad_hex.exit_code == 2 and "not hex" in bad_hex.output
    (tmp_path / "empty").mkdir()
    empty = audit_cli(tmp_path / "empty")  # an empty log dir is not a usage error (tests/cleaner/test_cli_answers.py)
    assert empty.exit_code == 0 and "no partition directories" in empty.stderr
