"""The benchmark of issue 7: Spark ingestion of 10 million rows (16-byte keys, 100-byte values) into 8 partitions.

In one run, on one local-mode Spark session (`--master`, default `local[*]`):

1. generate the input (untimed): `--rows` rows of a 16-byte binary key (drawn from `--keys` distinct keys) and a
   100-byte binary value, as one Parquet file of 1M-row row groups under `--data-dir` (default `bench/data/`);
2. Spark start-up: the time to get a session with the data source registered (JVM launch included), shown
   apart from everything else;
3. baselines on the same DataFrame: `noop` (Spark reads the Parquet and drops the rows: the floor any sink
   pays) and Spark's own Parquet writer (a built-in sink writing the same two columns);
4. the ingest: `segments.spark.ingest.ingest` (the code behind `logcleaner ingest`), records per batch 1000,
   no compression; rows/s and MB/s (payload: key + value bytes; and segment bytes written) over its wall time,
   which includes the driver's commit (the ordered append of the staged pieces);
5. peak memory: the largest summed RSS of the process tree (driver, JVM, Python workers) sampled every 0.1 s;
6. verification (untimed): `verify_paths` of the output and the record count.

A benchmark measures; it never asserts a time. Usage:
    python bench/ingest_bench.py [--rows 10000000] [--keys 2000000] [--partitions 8] [--master local[*]] [--keep]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from segments.tools.verify import verify_paths

KEY_BYTES = 16
VALUE_BYTES = 100


def make_input(path: Path, rows: int, keys: int, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    writer = None
    chunk = 1_000_000
    try:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            ids = rng.integers(0, keys, size=n, dtype=np.uint64)
            key_bytes = np.char.zfill(ids.astype("U16"), KEY_BYTES).astype("S16").view(np.uint8)
            values = rng.integers(0, 256, size=n * VALUE_BYTES, dtype=np.uint8)
            key_arr = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(0, (n + 1) * KEY_BYTES, KEY_BYTES, dtype=np.int32)), pa.py_buffer(key_bytes)])
            val_arr = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)), pa.py_buffer(values)])
            table = pa.table({"key": key_arr, "value": val_arr})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema, compression="none")
            writer.write_table(table, row_group_size=chunk)
    finally:
        if writer is not None:
            writer.close()


class TreeRss:
    """Peak of the summed RSS of this process and all its descendants, sampled on a thread."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def sample() -> int:
        parents: dict[int, int] = {}
        rss: dict[int, int] = {}
        page = os.sysconf("SC_PAGE_SIZE")
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            rss[int(entry)] = int(fields[21]) * page
        me = os.getpid()
        total = 0
        for pid in rss:
            p = pid
            while p and p != me:
                p = parents.get(p, 0)
            if p == me:
                total += rss[pid]
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self._stop.wait(self.interval_s)

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    args.data_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-", dir=args.data_dir))
    source = work / "input.parquet"
    print(f"# ingest benchmark: {args.rows:,} rows, {KEY_BYTES}-byte keys over {args.keys:,} distinct, "
          f"{VALUE_BYTES}-byte values, {args.partitions} partitions; master {args.master}; "
          f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs")
    started = time.perf_counter()
    make_input(source, args.rows, args.keys)
    payload = args.rows * (KEY_BYTES + VALUE_BYTES)
    print(f"input: {source.stat().st_size / 1e6:.1f} MB Parquet, {payload / 1e6:.1f} MB of keys+values "
          f"(generated in {time.perf_counter() - started:.1f} s, untimed)")

    with TreeRss() as rss:
        started = time.perf_counter()
        from segments.spark import get_session
        from segments.spark.ingest import ingest

        spark = get_session(args.master, app_name="ingest-bench",
                            conf={"spark.ui.showConsoleProgress": "false"})
        startup_s = time.perf_counter() - started
        try:
            df = spark.read.parquet(str(source))
            started = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            noop_s = time.perf_counter() - started
            started = time.perf_counter()
            df.write.mode("overwrite").option("compression", "none").parquet(str(work / "parquet-out"))
            parquet_s = time.perf_counter() - started
            parquet_bytes = dir_bytes(work / "parquet-out")
            shutil.rmtree(work / "parquet-out")
            # one warm-up ingest of a slice so the Python workers have loaded the compiled kernels
            warm = work / "warm.parquet"
            pq.write_table(pq.ParquetFile(source).read_row_group(0).slice(0, 10_000), warm)
            ingest(spark, str(warm), topic="warm", partitions=args.partitions, key_column="key",
                   value_column="value", output=str(work / "warm-logs"))
            started = time.perf_counter()
            result = ingest(spark, str(source), topic="bench", partitions=args.partitions, key_column="key",
                            value_column="value", output=str(work / "logs"), records_per_batch=1000)
            ingest_s = time.perf_counter() - started
        finally:
            spark.stop()
    written = dir_bytes(work / "logs")
    report = verify_paths([work / "logs"])

    def line(name: str, seconds: float, out_bytes: int) -> str:
        return (f"| {name} | {seconds:.1f} | {args.rows / seconds / 1e6:.2f} M | {payload / seconds / 1e6:.0f} | "
                f"{out_bytes / seconds / 1e6:.0f} | {ingest_s / seconds:.2f} |")

    print(f"\nSpark start-up (session + JVM + data source registration): {startup_s:.1f} s (not in the rows below)\n")
    print("| job | wall s | rows/s | payload MB/s | output MB/s | ingest time / job time |")
    print("|---|---:|---:|---:|---:|---:|")
    print(line("Spark read + noop sink (floor)", noop_s, 0))
    print(line("Spark read + Parquet write (built-in sink)", parquet_s, parquet_bytes))
    print(line("**logcleaner ingest** (read, partition, encode, stage, commit)", ingest_s, written))
    print(f"\npeak RSS of the process tree (driver + JVM + Python workers): {rss.peak / 2**20:.0f} MiB")
    print(f"output: {written / 1e6:.1f} MB in {report.segments} segments; verify: "
          f"{'OK' if not report.problems else report.problems[:3]}; records {report.records:,} "
          f"(expected {args.rows:,}); per partition: "
          + ", ".join(f"{result.records[p]:,}" for p in range(args.partitions)))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
