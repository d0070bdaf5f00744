"""The daemon's Prometheus metrics: Kafka's cleaner metrics under Prometheus names, and what Kafka lacks.

Owns one `CollectorRegistry` per daemon (no module-level state): counters and a histogram updated as
rounds finish and bytes move, and a collector that reads the manager's and pool's state at scrape time
for the gauges (so they are never stale). Names:

| metric | meaning |
|---|---|
| logcleaner_max_buffer_utilization_percent | max over threads of the last round's offset-map utilization |
| logcleaner_cleaner_recopy_percent | 100 × Σ bytes written / Σ bytes read over the threads' last rounds |
| logcleaner_max_clean_time_seconds | max over threads of the last round's duration |
| logcleaner_max_compaction_delay_seconds | how far past max.compaction.lag.ms the most overdue log is |
| logcleaner_dead_thread_count | cleaner threads that died (each is replaced) |
| logcleaner_uncleanable_partitions{log_dir} | partitions marked uncleanable, per log dir |
| logcleaner_uncleanable_bytes{log_dir} | their cleanable bytes |
| logcleaner_max_dirty_percent | highest dirty ratio seen at the last selection, × 100 |
| logcleaner_time_since_last_run_seconds | since a thread last looked for work |
| logcleaner_io_bytes_total{direction} | bytes read and written by cleaning |
| logcleaner_partition_dirty_ratio{topic,partition,log_dir} | per partition |
| logcleaner_partition_cleanable_bytes{topic,partition,log_dir} | per partition |
| logcleaner_partition_next_delete_horizon_seconds{topic,partition,log_dir} | when a kept tombstone's or marker's delete horizon passes next (epoch seconds, read from the log's batch headers at every selection, whoever stamped it; -1: none kept) |
| logcleaner_round_duration_seconds | histogram of round durations |
| logcleaner_rounds_total{result} | rounds by outcome: ok, aborted, failed |
| logcleaner_records_removed_total, logcleaner_bytes_removed_total | what cleaning removed |
| logcleaner_retention_segments_deleted_total, logcleaner_retention_bytes_deleted_total | what retention deleted |
| logcleaner_threads_alive, logcleaner_log_dirs_offline | pool and log-dir health |
| logcleaner_log_dir_bytes{log_dir} | bytes of the log dir's partitions (as last surveyed) |
| logcleaner_log_dir_free_bytes{log_dir}, logcleaner_log_dir_capacity_bytes{log_dir} | its filesystem |
| logcleaner_io_budget_bytes_per_second | the throttle's budget (each device gets all of it) |
| logcleaner_io_throttle_bytes_per_second{device} | cleaning I/O the device's budget let through, per second over the last 10 s |
| logcleaner_io_throttle_utilization{device} | that as a fraction of the budget (0 when unlimited) |
| logcleaner_io_throttle_wait_seconds_total{device} | time cleaning threads waited for the device's budget |
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["CleanerMetrics"]

_ROUND_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class CleanerMetrics:
    """Metrics of one daemon. `state` is a callable returning the live figures the gauges report."""

    def __init__(self, state: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._state = state
        self._lock = threading.Lock()
        self._last_rounds: dict[int, tuple[float, int, int, float]] = {}  # thread -> (util, read, written, s)
        self.io_bytes = Counter(
            "logcleaner_io_bytes", "Bytes read and written by cleaning.", ["direction"], registry=self.registry
        )
        for direction in ("read", "write"):
            self.io_bytes.labels(direction)
        self.round_duration = Histogram(
            "logcleaner_round_duration_seconds", "Duration of cleaning rounds.", buckets=_ROUND_BUCKETS_S,
            registry=self.registry,
        )
        self.rounds = Counter("logcleaner_rounds", "Cleaning rounds by outcome.", ["result"], registry=self.registry)
        for result in ("ok", "aborted", "failed"):
            self.rounds.labels(result)
        self.records_removed = Counter(
            "logcleaner_records_removed", "Records removed by cleaning.", registry=self.registry
        )
        self.bytes_removed = Counter("logcleaner_bytes_removed", "Bytes removed by cleaning.", registry=self.registry)
        self.segments_deleted = Counter(
            "logcleaner_retention_segments_deleted", "Segments deleted by retention.", registry=self.registry
        )
        self.retention_bytes_deleted = Counter(
            "logcleaner_retention_bytes_deleted", "Bytes deleted by retention.", registry=self.registry
        )
        self.registry.register(_StateCollector(self))

    def record_io(self, n_bytes: int, direction: str) -> None:
        self.io_bytes.labels(direction).inc(n_bytes)

    def record_round(self, thread_index: int, result) -> None:
        self.rounds.labels("ok").inc()
        self.round_duration.observe(result.elapsed_s)
        if not result.dry_run:
            self.records_removed.inc(max(0, result.records_read - result.records_written))
            self.bytes_removed.inc(max(0, result.size_before_bytes - result.size_after_bytes))
        with self._lock:
            self._last_rounds[thread_index] = (
                result.map_utilization, result.bytes_read, result.bytes_written, result.elapsed_s
            )

    def record_retention(self, segments: int, n_bytes: int) -> None:
        self.segments_deleted.inc(segments)
        self.retention_bytes_deleted.inc(n_bytes)

    def record_outcome(self, outcome: str) -> None:
        self.rounds.labels(outcome).inc()

    def last_rounds(self) -> list[tuple[float, int, int, float]]:
        with self._lock:
            return list(self._last_rounds.values())


class _StateCollector:
    """Gauges computed from the daemon's live state at each scrape."""

    def __init__(self, metrics: CleanerMetrics) -> None:
        self._metrics = metrics

    def describe(self):
        return []

    def collect(self):
        state = self._metrics._state()
        last = self._metrics.last_rounds()

        def gauge(name, doc, value, labels=None, samples=None):
            family = GaugeMetricFamily(name, doc, labels=labels)
            if samples is not None:
                for label_values, v in samples:
                    family.add_metric(label_values, v)
            else:
                family.add_metric([], value)
            return family

        read = sum(r[1] for r in last)
        written = sum(r[2] for r in last)
        yield gauge("logcleaner_max_buffer_utilization_percent",
                    "Max over threads of the last round's offset-map utilization, percent.",
                    100.0 * max((r[0] for r in last), default=0.0))
        yield gauge("logcleaner_cleaner_recopy_percent",
                    "100 x bytes written / bytes read over the threads' last rounds.",
                    100.0 * written / max(read, 1))
        yield gauge("logcleaner_max_clean_time_seconds", "Max over threads of the last round's duration.",
                    max((r[3] for r in last), default=0.0))
        yield gauge("logcleaner_max_compaction_delay_seconds",
                    "How far past max.compaction.lag.ms the most overdue log is.",
                    state["max_compaction_delay_ms"] / 1000.0)
        yield gauge("logcleaner_dead_thread_count", "Cleaner threads that died (each is replaced).",
                    state["dead_threads"])
        yield gauge("logcleaner_threads_alive", "Cleaner threads running.", state["threads_alive"])
        yield gauge("logcleaner_max_dirty_percent", "Highest dirty ratio at the last selection, percent.",
                    state["max_dirty_percent"])
        yield gauge("logcleaner_time_since_last_run_seconds", "Seconds since a thread last looked for work.",
                    state["time_since_last_run_s"])
        yield gauge("logcleaner_io_budget_bytes_per_second", "The I/O throttle's budget per device.",
                    state["io_budget_bytes_per_second"])
        yield gauge("logcleaner_log_dirs_offline",
                    "Log dirs offline: after an I/O error, or while a running Kafka broker owns them (.lock).",
                    state["log_dirs_offline"])
        throttles = state.get("io_throttles", {})  # device -> (bytes/s let through, utilization, wait seconds)
        yield gauge("logcleaner_io_throttle_bytes_per_second",
                    "Cleaning I/O the device's budget let through, bytes per second over the last 10 s.", None,
                    ["device"], [([d], v[0]) for d, v in throttles.items()])
        yield gauge("logcleaner_io_throttle_utilization",
                    "Cleaning I/O over the last 10 s as a fraction of the device's budget (0 when unlimited).", None,
                    ["device"], [([d], v[1]) for d, v in throttles.items()])
        waited = CounterMetricFamily("logcleaner_io_throttle_wait_seconds",
                                     "Seconds cleaning threads waited for the device's I/O budget.", labels=["device"])
        for d, v in throttles.items():
            waited.add_metric([d], v[2])
        yield waited
        uncleanable = state["uncleanable"]  # log_dir -> (count, bytes)
        yield gauge("logcleaner_uncleanable_partitions", "Partitions marked uncleanable.", None, ["log_dir"],
                    [([d], c) for d, (c, _) in uncleanable.items()])
        yield gauge("logcleaner_uncleanable_bytes", "Cleanable bytes of uncleanable partitions.", None, ["log_dir"],
                    [([d], b) for d, (_, b) in uncleanable.items()])
        usage = state.get("log_dirs", {})  # log_dir -> (log bytes, free bytes, filesystem bytes)
        for i, (name, doc) in enumerate((
            ("logcleaner_log_dir_bytes", "Bytes of the log dir's partitions, as last surveyed."),
            ("logcleaner_log_dir_free_bytes", "Free bytes of the log dir's filesystem (for unprivileged users)."),
            ("logcleaner_log_dir_capacity_bytes", "Size of the log dir's filesystem."),
        )):
            yield gauge(name, doc, None, ["log_dir"], [([d], v[i]) for d, v in usage.items()])
        partitions = state["partitions"]  # (topic, partition, log_dir, ratio, cleanable)
        labels = ["topic", "partition", "log_dir"]
        yield gauge("logcleaner_partition_dirty_ratio", "Dirty ratio of each partition.", None, labels,
                    [([t, str(p), d], r) for t, p, d, r, _ in partitions])
        yield gauge("logcleaner_partition_cleanable_bytes", "Cleanable bytes of each partition.", None, labels,
                    [([t, str(p), d], c) for t, p, d, _, c in partitions])
        horizons = state.get("delete_horizons", [])  # (topic, partition, log_dir, next horizon ms or -1)
        yield gauge("logcleaner_partition_next_delete_horizon_seconds",
                    "When the next kept tombstone's or marker's delete horizon passes, epoch seconds (-1: none kept).",
                    None, labels, [([t, str(p), d], h / 1000.0 if h >= 0 else -1.0) for t, p, d, h in horizons])
