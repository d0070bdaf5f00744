"""Offset-map throughput benchmark: inserts/s and lookups/s at 10%, 50% and 90% fill, plus peak memory.

Measures, never asserts a time. It does check that every lookup returned the right offset, because a fast
wrong answer is not a result.

Workload: `--keys` distinct keys (default 10,000,000) into a map sized by `memory_bytes_for_keys(keys,
load_factor)`, i.e. ~11.1M slots at load factor 0.9, so that the last key lands exactly on the fill limit
(90% fill). Two paths are measured:

* `hashes`: `insert_hashes` / `lookup_hashes` with pre-computed 128-bit hashes (the table alone);
* `spans`: `insert_key_spans` / `lookup_key_spans` on random keys of 8..40 bytes lying in one buffer (MurmurHash3
  of every key in place + table), which is what the cleaner runs on a segment.

"At X% fill" is reported two ways, for inserts:
* window: rate of inserting the keys that take the map from (X-5)% to X% of its slots (the marginal cost there);
* cumulative: keys inserted so far / time spent inserting them, from empty to X%.
Lookups at X% fill are timed on `--probe-keys` keys after the map reached X%: hits (a run of consecutive keys
already in the map, starting at a random key) and misses (keys never inserted). Each figure is the median over
`--repeat` runs (each run refills the same map after `clear()`); min and max are shown beside it.

Run from the repository root:
    .venv/bin/python bench/offsetmap_bench.py
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from offsetmap import OffsetMap, hash_key_spans, memory_bytes_for_keys

FILL_TARGETS = (0.10, 0.50, 0.90)
WINDOW_FRACTION = 0.05
KEY_BYTES_MIN = 8
KEY_BYTES_MAX = 40


@dataclass(frozen=True, slots=True)
class Workload:
    h1: np.ndarray
    h2: np.ndarray
    offsets: np.ndarray
    buf: np.ndarray
    key_pos: np.ndarray
    key_len: np.ndarray
    miss_h1: np.ndarray
    miss_h2: np.ndarray
    miss_buf: np.ndarray
    miss_pos: np.ndarray
    miss_len: np.ndarray


def _machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def _versions() -> str:
    import importlib.metadata as metadata

    names = ("numpy", "numba", "mmh3")
    return ", ".join([f"python {platform.python_version()}"] + [f"{n} {metadata.version(n)}" for n in names])


def _random_keys(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = rng.integers(KEY_BYTES_MIN, KEY_BYTES_MAX + 1, size=count).astype(np.int32)
    positions = np.zeros(count, dtype=np.int64)
    np.cumsum(lengths[:-1], out=positions[1:])
    buf = np.frombuffer(rng.bytes(int(lengths.sum(dtype=np.int64))), dtype=np.uint8)
    return buf, positions, lengths


def _workload(keys: int, probe_keys: int, seed: int, map_seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    buf, key_pos, key_len = _random_keys(rng, keys)
    # The hash path uses the very hashes of the span keys, so both paths insert the same key set.
    h1, h2 = hash_key_spans(buf, key_pos, key_len, map_seed)
    miss_buf, miss_pos, miss_len = _random_keys(rng, probe_keys)
    miss_h1, miss_h2 = hash_key_spans(miss_buf, miss_pos, miss_len, map_seed)
    return Workload(
        h1=h1,
        h2=h2,
        offsets=np.arange(keys, dtype=np.int64),
        buf=buf,
        key_pos=key_pos,
        key_len=key_len,
        miss_h1=miss_h1,
        miss_h2=miss_h2,
        miss_buf=miss_buf,
        miss_pos=miss_pos,
        miss_len=miss_len,
    )


def _run_once(m: OffsetMap, work: Workload, path: str, probe_keys: int, rng: np.random.Generator) -> dict:
    """Fill `m` from empty to 90% of its slots; return rates keyed by (metric, fill)."""
    m.clear()
    slots = m.slots
    bounds = [0]
    for fill in FILL_TARGETS:
        target = min(int(fill * slots), work.offsets.size)
        bounds += [int((fill - WINDOW_FRACTION) * slots), target]
    rates: dict[tuple[str, float], float] = {}
    out = np.empty(probe_keys, dtype=np.int64)
    spent = 0.0
    for step in range(len(bounds) - 1):
        lo, hi = bounds[step], bounds[step + 1]
        started = time.perf_counter()
        if path == "hashes":
            consumed = m.insert_hashes(work.h1[lo:hi], work.h2[lo:hi], work.offsets[lo:hi])
        else:
            consumed = m.insert_key_spans(work.buf, work.key_pos[lo:hi], work.key_len[lo:hi], work.offsets[lo:hi])
        elapsed = time.perf_counter() - started
        if consumed != hi - lo:
            raise RuntimeError(f"map refused keys below its fill limit: consumed {consumed} of {hi - lo}")
        spent += elapsed
        if step % 2 == 0:
            continue
        fill = FILL_TARGETS[step // 2]
        rates[("insert window", fill)] = (hi - lo) / elapsed
        rates[("insert cumulative", fill)] = hi / spent
        # A contiguous run of inserted keys: table accesses are still random (hash order), while the keys are
        # read sequentially from the buffer, as the cleaner's recopy pass reads them from a segment.
        first = int(rng.integers(0, hi - probe_keys + 1))
        chosen = slice(first, first + probe_keys)
        if path == "hashes":
            hit_args = (work.h1[chosen], work.h2[chosen])
            miss_args = (work.miss_h1, work.miss_h2)
            lookup = m.lookup_hashes
        else:
            hit_args = (work.buf, work.key_pos[chosen], work.key_len[chosen])
            miss_args = (work.miss_buf, work.miss_pos, work.miss_len)
            lookup = m.lookup_key_spans
        started = time.perf_counter()
        lookup(*hit_args, out=out)
        rates[("lookup hit", fill)] = probe_keys / (time.perf_counter() - started)
        if not np.array_equal(out, work.offsets[chosen]):
            raise RuntimeError("lookup of present keys returned wrong offsets")
        started = time.perf_counter()
        lookup(*miss_args, out=out)
        rates[("lookup miss", fill)] = probe_keys / (time.perf_counter() - started)
        if np.any(out != -1):
            raise RuntimeError("lookup of absent keys found an offset")
    return rates


def _warm_up() -> float:
    """Load (or on a cold cache compile) every kernel the benchmark uses; returns seconds taken."""
    started = time.perf_counter()
    m = OffsetMap(memory_bytes_for_keys(64))
    buf = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    pos = np.arange(8, dtype=np.int64)
    length = np.full(8, 4, dtype=np.int32)
    h1, h2 = hash_key_spans(buf, pos, length, m.seed)
    m.insert_hashes(h1, h2, np.arange(8))
    m.lookup_hashes(h1, h2)
    m.insert_key_spans(buf, pos, length, np.arange(8, 16))
    m.lookup_key_spans(buf, pos, length)
    return time.perf_counter() - started


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc/self/statm); -1 where unavailable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return -1


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values) / 1e6:6.2f} ({min(values) / 1e6:.2f}-{max(values) / 1e6:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000, help="distinct keys; the map is sized for them")
    parser.add_argument("--load-factor", type=float, default=0.9)
    parser.add_argument("--probe-keys", type=int, default=1_000_000, help="keys per lookup measurement")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; medians are reported")
    parser.add_argument("--seed", type=int, default=20240611, help="workload RNG seed")
    args = parser.parse_args(argv)
    if args.keys < 1000 or args.repeat < 1:
        parser.error("--keys must be at least 1000 and --repeat at least 1")
    # Hit lookups read a run of keys inserted before the 10% mark, so the run must fit there.
    args.probe_keys = max(1, min(args.probe_keys, args.keys // 10))

    warm_up_s = _warm_up()
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    memory_bytes = memory_bytes_for_keys(args.keys, args.load_factor)
    rss_empty = _rss_bytes()
    m = OffsetMap(memory_bytes, args.load_factor, seed=1)
    rss_map = _rss_bytes()
    started = time.perf_counter()
    work = _workload(args.keys, args.probe_keys, args.seed, m.seed)
    setup_s = time.perf_counter() - started

    hash_times = []
    for _ in range(args.repeat):  # includes allocating (and first-touching) the two output arrays
        started = time.perf_counter()
        hash_key_spans(work.buf, work.key_pos, work.key_len, m.seed)
        hash_times.append(time.perf_counter() - started)
    hash_s = statistics.median(hash_times)

    rng = np.random.default_rng(args.seed + 1)
    results: dict[str, dict[tuple[str, float], list[float]]] = {}
    for path in ("hashes", "spans"):
        collected: dict[tuple[str, float], list[float]] = {}
        for _ in range(args.repeat):
            for key, rate in _run_once(m, work, path, args.probe_keys, rng).items():
                collected.setdefault(key, []).append(rate)
        results[path] = collected
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # The same map, cleared and filled to 90% once more with everything else already resident: RSS must not move.
    rss_before_fill = _rss_bytes()
    m.clear()
    m.insert_hashes(work.h1, work.h2, work.offsets)
    rss_after_fill = _rss_bytes()
    inputs_bytes = sum(
        getattr(work, field).nbytes for field in Workload.__dataclass_fields__  # type: ignore[attr-defined]
    )

    print(f"command: {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    print(f"machine: {_machine()}")
    print(f"versions: {_versions()}")
    print(
        f"map: keys={args.keys:,} load_factor={args.load_factor} memory_bytes={memory_bytes:,} "
        f"slots={m.slots:,} capacity={m.capacity:,} table nbytes={m.nbytes:,} (= slots x 24: "
        f"{m.nbytes == m.slots * 24}) final size={m.size:,} utilization={m.utilization:.4f}"
    )
    print(
        f"kernel load (cached compile) {warm_up_s:.2f} s; workload setup {setup_s:.1f} s; "
        f"hash_key_spans alone (median, new output arrays each call): {args.keys / hash_s / 1e6:.1f} M keys/s "
        f"({work.buf.nbytes / hash_s / 1e9:.2f} GB/s of key bytes, mean key {work.buf.nbytes / args.keys:.1f} B)"
    )
    print(f"median of {args.repeat} runs, M ops/s (min-max); one thread; fill = size / slots")
    print()
    print("| path | fill | insert window | insert cumulative | lookup hit | lookup miss |")
    print("|---|---|---|---|---|---|")
    for path, collected in results.items():
        for fill in FILL_TARGETS:
            cells = [
                _fmt(collected[(metric, fill)])
                for metric in ("insert window", "insert cumulative", "lookup hit", "lookup miss")
            ]
            print(f"| {path} | {fill:.0%} | " + " | ".join(cells) + " |")
    print()
    print(
        f"peak RSS {peak_kib / 1024:.0f} MiB (before sizing the map: {rss_before_kib / 1024:.0f} MiB); "
        f"of which map table {m.nbytes / 2**20:.0f} MiB, benchmark inputs {inputs_bytes / 2**20:.0f} MiB"
    )
    print(
        f"map construction added {(rss_map - rss_empty) / 2**20:.1f} MiB RSS (table {m.nbytes / 2**20:.1f} MiB); "
        f"clearing and refilling it with {m.size:,} keys added {(rss_after_fill - rss_before_fill) / 2**20:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
