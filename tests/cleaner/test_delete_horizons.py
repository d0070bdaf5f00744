"""Delete horizons (KIP-534) end to end: one `clean` finishes what Kafka's cleaner would, and a log with
nothing left to remove is left alone (issue 17 §4, issue 23 §1).

Logs are written by kafka-python's record builder and read back by kafka-python (`tests/kafka_python_logs`),
so the verdicts come from an implementation of the format independent of ours, never from our counters.
Producers have expired by the clocks used here (record timestamps + 2 days), unless a test says otherwise.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cleaner.cli import main
from cleaner.round import clean_round
from cleaner.settings import Settings
from offsetmap import OffsetMap
from segments.partition.log import LogConfig, PartitionLog

from ..kafka_python_logs import (
    ABORT,
    COMMIT,
    Batch,
    committed_latest,
    data,
    file_states,
    inactive,
    marker,
    read_partition,
    txn,
    write_partition,
)

T0 = 1_700_000_000_000
DAY_MS = 86_400_000
NOW = T0 + 2 * DAY_MS  # every producer of these logs has expired (producer.id.expiration.ms: one day)
MAP_BYTES = 24 * 4096


def clean_cli(directory, *args: str, now_ms: int = NOW) -> dict:
    """`logcleaner clean DIR --json --now-ms NOW ARGS...`; the partition's JSON summary."""
    out = CliRunner().invoke(main, ["clean", str(directory), "--json", "--now-ms", str(now_ms), *args])
    assert out.exit_code == 0, out.output
    (summary,) = [json.loads(line) for line in out.output.splitlines() if line.startswith("{")]
    return summary


def tombstones(records):
    return [r for r in records if r.control_type is None and r.key is not None and r.value is None]


def markers(records):
    return [(r.producer_id, r.control_type) for r in records if r.control_type is not None]


def keyed_log(directory, *, keys: int = 400, deleted: int = 166):
    """`keys` keys written twice over three segments, the last `deleted` of them deleted by tombstones spread over
    the second and third segment, one more tombstone in the active segment. Returns the expected latest values."""
    first = [data([(b"k%03d" % i, b"v1-%03d" % i, T0 + i) for i in range(j, j + 20)]) for j in range(0, keys, 20)]
    second = [data([(b"k%03d" % i, b"v2-%03d" % i, T0 + 1000 + i) for i in range(j, j + 20)])
              for j in range(0, keys, 20)]
    gone = range(keys - deleted, keys)
    deletes = [data([(b"k%03d" % i, None, T0 + 2000 + i) for i in gone[j:j + 10]]) for j in range(0, deleted, 10)]
    write_partition(directory, [first, second + deletes[: len(deletes) // 2], deletes[len(deletes) // 2:],
                                [data([(b"active", None, T0 + 3000)])]])
    return {b"k%03d" % i: b"v2-%03d" % i for i in range(keys - deleted)}


# ---- issue 17 §4: one clean finishes what Kafka would -----------------------------------------------------------


def test_one_clean_with_zero_delete_retention_leaves_no_tombstone_outside_the_active_segment(tmp_path):
    d = tmp_path / "logs" / "p-0"
    expected = keyed_log(d)
    assert len(tombstones(read_partition(d))) == 167
    summary = clean_cli(d, "--set", "delete.retention.ms=0")
    assert summary["status"] == "ok" and summary["rounds"] == 2  # the first stamps the horizons, the second removes
    records = read_partition(d)
    assert tombstones(inactive(records, d)) == []
    assert [(r.key, r.value) for r in tombstones(records)] == [(b"active", None)]  # the active segment is never cleaned
    assert {k: v for k, v in committed_latest(records).items() if k != b"active"} == expected
    assert not any(r.batch_has_horizon for r in records)  # no tombstone or marker left: no horizon either


def test_a_later_clean_removes_tombstones_stamped_by_an_earlier_one_once_their_horizon_passed(tmp_path):
    d = tmp_path / "logs" / "p-0"
    expected = keyed_log(d)
    first = clean_cli(d, now_ms=NOW)  # delete.retention.ms: one day
    assert first["rounds"] == 1
    stamped = tombstones(inactive(read_partition(d), d))
    assert len(stamped) == 166 and all(r.batch_has_horizon for r in stamped)

    before = file_states(d.parent)
    early = clean_cli(d, now_ms=NOW + DAY_MS - 1)  # nothing dirty, no horizon passed: nothing to do
    assert early["rounds"] == 1 and early["bytes_written"] == 0
    assert file_states(d.parent) == before

    later = clean_cli(d, now_ms=NOW + DAY_MS)  # no new data, no --from-offset: the horizon alone makes it due
    assert later["rounds"] == 1 and later["records_written"] < later["records_read"]
    records = read_partition(d)
    assert tombstones(inactive(records, d)) == []
    assert {k: v for k, v in committed_latest(records).items() if k != b"active"} == expected


def transactions_log(directory):
    """Committed and aborted transactions, and tombstones inside and outside them. Returns the expected latest
    committed values and the markers that must stay."""
    write_partition(directory, [
        [
            data([(b"k5", b"before", T0)]),
            txn([(b"k1", b"txn-1", T0), (b"k2", b"txn-1", T0)], pid=1),  # committed, stays the latest
            txn([(b"k3", b"txn-2", T0)], pid=2),  # committed, superseded below
            txn([(b"k4", b"txn-3", T0)], pid=3),  # aborted
            marker(1, COMMIT, timestamp=T0),
            marker(3, ABORT, timestamp=T0),
        ],
        [
            txn([(b"k5", None, T0 + 1)], pid=4),  # a committed tombstone: its marker goes only after it
            marker(2, COMMIT, timestamp=T0 + 1),
            data([(b"k3", b"plain", T0 + 2), (b"k6", None, T0 + 2)]),
            marker(4, COMMIT, timestamp=T0 + 2),
        ],
        [data([(b"k7", b"v", T0 + 3)], codec=1), data([(b"k7", None, T0 + 4), (b"k8", b"v", T0 + 4)])],
        [],  # the active segment
    ])
    return {b"k1": b"txn-1", b"k2": b"txn-1", b"k3": b"plain", b"k8": b"v"}, [(1, COMMIT)]


def test_one_clean_with_zero_delete_retention_removes_tombstones_and_markers_of_transactions_without_data(tmp_path):
    d = tmp_path / "logs" / "p-0"
    expected, kept_markers = transactions_log(d)
    summary = clean_cli(d, "--set", "delete.retention.ms=0")
    # the dirty round; a pass removing the tombstones and the markers stamped with them, stamping pid 4's
    # marker whose only data was a tombstone; a pass removing that marker
    assert summary["rounds"] == 3
    records = read_partition(d)
    assert tombstones(records) == []
    assert markers(records) == kept_markers
    assert committed_latest(records) == expected
    assert not any(r.batch_has_horizon for r in records)
    verify = CliRunner().invoke(main, ["verify", str(d)])
    assert verify.exit_code == 0, verify.output


def test_once_runs_one_round_and_a_later_once_runs_the_due_horizon_pass(tmp_path):
    d = tmp_path / "logs" / "p-0"
    expected = keyed_log(d)
    first = clean_cli(d, "--set", "delete.retention.ms=0", "--once")
    assert first["rounds"] == 1
    assert len(tombstones(inactive(read_partition(d), d))) == 166  # stamped, still there
    second = clean_cli(d, "--set", "delete.retention.ms=0", "--once")
    assert second["rounds"] == 1
    records = read_partition(d)
    assert tombstones(inactive(records, d)) == []
    assert {k: v for k, v in committed_latest(records).items() if k != b"active"} == expected


def test_dry_run_reports_the_due_horizon_pass_and_changes_nothing(tmp_path):
    d = tmp_path / "logs" / "p-0"
    keyed_log(d)
    clean_cli(d)  # stamps the tombstones: horizon NOW + one day
    before = file_states(d.parent)
    dry = clean_cli(d, "--dry-run", now_ms=NOW + DAY_MS)
    assert dry["rounds"] == 1 and dry["dry_run"]
    assert dry["records_read"] - dry["records_written"] == 166  # what the pass would remove
    assert file_states(d.parent) == before


def test_a_second_clean_of_a_log_with_nothing_to_do_changes_no_file(tmp_path):
    d = tmp_path / "logs" / "p-0"
    transactions_log(d)
    clean_cli(d, "--set", "delete.retention.ms=0")
    before = file_states(d.parent)
    for now_ms in (NOW, NOW + DAY_MS, NOW + 30 * DAY_MS):
        again = clean_cli(d, "--set", "delete.retention.ms=0", now_ms=now_ms)
        assert again["bytes_written"] == 0
        assert file_states(d.parent) == before  # same bytes, same inodes, same mtimes


# ---- the round: output equal to input swaps nothing ------------------------------------------------------------


def _round(directory, now_ms, *, segment_bytes=1 << 30, retention_ms=0, **kwargs):
    topic = Settings.from_mappings({"delete.retention.ms": retention_ms, "segment.bytes": segment_bytes}).topic("p")
    with PartitionLog.open(directory, mode="cleaner", config=LogConfig(segment_bytes=segment_bytes)) as log:
        return clean_round(log, topic, OffsetMap(MAP_BYTES), now_ms=now_ms, seed=7, **kwargs)


def test_a_forced_round_over_a_log_with_nothing_to_remove_swaps_nothing(tmp_path):
    d = tmp_path / "logs" / "p-0"
    transactions_log(d)
    clean_cli(d, "--set", "delete.retention.ms=0")
    before = file_states(d.parent)
    result = _round(d, NOW + DAY_MS, force_recopy=True)
    assert result.groups >= 1 and result.groups_unchanged == result.groups
    assert result.next_delete_horizon_ms == -1
    assert file_states(d.parent) == before  # no rename, no new inode, no mtime change, no .cleaned left


def test_forced_rounds_over_single_segment_groups_swap_none_of_them(tmp_path):
    d = tmp_path / "logs" / "p-0"
    # five segments of 40 distinct keys each: no segment can join its neighbour under 3 KiB
    segments = [[data([(b"s%d-%02d" % (s, i), b"x" * 40, T0) for i in range(j, j + 10)]) for j in range(0, 40, 10)]
                for s in range(5)]
    write_partition(d, segments + [[]])
    first = _round(d, NOW, segment_bytes=3000)
    assert first.groups == 5 and first.groups_unchanged == 5  # nothing to remove: nothing swapped
    before = file_states(d.parent)
    again = _round(d, NOW, segment_bytes=3000, force_recopy=True)
    assert again.groups == 5 and again.groups_unchanged == 5
    assert file_states(d.parent) == before


def test_a_batch_that_lost_its_tombstones_is_written_without_a_delete_horizon(tmp_path):
    # issue 23: the batch kept b=b-v2 with a horizon that had passed, and the log was due for ever
    d = tmp_path / "logs" / "t-0"
    write_partition(d, [
        [data([(b"a", b"a-v1", T0), (b"b", b"b-v1", T0), (b"c", b"c-v1", T0)])],
        [data([(b"a", None, T0 + 1), (b"b", b"b-v2", T0 + 1)])],
        [data([(b"z", b"z", T0 + 2)])],
    ])
    first = _round(d, NOW, retention_ms=2000)
    assert first.next_delete_horizon_ms == NOW + 2000
    assert [(r.key, r.value, r.batch_has_horizon) for r in inactive(read_partition(d), d)] == [
        (b"c", b"c-v1", False), (b"a", None, True), (b"b", b"b-v2", True)]
    second = _round(d, NOW + 2000, retention_ms=2000, horizon_pass=True)
    assert second.groups == 1 and second.groups_unchanged == 0
    assert second.next_delete_horizon_ms == -1
    assert [(r.key, r.value, r.batch_has_horizon) for r in inactive(read_partition(d), d)] == [
        (b"c", b"c-v1", False), (b"b", b"b-v2", False)]
    before = file_states(d.parent)
    for later in (NOW + 2001, NOW + 10 * DAY_MS):
        result = _round(d, later, retention_ms=2000, horizon_pass=True)
        assert result.groups == 0 and result.next_delete_horizon_ms == -1  # nothing due: no pass at all
    assert file_states(d.parent) == before


# ---- the fixed point, over random logs ---------------------------------------------------------------------------


@st.composite
def histories(draw):
    """Random logs: plain batches and committed or aborted transactions of three producers, tombstones in and
    out of them, rolls; every transaction ends. Returns (segments, transactional tombstones?)."""
    segments: list[list[Batch]] = [[]]
    open_txns: dict[int, int] = {}  # pid -> next sequence
    txn_tombstone = False
    ts = T0
    for _ in range(draw(st.integers(1, 25))):
        ts += 1
        kind = draw(st.sampled_from(["plain", "plain", "txn", "end", "roll"]))
        if kind == "roll":
            segments.append([])
            continue
        if kind == "end":
            if open_txns:
                pid = draw(st.sampled_from(sorted(open_txns)))
                del open_txns[pid]
                segments[-1].append(marker(pid, draw(st.sampled_from([COMMIT, ABORT])), timestamp=ts))
            continue
        recs = [(b"k%d" % draw(st.integers(0, 5)), draw(st.sampled_from([None, b"v%d" % ts, b"w%d" % ts])), ts)
                for _ in range(draw(st.integers(1, 3)))]
        codec = draw(st.sampled_from([0, 0, 1, 4]))
        if kind == "txn":
            pid = draw(st.integers(1, 3))
            seq = open_txns.get(pid, 0)
            open_txns[pid] = seq + len(recs)
            segments[-1].append(txn(recs, pid=pid, seq=seq, codec=codec))
            txn_tombstone |= any(v is None for _, v, _ in recs)
        else:
            segments[-1].append(data(recs, codec=codec))
    for pid in sorted(open_txns):
        segments[-1].append(marker(pid, COMMIT, timestamp=ts + 1))
    return segments + [[]], txn_tombstone


# Found by the explore profile: the `.txnindex` entry of an aborted transaction whose first data batch went while
# its last stays as an empty header for its producer was rewritten with a later first offset by the next recopy.
ABORTED_WITH_AN_EMPTY_HEADER_LEFT = (
    [[data([(b"k0", None, T0 + 1)]), txn([(b"k0", None, T0 + 2)], pid=3), data([(b"k0", None, T0 + 3)]),
      txn([(b"k0", None, T0 + 4)], pid=3, seq=1), txn([(b"k0", None, T0 + 5)], pid=1),
      data([(b"k0", b"v", T0 + 6)]), marker(3, ABORT, timestamp=T0 + 7), marker(1, COMMIT, timestamp=T0 + 8)], []],
    True,
)
# Found by the explore profile: with small groups, the second pass merges two groups, the first group's last
# batch (an empty header of the transaction's data) is no longer kept, and only then is the marker stamped.
MERGED_GROUPS_RELEASE_A_MARKER = (
    [[txn([(b"k0", b"v", T0 + 1)], pid=1)],
     [marker(1, COMMIT, timestamp=T0 + 2)] + [data([(b"k0", None, T0 + 3 + i)]) for i in range(7)], []],
    False,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(history=histories(), segment_bytes=st.sampled_from([1 << 30, 300]), retention_ms=st.sampled_from([0, 5000]),
       expired=st.booleans())
@example(history=ABORTED_WITH_AN_EMPTY_HEADER_LEFT, segment_bytes=1 << 30, retention_ms=0, expired=False)
@example(history=MERGED_GROUPS_RELEASE_A_MARKER, segment_bytes=300, retention_ms=0, expired=True)
def test_rounds_reach_a_fixed_point_within_two_passes_and_it_stays_put(tmp_path_factory, history, segment_bytes,
                                                                        retention_ms, expired):
    segments, txn_tombstone = history
    # A transaction whose data is a tombstone needs one pass more: its marker is stamped when the tombstone goes.
    passes_max = 3 if txn_tombstone else 2
    if segment_bytes < 1 << 20:
        # Several groups: a pass may merge groups whose last batches were kept as empty headers (each group keeps
        # its last batch, cleaner/recopy.py); an empty transactional header let go that way releases its marker,
        # stamped then and removed a pass later. At most one pass more per segment merged.
        passes_max += len(segments)
    d = tmp_path_factory.mktemp("fixed") / "logs" / "p-0"
    write_partition(d, segments)
    before_latest = {k: v for k, v in committed_latest(read_partition(d)).items() if v is not None}
    now = T0 + (2 * DAY_MS if expired else 10_000)

    def round_at(now_ms, **kwargs):
        return _round(d, now_ms, segment_bytes=segment_bytes, retention_ms=retention_ms, horizon_pass=True, **kwargs)

    # Each round as `clean` and the daemon run it, each at a time past every horizon stamped before it.
    changed = 0
    for _ in range(passes_max + 2):
        state = file_states(d.parent)
        result = round_at(now)
        now += retention_ms + 1
        if file_states(d.parent) == state:
            break
        changed += 1
    assert changed <= passes_max
    assert result.next_delete_horizon_ms == -1  # nothing left for a pass: no daemon would select it again
    records = read_partition(d)
    assert tombstones(records) == []
    assert all(r.control_type is not None or r.value is not None for r in records if r.batch_has_horizon)
    assert committed_latest(records) == before_latest

    fixed = file_states(d.parent)
    for later in (now, now + 3_600_000):  # within the hour: a producer that had not expired still has not
        assert round_at(later).groups == 0  # nothing dirty, nothing due: no recopy
        if segment_bytes > 1 << 20:  # one group: even a forced recopy comes out as it went in
            forced = round_at(later, force_recopy=True)
            assert forced.groups_unchanged == forced.groups
    assert file_states(d.parent) == fixed
