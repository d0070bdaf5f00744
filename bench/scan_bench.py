"""Benchmark of the bulk scan (`segments.codec.scan`) over ~1 GB logs, against plain `read()` of the same bytes.

Generates (seeded, deterministic) one `.log` per shape into `--data-dir` (default `bench/data/`, gitignored):

  a: 16-record batches, 1000-byte random values
  b: 100-record batches, 100-byte random values

keys are 9-16 byte strings ("key-" + zero-padded id) drawn from a space of 100,000 keys, codec none. Every
measurement then runs in a fresh child process (so its peak RSS is its own) and walks the file in bounded
windows (`--window-mb`, default 32 MiB): a window ends at the last whole batch (the scan's torn-tail
`end_position`) and the next one starts there, so memory does not grow with the file.

Times are wall-clock, best of `--repeats` after one untimed run; "MB/s per CPU-s" divides by the process's
CPU time instead (less sensitive to other processes on a shared machine; for cold reads it omits I/O waits).

Modes per shape: `read` (readinto a reused buffer: the baseline), `read+scan` with and without CRC
verification, `mmap+scan` (one mapping per window) with and without CRC, `scan` (the same walk as read+scan,
timing only the scans), `read+scan-ahead` (a reader thread fills the next window while the scan runs: 2 cores),
and `read` / `read+scan` / `read+scan-ahead` from a cold page cache (posix_fadvise DONTNEED first). It also measures
the numba first-call compile time (empty cache) and the cached load time, each in a fresh process.

Usage: python bench/scan_bench.py [--size-mb 1024] [--quick] [--shape a|b|ab] [--window-mb 32] [--keep]
The generated files are deleted at the end unless --keep is given. A benchmark measures; it never asserts a time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import mmap
import os
import platform
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {"a": (16, 1000), "b": (100, 100)}  # records per batch, value bytes
KEY_SPACE = 100_000
SEED = 20240611
GENERATE_CHUNK_BYTES = 64 * 1024 * 1024
REPEATS_WARM = 3


# ---- generation ------------------------------------------------------------------------------------------------


def _build_generator():
    import numba

    @numba.njit(nogil=True)
    def put_varint(out, p, value):
        z = (value << 1) ^ (value >> 63)
        while z >= 0x80:
            out[p] = (z & 0x7F) | 0x80
            z >>= 7
            p += 1
        out[p] = z
        return p + 1

    @numba.njit(nogil=True)
    def put_be(out, p, value, width):
        for i in range(width):
            out[p + i] = (value >> (8 * (width - 1 - i))) & 0xFF

    @numba.njit(nogil=True)
    def varint_size(value):
        z = (value << 1) ^ (value >> 63)
        size = 1
        while z >= 0x80:
            z >>= 7
            size += 1
        return size

    @numba.njit(nogil=True)
    def fill(out, capacity, base_offset, records_per_batch, value_len, key_ids, value_starts, pool, ts0, starts):
        """Write whole v2 batches into `out` until the next might not fit; returns (bytes, batches).
        CRCs are left 0 (filled in afterwards)."""
        p = 0
        b = 0
        k = 0
        batch_max = 61 + records_per_batch * (value_len + 40)
        while p + batch_max <= capacity and b < starts.shape[0]:
            start = p
            starts[b] = start
            p += 61
            for j in range(records_per_batch):
                key_id = key_ids[k]
                key_len = 9 + key_id % 8  # 9..16 bytes: "key-" and 5..12 digits
                body = (1 + 2 * varint_size(j) + varint_size(key_len) + key_len + varint_size(value_len)
                        + value_len + 1)
                p = put_varint(out, p, body)
                out[p] = 0  # attributes
                p += 1
                p = put_varint(out, p, j)  # timestampDelta
                p = put_varint(out, p, j)  # offsetDelta
                p = put_varint(out, p, key_len)
                out[p] = 107  # "key-"
                out[p + 1] = 101
                out[p + 2] = 121
                out[p + 3] = 45
                v = key_id
                for d in range(key_len - 5, -1, -1):
                    out[p + 4 + d] = 48 + v % 10
                    v //= 10
                p += key_len
                p = put_varint(out, p, value_len)
                vs = value_starts[k]
                out[p : p + value_len] = pool[vs : vs + value_len]
                p += value_len
                out[p] = 0  # headersCount
                p += 1
                k += 1
            put_be(out, start, base_offset, 8)
            put_be(out, start + 8, p - start - 12, 4)
            put_be(out, start + 12, 0, 4)  # partitionLeaderEpoch
            out[start + 16] = 2
            put_be(out, start + 17, 0, 4)  # crc, later
            put_be(out, start + 21, 0, 2)  # attributes
            put_be(out, start + 23, records_per_batch - 1, 4)
            put_be(out, start + 27, ts0 + base_offset, 8)
            put_be(out, start + 35, ts0 + base_offset + records_per_batch - 1, 8)
            put_be(out, start + 43, -1, 8)
            put_be(out, start + 51, -1, 2)
            put_be(out, start + 53, -1, 4)
            put_be(out, start + 57, records_per_batch, 4)
            base_offset += records_per_batch
            b += 1
        return p, b

    return fill


def generate(path: Path, shape: str, size_bytes: int) -> dict:
    """Write ~size_bytes of shape `shape` to `path`; returns counts. Deterministic for a given size."""
    import crc32c

    from segments.codec.records import decode_batch

    records_per_batch, value_len = SHAPES[shape]
    fill = _build_generator()
    rng = np.random.default_rng(SEED + ord(shape))
    pool = np.frombuffer(rng.bytes(16 * 1024 * 1024), dtype=np.uint8)
    out = np.empty(GENERATE_CHUNK_BYTES, dtype=np.uint8)
    starts = np.empty(GENERATE_CHUNK_BYTES // 61, dtype=np.int64)
    written = batches = records = 0
    base_offset = 0
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        while written < size_bytes:
            capacity = min(GENERATE_CHUNK_BYTES, size_bytes - written + 61 + records_per_batch * (value_len + 40))
            n_keys = capacity // (value_len + 16) + records_per_batch  # a record takes ≥ value_len + 18 bytes
            key_ids = rng.integers(0, KEY_SPACE, n_keys)
            value_starts = rng.integers(0, len(pool) - value_len, n_keys)
            used, n = fill(
                out, capacity, base_offset, records_per_batch, value_len, key_ids, value_starts, pool,
                1_700_000_000_000, starts,
            )
            if n == 0:
                break
            view = memoryview(out)
            ends = np.append(starts[1:n], used).tolist()
            for s, e in zip(starts[:n].tolist(), ends):
                struct.pack_into(">I", view, s + 17, crc32c.crc32c(view[s + 21 : e]))
            if written == 0:  # sanity: the object-path decoder accepts what the generator wrote
                for s, e in list(zip(starts[:n].tolist(), ends))[:3]:
                    batch = decode_batch(out[s:e].tobytes())
                    if len(batch.records) != records_per_batch or len(batch.records[0].value) != value_len:
                        raise RuntimeError("the generator wrote a batch the object path reads differently")
            f.write(view[:used])
            written += used
            batches += n
            records += n * records_per_batch
            base_offset += n * records_per_batch
        f.flush()
        os.fsync(f.fileno())
    return {
        "bytes": written,
        "batches": batches,
        "records": records,
        "generate_s": time.perf_counter() - t0,
    }


# ---- measurement (runs in a child process) -------------------------------------------------------------------


def _peak_rss_mib() -> float:
    """Peak RSS of this process (getrusage ru_maxrss; the driver that spawns it stays small, so the value
    Linux carries over from the parent across fork/exec does not dominate)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _walk_read(path: Path, window: int, do_scan: bool, verify_crc: bool) -> tuple[int, int, int]:
    """readinto a reused window buffer; scan it; continue at the scan's end_position. (bytes, batches, records)"""
    from segments.codec.scan import ScanBuffers, scan

    buf = np.empty(window, dtype=np.uint8)
    buffers = ScanBuffers()
    size = path.stat().st_size
    total = batches = records = 0
    with open(path, "rb", buffering=0) as f:
        position = 0
        while position < size:
            f.seek(position)
            got = f.readinto(memoryview(buf))
            if not do_scan:
                position += got
                total += got
                continue
            result = scan(buf[:got], base_position=position, verify_crc=verify_crc, buffers=buffers)
            if result.n_batches == 0:
                raise RuntimeError(f"no whole batch in a {window}-byte window at {position}: widen --window-mb")
            batches += result.n_batches
            records += result.n_records
            total += result.end_position - position
            position = result.end_position
    return total, batches, records


def _walk_mmap(path: Path, window: int, verify_crc: bool) -> tuple[int, int, int]:
    """One read-only mapping per window (aligned down to the allocation granularity)."""
    from segments.codec.scan import ScanBuffers, scan

    buffers = ScanBuffers()
    size = path.stat().st_size
    total = batches = records = 0
    granularity = mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        position = 0
        while position < size:
            aligned = position - position % granularity
            length = min(window, size - aligned)
            mm = mmap.mmap(f.fileno(), length, offset=aligned, access=mmap.ACCESS_READ)
            view = np.frombuffer(mm, dtype=np.uint8)
            result = scan(view, start=position - aligned, base_position=aligned, verify_crc=verify_crc, buffers=buffers)
            batches += result.n_batches
            records += result.n_records
            total += result.end_position - position
            position = result.end_position
            del result, view
            mm.close()
    return total, batches, records


def _scan_in_memory(path: Path, window: int, verify_crc: bool) -> tuple[int, int, int, float, float]:
    """Like `_walk_read`, but only the scans are timed: the scan's own cost over the whole file.
    Returns (bytes, batches, records, wall seconds, CPU seconds) of the scans."""
    from segments.codec.scan import ScanBuffers, scan

    buf = np.empty(window, dtype=np.uint8)
    buffers = ScanBuffers()
    size = path.stat().st_size
    total = batches = records = 0
    elapsed = cpu_elapsed = 0.0
    with open(path, "rb", buffering=0) as f:
        position = 0
        while position < size:
            f.seek(position)
            got = f.readinto(memoryview(buf))
            t, cpu = time.perf_counter(), time.process_time()
            result = scan(buf[:got], base_position=position, verify_crc=verify_crc, buffers=buffers)
            elapsed += time.perf_counter() - t
            cpu_elapsed += time.process_time() - cpu
            batches += result.n_batches
            records += result.n_records
            total += result.end_position - position
            position = result.end_position
    return total, batches, records, elapsed, cpu_elapsed


# The largest batch the read-ahead walk carries from one window into the next (Kafka's default
# max.message.bytes is 1,048,588; a larger batch raises rather than growing the buffers).
CARRY_BYTES_MAX = 2 * 1024 * 1024


def _walk_read_ahead(path: Path, window: int, verify_crc: bool) -> tuple[int, int, int]:
    """A reader thread fills window k+1 (the GIL is released in read) while this thread scans window k.

    Windows are consecutive fixed chunks of the file read into the tail of a buffer with CARRY_BYTES_MAX of
    headroom; the torn batch at the end of one window is copied into the headroom before the next chunk, so
    the scan sees whole batches without re-reading or copying a window.
    """
    import queue
    import threading

    from segments.codec.scan import ScanBuffers, scan

    size = path.stat().st_size
    free: queue.Queue = queue.Queue()
    full: queue.Queue = queue.Queue()
    for _ in range(2):
        free.put(np.empty(CARRY_BYTES_MAX + window, dtype=np.uint8))

    def reader() -> None:
        with open(path, "rb", buffering=0) as f:
            while True:
                buf = free.get()
                got = f.readinto(memoryview(buf)[CARRY_BYTES_MAX:])
                full.put((buf, got))
                if got == 0:
                    return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    buffers = ScanBuffers()
    carry = np.empty(0, dtype=np.uint8)
    position = 0  # file position of the first byte not yet scanned
    total = batches = records = 0
    while True:
        buf, got = full.get()
        if got == 0:
            break
        start = CARRY_BYTES_MAX - len(carry)
        buf[start:CARRY_BYTES_MAX] = carry
        end = CARRY_BYTES_MAX + got
        result = scan(buf, start=start, end=end, base_position=position - start, verify_crc=verify_crc,
                      buffers=buffers)
        batches += result.n_batches
        records += result.n_records
        total += result.end_position - position
        tail = end - (result.end_position - (position - start))
        if tail > CARRY_BYTES_MAX:
            raise RuntimeError(f"a batch of more than {CARRY_BYTES_MAX} bytes at {result.end_position}")
        carry = buf[end - tail : end].copy()
        position = result.end_position
        free.put(buf)
    thread.join()
    if position != size:
        raise RuntimeError(f"read-ahead walk ended at {position}, the file has {size} bytes")
    return total, batches, records


def measure(mode: str, path: Path, window: int, repeats: int) -> dict:
    from segments.codec.scan import warm_up

    warm_up()
    rss_base = _peak_rss_mib()
    best = None
    for attempt in range(repeats + 1):
        # Attempt 0 is untimed: it fills the page cache and touches the reused buffers once, so the timed runs
        # measure the steady state of a long-running cleaner (first-touch page faults cost ~10 µs per page on
        # this VM). Cold-cache runs then drop the file's pages first.
        if attempt and mode.endswith("cold"):
            _drop_cache(path)
        t = time.perf_counter()
        cpu = time.process_time()
        if mode.startswith("read+scan-ahead"):
            total, batches, records = _walk_read_ahead(path, window, "nocrc" not in mode)
        elif mode.startswith("read+scan"):
            total, batches, records = _walk_read(path, window, True, "nocrc" not in mode)
        elif mode.startswith("read"):
            total, batches, records = _walk_read(path, window, False, False)
        elif mode.startswith("mmap+scan"):
            total, batches, records = _walk_mmap(path, window, "nocrc" not in mode)
        elif mode.startswith("scan"):
            total, batches, records, elapsed, cpu_elapsed = _scan_in_memory(path, window, "nocrc" not in mode)
        else:
            raise ValueError(mode)
        seconds = time.perf_counter() - t
        cpu_seconds = time.process_time() - cpu
        if mode.startswith("scan"):
            seconds, cpu_seconds = elapsed, cpu_elapsed
        if attempt == 0:
            continue
        if best is None or seconds < best["seconds"]:
            best = {"seconds": seconds, "bytes": total, "batches": batches, "records": records,
                    "cpu_seconds": cpu_seconds}
        best["cpu_seconds"] = min(best["cpu_seconds"], cpu_seconds)
    best["mode"] = mode
    best["peak_rss_mib"] = _peak_rss_mib()
    best["baseline_rss_mib"] = rss_base
    return best


def compile_times() -> dict:
    """First-call compile time (empty numba cache) and cached load time, each in a fresh process."""
    code = (
        "import time; t=time.perf_counter(); import segments.codec.scan as s; t1=time.perf_counter(); "
        "s.warm_up(); t2=time.perf_counter(); print(t1-t, t2-t1)"
    )
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("compile", "cached"):
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
            imp, warm = (float(x) for x in res.stdout.split())
            out[label] = {"import_s": imp, "warm_up_s": warm}
    return out


# ---- driver ----------------------------------------------------------------------------------------------------

MODES = [
    "read",
    "read+scan-nocrc",
    "read+scan",
    "mmap+scan-nocrc",
    "mmap+scan",
    "scan-nocrc",
    "scan",
    "read+scan-ahead",
    "read-cold",
    "read+scan-cold",
    "read+scan-ahead-cold",
]


def run_generate(path: Path, shape: str, size_bytes: int) -> dict:
    """Generate in a child process, so this driver's peak RSS stays small (children inherit it)."""
    cmd = [sys.executable, __file__, "--generate", shape, "--file", str(path), "--size-mb", str(size_bytes / 2**20)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"generation failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_child(mode: str, path: Path, window: int, repeats: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", mode, "--file", str(path), "--window-mb", str(window / 2**20),
           "--repeats", str(repeats)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"{mode} failed:\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=1024)
    parser.add_argument("--quick", action="store_true", help="64 MB per shape, one repeat")
    parser.add_argument("--shape", default="ab")
    parser.add_argument("--window-mb", type=float, default=32)
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    parser.add_argument("--repeats", type=int, help=f"timed runs per mode, best kept (default {REPEATS_WARM}; 1 with --quick)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--generate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    window = int(args.window_mb * 2**20)

    if args.measure:
        print(json.dumps(measure(args.measure, args.file, window, args.repeats or 1)))
        return
    if args.generate:
        print(json.dumps(generate(args.file, args.generate, int(args.size_mb * 2**20))))
        return

    size_mb = 64 if args.quick else args.size_mb
    repeats = args.repeats or (1 if args.quick else REPEATS_WARM)
    from importlib.metadata import version

    print(f"# scan benchmark {dt.datetime.now().isoformat(timespec='seconds')}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, numba {version('numba')}, "
          f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), window {window >> 20} MiB, "
          f"best of {repeats}")
    ct = compile_times()
    print(f"numba: first call (empty cache) import {ct['compile']['import_s']:.2f} s + compile "
          f"{ct['compile']['warm_up_s']:.2f} s; cached: import {ct['cached']['import_s']:.2f} s + load "
          f"{ct['cached']['warm_up_s'] * 1000:.0f} ms")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    for shape in args.shape:
        records_per_batch, value_len = SHAPES[shape]
        path = args.data_dir / f"scan-bench-{shape}-{int(size_mb)}mb.log"
        info = run_generate(path, shape, int(size_mb * 2**20))
        print()
        print(f"## shape {shape}: {records_per_batch} records/batch, {value_len}-byte values: "
              f"{info['bytes'] / 1e6:.0f} MB, {info['batches']} batches, {info['records']} records "
              f"(generated in {info['generate_s']:.1f} s)")
        print()
        print(f"load average before: {os.getloadavg()[0]:.2f}")
        print()
        print("| mode | MB/s | records/s | s | vs read | MB/s per CPU-s | peak RSS MiB |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        results = {}
        for mode in MODES:
            results[mode] = run_child(mode, path, window, 1 if mode.endswith("cold") else repeats)
        read_s = results["read"]["seconds"] * (results["read+scan"]["bytes"] / results["read"]["bytes"])
        for mode in MODES:
            r = results[mode]
            mbps = r["bytes"] / r["seconds"] / 1e6
            rps = r["records"] / r["seconds"] if r["records"] else float("nan")
            base = results["read-cold"] if mode.endswith("cold") else results["read"]
            ratio = (r["bytes"] / r["seconds"]) / (base["bytes"] / base["seconds"])
            rps_txt = "-" if not r["records"] else f"{rps / 1e6:.1f} M"
            cpu_mbps = r["bytes"] / max(r["cpu_seconds"], 1e-9) / 1e6
            print(f"| {mode} | {mbps:,.0f} | {rps_txt} | {r['seconds']:.3f} | {ratio:.2f} | {cpu_mbps:,.0f} | "
                  f"{r['peak_rss_mib']:.0f} |")
        crc_cost = results["read+scan"]["seconds"] - results["read+scan-nocrc"]["seconds"]
        scan_only = results["read+scan"]["seconds"] - read_s
        print()
        print(f"CRC verification adds {crc_cost:.3f} s ({crc_cost / results['read+scan']['seconds'] * 100:.0f}% of "
              f"read+scan); the scan adds {scan_only:.3f} s to the plain read of the same bytes "
              f"(read+scan / read = {results['read+scan']['seconds'] / read_s:.2f}). Baseline RSS after "
              f"import + warm-up: {results['read']['baseline_rss_mib']:.0f} MiB. Load average after: "
              f"{os.getloadavg()[0]:.2f}.")
        if not args.keep:
            path.unlink()
    if not args.keep:
        try:
            args.data_dir.rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    main()
