"""What an offset map's inserts cost by the table's density, the entries' order and the threads inserting
(bench/RESULTS.md, fifteenth round). A benchmark measures; it never asserts a time.

Inserts 8 M W2-like entries (1 M distinct keys drawn uniformly, random 128-bit hashes) in windows of 70,000, as the
survey does, straight into the table kernel (`offsetmap._kernels.insert_hashes`, each region fixed: no growth),
each case `--repeats` times into a zeroed table (the first run of a case also pays its pages' first touch):

* `--slots N,...`: one thread into a table of N slots (1 M keys fill 1.12 M slots to 89%, 2.1 M to 48%): the cost
  of a denser or sparser region;
* `--sorted`: the same, each window's entries first stably sorted by their first bucket (a pass that makes the
  table's accesses ascending), the sort's own time shown apart;
* `--split`: the offset map itself in two parts filled on two threads (`OffsetMap.reset(parts=2)`,
  `cleaner.indexing.PartThreads`: each thread inserts its part's keys of every window), against one part on one
  thread, each window through `insert_hashes` with the superseded offsets' bitmap as the survey calls it (issue
  22: one large partition on several cores).

Usage: python bench/map_insert_bench.py [--slots 1120000,1333333,2097152] [--sorted] [--split] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cleaner.indexing import PartThreads
from offsetmap import OffsetMap
from offsetmap._compiled import kernels
from offsetmap.map import _allocate_table, _allocate_tags

KEYS = 1_000_000
ENTRIES = 8_000_000
WINDOW = 70_000  # about a W2 window's records
SPLIT_MAP_BYTES = 256 << 20  # bench/run.py's dedupe buffer
_NO_BITS = np.empty(0, dtype=np.uint8)


def _entries(seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    key_h1 = np.frombuffer(rng.bytes(8 * KEYS), dtype=np.uint64)
    key_h2 = np.frombuffer(rng.bytes(8 * KEYS), dtype=np.uint64)
    pick = rng.integers(0, KEYS, ENTRIES)
    return key_h1[pick], key_h2[pick], np.arange(ENTRIES, dtype=np.int64)


def _insert(table: np.ndarray, tags: np.ndarray, slots: int, h1, h2, offsets, previous, size: int) -> int:
    choice = np.uint64(max(1, slots // 8))
    _, size = kernels().insert_hashes(table, tags, slots, choice, -(-slots // 8), 1, h1, h2, offsets, size, 2**62,
                                      previous, _NO_BITS, 0)
    return int(size)


def one_thread(table, tags, slots, h1, h2, offsets, previous, order_by_bucket: bool = False
               ) -> tuple[float, float, int]:
    """(seconds in all, of which sorting, keys) of one thread inserting every window into `slots` slots (and the
    table's tags, `offsetmap.map`)."""
    part = table[: 3 * slots]
    part.fill(0)
    tags.fill(0)
    size, sorting = 0, 0.0
    started = time.perf_counter()
    for s in range(0, ENTRIES, WINDOW):
        a, b, o, p = h1[s:s + WINDOW], h2[s:s + WINDOW], offsets[s:s + WINDOW], previous[s:s + WINDOW]
        if order_by_bucket:
            t = time.perf_counter()
            order = np.argsort(((a >> np.uint64(32)) * np.uint64(max(1, slots // 8))) >> np.uint64(32), kind="stable")
            a, b, o = a[order], b[order], o[order]
            sorting += time.perf_counter() - t
        size = _insert(part, tags, slots, a, b, o, p, size)
    return time.perf_counter() - started, sorting, size


def in_parts(offset_map: OffsetMap, parts: int, h1, h2, offsets) -> tuple[float, int, int]:
    """(seconds, keys, parts at the end) of `parts` threads filling the map in as many parts
    (`OffsetMap.reset(parts=...)`, `cleaner.indexing.PartThreads`), every window through `insert_hashes` with the
    bitmap of superseded offsets, as a round's survey fills it; one part is the one-thread insert."""
    bits = np.zeros(ENTRIES // 8, dtype=np.uint8)
    offset_map.reset(1, expected_keys=ENTRIES, parts=parts)
    with PartThreads(parts - 1) as run:
        started = time.perf_counter()
        for s in range(0, ENTRIES, WINDOW):
            offset_map.insert_hashes(h1[s:s + WINDOW], h2[s:s + WINDOW], offsets[s:s + WINDOW],
                                     superseded=(bits, 0), run=run)
        return time.perf_counter() - started, offset_map.size, offset_map.parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", default="1120000,1333333,1600000,2097152,4194304")
    parser.add_argument("--sorted", action="store_true")
    parser.add_argument("--split", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    h1, h2, offsets = _entries()
    previous = np.empty(ENTRIES, dtype=np.int64)
    sizes = [int(s) for s in args.slots.split(",") if s]
    _, table = _allocate_table(max(sizes))
    _, tags = _allocate_tags(max(sizes))
    print(f"{ENTRIES:,} entries of {KEYS:,} keys in windows of {WINDOW:,}; median of {args.repeats} (min-max), ns an entry")
    for slots in sizes:
        runs = [one_thread(table, tags, slots, h1, h2, offsets, previous) for _ in range(args.repeats)]
        ns = [r[0] / ENTRIES * 1e9 for r in runs]
        print(f"one thread, {slots:,} slots ({slots * 24 / 2**20:.0f} MiB, {runs[0][2] / slots:.0%} full): "
              f"{statistics.median(ns):.1f} ns ({min(ns):.1f}-{max(ns):.1f})")
        if args.sorted:
            runs = [one_thread(table, tags, slots, h1, h2, offsets, previous, True) for _ in range(args.repeats)]
            ns = [r[0] / ENTRIES * 1e9 for r in runs]
            sort_ns = statistics.median(r[1] / ENTRIES * 1e9 for r in runs)
            print(f"  sorted by first bucket: {statistics.median(ns):.1f} ns ({min(ns):.1f}-{max(ns):.1f}), "
                  f"of which the sort {sort_ns:.1f}")
    if args.split:
        offset_map = OffsetMap(SPLIT_MAP_BYTES)
        runs: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.repeats):
            for parts in (1, 2):  # interleaved: the machine's drift falls on both
                elapsed, keys, held = in_parts(offset_map, parts, h1, h2, offsets)
                assert keys == len(np.unique(h1)) and held == parts, "the map lost keys or its parts"
                runs[parts].append(elapsed)
        one, two = statistics.median(runs[1]), statistics.median(runs[2])
        print(f"the map in parts ({SPLIT_MAP_BYTES >> 20} MiB, growing regions): one thread {one:.3f} s, two threads "
              f"in two parts {two:.3f} s ({one / two:.2f}x)")

if __name__ == "__main__":
    main()
