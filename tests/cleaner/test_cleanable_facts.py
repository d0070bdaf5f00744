"""The facts selection reads without a round (`segments.partition.facts`) are the ones a round's survey finds,
so `cleaner.cleanable.cleanable_range` gives selection and round the same range (issue 18); and they are cheap:
each segment file is walked once while it does not change, an active segment only where it grew.
"""

from __future__ import annotations

import os
import random

import pytest

from cleaner.cleanable import cleanable_range
from cleaner.settings import Settings
from cleaner.survey import survey_log
from segments.codec import format as fmt
from segments.codec.errors import CorruptRecordError
from segments.codec.records import Record, encode_batch, encode_control_batch
from segments.files import facts as segment_facts
from segments.partition.facts import FactsCache, first_unstable_offset
from segments.partition.log import LogConfig, PartitionLog

from .builders import DAY_MS, ROLL, T0, abort, batch, build_log, clean, commit, partition_dir, txn_batch


def _survey_facts(directory, high_watermark):
    with PartitionLog.open(directory, mode="reader") as log:
        return survey_log(log).facts(high_watermark)


def _log(directory, seed: int, *, leave_open: bool) -> None:
    """A seeded log of plain, idempotent and transactional batches, commits, aborts, a control record that is
    no transaction marker, and rolls, so that transactions span segments; with `leave_open`, some never end."""
    rnd = random.Random(seed)
    steps: list = []
    open_txns: set[int] = set()
    for i in range(60):
        kind = rnd.random()
        recs = [(b"k%d" % rnd.randint(0, 5), b"v%d" % i, T0 + rnd.randint(0, 50))]
        if kind < 0.35:
            pid = rnd.choice([1, 2, 3, 4])
            steps.append(txn_batch(recs, pid=pid))
            open_txns.add(pid)
        elif kind < 0.5 and open_txns:
            pid = rnd.choice(sorted(open_txns))
            open_txns.discard(pid)
            steps.append(commit(pid, timestamp=T0 + i) if rnd.random() < 0.5 else abort(pid, timestamp=T0 + i))
        elif kind < 0.55:
            steps.append(commit(rnd.choice([1, 2, 3, 4]), timestamp=T0 + i))  # a marker with no data before it
        elif kind < 0.58:
            steps.append(encode_control_batch(offset=0, control_type=5, timestamp=T0 + i, producer_id=1,
                                              producer_epoch=0))  # not a transaction marker: ends nothing
        else:
            steps.append(batch(recs, producer_id=10, producer_epoch=0) if kind < 0.7 else batch(recs))
        if rnd.random() < 0.2:
            steps.append(ROLL)
    if not leave_open:
        steps += [commit(pid) for pid in sorted(open_txns)]
    build_log(directory, steps, roll_at_end=rnd.random() < 0.5)


@pytest.fixture(params=["batch by batch", "in windows"])
def walk_mode(request, monkeypatch):
    """Either walk of an inactive segment: the test logs are small, so the windowed one is made the rule."""
    if request.param == "in windows":
        monkeypatch.setattr(segment_facts, "WINDOWED_MIN_BYTES", 0)
    return request.param


@pytest.mark.parametrize("seed", range(12))
def test_the_facts_read_without_a_round_are_the_surveys(tmp_path, seed, walk_mode):
    d = partition_dir(tmp_path)
    _log(d, seed, leave_open=seed % 2 == 0)
    end = _survey_facts(d, None).segments[-1].next_offset
    cache = FactsCache()
    for hw in (None, 0, end // 3, end // 2, end - 1, end):
        assert cache.read(d, high_watermark=hw) == _survey_facts(d, hw), hw
    clean(d, now_ms=T0 + 2 * DAY_MS)  # emptied markers and batches, a checkpoint; new files
    for hw in (None, end // 2, end):
        assert cache.read(d, high_watermark=hw) == _survey_facts(d, hw), hw


def test_selection_and_round_find_the_same_range_from_their_facts(tmp_path):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"1")]), ROLL, batch([(b"b", b"1")]), txn_batch([(b"c", b"1")], pid=3), ROLL,
                  batch([(b"a", b"2")]), ROLL, commit(3), ROLL, batch([(b"b", b"2")])])
    topic = Settings.from_mappings({"cleanup.policy": "compact"}).topic("t")
    for hw in (None, 2, 4, 5, 6):  # the commit (offset 4) is not below a high watermark of 2 or 4
        ranges = [cleanable_range(facts, topic, log_start_offset=0, now_ms=T0, checkpoint=None)
                  for facts in (FactsCache().read(d, high_watermark=hw), _survey_facts(d, hw))]
        assert ranges[0] == ranges[1]
    assert FactsCache().read(d, high_watermark=4).first_unstable_offset == 2
    assert FactsCache().read(d, high_watermark=5).first_unstable_offset is None


def test_first_unstable_offset_folds_transactions_across_segments():
    walk = segment_facts.TxnSummary
    first = walk(first_markers=(), later_markers=(), later_firsts_min=(), open_at_end=((7, 10), (8, 12)), max_marker=-1)
    # producer 7's transaction (begun at 10) ends at 20; 8's stays open; 9's begins at 25 and ends at 30
    second = walk(first_markers=((7, 20, 15),), later_markers=(30,), later_firsts_min=(25,), open_at_end=(),
                  max_marker=30)
    assert first_unstable_offset([first, second]) == 12
    assert first_unstable_offset([first]) == 10
    assert first_unstable_offset([second]) is None
    assert first_unstable_offset([first, second], high_watermark=20) == 10  # 7's marker is not below it
    assert first_unstable_offset([second], high_watermark=21) == 25
    assert first_unstable_offset([second], high_watermark=20) == 15  # no data of 7 before: its own first


def test_the_least_delete_horizon_of_a_segments_batches_with_records_is_one_of_its_facts(tmp_path, walk_mode):
    d = partition_dir(tmp_path)
    build_log(d, [
        batch([(b"a", b"1")]), batch([(b"b", None)], delete_horizon_ms=T0 + 500),
        batch([(b"c", None)], delete_horizon_ms=T0 + 300), ROLL,
        encode_batch([], base_offset=0, last_offset_delta=0, delete_horizon_ms=T0 + 100),  # emptied: keeps nothing
        batch([(b"d", None)], delete_horizon_ms=T0 + 700), ROLL,
        batch([(b"e", None)], delete_horizon_ms=T0 + 50),  # the active segment
    ], roll_at_end=False)
    facts = FactsCache().read(d)
    assert facts == _survey_facts(d, None)
    assert [s.earliest_delete_horizon_ms for s in facts.segments] == [T0 + 300, T0 + 700, T0 + 50]
    bases = [s.base_offset for s in facts.segments]
    assert facts.earliest_delete_horizon_ms(0, bases[2]) == T0 + 300
    assert facts.earliest_delete_horizon_ms(0, bases[2], frozenset({0})) == T0 + 700
    topic = Settings.from_mappings({"cleanup.policy": "compact"}).topic("t")
    # What a pass reaches, [log start, first uncleanable): the active segment's horizon is not among them.
    rng = cleanable_range(facts, topic, log_start_offset=0, now_ms=T0, checkpoint=bases[2])
    assert rng.empty and rng.kept_delete_horizon_ms == T0 + 300
    assert not rng.horizon_passed(T0 + 299) and rng.horizon_passed(T0 + 300)
    rng = cleanable_range(facts, topic, log_start_offset=bases[1], now_ms=T0, checkpoint=bases[2])
    assert rng.kept_delete_horizon_ms == T0 + 700
    build_log(d, [batch([(b"f", b"1")])], roll_at_end=True)  # roll: every segment is within reach
    assert cleanable_range(FactsCache().read(d), topic, log_start_offset=0, now_ms=T0,
                           checkpoint=bases[2]).kept_delete_horizon_ms == T0 + 50


class _Walks:
    """Counts the segment walks and the bytes they walk over."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[int, int, bool]] = []  # (base offset, position walked from, inactive)
        advance = segment_facts.SegmentWalk.advance

        def counted(walk, segment, *, inactive=False):
            self.calls.append((walk.base_offset, walk.position, inactive))
            return advance(walk, segment, inactive=inactive)

        monkeypatch.setattr(segment_facts.SegmentWalk, "advance", counted)


def test_a_file_is_walked_once_while_it_does_not_change_and_a_grown_one_only_where_it_grew(tmp_path, monkeypatch):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"1")]), ROLL, txn_batch([(b"b", b"1")], pid=2), ROLL, batch([(b"c", b"1")])],
              roll_at_end=False)
    walks = _Walks(monkeypatch)
    cache = FactsCache()
    facts = cache.read(d)
    bases = [s.base_offset for s in facts.segments]
    assert walks.calls == [(b, 0, True) for b in bases[:-1]] + [(bases[-1], 0, False)]
    assert facts.first_unstable_offset == 1
    walks.calls.clear()
    assert cache.read(d) == facts
    assert walks.calls == []  # nothing changed: no file opened
    active_size = facts.segments[-1].size_bytes
    with PartitionLog.open(d, mode="writer", config=LogConfig()) as log:
        log.append_batches(commit(2))
    grown = cache.read(d)
    assert walks.calls == [(bases[-1], active_size, False)]  # the active segment, from where its walk stopped
    assert grown.first_unstable_offset is None and grown.segments[:-1] == facts.segments[:-1]
    assert grown == _survey_facts(d, None)


def test_a_rewritten_file_is_walked_again_from_its_start(tmp_path, monkeypatch):
    d = partition_dir(tmp_path)
    build_log(d, [txn_batch([(b"a", b"1")], pid=2), batch([(b"a", b"2")]), ROLL, batch([(b"c", b"1")])])
    cache = FactsCache()
    assert cache.read(d).first_unstable_offset == 0
    first = d / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    data = b"".join(encode_batch([Record(o, T0, b"a", b"%d" % o)], base_offset=o) for o in range(3))
    tmp = first.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, first)  # a new file, larger than the old one
    walks = _Walks(monkeypatch)
    facts = cache.read(d)
    assert walks.calls == [(0, 0, True)]
    assert facts.first_unstable_offset is None and facts.segments[0].next_offset == 3


def test_an_inactive_segment_with_an_incomplete_final_batch_is_corrupt_the_active_one_is_being_written(tmp_path,
                                                                                                          walk_mode):
    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"1")]), ROLL, batch([(b"b", b"1")])], roll_at_end=False)
    active = d / fmt.offset_file_name(1, fmt.LOG_SUFFIX)
    whole = _survey_facts(d, None)
    with open(active, "ab") as f:
        f.write(batch([(b"c", b"1")])[:30])  # its writer is part way through an append
    assert FactsCache().read(d).segments[-1].next_offset == whole.segments[-1].next_offset
    first = d / fmt.offset_file_name(0, fmt.LOG_SUFFIX)
    with open(first, "ab") as f:
        f.write(b"\0\0\0\0\0\0\0\x09\0\0\0\x40")  # a batch that cannot end where the file does
    with pytest.raises(CorruptRecordError, match="incomplete"):
        FactsCache().read(d)


def test_a_log_dir_entry_that_is_a_link_or_a_fifo_is_refused_unopened(tmp_path):
    from segments.codec.errors import LinkRefusedError, NotRegularFileError

    d = partition_dir(tmp_path)
    build_log(d, [batch([(b"a", b"1")])])
    fifo = d / fmt.offset_file_name(50, fmt.LOG_SUFFIX)
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError):
        FactsCache().read(d)
    fifo.unlink()
    (d / fmt.offset_file_name(50, fmt.LOG_SUFFIX)).symlink_to(d / fmt.offset_file_name(0, fmt.LOG_SUFFIX))
    with pytest.raises(LinkRefusedError):
        FactsCache().read(d)
