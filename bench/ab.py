"""Interleaved A/B of whole `logcleaner clean` processes: the same partition cleaned by the code of two or more
trees, run after run in turn, so that the machine's drift falls on every tree alike.

Per run and tree: `cp -r` of the partition into a fresh directory under `--data-dir` and `sync`, then one
`python -m cleaner.cli clean DIR --json` with `PYTHONPATH=TREE` (a worktree of the commit to measure, e.g.
`git worktree add /tmp/before HEAD~1`; `.` is this one). Prints per tree the median of the wall time of the
process and of the round's own figures from its JSON (`survey_s`, `index_s`, `recopy_s`, `elapsed_s`), the
wall time minus the round, split where the summary line arrives: before the round (start-up, imports, opening)
and after the summary (removing the replaced segments, the interpreter's exit), and the process's peak RSS. With
`--cold`, the copy's pages are dropped from the page cache before each clean; `--set NAME=VALUE` (repeatable)
gives every clean a cleaner setting, e.g. `log.cleaner.io.max.bytes.per.second`. A benchmark measures; it never
asserts a time. The inputs are any partition directory, e.g. one `bench/run.py --keep` left.

A tree may carry environment variables for its processes: `--tree .:LOGCLEANER_KERNELS=jit` runs this tree's
code with numba's JIT instead of the kernels' module built ahead of time.

Usage: python bench/ab.py PARTITION_DIR --runs 10 --tree /tmp/before --tree .
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from run import _copy, _drop_cache, _run_measured  # the sibling module, from the path above

NOW_MS = 1_900_000_000_000
FIELDS = ("survey_s", "index_s", "recopy_s", "elapsed_s")


def _tree(spec: str) -> tuple[Path, dict[str, str]]:
    """`TREE[:NAME=VALUE,...]` → (the tree, the variables its processes get)."""
    path, _, variables = spec.partition(":")
    return Path(path).resolve(), dict(v.split("=", 1) for v in variables.split(",") if v)


def _one(partition: Path, spec: str, run_dir: Path, dedupe_bytes: int, cold: bool = False,
         settings: tuple[str, ...] = ()) -> dict:
    tree, variables = _tree(spec)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    target = run_dir / partition.name
    _copy(partition, target)
    if cold:
        _drop_cache(target)
    command = [sys.executable, "-m", "cleaner.cli", "clean", str(target), "--json", "--now-ms", str(NOW_MS),
               "--set", f"log.cleaner.dedupe.buffer.size={dedupe_bytes}", *(a for s in settings for a in ("--set", s))]
    run = _run_measured(command, dict(os.environ, PYTHONPATH=str(tree), **variables), cwd=tree)
    if run["rc"]:
        raise SystemExit(f"clean with {tree} failed ({run['rc']}): {run['stderr'].strip()}")
    wall, printed = run["wall_s"], run["last_line_s"]
    summary = json.loads(run["stdout"].strip().splitlines()[-1])
    return {"wall_s": wall, "rss_mib": run["peak_rss_mib"], "before_s": printed - float(summary["elapsed_s"]),
            "after_s": wall - printed, **{f: float(summary[f]) for f in FIELDS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("partition", type=Path, help="a partition directory (never changed: copies are cleaned)")
    parser.add_argument("--tree", action="append", required=True,
                        help="a tree whose code runs, optionally with variables: TREE[:NAME=VALUE,...] (repeat)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--dedupe-mb", type=float, default=256)
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a cleaner setting for every clean (repeatable), e.g. the I/O throttle")
    parser.add_argument("--cold", action="store_true",
                        help="drop the copy's pages from the page cache (posix_fadvise DONTNEED) before each clean")
    args = parser.parse_args()
    trees = list(args.tree)
    run_dir = args.data_dir / "ab-run"
    rows: dict[str, list[dict]] = {t: [] for t in trees}
    try:
        for _ in range(args.runs):
            for tree in trees:
                rows[tree].append(_one(args.partition.resolve(), tree, run_dir, int(args.dedupe_mb * 2**20),
                                       args.cold, tuple(args.set)))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"{args.partition}: {args.runs} runs per tree, interleaved, {'cold' if args.cold else 'warm'} page cache; "
          f"load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| tree | wall s | survey s | index s | recopy s | round s | wall minus round s | before the round s | "
          "after the summary s | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tree, runs in rows.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "rss_mib", "before_s", "after_s", *FIELDS)}
        outside = statistics.median(r["wall_s"] - r["elapsed_s"] for r in runs)
        print(f"| {tree} | {med['wall_s']:.3f} | {med['survey_s']:.3f} | {med['index_s']:.3f} | "
              f"{med['recopy_s']:.3f} | {med['elapsed_s']:.3f} | {outside:.3f} | {med['before_s']:.3f} | "
              f"{med['after_s']:.3f} | {med['rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
