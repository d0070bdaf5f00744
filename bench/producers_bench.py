"""The survey's producer tracking per window, against the number of producers in it (issue 22: the GIL).

`cleaner.survey._track_producers` advances the producers' states over one window's batches that carry a producer
id, in one pass of numpy over all of them; the model in `tests/cleaner/test_track_producers.py` (the code it
replaced) did the same with ~20 small numpy calls per producer. Both run under the GIL. Since Kafka 3.0 every
producer is idempotent by default, so a window of a busy topic holds batches of many producers. This times both
on synthetic windows of idempotent batches (best of 5 per case; a benchmark measures, it never asserts a time).

Usage: python bench/producers_bench.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests" / "cleaner"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from test_track_producers import per_producer  # the model, from the path above

from cleaner.survey import _ProducerRows, _track_producers


def main() -> None:
    rng = np.random.default_rng(1)
    print("| producers in the window | batches | per producer ms | one pass ms | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for producers, batches in ((5, 800), (100, 800), (2000, 800), (2000, 8000)):
        pid = rng.integers(0, producers, batches).astype(np.int64) + 10**9
        base = np.arange(batches, dtype=np.int64) * 10
        rows = _ProducerRows(pid, np.zeros(batches, bool), np.zeros(batches, bool), base, base + 9, base,
                             np.full(batches, -1, np.int64))
        best = {}
        for name, track in (("model", per_producer), ("ours", _track_producers)):
            times = []
            for _ in range(5):
                started = time.perf_counter()
                track(rows, {}, [])
                times.append(time.perf_counter() - started)
            best[name] = min(times) * 1e3
        print(f"| {producers:,} | {batches:,} | {best['model']:.2f} | {best['ours']:.2f} | "
              f"{best['model'] / best['ours']:.1f}x |")


if __name__ == "__main__":
    main()
