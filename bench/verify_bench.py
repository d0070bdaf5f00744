"""What the safety check (`log.cleaner.verify`) costs: one full clean of each workload with it off and on.

For each workload (`bench/workloads.py`; `--workloads W1,W2,W4`, `--scale 0.1` for a quick run), in one run
and one process (the numba kernels compiled by an untimed warm-up clean first):

1. generate it once into a temporary directory under `--data-dir` (default `bench/data/`, deleted at the end);
2. per measured run and mode, copy the pristine partition to a fresh directory (`shutil.copytree`, timed: the
   baseline of reading and writing the same bytes) and clean it with `cleaner.oneshot.clean_partition`,
   `log.cleaner.verify` false or true, warm page cache; the round's `verify_s` says how much of the time the
   check itself took, `verified_records` how many latest records it confirmed;
3. median of `--repeats` (default 3) per mode; the report gives MB/s of input, the check's share, and the
   ratio of the two modes' wall times, plus peak RSS of the process (it only grows: read it per row as an
   upper bound).

A benchmark measures; it never asserts a time.

Usage: python bench/verify_bench.py [--workloads W1,W2,W4] [--scale 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import workloads
from cleaner.oneshot import clean_partition
from cleaner.settings import Settings

NOW_MS = workloads.T0_MS + 10**12  # every record old enough; tombstones' horizons not yet reached at first clean


def _settings(verify: bool) -> Settings:
    return Settings.from_mappings({
        "cleanup.policy": "compact",
        "log.cleaner.dedupe.buffer.size": 512 * 1024 * 1024,
        "log.cleaner.verify": verify,
    })


def _one_run(pristine: Path, work: Path, verify: bool) -> dict:
    if work.exists():
        shutil.rmtree(work)
    t = time.perf_counter()
    shutil.copytree(pristine, work / pristine.name)
    copy_s = time.perf_counter() - t
    t = time.perf_counter()
    outcome = clean_partition(work / pristine.name, _settings(verify), now_ms=NOW_MS)
    wall = time.perf_counter() - t
    if not outcome.ok:
        raise SystemExit(f"clean failed: {outcome.error}")
    return {"wall_s": wall, "copy_s": copy_s, "verify_s": sum(r.verify_s for r in outcome.rounds),
            "verified": sum(r.verified_records for r in outcome.rounds),
            "written": sum(r.records_written for r in outcome.rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W4")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data")
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.data_dir, prefix="verify-") as tmp:
        root = Path(tmp)
        for name in args.workloads.split(","):
            manifest = workloads.generate(name, root / name / "pristine", scale=args.scale)
            pristine = next((root / name / "pristine").glob("*-0"))
            input_bytes = sum(f.stat().st_size for f in pristine.glob("*.log"))
            _one_run(pristine, root / name / "warmup", True)  # compile and warm the page cache
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for verify in (False, True):
                    runs[verify].append(_one_run(pristine, root / name / "run", verify))
            off, on = (sorted(runs[v], key=lambda r: r["wall_s"])[len(runs[v]) // 2] for v in (False, True))
            copy_s = statistics.median(r["copy_s"] for v in runs for r in runs[v])
            rows.append((name, input_bytes, manifest, off, on, copy_s,
                         resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))
            shutil.rmtree(root / name)
    mb = 1e6
    print(f"log.cleaner.verify cost, scale {args.scale}, median of {args.repeats} runs per mode, warm page cache")
    print()
    print("| workload | input MB | records kept | verify off s | MB/s | verify on s | MB/s | of which check s | "
          "on/off | latest records checked | copy s | copy MB/s | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, size, _, off, on, copy_s, rss in rows:
        print(f"| {name} | {size / mb:,.0f} | {off['written']:,} | {off['wall_s']:.2f} | {size / mb / off['wall_s']:,.0f} | "
              f"{on['wall_s']:.2f} | {size / mb / on['wall_s']:,.0f} | {on['verify_s']:.2f} | "
              f"{on['wall_s'] / off['wall_s']:.2f} | {on['verified']:,} | {copy_s:.2f} | {size / mb / copy_s:,.0f} | "
              f"{rss:,.0f} |")


if __name__ == "__main__":
    main()
