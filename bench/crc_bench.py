"""The CRC-32C kernels alone (`segments.codec._crc_kernels`, both variants) against the `crc32c` package.

Four cases, each 1 GiB of random bytes, best of `--repeats`: 16 KiB batches of one 1 GiB buffer (one kernel
call; `crc32c.crc32c` per batch, as the scan did); the same 1 GiB as one buffer; one 256 KiB buffer 4096 times
(cache-resident: the instruction's throughput); and 128 windows of 8 MiB, each written just before its
16 KiB batches are checked (as a read-ahead window is).

    .venv/bin/python bench/crc_bench.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import crc32c
import numpy as np

from segments.codec import _crc_kernels as ck

BATCH = 16 * 1024
GIB = 1 << 30


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, GIB, dtype=np.uint8)
    starts = np.arange(0, GIB, BATCH, dtype=np.int64)
    ends = starts + BATCH
    out = np.empty(len(starts), dtype=np.int64)
    small = big[: 256 * 1024].copy()
    small_starts = np.zeros(GIB // len(small), dtype=np.int64)
    small_ends = small_starts + len(small)
    small_out = np.empty(len(small_starts), dtype=np.int64)
    window = np.empty(8 << 20, dtype=np.uint8)
    w_starts = np.arange(0, len(window), BATCH, dtype=np.int64)
    w_ends = w_starts + BATCH
    w_out = np.empty(len(w_starts), dtype=np.int64)
    view, w_view = big.data, window.data
    pairs, w_pairs = list(zip(starts.tolist(), ends.tolist())), list(zip(w_starts.tolist(), w_ends.tolist()))

    def windows(check) -> float:
        spent = 0.0
        for w in range(GIB // len(window)):
            window[:] = big[w * len(window) : (w + 1) * len(window)]
            t = time.perf_counter()
            check()
            spent += time.perf_counter() - t
        return spent

    def package_windows() -> None:
        w_out[:] = [crc32c.crc32c(w_view[a:b]) for a, b in w_pairs]

    print(f"load average {os.getloadavg()[0]:.2f}; best of {args.repeats}; seconds per GiB")
    print("| code | 1 GiB in 16 KiB batches | 1 GiB, one buffer | 256 KiB x 4096 (in cache) | 8 MiB windows just written |")
    print("|---|---:|---:|---:|---:|")
    reference = None
    for name in ck.VARIANTS:
        if name == "sse42" and not ck._has_sse42():
            continue
        ck.use_variant(name)
        ck.batch_crcs(big, starts[:1], ends[:1], out[:1])  # load or compile
        row = [
            _best(lambda: ck.batch_crcs(big, starts, ends, out), args.repeats),
            _best(lambda: ck.crc32c(big), args.repeats),
            _best(lambda: ck.batch_crcs(small, small_starts, small_ends, small_out), args.repeats),
            min(windows(lambda: ck.batch_crcs(window, w_starts, w_ends, w_out)) for _ in range(args.repeats)),
        ]
        reference = out.copy() if reference is None else reference
        assert (out == reference).all()
        print(f"| kernel, {name} | " + " | ".join(f"{t:.3f}" for t in row) + " |")

    def package_batches() -> None:
        out[:] = [crc32c.crc32c(view[a:b]) for a, b in pairs]

    row = [
        _best(package_batches, args.repeats),
        _best(lambda: crc32c.crc32c(big), args.repeats),
        _best(lambda: [crc32c.crc32c(small) for _ in range(len(small_starts))], args.repeats),
        min(windows(package_windows) for _ in range(args.repeats)),
    ]
    assert reference is not None and (out == reference).all()
    print("| `crc32c.crc32c` per batch / buffer (GIL held below 32 KiB) | " + " | ".join(f"{t:.3f}" for t in row) + " |")


if __name__ == "__main__":
    main()
