"""What an offset map's inserts cost by the table's density, the entries' order and the threads inserting
(bench/RESULTS.md, fifteenth round). A benchmark measures; it never asserts a time.

Inserts 8 M W2-like entries (1 M distinct keys drawn uniformly, random 128-bit hashes) in windows of 70,000, as the
survey does, straight into the table kernel (`offsetmap._kernels.insert_hashes`, each region fixed: no growth),
each case `--repeats` times into a zeroed table (the first run of a case also pays its pages' first touch):

* `--slots N,...`: one thread into a table of N slots (1 M keys fill 1.12 M slots to 89%, 2.1 M to 48%): the cost
  of a denser or sparser region;
* `--sorted`: the same, each window's entries first stably sorted by their first bucket (a pass that makes the
  table's accesses ascending), the sort's own time shown apart;
* `--split`: two threads, each inserting its half of every window (split by the hash's lowest bit, on the calling
  thread, timed apart) into its own half of a 2.1 M-slot table, against one thread into the whole table: what a
  map split by hash would give the survey's inserts (issue 22: one large partition on several cores).

Usage: python bench/map_insert_bench.py [--slots 1120000,1333333,2097152] [--sorted] [--split] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offsetmap._compiled import kernels
from offsetmap.map import _allocate_table

KEYS = 1_000_000
ENTRIES = 8_000_000
WINDOW = 70_000  # about a W2 window's records
SPLIT_SLOTS = 2_097_152  # the region 1 M keys end in (a region doubles when half full)
_NO_BITS = np.empty(0, dtype=np.uint8)


def _entries(seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    key_h1 = np.frombuffer(rng.bytes(8 * KEYS), dtype=np.uint64)
    key_h2 = np.frombuffer(rng.bytes(8 * KEYS), dtype=np.uint64)
    pick = rng.integers(0, KEYS, ENTRIES)
    return key_h1[pick], key_h2[pick], np.arange(ENTRIES, dtype=np.int64)


def _insert(table: np.ndarray, slots: int, h1, h2, offsets, previous, size: int) -> int:
    choice = np.uint64(max(1, slots // 8))
    _, size = kernels().insert_hashes(table, slots, choice, -(-slots // 8), h1, h2, offsets, size, 2**62, previous,
                                      _NO_BITS, 0)
    return int(size)


def one_thread(table, slots, h1, h2, offsets, previous, order_by_bucket: bool = False) -> tuple[float, float, int]:
    """(seconds in all, of which sorting, keys) of one thread inserting every window into `slots` slots."""
    part = table[: 3 * slots]
    part.fill(0)
    size, sorting = 0, 0.0
    started = time.perf_counter()
    for s in range(0, ENTRIES, WINDOW):
        a, b, o, p = h1[s:s + WINDOW], h2[s:s + WINDOW], offsets[s:s + WINDOW], previous[s:s + WINDOW]
        if order_by_bucket:
            t = time.perf_counter()
            order = np.argsort(((a >> np.uint64(32)) * np.uint64(max(1, slots // 8))) >> np.uint64(32), kind="stable")
            a, b, o = a[order], b[order], o[order]
            sorting += time.perf_counter() - t
        size = _insert(part, slots, a, b, o, p, size)
    return time.perf_counter() - started, sorting, size


def two_threads(table, h1, h2, offsets) -> tuple[float, float, int]:
    """(seconds in all, of which splitting, keys) of two threads, each inserting its half of every window into its
    half of the table; the window is split on the calling thread, and both halves go in before the next window."""
    half = SPLIT_SLOTS // 2
    table[: 3 * SPLIT_SLOTS].fill(0)
    parts = [table[: 3 * half], table[3 * half: 6 * half]]
    sizes = [0, 0]
    jobs: list = [None, None]
    go = [threading.Semaphore(0), threading.Semaphore(0)]
    done = threading.Semaphore(0)

    def worker(p: int) -> None:
        while True:
            go[p].acquire()
            if jobs[p] is None:
                return
            sizes[p] = _insert(parts[p], half, *jobs[p], sizes[p])
            done.release()

    threads = [threading.Thread(target=worker, args=(p,), daemon=True) for p in (0, 1)]
    for t in threads:
        t.start()
    splitting = 0.0
    started = time.perf_counter()
    for s in range(0, ENTRIES, WINDOW):
        t = time.perf_counter()
        a, b, o = h1[s:s + WINDOW], h2[s:s + WINDOW], offsets[s:s + WINDOW]
        low = (b & np.uint64(1)).astype(bool)
        for p, rows in enumerate((np.flatnonzero(~low), np.flatnonzero(low))):
            jobs[p] = (a[rows], b[rows], o[rows], np.empty(len(rows), dtype=np.int64))
        splitting += time.perf_counter() - t
        go[0].release()
        go[1].release()
        done.acquire()
        done.acquire()
    elapsed = time.perf_counter() - started
    for p in (0, 1):
        jobs[p] = None
        go[p].release()
    for t in threads:
        t.join()
    return elapsed, splitting, sizes[0] + sizes[1]


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
    _, table = _allocate_table(max([*sizes, SPLIT_SLOTS]))
    print(f"{ENTRIES:,} entries of {KEYS:,} keys in windows of {WINDOW:,}; median of {args.repeats} (min-max), ns an entry")
    for slots in sizes:
        runs = [one_thread(table, slots, h1, h2, offsets, previous) for _ in range(args.repeats)]
        ns = [r[0] / ENTRIES * 1e9 for r in runs]
        print(f"one thread, {slots:,} slots ({slots * 24 / 2**20:.0f} MiB, {runs[0][2] / slots:.0%} full): "
              f"{statistics.median(ns):.1f} ns ({min(ns):.1f}-{max(ns):.1f})")
        if args.sorted:
            runs = [one_thread(table, slots, h1, h2, offsets, previous, True) for _ in range(args.repeats)]
            ns = [r[0] / ENTRIES * 1e9 for r in runs]
            sort_ns = statistics.median(r[1] / ENTRIES * 1e9 for r in runs)
            print(f"  sorted by first bucket: {statistics.median(ns):.1f} ns ({min(ns):.1f}-{max(ns):.1f}), "
                  f"of which the sort {sort_ns:.1f}")
    if args.split:
        ones, twos, splits = [], [], []
        for _ in range(args.repeats):
            ones.append(one_thread(table, SPLIT_SLOTS, h1, h2, offsets, previous)[0])
            elapsed, splitting, keys = two_threads(table, h1, h2, offsets)
            assert keys == one_thread(table, SPLIT_SLOTS, h1, h2, offsets, previous)[2], "the halves lost keys"
            twos.append(elapsed)
            splits.append(splitting)
        one, two, split = statistics.median(ones), statistics.median(twos), statistics.median(splits)
        print(f"split by hash, {SPLIT_SLOTS:,} slots: one thread {one:.3f} s, two threads {two:.3f} s "
              f"({one / two:.2f}x), of which the split on the calling thread {split:.3f} s "
              f"(without it {one / (two - split):.2f}x)")


if __name__ == "__main__":
    main()
