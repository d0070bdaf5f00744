"""What writing a cleaned segment costs through the page cache and around it (`log.cleaner.io.direct`).

Writes `--mb` MB into a new file in chunks of `--chunk-mb`, as a round's recopy appends its windows' output, and
fsyncs it, two ways, run after run in turn (so the machine's drift falls on both):

* `cache`: `FileOps.pwrite_all` of each chunk (ordinary writes: each byte copied into a new page-cache page), then
  the fsync that writes them out;
* `direct`: `segments.files.direct.DirectAppender` (what `LogSegment.write_directly` uses): whole blocks written
  around the page cache through its staging buffer, the last partial block through the cache at the drain, then
  the fsync.

Each file is kept until the run ends (so each write takes pages never used in this run, as a clean's output does),
then all are removed. Prints per way the median wall time of the writes and of the fsync, the writing thread's CPU
time, and MB/s. A benchmark measures; it never asserts a time.

Usage: python bench/write_bench.py [--mb 100] [--chunk-mb 8] [--runs 5] [--data-dir bench/data/write]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from segments.files.direct import DirectAppender
from segments.files.fileio import FileOps


def _write(path: Path, chunk: bytes, total: int, direct: bool) -> tuple[float, float, float]:
    """(writes s, fsync s, the thread's CPU s in the writes) of one new file of `total` bytes."""
    ops = FileOps()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        appender = DirectAppender(path, fd, ops) if direct else None
        if direct and not appender.direct:
            raise SystemExit(f"{path.parent}: this file system takes no direct writes")
        started, cpu = time.perf_counter(), time.thread_time()
        position = 0
        while position < total:
            piece = chunk[:total - position]
            if appender is not None:
                appender.append(piece)
            else:
                ops.pwrite_all(fd, piece, position)
            position += len(piece)
        if appender is not None:
            appender.drain()
        written, cpu = time.perf_counter() - started, time.thread_time() - cpu
        started = time.perf_counter()
        os.fsync(fd)
        synced = time.perf_counter() - started
        if appender is not None:
            appender.close()
        return written, synced, cpu
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--chunk-mb", type=float, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data" / "write")
    args = parser.parse_args()
    total = int(args.mb * 1e6)
    chunk = np.random.default_rng(1).integers(0, 256, int(args.chunk_mb * 1e6) + 1357, dtype=np.uint8).tobytes()
    shutil.rmtree(args.data_dir, ignore_errors=True)
    args.data_dir.mkdir(parents=True)
    results: dict[str, list[tuple[float, float, float]]] = {"cache": [], "direct": []}
    try:
        for run in range(args.runs):
            for way in results:
                results[way].append(_write(args.data_dir / f"{way}-{run}.bin", chunk, total, way == "direct"))
    finally:
        shutil.rmtree(args.data_dir, ignore_errors=True)
    print(f"{args.mb:g} MB a file in chunks of {args.chunk_mb:g} MB, {args.runs} runs each, in turn; medians")
    print("| way | writes s | fsync s | total s | MB/s | writing thread's CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for way, rows in results.items():
        writes, syncs, cpus = (statistics.median(column) for column in zip(*rows))
        both = statistics.median(w + s for w, s, _ in rows)
        print(f"| {way} | {writes:.3f} | {syncs:.3f} | {both:.3f} | {args.mb / both:,.0f} | {cpus:.3f} |")


if __name__ == "__main__":
    main()
