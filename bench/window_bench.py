"""A round's per-window read work on one thread, by window size: what a window of the survey and of the recopy
costs the thread that reads it (bench/RESULTS.md, twentieth round). A benchmark measures; it never asserts a time.

Walks the first `--segments` inactive segments of a partition (any partition directory, e.g. `bench/data/src/w1-0`;
its pages cached: run it twice, the first run reads them in) window by window as a round does: each window a
mapping of its pages, populated (`LogSegment.scan_windows(mapped=True)`), then scanned with its records, in the
cases:

* `crc`: the survey's scan (every batch's CRC-32C checked first, then the records walked);
* `no crc`: the recopy's scan (the records walked in a window nothing has read before);
* `+ keys`: and the records' keys hashed as the survey's index does (`cleaner.indexing._window_keys`).

Prints per window size and case the median and the best of `--repeats` walks, in ms per GB of the segments, the
cases interleaved so that the machine's drift falls on each alike. It times the code of the tree it is run from:
for an A/B, run it from a worktree of each commit in turn (`git worktree add /tmp/before HEAD~1`, then
`python /tmp/before/bench/window_bench.py PART` and `python bench/window_bench.py PART`), each with its kernels built.

Usage: python bench/window_bench.py PARTITION_DIR [--window-mb 8,16] [--repeats 5] [--segments 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _walk(segments, window_bytes: int, crc: bool, keys: bool) -> float:
    """Seconds to map, populate and scan every window of `segments` (and hash their keys with `keys`)."""
    from cleaner.indexing import _window_keys
    from segments.files.readahead import WindowRing

    ring = WindowRing(window_bytes)
    started = time.perf_counter()
    for segment in segments:
        for _, result in segment.scan_windows(0, window_bytes=window_bytes, verify_crc=crc, ring=ring, mapped=True):
            if keys:
                _window_keys(result, None, 0, 1 << 62, 7)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("partition", type=Path)
    parser.add_argument("--window-mb", default="8,16", help="window sizes in MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--segments", type=int, default=6, help="inactive segments walked (the first ones)")
    args = parser.parse_args()
    from cleaner.allocator import limit_blas_threads, tune_allocator
    from segments.partition.log import PartitionLog

    limit_blas_threads()  # as every logcleaner process does
    tune_allocator()
    sizes = [int(float(x) * 2**20) for x in args.window_mb.split(",")]
    cases = [(size, crc, keys) for size in sizes for crc in (True, False) for keys in (False, True)]
    with PartitionLog.open(args.partition, mode="reader") as log_:
        segments = log_.segments[:-1][: args.segments]
        gb = sum(segment.size_bytes for segment in segments) / 1e9
        _walk(segments, sizes[0], True, True)  # the pages read in, the kernels loaded
        times: dict[tuple[int, bool, bool], list[float]] = {case: [] for case in cases}
        for _ in range(args.repeats):
            for case in cases:
                times[case].append(_walk(segments, *case))
    print(f"{args.partition.name}: {len(segments)} segments, {gb:.2f} GB; ms per GB, median (best) of {args.repeats}")
    print("| window | case | ms/GB | best |")
    print("|---:|---|---:|---:|")
    for (size, crc, keys), runs in times.items():
        case = ("crc" if crc else "no crc") + (" + keys" if keys else "")
        print(f"| {size / 2**20:g} MiB | {case} | {1000 * statistics.median(runs) / gb:.1f} | "
              f"{1000 * min(runs) / gb:.1f} |")


if __name__ == "__main__":
    main()
