"""The daemon decides policies by the same rule as `clean` (cleaner/policy.py): nothing by guess.

A log dir holding Kafka's internal topics and ordinary topics, with old, expired segments everywhere: with
no policy configured the daemon compacts only the internal topics (Kafka gives them `compact`), deletes
nothing, and reports every ordinary topic in `/status` with why; with a KRaft metadata log and the broker's
server.properties it does what Kafka would.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from segments.tools.generate import WorkloadSpec, generate_partition
from tests.kraft_builders import topic, topic_config, write_kraft_log_dir

from .daemon_helpers import (
    HOUR_MS,
    T0,
    DaemonProcess,
    FileClock,
    free_port,
    log_end_offset,
    records_of,
    segment_bases,
    wait_until,
)

SMALL = dict(records=600, keys=50, segment_bytes=8 * 1024, timestamp_step_ms=1000)
LATER_MS = T0 + 30 * 24 * HOUR_MS  # every segment is far past Kafka's default retention (7 days)


def _config(path: Path, log_dir: Path, port: int, extra: str = "") -> Path:
    path.write_text(f'"log.dirs" = ["{log_dir}"]\n"log.cleaner.backoff.ms" = 100\n'
                    f'"log.retention.check.interval.ms" = 200\n"min.cleanable.dirty.ratio" = 0.01\n{extra}\n'
                    f'[server]\nlisten = "127.0.0.1:{port}"\ndiscovery_interval_ms = 200\n')
    return path


def _start(tmp_path: Path, config: Path, port: int, *args: str) -> DaemonProcess:
    clock = FileClock(tmp_path / "clock-ms", LATER_MS)
    return DaemonProcess(config, port, tmp_path / "daemon.log", clock=clock, extra_args=args).start()


@pytest.mark.slow
def test_with_no_policy_configured_only_internal_topics_are_compacted_and_nothing_is_deleted(tmp_path):
    log_dir = tmp_path / "logs"
    names = ["__consumer_offsets-3", "__transaction_state-1", "orders-0", "clicks-2"]
    for i, name in enumerate(names):
        generate_partition(log_dir / name, WorkloadSpec(seed=i, **SMALL))
    before = {name: (segment_bases(log_dir / name), records_of(log_dir / name)) for name in names}
    port = free_port()
    daemon = _start(tmp_path, _config(tmp_path / "c.toml", log_dir, port), port)
    try:
        for name in names[:2]:
            wait_until(lambda: daemon.partition(name)["rounds"] >= 1, timeout_s=60, what=f"{name} compacted")
        time.sleep(1.5)  # several retention checks and selection passes
        status = daemon.partitions()
        for name in names[:2]:
            assert status[name]["cleanup_policy"] == "compact" and status[name]["policy_known"]
            assert "internal topic" in status[name]["policy_source"]
            assert status[name]["retention_segments_deleted"] == 0
            assert segment_bases(log_dir / name)[0] == 0  # compacted, not deleted
        for name in names[2:]:
            assert not status[name]["policy_known"] and status[name]["cleanup_policy"] == ""
            assert "no KRaft metadata log" in status[name]["policy_source"]
            assert status[name]["rounds"] == 0 and status[name]["retention_segments_deleted"] == 0
            assert (segment_bases(log_dir / name), records_of(log_dir / name)) == before[name]
        log_text = daemon.log_text()
        assert log_text.count("partition left as it is dir=") == 2  # each reported once
        # the hint names what decides every topic for the daemon: its config file (run has no --set)
        assert log_text.count('the config file\'s flat "cleanup.policy" = ... decides every topic') == 2, log_text
        assert "--set cleanup.policy" not in log_text
    finally:
        daemon.close()


@pytest.mark.slow
def test_with_kraft_metadata_and_server_properties_the_daemon_does_what_kafka_would(tmp_path):
    log_dir = write_kraft_log_dir(tmp_path / "logs", [
        topic("orders"), topic("users"), topic_config("users", "cleanup.policy", "compact"),
    ])
    for i, name in enumerate(["orders-0", "users-0", "__consumer_offsets-0"]):
        generate_partition(log_dir / name, WorkloadSpec(seed=i, **SMALL))
    properties = tmp_path / "server.properties"
    properties.write_text(f"log.dirs={log_dir}\nprocess.roles=broker\nnode.id=1\n")
    metadata_before = sorted((p.name, p.read_bytes()) for p in (log_dir / "__cluster_metadata-0").iterdir())
    port = free_port()
    daemon = _start(tmp_path, _config(tmp_path / "c.toml", log_dir, port), port, "--server-properties", str(properties))
    try:
        orders = log_dir / "orders-0"
        wait_until(lambda: segment_bases(orders) == [log_end_offset(orders)] or len(segment_bases(orders)) == 1,
                   timeout_s=60, what="orders-0's expired segments deleted (Kafka's default policy: delete)")
        wait_until(lambda: daemon.partition("users-0")["rounds"] >= 1, timeout_s=60, what="users-0 compacted")
        wait_until(lambda: daemon.partition("__consumer_offsets-0")["rounds"] >= 1, timeout_s=60,
                   what="__consumer_offsets-0 compacted")
        status = daemon.partitions()
        assert status["orders-0"]["cleanup_policy"] == "delete" and "Kafka's default" in status["orders-0"]["policy_source"]
        assert status["orders-0"]["rounds"] == 0
        assert "KRaft metadata" in status["users-0"]["policy_source"]
        assert status["users-0"]["retention_segments_deleted"] == 0
        assert "__cluster_metadata-0" not in status
        assert sorted((p.name, p.read_bytes()) for p in (log_dir / "__cluster_metadata-0").iterdir()) == metadata_before
        assert json.dumps(daemon.status()["clusters"]).count("KRaft metadata") == 1
    finally:
        daemon.close()
