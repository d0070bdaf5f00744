"""How the cost of cleaning one partition grows with its size (issue 19): time per GB must stay flat.

For each size in `--sizes` (GB, default 1,2,4,8,16), one partition of workload W2's shape (`bench/workloads.py`:
100-byte values, 100 records a batch, 1 M keys per GB, so the distinct keys grow with the size; 128 MiB
segments at every size) is generated once under `--data-dir` (gitignored), copied with `cp -r` + `sync`
(timed: the physical baseline), and cleaned to the end twice from fresh copies (warm page cache): once as
a daemon's cleaner thread does, rounds one after the other in one process with one offset map, one window
ring and one survey memo, the C allocator tuned as in every `logcleaner` process (`cleaner.round.clean_round`;
each round's figures), once by one `logcleaner clean DIR` process (the
whole wall time, start-up included). With the default 256 MiB dedupe buffer (10.6 M slots at 24 bytes, filled to 90%), the map holds
~9.5 M keys: from 10 GB on, a round is partial and the partition takes several.

Per size it prints: rounds, the sum of the rounds' `elapsed_s`, s per GB of input, each round's surveyed,
recopied and written MB, map utilisation, MB/s and phases, and the `logcleaner clean` wall time. With `--plot PNG`, s/GB against size (rounds only and whole
processes) and MB/s per round. A benchmark measures; it never asserts a time.

Usage: python bench/partition_size.py [--sizes 1,2,4,8,16] [--dedupe-mb 256] [--plot bench/partition_size.png]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# the sibling modules, from the path above
from run import LOGCLEANER, _code_state, _copy, _run_measured, plot_argument
from workloads import MIB, WORKLOADS, generate


def _pristine(data_dir: Path, gb: float) -> tuple[Path, int]:
    """The generated partition of `gb` GB (made once) and the clock to clean it at."""
    log_dir = data_dir / f"size-{gb:g}"
    manifest_path = next(log_dir.glob("*.workload.json"), None) if log_dir.exists() else None
    if manifest_path is None:
        if log_dir.exists():
            shutil.rmtree(log_dir)
        w = replace(WORKLOADS["W2"].scaled(gb), segment_bytes=128 * MIB, name="W2")
        generate(w, log_dir)
        manifest_path = next(log_dir.glob("*.workload.json"))
    manifest = json.loads(manifest_path.read_text())
    return next(p for p in log_dir.iterdir() if p.is_dir()), int(manifest["now_ms"])


def _log_bytes(part: Path) -> int:
    return sum(p.stat().st_size for p in part.glob("*.log"))


def _rounds_in_one_process(part: Path, now_ms: int, dedupe_bytes: int) -> list[dict]:
    """The daemon's view: one process, one offset map and one window ring reused round after round until the
    partition is clean (a child process, so that its peak RSS is its own)."""
    run = _run_measured([sys.executable, __file__, "--child", str(part), "--now-ms", str(now_ms),
                         "--dedupe-bytes", str(dedupe_bytes)])
    if run["rc"]:
        raise SystemExit(f"the rounds failed ({run['rc']}): {run['stderr']}")
    rounds = [json.loads(line) for line in run["stdout"].splitlines() if line.startswith("{")]
    for r in rounds:
        r["peak_rss_mib"] = run["peak_rss_mib"]
    return rounds


def _child(part: Path, now_ms: int, dedupe_bytes: int) -> None:
    sys.path.insert(0, str(BENCH.parent))
    from cleaner.allocator import tune_allocator
    from cleaner.round import clean_round
    from cleaner.settings import Settings
    from cleaner.survey import WINDOW_BYTES, SurveyMemo
    from offsetmap import OffsetMap
    from segments.files.readahead import WindowRing
    from segments.partition.log import PartitionLog

    topic = Settings.from_mappings({"cleanup.policy": "compact"}).topic(part.name.rsplit("-", 1)[0])
    tune_allocator()  # as every `logcleaner` process (the daemon's included) does
    offset_map, ring, memo = OffsetMap(dedupe_bytes), WindowRing(WINDOW_BYTES), SurveyMemo()
    for _ in range(64):
        with PartitionLog.open(part, mode="cleaner") as log:
            r = clean_round(log, topic, offset_map, now_ms=now_ms, seed=7, ring=ring, survey_memo=memo)
        if not r.records_read and not r.records_indexed:
            break
        print(json.dumps({"elapsed_s": r.elapsed_s, "read_mb": r.survey_bytes_read / 1e6, "dirty_mb": r.bytes_read / 1e6,
                          "written_mb": r.bytes_written / 1e6, "map_utilization": r.map_utilization,
                          "survey_s": r.survey_s, "index_s": r.index_s, "recopy_s": r.recopy_s}), flush=True)
        if r.done:
            break


def _whole_clean(part: Path, now_ms: int, dedupe_bytes: int) -> float:
    """Wall seconds of one `logcleaner clean` process cleaning the partition to the end (start-up included)."""
    run = _run_measured([str(LOGCLEANER), "clean", str(part), "--json", "--now-ms", str(now_ms),
                         "--set", f"log.cleaner.dedupe.buffer.size={dedupe_bytes}"])
    if run["rc"]:
        raise SystemExit(f"clean failed ({run['rc']}): {run['stderr']}")
    return run["wall_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,2,4,8,16", help="partition sizes in GB")
    parser.add_argument("--dedupe-mb", type=float, default=256)
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data" / "partition-size")
    parser.add_argument("--plot", type=plot_argument)
    parser.add_argument("--keep", action="store_true", help="keep the generated partitions")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--now-ms", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dedupe-bytes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.now_ms, args.dedupe_bytes)
        return
    sizes = [float(s) for s in args.sizes.split(",")]
    dedupe_bytes = int(args.dedupe_mb * MIB)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    print(f"# partition size: {platform.node()}, {_code_state()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    for gb in sizes:
        pristine, now_ms = _pristine(args.data_dir, gb)
        run_dir = args.data_dir / "run"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir()
        cp_s = _copy(pristine, run_dir / pristine.name)
        part = run_dir / pristine.name
        size = _log_bytes(part)
        rounds = _rounds_in_one_process(part, now_ms, dedupe_bytes)
        shutil.rmtree(run_dir)
        run_dir.mkdir()
        _copy(pristine, run_dir / pristine.name)
        wall = _whole_clean(part, now_ms, dedupe_bytes)
        round_s = sum(r["elapsed_s"] for r in rounds)
        rows.append({"gb": gb, "bytes": size, "cp_s": cp_s, "rounds": rounds, "wall_s": wall, "round_s": round_s})
        print(f"{gb:g} GB ({size / 1e9:.2f} GB): {len(rounds)} round(s), rounds {round_s:.2f} s "
              f"({round_s / (size / 1e9):.3f} s/GB), logcleaner clean {wall:.2f} s, cp+sync {cp_s:.2f} s", flush=True)
        shutil.rmtree(run_dir)
    print("\n| size GB | rounds | rounds s | s/GB (rounds) | `clean` s | s/GB (`clean`) | cp+sync s/GB | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        gb = r["bytes"] / 1e9
        rss = max(x["peak_rss_mib"] for x in r["rounds"]) if r["rounds"] else 0
        print(f"| {r['gb']:g} | {len(r['rounds'])} | {r['round_s']:.2f} | {r['round_s'] / gb:.3f} | {r['wall_s']:.2f} "
              f"| {r['wall_s'] / gb:.3f} | {r['cp_s'] / gb:.3f} | {rss:.0f} |")
    print("\nPer round:\n\n| size GB | round | survey MB | recopied MB | written MB | map use | s | MB/s of the survey |"
          " survey / index / recopy s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        for k, x in enumerate(r["rounds"], 1):
            print(f"| {r['gb']:g} | {k} | {x['read_mb']:,.0f} | {x['dirty_mb']:,.0f} | {x['written_mb']:,.0f} | "
                  f"{x['map_utilization']:.2f} | {x['elapsed_s']:.2f} | {x['read_mb'] / x['elapsed_s']:,.0f} | "
                  f"{x['survey_s']:.2f} / {x['index_s']:.2f} / {x['recopy_s']:.2f} |")
    (args.data_dir / "results.json").write_text(json.dumps(rows, indent=1))
    if args.plot:
        _plot(rows, args.plot)
    if not args.keep:
        shutil.rmtree(args.data_dir)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    gbs = [r["bytes"] / 1e9 for r in rows]
    left.plot(gbs, [r["round_s"] / g for r, g in zip(rows, gbs)], "o-", label="rounds in one process")
    left.plot(gbs, [r["wall_s"] / g for r, g in zip(rows, gbs)], "s--", label="one `logcleaner clean` process")
    left.plot(gbs, [r["cp_s"] / g for r, g in zip(rows, gbs)], "^:", label="cp -r + sync")
    left.set_xscale("log", base=2)
    left.set_xlabel("partition size, GB (W2 shape)")
    left.set_ylabel("seconds per GB")
    left.set_ylim(bottom=0)
    left.legend()
    left.set_title("time per GB against partition size")
    for r in rows:
        xs = list(range(1, len(r["rounds"]) + 1))
        right.plot(xs, [x["read_mb"] / x["elapsed_s"] for x in r["rounds"]], "o-", label=f"{r['gb']:g} GB")
    right.set_xlabel("round")
    right.set_ylabel("MB surveyed per second of the round")
    right.set_ylim(bottom=0)
    right.legend()
    right.set_title("throughput of each round")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
