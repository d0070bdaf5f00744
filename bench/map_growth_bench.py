"""The offset map's growth in a fresh process against a warm one (bench/RESULTS.md, eleventh round).

Inserts 8 M W2-like records (1 M distinct keys, uniform) in windows of 70,000 into a 256 MiB `OffsetMap`, four
maps in a row in one process, and prints per map the total insert time, the time in its region's growths
(`OffsetMap._grow_if_due`, timed by a wrapper) and the process's AnonHugePages. With `--no-huge-pages`, the
map's table is not advised to use transparent huge pages. A benchmark measures; it never asserts a time.

Usage: python bench/map_growth_bench.py [--no-huge-pages] [--maps 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import offsetmap.map as map_module
from offsetmap import OffsetMap

RECORDS = 8_000_000
KEYS = 1_000_000
WINDOW = 70_000  # about a W2 window's records


def _anon_huge_mib() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-huge-pages", action="store_true")
    parser.add_argument("--maps", type=int, default=4)
    args = parser.parse_args()
    if args.no_huge_pages:
        map_module._MADV_HUGEPAGE = None
    keys = np.random.default_rng(1).integers(0, KEYS, size=RECORDS).astype(np.uint64)
    h1 = keys * np.uint64(0x9E37_79B9_7F4A_7C15) + np.uint64(12345)
    h2 = (keys ^ np.uint64(0xABCDEF)) * np.uint64(0xC2B2_AE3D_27D4_EB4F)
    offsets = np.arange(RECORDS, dtype=np.int64)
    grow = OffsetMap._grow_if_due
    for n in range(args.maps):
        growths: list[float] = []

        def timed(self, growths=growths):
            started = time.perf_counter()
            grew = grow(self)
            if grew:
                growths.append(time.perf_counter() - started)
            return grew

        offset_map = OffsetMap(256 << 20)
        offset_map.reset(7, expected_keys=RECORDS)
        OffsetMap._grow_if_due = timed  # type: ignore[method-assign]
        started = time.perf_counter()
        for i in range(0, RECORDS, WINDOW):
            offset_map.insert_hashes(h1[i:i + WINDOW], h2[i:i + WINDOW], offsets[i:i + WINDOW])
        total = time.perf_counter() - started
        OffsetMap._grow_if_due = grow  # type: ignore[method-assign]
        print(f"map {n}: inserts {total:.3f} s, of which {len(growths)} growths {sum(growths):.3f} s "
              f"({', '.join(f'{g * 1e3:.0f}' for g in growths)} ms); AnonHugePages {_anon_huge_mib()} MiB; "
              f"keys {offset_map.size:,}", flush=True)
        del offset_map


if __name__ == "__main__":
    main()
