"""How far this machine itself scales with threads, for the work a round does without the GIL (issue 22).

Before blaming the cleaner for two threads that are not twice one, check that the machine can: each primitive
below runs on 1, 2 and 4 threads at once, every thread with its own data, and the report is the throughput of
T threads over the first count's (one thread by default; 2.0 at T=2 is perfect scaling on two cores):

- `crc-cache`: the CRC-32C kernel (`segments.codec._crc_kernels.batch_crcs`) over a 1 MiB buffer, 512 × 6
  times (compute, in the CPU's cache);
- `crc-memory`: the same kernel over 256 MiB in 8 MiB batches, 6 times (compute from memory);
- `read`: `os.preadv` of a 256 MiB file from the page cache into an 8 MiB buffer, 6 times (the kernel's copy);
- `write`: 1.5 GiB written to a new file in 8 MiB writes, no fsync (the page cache);
- `memcpy`: `numpy.copyto` of 256 MiB, 6 times.

Median of `--repeats` (default 5) per row. The files are made under `--data-dir` and removed at the end. A
benchmark measures; it never asserts a time.

Usage: python bench/machine_scaling.py [--threads 1,2,4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from segments.codec._crc_kernels import batch_crcs

SIZE = 256 << 20
CHUNK = 8 << 20
PASSES = 6  # over the 256 MiB: each timed step takes ~0.1-0.5 s, long enough to read above the noise


def _crc_cache(data: dict, i: int) -> None:
    buf = data["small"][i]
    starts, ends, out = np.zeros(1, np.int64), np.full(1, len(buf), np.int64), np.empty(1, np.int64)
    for _ in range(512 * PASSES):
        batch_crcs(buf, starts, ends, out)


def _crc_memory(data: dict, i: int) -> None:
    buf = data["big"][i]
    starts = np.arange(0, SIZE, CHUNK, dtype=np.int64)
    ends, out = starts + CHUNK, np.empty(len(starts), np.int64)
    for _ in range(PASSES):
        batch_crcs(buf, starts, ends, out)


def _read(data: dict, i: int) -> None:
    buf = bytearray(CHUNK)
    fd = os.open(data["files"][i], os.O_RDONLY)
    try:
        for _ in range(PASSES):
            position = 0
            while position < SIZE:
                position += os.preadv(fd, [buf], position)
    finally:
        os.close(fd)


def _write(data: dict, i: int) -> None:
    buf = bytes(CHUNK)
    path = data["dir"] / f"written-{i}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(PASSES * SIZE // CHUNK):
            os.write(fd, buf)
    finally:
        os.close(fd)
        path.unlink()


def _memcpy(data: dict, i: int) -> None:
    target = np.empty(SIZE, np.uint8)
    for _ in range(PASSES):
        np.copyto(target, data["big"][i])


PRIMITIVES: dict[str, Callable[[dict, int], None]] = {
    "crc-cache": _crc_cache, "crc-memory": _crc_memory, "read": _read, "write": _write, "memcpy": _memcpy,
}


def _timed(fn: Callable[[dict, int], None], data: dict, threads: int) -> float:
    workers = [threading.Thread(target=fn, args=(data, i)) for i in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    most = max(counts)
    directory = args.data_dir / "machine-scaling"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        rng = np.random.default_rng(20240611)
        files = []
        for i in range(most):
            path = directory / f"input-{i}"
            path.write_bytes(rng.integers(0, 256, SIZE, dtype=np.uint8).tobytes())
            files.append(path)
        data = {
            "dir": directory, "files": files,
            "small": [rng.integers(0, 256, 1 << 20, dtype=np.uint8) for _ in range(most)],
            "big": [rng.integers(0, 256, SIZE, dtype=np.uint8) for _ in range(most)],
        }
        _crc_cache(data, 0)  # the kernel loaded before any timing
        print(f"{os.cpu_count()} CPUs; load average before {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
              f"median of {args.repeats}")
        print("| primitive | " + " | ".join(f"T={t} s" for t in counts) + " | "
              + " | ".join(f"× at T={t}" for t in counts[1:]) + " |")
        print("|---|" + "---:|" * (2 * len(counts) - 1))
        for name, fn in PRIMITIVES.items():
            walls = {t: statistics.median(_timed(fn, data, t) for _ in range(args.repeats)) for t in counts}
            first = counts[0] / walls[counts[0]]  # throughput of the first count, in runs per second
            print(f"| {name} | " + " | ".join(f"{walls[t]:.3f}" for t in counts) + " | "
                  + " | ".join(f"{t / walls[t] / first:.2f}" for t in counts[1:]) + " |")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
