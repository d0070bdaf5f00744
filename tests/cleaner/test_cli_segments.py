"""`logcleaner dump`, `verify` and `demo` through click's CliRunner, on real and generated files."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cleaner.cli import main
from segments.codec.records import Header, Record, encode_batch, encode_control_batch
from segments.partition.log import PartitionLog

from ..kafka_fixtures import KAFKA_FIXTURES
from ..segments.helpers import copy_fixture, keyed_batch, write_log


def test_dump_prints_batches_and_deep_records_with_data(tmp_path):
    d = tmp_path / "t-0"
    with PartitionLog.open(d, mode="writer", create=True) as log:
        log.append_batches(
            encode_batch([Record(0, 5, b"key", b"value", (Header("h", b"1"),)), Record(1, 6, b"k2", None)], base_offset=0)
        )
        log.append_batches(encode_control_batch(offset=0, control_type=1, timestamp=7, producer_id=3, producer_epoch=0))
    runner = CliRunner()
    path = str(d / "00000000000000000000.log")
    out = runner.invoke(main, ["dump", path])
    assert out.exit_code == 0, out.output
    assert "baseOffset: 0 lastOffset: 1 count: 2" in out.output
    assert "isControl: true" in out.output
    deep = runner.invoke(main, ["dump", "--print-data-log", path])
    assert "| offset: 0 CreateTime: 5 keySize: 3 valueSize: 5" in deep.output
    assert "key: key payload: value" in deep.output
    assert "endTxnMarker: COMMIT" in deep.output
    js = runner.invoke(main, ["dump", "--json", "--deep-iteration", path])
    entries = [json.loads(line) for line in js.output.splitlines()]
    assert [e["type"] for e in entries] == ["file", "batch", "record", "record", "batch", "record"]
    assert entries[3]["valueSize"] == -1


def test_dump_index_and_sanity_check(tmp_path):
    write_log(tmp_path / "t-0", 40, segment_bytes=100_000)
    index = str(tmp_path / "t-0" / "00000000000000000000.index")
    runner = CliRunner()
    out = runner.invoke(main, ["dump", index])
    assert out.exit_code == 0 and "offset: " in out.output and "position: " in out.output
    ok = runner.invoke(main, ["dump", "--index-sanity-check", index])
    assert ok.exit_code == 0 and "passed sanity check" in ok.output
    with open(index, "ab") as f:
        f.write(b"\x00\x00\x00")
    bad = runner.invoke(main, ["dump", "--index-sanity-check", index])
    assert bad.exit_code == 1 and "failed sanity check" in bad.output


def test_verify_accepts_a_good_log_dir_and_reports_each_problem_with_file_and_position(tmp_path):
    write_log(tmp_path / "logs" / "t-0", 40)
    write_log(tmp_path / "logs" / "t-1", 40)
    runner = CliRunner()
    ok = runner.invoke(main, ["verify", str(tmp_path / "logs")])
    assert ok.exit_code == 0, ok.output
    assert "OK: 2 partition(s)" in ok.output
    seg = tmp_path / "logs" / "t-1" / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[100] ^= 0x40
    seg.write_bytes(bytes(data))
    (tmp_path / "logs" / "t-0" / "00000000000000000000.log.cleaned").write_bytes(b"")
    bad = runner.invoke(main, ["verify", str(tmp_path / "logs")])
    assert bad.exit_code == 1
    lines = [line for line in bad.output.splitlines() if ": byte " in line]
    assert any(line.startswith(str(seg) + ": byte ") for line in lines)
    assert any(".log.cleaned: byte 0: leftover" in line for line in lines)


def test_verify_accepts_every_fixture_partition(tmp_path):
    runner = CliRunner()
    for name in ["kafka-2.4-c2/raw", "kafka-2.4-c2/kafka-cleaned"]:
        d = copy_fixture(name, tmp_path / name.replace("/", "_"))
        target = d.parent / "c2-0"
        d.rename(target)
        out = runner.invoke(main, ["verify", str(target)])
        assert out.exit_code == 0, out.output
    out = runner.invoke(main, ["verify", str(KAFKA_FIXTURES / "public")])
    assert out.exit_code == 0, out.output
    assert "5 partition(s)" in out.output


def test_demo_generates_cleans_and_verifies_a_log_dir(tmp_path):
    runner = CliRunner()
    out = runner.invoke(main, ["demo", "--dir", str(tmp_path / "demo"), "--records", "3000", "--keys", "100"])
    assert out.exit_code == 0, out.output
    assert "before: " in out.output and "after: " in out.output
    assert "demo-0: cleaned [0, 3000) in 1 round(s): 3000 -> 100 records" in out.output
    assert "verify: OK" in out.output
    assert (tmp_path / "demo" / "demo-0" / "00000000000000000000.log").exists()


def test_keyed_batch_helper_is_valid():
    from segments.codec.records import decode_batch

    assert decode_batch(keyed_batch([(b"a", b"b")])).records[0].key == b"a"
