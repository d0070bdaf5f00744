"""Generational cleaning: the plan's arithmetic, and rounds that keep every guarantee of a full recopy.

Model test: a seeded stream of skewed updates, tombstones and committed/aborted transactions is appended in
rounds and cleaned in generational mode after each; after every round a read-committed consumer sees the
latest value of every key, only input offsets and in order; partial rounds recopy less than the log; and a
full cycle leaves exactly the records a Kafka-style full recopy after every round leaves.
"""

from __future__ import annotations

import random

import pytest

from cleaner.generations import GENERATIONS_FILE, load_starts, plan_round, save_starts
from segments.partition.log import LogConfig

from ..reliability.scenario import committed_records, latest_by_key
from .builders import DAY_MS, T0, Rec, abort, batch, build_log, clean, commit, partition_dir, txn_batch

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=256)
NOW = T0 + 1000


def test_plan_merges_young_generations_while_they_are_small_against_what_is_merged():
    bases = [0, 100, 200, 300, 400, 500]
    sizes = [8000, 4000, 1000, 500, 300, 200]  # gens start at 0, 100, 200, 300; dirty = [400, 600)
    plan = plan_round([100, 200, 300], bases, sizes, log_start=0, first_dirty=400, first_uncleanable=600,
                      ratio=2.0, map_capacity=10**6)
    # dirty 500 B, ratio 2: gen@300 (500 ≤ 1000) joins → 1000 merged; gen@200 (1000 ≤ 2000) → 2000; gen@100
    # (4000 ≤ 4000) → 6000; gen@0 (8000 ≤ 12000) joins too: a full cycle.
    assert plan.full and plan.recopy_from == 0 and plan.map_from == 100 and plan.merged == 4
    plan = plan_round([100, 200, 300], bases, sizes, log_start=0, first_dirty=400, first_uncleanable=600,
                      ratio=1.0, map_capacity=10**6)
    # ratio 1: gen@300 (500 ≤ 500) → 1000; gen@200 (1000 ≤ 1000) → 2000; gen@100 (4000 > 2000) stays.
    assert (plan.recopy_from, plan.map_from, plan.merged, plan.full) == (200, 300, 2, False)


def test_plan_merges_nothing_when_the_youngest_generation_is_large_and_respects_the_map_capacity():
    bases, sizes = [0, 100, 200], [9000, 9000, 100]
    plan = plan_round([100], bases, sizes, log_start=0, first_dirty=200, first_uncleanable=300, ratio=4.0,
                      map_capacity=10**6)
    assert (plan.recopy_from, plan.map_from, plan.merged) == (200, 200, 0)
    plan = plan_round([100], bases, [10, 10, 100], log_start=0, first_dirty=200, first_uncleanable=300, ratio=4.0,
                      map_capacity=150)  # merging gen@0 needs the map over [100, 300): 200 > 150
    assert (plan.recopy_from, plan.map_from, plan.full) == (100, 200, False)


def test_stale_generation_starts_are_ignored_and_the_file_round_trips(tmp_path):
    plan = plan_round([50, 100, 999], [0, 100], [10, 10], log_start=0, first_dirty=100, first_uncleanable=100,
                      ratio=4.0, map_capacity=10)
    assert plan.generations == (0,)
    save_starts(tmp_path, [3, 1, 2])
    assert load_starts(tmp_path) == [1, 2, 3]
    (tmp_path / GENERATIONS_FILE).write_text("{not json")
    assert load_starts(tmp_path) == []


def _round_steps(rnd: random.Random, first_seq: int, batches: int, hot_keys: int, cold_keys: int) -> list[bytes]:
    steps, seq, pid = [], first_seq, 7
    for i in range(batches):
        recs = []
        for _ in range(rnd.randint(1, 3)):
            k = rnd.randrange(hot_keys) if rnd.random() < 0.9 else hot_keys + rnd.randrange(cold_keys)
            value = None if rnd.random() < 0.1 else b"v%06d" % seq
            recs.append(Rec(b"k%04d" % k, value, T0 + seq))
            seq += 1
        if i % 9 == 8:
            steps.append(txn_batch(recs, pid=pid, seq=seq))
            steps.append(abort(pid) if rnd.random() < 0.4 else commit(pid))
        else:
            steps.append(batch(recs))
    return steps


def _history(seed: int):
    rnd = random.Random(seed)
    first = [batch([Rec(b"k%04d" % k, b"first-%04d" % k, T0)]) for k in range(200)]  # every key once
    return [first] + [_round_steps(rnd, 10_000 * (r + 1), 40, hot_keys=8, cold_keys=192) for r in range(8)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_generational_rounds_keep_the_latest_value_and_a_full_cycle_matches_kafka(tmp_path, seed):
    history = _history(seed)
    gen_dir, full_dir = partition_dir(tmp_path / "gen"), partition_dir(tmp_path / "full")
    generational = {"cleaner.mode": "generational", "cleaner.generation.ratio": 2.0, "delete.retention.ms": DAY_MS}
    written = []
    partial_rounds = 0
    for steps in history:
        for d in (gen_dir, full_dir):
            build_log(d, steps, config=CONFIG)
        before = committed_records(gen_dir)
        written += [r for r in before if r not in set(written)]
        result = clean(gen_dir, now_ms=NOW, settings=generational, config=CONFIG)
        clean(full_dir, now_ms=NOW, settings={"delete.retention.ms": DAY_MS}, config=CONFIG)
        if not result.full_cycle:
            partial_rounds += 1
            assert result.recopy_from > 0
        seen = committed_records(gen_dir)
        offsets = [o for o, _, _ in seen]
        assert offsets == sorted(set(offsets))
        assert set(seen) <= set(before)
        expected, got = latest_by_key(before), latest_by_key(seen)
        assert {k: v for k, v in got.items() if v is not None} == {k: v for k, v in expected.items() if v is not None}
    assert partial_rounds >= 3, "the skewed history must give partial rounds"
    gen_records = committed_records(gen_dir)
    assert len(gen_records) > len(committed_records(full_dir)), "superseded records survive in older generations"
    full_cycle = clean(gen_dir, now_ms=NOW, settings=generational, force_recopy=True, config=CONFIG)
    assert full_cycle.full_cycle and full_cycle.recopy_from == 0
    assert committed_records(gen_dir) == committed_records(full_dir)


def test_a_forced_round_merges_every_generation_the_map_can_cover():
    bases, sizes = [0, 100, 200], [9000, 9000, 100]
    plan = plan_round([100], bases, sizes, log_start=0, first_dirty=200, first_uncleanable=300, ratio=4.0,
                      map_capacity=10**6, force_full=True)
    assert (plan.recopy_from, plan.map_from, plan.full) == (0, 100, True)
    plan = plan_round([100], bases, sizes, log_start=0, first_dirty=200, first_uncleanable=300, ratio=4.0,
                      map_capacity=150, force_full=True)
    assert (plan.recopy_from, plan.full) == (100, False)
