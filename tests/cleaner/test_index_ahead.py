"""The offset map filled in the survey's pass (`cleaner.indexing.IndexAhead`) is the index phase's map.

Each case cleans two copies of one log, round after round: one as it runs, one with the survey's indexing
turned off (the index phase reads the section again, as before). Files and every round counter but
`bytes_read` (the index phase's own reads, gone when the survey indexed) must be equal, and the case says
whether the survey's pass was used.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import asdict

import pytest

from cleaner import indexing
from cleaner import round as round_module
from segments.codec import format as fmt
from segments.codec.records import Record, encode_batch
from tests.kafka_fixtures import copy_kafka_fixture

from .builders import (
    DAY_MS,
    ROLL,
    T0,
    Rec,
    abort,
    batch,
    build_log,
    clean,
    commit,
    file_digests,
    partition_dir,
    random_log,
    set_high_watermark,
    txn_batch,
    write_raw_segment,
)

TIMINGS = {"elapsed_s", "survey_s", "index_s", "recopy_s", "verify_s", "bytes_read"}


def _rounds(directory, *, map_bytes, settings=None, now_ms=T0 + 2 * DAY_MS, limit=12):
    out = []
    for _ in range(limit):
        result = clean(directory, now_ms=now_ms, map_bytes=map_bytes, settings=settings)
        out.append({k: v for k, v in asdict(result).items() if k not in TIMINGS})
        if result.done:
            break
    return out


def _compare(tmp_path, monkeypatch, build, *, map_bytes=24 * 4096, settings=None):
    """(rounds of the survey's pass, how many rounds it indexed); asserts equality with the index phase's."""
    used = []
    real_result = indexing.IndexAhead.result

    def spying_result(self, *args):
        index = real_result(self, *args)
        used.append(index is not None)
        return index

    a, b = partition_dir(tmp_path / "a"), partition_dir(tmp_path / "b")
    build(a)
    shutil.copytree(a.parent, b.parent)
    with monkeypatch.context() as m:
        m.setattr(indexing.IndexAhead, "result", spying_result)
        fused = _rounds(a, map_bytes=map_bytes, settings=settings)
    with monkeypatch.context() as m:
        m.setattr(round_module, "_index_ahead", lambda *args: None)
        plain = _rounds(b, map_bytes=map_bytes, settings=settings)
    assert fused == plain
    assert file_digests(a) == file_digests(b)
    return fused, sum(used)


def _keyed_log(seed: int, *, codec_choice=True, batches=80):
    def build(directory):
        rnd = random.Random(seed)
        steps = []
        for i in range(batches):
            recs = [Rec(b"k%d" % rnd.randint(0, 30), None if rnd.random() < 0.15 else b"v%d" % i, T0 + i,
                        delta=j) for j in range(rnd.randint(1, 6))]
            codec = rnd.choice(list(fmt.COMPRESSION_NAMES)) if codec_choice else fmt.COMPRESSION_NONE
            steps.append(batch(recs, compression=codec))
            if rnd.random() < 0.12:
                steps.append(ROLL)
        build_log(directory, steps)
    return build


@pytest.mark.parametrize("seed", range(6))
def test_full_rounds_of_logs_without_transactions_index_in_the_survey(tmp_path, monkeypatch, seed):
    rounds, used = _compare(tmp_path, monkeypatch, _keyed_log(seed))
    assert used >= 1


@pytest.mark.parametrize("seed", range(4))
def test_partial_rounds_a_map_that_fills_mid_batch_and_the_next_rounds_from_inside_a_segment(tmp_path, monkeypatch,
                                                                                             seed):
    rounds, used = _compare(tmp_path, monkeypatch, _keyed_log(100 + seed), map_bytes=24 * 8)
    assert len(rounds) > 2 and used == len(rounds)
    assert any(r["map_full"] for r in rounds)


def test_a_high_watermark_inside_a_segment_bounds_the_section_alike(tmp_path, monkeypatch):
    def build(directory):
        build_log(directory, [batch([(b"k%d" % (i % 5), b"v%d" % i) for i in range(4)]) if s != ROLL else ROLL
                              for s in ["b", "b", ROLL, "b", "b", ROLL, "b", "b"]])
        set_high_watermark(directory, 13)  # inside the second segment, [8, 16)

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert rounds[0]["first_uncleanable"] == 8 and used == 1


def test_an_aborted_transaction_in_the_section_is_dropped_from_the_survey_pass(tmp_path, monkeypatch):
    """`a` of the aborted transaction must not supersede `a`=1: if the survey's pass inserted it, the round
    would drop `a`=1, and the files would differ from the index phase's."""
    def build(directory):
        build_log(directory, [batch([(b"a", b"1"), (b"b", b"1")]), txn_batch([(b"a", b"2")], pid=5),
                              batch([(b"b", b"2")]), abort(5), txn_batch([(b"b", b"3")], pid=6), commit(6),
                              ROLL, batch([(b"b", b"4")])])

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert used == 1 and rounds[0]["records_indexed"] == 5  # a=1, b=1, b=2, b=3, b=4 (the last segment is not active)


def test_a_transaction_across_segments_is_held_until_its_marker(tmp_path, monkeypatch):
    def build(directory):
        build_log(directory, [batch([(b"a", b"1")]), txn_batch([(b"a", b"2"), (b"c", b"2")], pid=5), ROLL,
                              batch([(b"b", b"1")]), txn_batch([(b"b", b"2")], pid=5), ROLL, abort(5),
                              batch([(b"c", b"3")]), ROLL, batch([(b"z", b"1")])])

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert used == 1 and rounds[0]["records_indexed"] == 4  # a=1, b=1, c=3, z=1 (the last segment is not active)


def test_an_open_transaction_inside_an_inactive_segment_ends_the_section_below_the_end_assumed(tmp_path,
                                                                                               monkeypatch):
    """The open transaction bounds the section at its segment's base (8): the survey's pass stopped there, so it
    is used; the same transaction starting after indexed records of its segment is not (they went in)."""
    def build(first_batch):
        def build_it(directory):
            steps = [batch([(b"a", b"1")]), ROLL] + ([] if first_batch else [batch([(b"a", b"2")])])
            build_log(directory, steps + [txn_batch([(b"a", b"3")], pid=5), batch([(b"b", b"1")]), ROLL,
                                          batch([(b"z", b"1")])])
        return build_it

    rounds, used = _compare(tmp_path / "first", monkeypatch, build(True))
    assert rounds[0]["first_uncleanable"] == 1 and used == 1
    rounds, used = _compare(tmp_path / "later", monkeypatch, build(False))
    assert rounds[0]["first_uncleanable"] == 1 and used == 0


def test_a_marker_at_the_high_watermark_keeps_its_transaction_undecided(tmp_path, monkeypatch):
    """The transaction from 1 ends at 4, past the high watermark: it stays undecided (the section ends at 1),
    and the survey's pass, which held back what follows its first offset, is used."""
    def build(directory):
        build_log(directory, [batch([(b"a", b"1")]), ROLL, txn_batch([(b"a", b"2")], pid=5), batch([(b"b", b"1")]),
                              ROLL, batch([(b"a", b"3")]), abort(5), ROLL, batch([(b"a", b"5")]), ROLL,
                              batch([(b"z", b"1")])])
        set_high_watermark(directory, 4)  # the abort marker, at 4, is not replicated

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert rounds[0]["first_uncleanable"] == 1 and used == 1


@pytest.mark.parametrize("seed", range(12))
def test_random_transactional_logs_every_codec_index_in_the_survey_alike(tmp_path, monkeypatch, seed):
    """Every transaction ended: every full round's map is built in the survey's pass."""
    rounds, used = _compare(tmp_path, monkeypatch, lambda d: random_log(d, seed, batches_max=50))
    assert used == len(rounds)


@pytest.mark.parametrize("seed", range(12))
def test_random_transactional_logs_with_partial_rounds_index_in_the_survey_alike(tmp_path, monkeypatch, seed):
    """A map of a few keys fills inside transactions; the next rounds start inside a segment."""
    rounds, used = _compare(tmp_path, monkeypatch, lambda d: random_log(d, 40 + seed, batches_max=60),
                            map_bytes=24 * 4)
    assert used == len(rounds) and len(rounds) > 1


@pytest.mark.parametrize("seed", range(16))
def test_random_logs_with_transactions_left_open_and_a_high_watermark_come_out_the_same(tmp_path, monkeypatch,
                                                                                        seed):
    def build(directory):
        random_log(directory, 80 + seed, batches_max=60, end_transactions=seed % 2 == 0)
        if seed % 4 >= 2:
            set_high_watermark(directory, random.Random(seed).randint(5, 150))

    _compare(tmp_path, monkeypatch, build, map_bytes=24 * (4 if seed % 3 == 0 else 4096))


def test_more_held_back_than_the_bound_leaves_indexing_to_the_index_phase(tmp_path, monkeypatch):
    """A transaction open across the section holds every later record back: past `HELD_BYTES_MAX`, the
    survey's pass gives up and the index phase reads the section."""
    monkeypatch.setattr(indexing, "HELD_BYTES_MAX", 24 * 10)

    def build(directory):
        build_log(directory, [txn_batch([(b"t", b"1")], pid=5)]
                  + [batch([(b"k%d" % i, b"v")]) for i in range(20)] + [ROLL, commit(5), ROLL, batch([(b"z", b"1")])])

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert used == 0 and rounds[0]["records_indexed"] == 22  # t, k0-k19, z (the last segment is not active)


def test_min_compaction_lag_is_not_foreseen(tmp_path, monkeypatch):
    rounds, used = _compare(tmp_path, monkeypatch, _keyed_log(3), settings={"min.compaction.lag.ms": 1})
    assert used == 0


def test_a_log_cleaned_by_kafka_with_gaps_between_segments_indexed_from_its_start(tmp_path, monkeypatch):
    """Kafka's cleaner leaves offset gaps where a segment's last records went (KAFKA-8764): indexing the whole
    log again (no checkpoint) must jump them the same way in both passes."""
    def build(directory):
        copy_kafka_fixture("kafka-2.4-c2/kafka-cleaned", directory)

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert used == len(rounds) == 1


def test_offset_gaps_between_segments_are_jumped_alike(tmp_path, monkeypatch):
    """Segments [0, 10) and [20, 30) then the active one at 40: a fully indexed section ends at 40, not 30."""
    def build(directory):
        directory.mkdir(parents=True)
        for base in (0, 20, 40):
            records = [Record(offset=base + i, timestamp=T0 + base + i, key=b"k%d" % (i % 3), value=b"v") for i in range(10)]
            write_raw_segment(directory, base, encode_batch(records, base_offset=base) if base < 40 else b"")

    rounds, used = _compare(tmp_path, monkeypatch, build)
    assert used == 1 and rounds[0]["end_offset"] == 40
