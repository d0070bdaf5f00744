"""No topic is compacted, nor deleted, by guess: each policy comes from a real source (cleaner/policy.py).

The rule is checked through `resolve_policy` for every source in its order, and end to end through
`logcleaner clean` on log dirs a KRaft broker, a ZooKeeper-mode broker and no broker at all would leave.
Segment files are written with kafka-python's builder; what survives is read back with kafka-python.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cleaner.cli import main
from cleaner.config_file import load_config
from cleaner.policy import PolicyError, cluster_view, resolve_policy, unknown_policy_hint
from tests.kraft_builders import broker_config, remove_topic, topic, topic_config, write_kraft_log_dir

DAY_MS = 86_400_000
NOW_MS = 1_700_000_000_000 + 30 * DAY_MS


def _write_partition(log_dir: Path, name: str, keys: list[str], timestamp_ms: int = 1_700_000_000_000) -> Path:
    """A partition of two segments (the first inactive) holding `keys` twice, old enough to expire."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    directory = log_dir / name
    directory.mkdir(parents=True)
    offset = 0
    for base_name in range(2):
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        base = offset
        for i, key in enumerate(keys * (2 if base_name == 0 else 1)):
            builder.append(i, timestamp=timestamp_ms, key=key.encode(), value=f"{key}@{offset}".encode(), headers=[])
            offset += 1
        data = bytearray(builder.build())
        data[0:8] = base.to_bytes(8, "big")
        (directory / f"{base:020d}.log").write_bytes(bytes(data))
        os.utime(directory / f"{base:020d}.log", ns=(timestamp_ms * 1_000_000,) * 2)
    return directory


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _segments(root: Path) -> dict[str, str]:
    return {k: v for k, v in _tree(root).items() if k.endswith(".log")}


def _policy(log_dir: Path, topic_name: str, *, config=None, properties=None, overrides=None, named=False):
    loaded = load_config(config, server_properties=properties, overrides=overrides)
    return resolve_policy(topic_name, cluster_view(log_dir, loaded.settings), named=named)


# ---- the rule, source by source -------------------------------------------------------------------


def test_without_any_source_an_ordinary_topic_is_unknown_and_internal_topics_are_compacted(tmp_path):
    assert not _policy(tmp_path, "orders").known
    assert _policy(tmp_path, "__consumer_offsets").policy == ("compact",)
    assert _policy(tmp_path, "__transaction_state").policy == ("compact",)
    never = _policy(tmp_path, "__cluster_metadata", overrides={"cleanup.policy": "compact"})
    assert never.never and not never.known


def test_the_users_topic_level_values_decide_first(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[topics.orders]\n"cleanup.policy" = "compact,delete"\n')
    write_kraft_log_dir(tmp_path / "logs", [topic("orders"), topic_config("orders", "cleanup.policy", "delete")])
    p = _policy(tmp_path / "logs", "orders", config=config)
    assert p.policy == ("compact", "delete") and "[topics.orders]" in p.source
    p = _policy(tmp_path / "logs", "orders", overrides={"cleanup.policy": "compact"})
    assert p.policy == ("compact",) and p.source == "--set"


def test_the_more_specific_wins_a_topics_table_beats_a_flat_set_value(tmp_path):
    # the operator's case: -c a.toml with [topics.demo] compact,delete and --set cleanup.policy=compact
    config = tmp_path / "a.toml"
    config.write_text('"cleanup.policy" = "delete"\n[topics.demo]\n"cleanup.policy" = "compact,delete"\n')
    overrides = {"cleanup.policy": "compact"}
    p = _policy(tmp_path, "demo", config=config, overrides=overrides)
    assert p.policy == ("compact", "delete") and "[topics.demo]" in p.source
    p = _policy(tmp_path, "orders", config=config, overrides=overrides)  # among flat values --set beats the file
    assert p.policy == ("compact",) and p.source == "--set"
    assert _policy(tmp_path, "orders", config=config).policy == ("delete",)


def test_a_flat_cleanup_policy_decides_internal_topics_too_and_log_cleanup_policy_does_not(tmp_path):
    # docs/configuration.md warns of it: a flat delete reaches __consumer_offsets, the broker level does not
    for internal in ("__consumer_offsets", "__transaction_state"):
        assert _policy(tmp_path, internal, overrides={"cleanup.policy": "delete"}).policy == ("delete",)
        p = _policy(tmp_path, internal, overrides={"log.cleanup.policy": "delete"})
        assert p.policy == ("compact",) and "internal topic" in p.source


def test_a_server_properties_policy_without_kraft_metadata_says_it_decides_only_listed_topics(tmp_path):
    properties = tmp_path / "spc.properties"
    properties.write_text("log.cleanup.policy=compact\n")
    p = _policy(tmp_path, "demo", properties=properties)
    assert not p.known
    assert "no KRaft metadata log" in p.source and "no setting names it" not in p.source
    assert f"the log.cleanup.policy of server.properties {properties} applies only to topics the KRaft metadata " \
           "lists" in p.source
    properties.write_text("num.partitions=3\n")  # no log.cleanup.policy line: Kafka's default, for listed topics
    assert "applies only to topics the KRaft metadata lists" in _policy(tmp_path, "demo", properties=properties).source


def test_the_hint_for_an_unknown_policy_names_what_decides_every_topic_where_it_runs():
    assert "--set cleanup.policy=... decides every topic" in unknown_policy_hint("demo")
    daemon = unknown_policy_hint("demo", daemon=True)  # run has no --set
    assert daemon.startswith('[topics.demo] "cleanup.policy" = "compact"') and "--set" not in daemon
    assert 'the config file\'s flat "cleanup.policy" = ... decides every topic' in daemon


def test_kraft_topic_configs_decide_next_and_their_other_settings_apply(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [
        topic("users"), topic_config("users", "cleanup.policy", "compact"),
        topic_config("users", "delete.retention.ms", "1234"), topic_config("users", "min.insync.replicas", "2"),
    ])
    view = cluster_view(log_dir, load_config(None).settings)
    p = resolve_policy("users", view)
    assert p.policy == ("compact",) and "KRaft metadata" in p.source and "topic config" in p.source
    assert view.settings.topic("users").delete_retention_ms == 1234


def test_a_kraft_topic_without_override_takes_the_brokers_default_only_when_it_is_known(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [topic("orders")])
    assert not _policy(log_dir, "orders").known  # the broker's static default is not known
    properties = tmp_path / "server.properties"
    properties.write_text("node.id=1\nprocess.roles=broker\n")
    p = _policy(log_dir, "orders", properties=properties)
    assert p.policy == ("delete",) and "Kafka's default" in p.source
    properties.write_text("log.cleanup.policy=compact\n")
    assert _policy(log_dir, "orders", properties=properties).policy == ("compact",)


def test_kraft_dynamic_cluster_and_broker_defaults_count_as_the_broker_level(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [
        topic("orders"), broker_config("", "log.cleanup.policy", "compact"),
        broker_config("1", "log.cleaner.delete.retention.ms", "77"),
    ])
    view = cluster_view(log_dir, load_config(None).settings)
    p = resolve_policy("orders", view)
    assert p.policy == ("compact",) and "cluster default" in p.source
    assert view.settings.topic("orders").delete_retention_ms == 77  # node 1's dynamic config (meta.properties)


def test_a_zookeeper_mode_log_dir_is_unknown_even_with_server_properties(tmp_path):
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "meta.properties").write_text("version=0\nbroker.id=0\n")
    properties = tmp_path / "server.properties"
    properties.write_text("log.cleanup.policy=delete\nzookeeper.connect=localhost:2181\n")
    p = _policy(log_dir, "orders", properties=properties)
    assert not p.known and "ZooKeeper" in p.source
    assert _policy(log_dir, "orders", overrides={"log.cleanup.policy": "compact"}).policy == ("compact",)


def test_a_named_partition_is_compacted_when_nothing_else_decides(tmp_path):
    assert _policy(tmp_path, "orders", named=True).policy == ("compact",)
    log_dir = write_kraft_log_dir(tmp_path / "logs", [topic("orders"), topic_config("orders", "cleanup.policy", "delete")])
    assert _policy(log_dir, "orders", named=True).policy == ("delete",)


def test_a_deleted_topics_leftover_partition_is_never_touched(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [topic("gone"), remove_topic("gone")])
    p = _policy(log_dir, "gone", overrides={"cleanup.policy": "compact"})
    assert p.never and not p.known and "deleted" in p.source


def test_a_metadata_log_that_does_not_decode_refuses_rather_than_guessing(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [topic("orders")])
    segment = log_dir / "__cluster_metadata-0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[40] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises(PolicyError, match=r"00000000000000000000\.log: byte \d+: CRC"):
        cluster_view(log_dir, load_config(None).settings)


def test_a_kraft_config_out_of_range_names_the_metadata_log(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [topic("t"), topic_config("t", "delete.retention.ms", "-5")])
    with pytest.raises(PolicyError, match=r"delete.retention.ms.*topic t in KRaft metadata"):
        cluster_view(log_dir, load_config(None).settings)


# ---- end to end: logcleaner clean ----------------------------------------------------------------------


def test_clean_of_a_log_dir_with_unknown_policies_changes_nothing_and_names_the_deciding_lines(tmp_path):
    log_dir = tmp_path / "logs"
    _write_partition(log_dir, "orders-0", ["a", "b"])
    _write_partition(log_dir, "orders-1", ["c"])
    _write_partition(log_dir, "__consumer_offsets-3", ["g1", "g2"])
    before = _tree(log_dir)
    result = CliRunner().invoke(main, ["clean", str(log_dir), "--now-ms", str(NOW_MS)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # one error: its first line complete in itself, then the topics on indented lines (docs/cli.md, "Rules")
    first, *rest = result.stderr.splitlines()
    assert first == ("Error: the cleanup policy of 1 topic(s) is unknown (listed below), so nothing was changed; "
                     "decide each in the config file (-c) or with --set")
    assert rest and all(line.startswith("  ") for line in rest)
    assert "orders (2 partition(s))" in result.output
    assert '[topics.orders] "cleanup.policy" = "compact"' in result.output
    assert "__consumer_offsets" not in result.output  # Kafka's internal topic: known
    assert _tree(log_dir) == before


def test_clean_applies_kafkas_behaviour_from_server_properties_and_kraft_metadata(tmp_path):
    """Internal topics compacted, a topic with a compact override compacted, an ordinary one deleted by
    retention.ms (Kafka's default policy via server.properties), KRaft's own log untouched."""
    log_dir = write_kraft_log_dir(tmp_path / "logs", [
        topic("orders"), topic("users"), topic("__consumer_offsets"),
        topic_config("users", "cleanup.policy", "compact"),
    ])
    properties = tmp_path / "server.properties"
    properties.write_text(f"log.dirs={log_dir}\nlog.retention.hours=168\n")
    _write_partition(log_dir, "orders-0", ["a", "b"])
    _write_partition(log_dir, "users-0", ["a", "b"])
    _write_partition(log_dir, "__consumer_offsets-0", ["g"])
    metadata_before = _tree(log_dir / "__cluster_metadata-0")
    result = CliRunner().invoke(main, ["clean", str(log_dir), "--server-properties", str(properties),
                                       "--now-ms", str(NOW_MS), "--json"])
    assert result.exit_code == 0, result.output
    import json
    rows = {r["partition"]: r for r in map(json.loads, result.output.strip().splitlines())}
    assert rows["orders-0"]["cleanup_policy"] == "delete" and rows["orders-0"]["segments_deleted"] == 1
    assert rows["users-0"]["cleanup_policy"] == "compact" and rows["users-0"]["records_written"] < rows["users-0"]["records_read"]
    assert "KRaft metadata" in rows["users-0"]["policy_source"]
    assert rows["__consumer_offsets-0"]["cleanup_policy"] == "compact"
    assert rows["__cluster_metadata-0"]["status"] == "skipped"
    assert _tree(log_dir / "__cluster_metadata-0") == metadata_before


def test_clean_dry_run_shows_where_each_policy_came_from(tmp_path):
    log_dir = tmp_path / "logs"
    _write_partition(log_dir, "orders-0", ["a", "b"])
    _write_partition(log_dir, "__transaction_state-0", ["t"])
    before = _segments(log_dir)
    result = CliRunner().invoke(main, ["clean", str(log_dir), "--dry-run", "--set", "cleanup.policy=compact",
                                       "--now-ms", str(NOW_MS)])
    assert result.exit_code == 0, result.output
    assert "orders-0 [compact: --set]" in result.output
    assert "__transaction_state-0 [compact: --set]" in result.output
    named = CliRunner().invoke(main, ["clean", str(log_dir / "orders-0"), "--dry-run", "--now-ms", str(NOW_MS)])
    assert "orders-0 [compact: its partition directory was named on the command line]" in named.output
    assert _segments(log_dir) == before  # (opening a log rebuilds missing indexes; the segments stay)
