"""Generational cleaning against Kafka-style full recopy on skewed updates (issue 10).

A log of `--keys` distinct keys (10 million by default, each written once, 100-byte values; a freshly
loaded log has no duplicates, so it starts clean) receives `--rounds` rounds of `--updates` Zipf-distributed
updates (exponent 1; the ranks placed at random on the key space afresh each round, so every round has
new hot keys), each followed by one cleaning. Two copies of the log get exactly the same appends: one is cleaned with `cleaner.mode = full` (Kafka), the
other with `cleaner.mode = generational`. After the last round the generational log gets one forced full
cycle, and the two logs must then hold exactly the same offsets (records at equal offsets are the same
input record). Prints, per round and mode: bytes read (survey, index+recopy) and written, cleaning time,
log size; then totals and the ratio of bytes written per round; writes a PNG plot.

Usage: python bench/generational_bench.py [--keys 10000000] [--updates 1000000] [--rounds 20]
           [--dir /tmp/logcleaner-genbench] [--plot bench/generational.png] [--ratio 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.run import plot_argument
from bench.workloads import T0_MS, WORKLOADS, _draw_keys, generate
from cleaner.round import clean_round
from cleaner.settings import Settings
from offsetmap import OffsetMap
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT
from segments.partition.log import PartitionLog
from segments.spark.arrow_records import encode_table

MIB = 1024 * 1024
MAP_BYTES = 512 * MIB
MODES = ("full", "generational")


def _updates(keys: int, n: int, rng: np.random.Generator, value_bytes: int = 100):
    """n Zipf-distributed updates as Arrow key/value arrays (keys formatted as the workloads do).

    Each call places the popularity ranks on the key space afresh (`bench.workloads._draw_keys`), so the hot
    keys of one round are not those of the next: every round touches a new set of keys spread at random."""
    w = replace(WORKLOADS["Z1"], keys=keys, key_distribution="zipf", zipf_s=1.0)
    key_ids = _draw_keys(w, rng, n)
    key_bytes = np.char.add(b"key-", np.char.zfill(key_ids.astype("S8"), 8)).astype("S12")
    keys_arr = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(0, 12 * (n + 1), 12, dtype=np.int32)),
                                                       pa.py_buffer(key_bytes.tobytes())])
    values = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8)
    values_arr = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(np.arange(0, value_bytes * (n + 1), value_bytes, dtype=np.int32)),
                         pa.py_buffer(values.tobytes())])
    return keys_arr, values_arr


def _append(directory: Path, data: bytes) -> None:
    with PartitionLog.open(directory, mode="writer") as log:
        log.append_batches(data)
        log.roll()


def _clean(directory: Path, settings: Settings, now_ms: int, *, force: bool = False) -> dict:
    topic = settings.topic(directory.name.rsplit("-", 1)[0])
    with PartitionLog.open(directory, mode="cleaner", config=topic.log_config()) as log:
        started = time.perf_counter()
        r = clean_round(log, topic, OffsetMap(MAP_BYTES), now_ms=now_ms, force_recopy=force)
        elapsed = time.perf_counter() - started
        size = log.size_bytes
    assert r.done, "the map must cover each round's dirty section"
    return {"survey_read": r.survey_bytes_read, "read": r.bytes_read, "written": r.bytes_written, "seconds": elapsed,
            "size": size, "full_cycle": r.full_cycle, "recopy_from": r.recopy_from, "merged": r.generations_merged}


def _offsets(directory: Path) -> np.ndarray:
    parts = []
    with PartitionLog.open(directory, mode="reader") as log:
        for segment in log.segments:
            for _, result in segment.scan_windows(window_bytes=8 * MIB):
                parts.append(result.offset.copy())
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for mode, style in zip(MODES, ("o-", "s-")):
        mine = [r for r in rows if r["mode"] == mode and r["round"] > 0]
        x = [r["round"] for r in mine]
        axes[0].plot(x, [r["written"] / MIB for r in mine], style, label=mode)
        axes[1].plot(x, [(r["read"] + r["survey_read"]) / MIB for r in mine], style, label=mode)
        axes[2].plot([r["round"] for r in rows if r["mode"] == mode],
                     [r["size"] / MIB for r in rows if r["mode"] == mode], style, label=mode)
    for ax, label in zip(axes, ("MiB written per round", "MiB read per round (survey included)", "log size (MiB)")):
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/logcleaner-genbench"))
    parser.add_argument("--plot", type=plot_argument, default=str(ROOT / "bench" / "generational.png"),
                        help="the plot's PNG ('' for none)")
    parser.add_argument("--json", type=Path, help="also write every row as JSON here")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    started = time.perf_counter()
    w = replace(WORKLOADS["U1"], name="G", records=args.keys, keys=args.keys, active_records=100,
                segment_bytes=128 * MIB)
    manifest = generate(w, args.dir / "full")
    shutil.copytree(args.dir / "full", args.dir / "generational")
    print(f"bootstrap: {args.keys:,} keys, {manifest['bytes'] / MIB:.0f} MiB, {manifest['segments']} segments "
          f"({time.perf_counter() - started:.0f} s)", flush=True)
    dirs = {m: args.dir / m / "g-0" for m in MODES}
    settings = {
        m: Settings.from_mappings({"cleanup.policy": "compact", "cleaner.mode": m, "cleaner.generation.ratio": args.ratio,
                                   "segment.bytes": 128 * MIB, "delete.retention.ms": 86_400_000})
        for m in MODES
    }
    for m in MODES:  # a freshly loaded log of distinct keys is clean up to its active segment
        with PartitionLog.open(dirs[m], mode="cleaner") as log:
            log.write_log_dir_checkpoint(CLEANER_OFFSET_CHECKPOINT, log.segments[-1].base_offset)
    rows = [{"mode": m, "round": 0, "size": manifest["bytes"], "read": 0, "survey_read": 0, "written": 0,
             "seconds": 0.0} for m in MODES]
    rng = np.random.Generator(np.random.PCG64DXSM(2024))
    now = T0_MS + 10**9
    print(f"{'round':>5} {'mode':>12} {'read MiB':>9} {'survey':>7} {'written':>8} {'seconds':>8} {'size MiB':>9} "
          f"{'recopied from':>14} {'merged':>6}", flush=True)
    for rnd in range(1, args.rounds + 1):
        keys, values = _updates(args.keys, args.updates, rng)
        timestamps = np.full(args.updates, now, dtype=np.int64)
        encoded = encode_table(keys, values, timestamps, np.zeros(args.updates, np.int64), records_per_batch=100)
        for m in MODES:
            _append(dirs[m], encoded.data[0])
            row = {"mode": m, "round": rnd, **_clean(dirs[m], settings[m], now)}
            rows.append(row)
            print(f"{rnd:>5} {m:>12} {row['read'] / MIB:>9.0f} {row['survey_read'] / MIB:>7.0f} "
                  f"{row['written'] / MIB:>8.0f} {row['seconds']:>8.1f} {row['size'] / MIB:>9.0f} "
                  f"{row['recopy_from']:>14,} {row['merged']:>6}", flush=True)
        now += 60_000
    final = _clean(dirs["generational"], settings["generational"], now, force=True)
    print(f"forced full cycle (generational): written {final['written'] / MIB:.0f} MiB in {final['seconds']:.1f} s, "
          f"size {final['size'] / MIB:.0f} MiB", flush=True)
    same = np.array_equal(_offsets(dirs["full"]), _offsets(dirs["generational"]))
    print(f"final content identical (offsets of every record): {same}")
    totals = {}
    for m in MODES:
        mine = [r for r in rows if r["mode"] == m and r["round"] > 0]
        totals[m] = {k: sum(r[k] for r in mine) for k in ("read", "survey_read", "written", "seconds")}
        t = totals[m]
        print(f"{m:>12}: per round written {t['written'] / args.rounds / MIB:.0f} MiB, read {t['read'] / args.rounds / MIB:.0f}"
              f" MiB (+{t['survey_read'] / args.rounds / MIB:.0f} MiB survey), cleaning {t['seconds']:.0f} s in all, "
              f"final size {mine[-1]['size'] / MIB:.0f} MiB")
    ratio = totals["full"]["written"] / max(totals["generational"]["written"], 1)
    print(f"full recopy writes {ratio:.1f}x the bytes of generational per round "
          f"(the forced final cycle excluded; with it {totals['full']['written'] / (totals['generational']['written'] + final['written']):.1f}x); "
          f"cleaning time {totals['full']['seconds'] / totals['generational']['seconds']:.1f}x")
    if args.plot:
        _plot(rows, args.plot, f"{args.keys:,} keys, {args.updates:,} Zipf(1) updates per round, ratio {args.ratio}")
        print(f"plot: {args.plot}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "final": final, "same": bool(same)}, indent=1))
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
