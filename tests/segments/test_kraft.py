"""KRaft metadata: record values against golden bytes written from Kafka's published schemas
(docs/format.md section 3.6), and whole metadata logs and snapshots replayed as the
controller replays them. Logs are built with kafka-python's batch builder (tests/kraft_builders.py)."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError, LogStateError
from segments.codec.metadata_records import (
    ConfigRecord,
    OtherMetadataRecord,
    RemoveTopicRecord,
    TopicRecord,
    TransactionMarkerRecord,
    decode_metadata_record,
    encode_config_record,
    encode_remove_topic_record,
    encode_topic_record,
    encode_transaction_marker,
)
from segments.tools.kraft import find_metadata_log, read_cluster_metadata
from tests.kafka_fixtures import KAFKA_FIXTURES
from tests.kraft_builders import (
    broker_config,
    remove_topic,
    topic,
    topic_config,
    topic_id,
    write_segment,
    write_snapshot,
)

ID = bytes(range(16))

# ---- golden bytes ------------------------------------------------------------------------------------

TOPIC_ORDERS = bytes.fromhex("010200" "076f7264657273" "000102030405060708090a0b0c0d0e0f" "00")
CONFIG_ORDERS_COMPACT = bytes.fromhex(
    "010400" "02" "076f7264657273" "0f" + b"cleanup.policy".hex() + "08" + b"compact".hex() + "00")
CONFIG_ORDERS_DELETED = bytes.fromhex("010400" "02" "076f7264657273" "0f" + b"cleanup.policy".hex() + "00" "00")
REMOVE_TOPIC = bytes.fromhex("010900" "000102030405060708090a0b0c0d0e0f" "00")
# Values read from the real KRaft log in tests/fixtures/kafka/public/__cluster_metadata-0:
FEATURE_LEVEL_REAL = bytes.fromhex("010c00116d657461646174612e76657273696f6e001400")  # metadata.version = 20
BEGIN_TXN_REAL = bytes.fromhex("01170001001212426f6f747374726170207265636f726473")  # Name "Bootstrap records"
END_TXN_REAL = bytes.fromhex("01180000")


def test_topic_record_golden_bytes_round_trip():
    assert encode_topic_record("orders", ID) == TOPIC_ORDERS
    assert decode_metadata_record(TOPIC_ORDERS) == TopicRecord("orders", ID)


def test_config_record_golden_bytes_round_trip_and_a_null_value_means_deleted():
    assert encode_config_record(2, "orders", "cleanup.policy", "compact") == CONFIG_ORDERS_COMPACT
    assert decode_metadata_record(CONFIG_ORDERS_COMPACT) == ConfigRecord(2, "orders", "cleanup.policy", "compact")
    assert encode_config_record(2, "orders", "cleanup.policy", None) == CONFIG_ORDERS_DELETED
    assert decode_metadata_record(CONFIG_ORDERS_DELETED).value is None


def test_remove_topic_record_golden_bytes_round_trip():
    assert encode_remove_topic_record(ID) == REMOVE_TOPIC
    assert decode_metadata_record(REMOVE_TOPIC) == RemoveTopicRecord(ID)


def test_real_broker_values_decode_as_other_records_and_transaction_markers():
    assert decode_metadata_record(FEATURE_LEVEL_REAL) == OtherMetadataRecord(12, 0)
    assert decode_metadata_record(BEGIN_TXN_REAL) == TransactionMarkerRecord(23)
    assert decode_metadata_record(END_TXN_REAL) == TransactionMarkerRecord(24)
    assert encode_transaction_marker(24) == END_TXN_REAL


@given(st.text(max_size=300), st.binary(min_size=16, max_size=16), st.text(max_size=50),
       st.one_of(st.none(), st.text(max_size=500)))
def test_encode_decode_round_trip(name, uid, key, value):
    assert decode_metadata_record(encode_topic_record(name or "t", uid)) == TopicRecord(name or "t", uid)
    assert decode_metadata_record(encode_config_record(4, name, key or "k", value)) == ConfigRecord(4, name, key or "k", value)


@pytest.mark.parametrize("value, reason", [
    (b"", "runs past the end"),
    (bytes.fromhex("020200"), "frame version"),
    (TOPIC_ORDERS[:-5], "needs 16 bytes"),
    (TOPIC_ORDERS + b"\x00", "bytes after the record"),
    (bytes.fromhex("010200") + b"\x00" + ID + b"\x00", "is null"),
    (bytes.fromhex("010200") + b"\x03\xff\xfe" + ID + b"\x00", "not UTF-8"),
])
def test_bad_values_raise_a_located_corruption_error(value, reason):
    with pytest.raises(CorruptRecordError, match=reason):
        decode_metadata_record(value)


# ---- replaying a metadata log ---------------------------------------------------------------------------


def test_the_real_kraft_log_replays_with_no_topics_to_its_end():
    metadata = read_cluster_metadata(KAFKA_FIXTURES / "public" / "__cluster_metadata-0")
    assert metadata.end_offset == 2563  # 2561 metadata records and 2 control records (fixture README)
    assert metadata.topics == {} and metadata.topic_configs == {} and metadata.snapshot is None


def test_topics_configs_removals_and_cluster_defaults_replay_in_offset_order(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    write_segment(directory, 0, [
        [topic("orders"), topic("users"), topic("gone")],
        [topic_config("users", "cleanup.policy", "compact"), topic_config("users", "delete.retention.ms", "1000"),
         topic_config("orders", "cleanup.policy", "compact"), topic_config("gone", "cleanup.policy", "compact")],
        [topic_config("orders", "cleanup.policy", None), remove_topic("gone"),
         broker_config("", "log.cleanup.policy", "compact"), broker_config("1", "log.retention.ms", "5")],
    ])
    metadata = read_cluster_metadata(directory)
    assert metadata.topics == {"orders": topic_id("orders"), "users": topic_id("users")}
    assert metadata.removed_topics == {"gone": topic_id("gone")}
    assert metadata.topic_configs == {"users": {"cleanup.policy": "compact", "delete.retention.ms": "1000"}}
    assert metadata.broker_configs == {"": {"log.cleanup.policy": "compact"}, "1": {"log.retention.ms": "5"}}
    assert metadata.end_offset == 11


def test_a_recreated_topic_is_live_with_none_of_the_old_configs(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    from segments.codec.metadata_records import encode_topic_record as enc
    write_segment(directory, 0, [[topic("t"), topic_config("t", "cleanup.policy", "compact"), remove_topic("t"),
                                  enc("t", bytes(16))]])
    metadata = read_cluster_metadata(directory)
    assert metadata.topics == {"t": bytes(16)} and metadata.removed_topics == {} and metadata.topic_configs == {}


def test_records_of_an_aborted_or_unfinished_metadata_transaction_are_not_applied(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    write_segment(directory, 0, [
        [encode_transaction_marker(23), topic("committed"), encode_transaction_marker(24)],
        [encode_transaction_marker(23), topic("aborted"), encode_transaction_marker(25)],
        [encode_transaction_marker(23), topic("open")],
    ])
    assert set(read_cluster_metadata(directory).topics) == {"committed"}


def test_the_latest_snapshot_then_the_log_from_its_end_offset(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    # Old snapshot (ignored), latest snapshot at 6; the log's records below 6 are covered by it.
    write_snapshot(directory, 3, [topic("stale")])
    write_snapshot(directory, 6, [topic("a"), topic("b"), topic_config("a", "cleanup.policy", "compact")])
    write_segment(directory, 0, [[topic("below-snapshot")] * 6, [topic("c"), remove_topic("b")]])
    metadata = read_cluster_metadata(directory)
    assert metadata.snapshot == f"{6:020d}-{1:010d}.checkpoint"
    assert set(metadata.topics) == {"a", "c"}
    assert metadata.topic_configs == {"a": {"cleanup.policy": "compact"}}
    assert metadata.end_offset == 8


def test_segments_deleted_under_a_snapshot_leave_the_snapshot_alone_deciding(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    write_snapshot(directory, 100, [topic("a"), topic_config("a", "cleanup.policy", "compact")])
    write_segment(directory, 100, [[topic("b")]])
    metadata = read_cluster_metadata(directory)
    assert set(metadata.topics) == {"a", "b"} and metadata.end_offset == 101


def test_a_torn_tail_ends_the_read_and_corruption_names_file_and_byte(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    write_segment(directory, 0, [[topic("a")], [topic("b")]])
    segment = directory / f"{0:020d}.log"
    data = segment.read_bytes()
    first = 12 + int.from_bytes(data[8:12], "big")  # the second batch starts after the first's length
    segment.write_bytes(data[:-3])
    assert set(read_cluster_metadata(directory).topics) == {"a"}
    broken = bytearray(data)
    broken[first + 40] ^= 0xFF  # inside the second batch: its CRC no longer matches
    segment.write_bytes(bytes(broken))
    with pytest.raises(CorruptRecordError) as info:
        read_cluster_metadata(directory)
    assert info.value.path == str(segment) and info.value.position == first + fmt.CRC_OFFSET  # its CRC field


def test_a_bad_record_value_names_the_file_the_batch_and_the_offset(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    write_segment(directory, 0, [[topic("a"), b"\x01\x02\x00\x07orders"]])
    with pytest.raises(CorruptRecordError, match=r"byte 0: metadata record at offset 1: "):
        read_cluster_metadata(directory)


def test_a_fifo_named_like_a_segment_is_refused_without_blocking(tmp_path):
    directory = tmp_path / "__cluster_metadata-0"
    write_segment(directory, 0, [[topic("a")]])
    os.mkfifo(directory / f"{5:020d}.log")
    with pytest.raises(LogStateError, match="not a regular file"):
        read_cluster_metadata(directory)


def test_the_metadata_log_is_found_where_kafka_puts_it_and_a_link_is_not_followed(tmp_path):
    real = tmp_path / "meta"
    write_segment(real / "__cluster_metadata-0", 0, [[topic("a")]])
    (tmp_path / "logs").mkdir()
    assert find_metadata_log([tmp_path / "logs", real]) == real / "__cluster_metadata-0"
    shutil.rmtree(tmp_path / "logs")
    (tmp_path / "logs").mkdir()
    os.symlink(real / "__cluster_metadata-0", tmp_path / "logs" / "__cluster_metadata-0")
    assert find_metadata_log([tmp_path / "logs"]) is None


def test_every_vector_here_is_written_out_in_docs_format_md():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    section = doc[doc.index("### 3.6 KRaft metadata records"):doc.index("## 4. The swap protocol")]
    written = {"".join(cell.strip("` ").split()) for line in section.splitlines() if line.startswith("|")
               for cell in line.split("|") if cell.strip().startswith("`")}
    for vector in (TOPIC_ORDERS, CONFIG_ORDERS_COMPACT, CONFIG_ORDERS_DELETED, REMOVE_TOPIC, FEATURE_LEVEL_REAL,
                   BEGIN_TXN_REAL):
        assert vector.hex() in written, vector.hex()
