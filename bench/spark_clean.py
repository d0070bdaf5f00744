"""Distributed clean (issue 20): `clean --spark` against one process and the daemon on the same partitions.

In one run:

1. generate `--partitions` (default 32) partitions of W2 (`bench/workloads.py`: 100-byte random values, 100 a
   batch) of about `--partition-mb` (default 64) MB each, each with its own seed, into one log directory under
   `--data-dir` (default `bench/data/`, gitignored; deleted at the end unless `--keep`): the pristine copy;
2. one untimed warm-up `clean` (the numba cache loaded, the page cache warm), whose records kept per partition
   every later run must match;
3. per mode, `--repeats` (default 1) times: `cp -r` the pristine directory to a fresh one and `sync`, then time
   a fresh process (start-up and imports count) cleaning it:
   * `clean1`, `clean2`: `logcleaner clean DIR` with `log.cleaner.threads` 1 and 2 (one process);
   * `daemon`: `logcleaner run` with 2 threads, from its start until `/status` shows every partition cleaned
     (`bench/threads.py`'s measurement);
   * `local`: `logcleaner clean --spark --master local[2]`;
   * `cluster`: `logcleaner clean --spark` on a standalone cluster of two one-core workers (1 GiB each,
     executors of 512 MiB) on this machine, started once from the pyspark installation
     (`tests/integration/spark_cluster.py`) before the first cluster run (its start-up is not timed);
   the offset map is 128 MiB per thread or task in every mode (`log.cleaner.dedupe.buffer.size` 128 MiB a
   thread, 128 MiB per task with --spark);
4. the rows (medians): wall s of the whole process; partitions/s and MB/s of input `.log` bytes over that
   wall; for Spark, the session's start-up (`spark_startup_s` of the total), the job's wall (`elapsed_s`), its
   MB/s, the sum of the partitions' own `elapsed_s` (the cleaning the tasks did), and the Spark overhead per
   partition: (job wall x 2 task slots - that sum) / partitions, the slot time a partition costs beyond its
   cleaning (scheduling, serialisation, Python workers, their imports and kernels, the time slots idle at the
   end); "load" is the 1-minute load average before the row's first run (the machine may be shared);
5. the driver's planning alone (`--plan-partitions`, default 10,000): a log dir of that many copies of a small
   W2 partition, and the time `clean --spark` spends on it before its job, step by step, in this process.

A benchmark measures; it never asserts a time. Usage:
python bench/spark_clean.py [--partitions 32] [--partition-mb 64] [--repeats 1]
                            [--modes clean1,clean2,daemon,local,cluster] [--plan-partitions 10000] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
for path in (BENCH, ROOT):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

# the sibling modules, and the cluster of the integration tests, from the paths above
from run import LOGCLEANER, _code_state, _copy, _run_measured
from threads import _clean, _daemon, _generate, _log_bytes

from tests.integration.spark_cluster import standalone_cluster

W2_MB = 952.0  # W2 at scale 1 (bench/RESULTS.md)
MAP_BYTES = 128 * 2**20  # the offset map of one thread or task
SLOTS = 2  # task slots in local[2] and in the 2-worker cluster
EXECUTOR_MEMORY = "512m"


def _spark(log_dir: Path, now_ms: int, master: str, env: dict | None) -> dict:
    run = _run_measured([
        str(LOGCLEANER), "clean", str(log_dir), "--spark", "--master", master, "--json", "--now-ms", str(now_ms),
        "--set", "cleanup.policy=compact", "--set", f"log.cleaner.dedupe.buffer.size={MAP_BYTES}",
        "--spark-conf", f"spark.executor.memory={EXECUTOR_MEMORY}", "--spark-log", str(log_dir.parent / "spark.log"),
    ], env=env)
    if run["rc"]:
        raise RuntimeError(f"clean --spark of {log_dir} failed (exit {run['rc']}):\n{run['stderr'][-3000:]}")
    *summaries, total = [json.loads(line) for line in run["stdout"].splitlines() if line.startswith("{")]
    if any(s["status"] != "ok" for s in summaries):
        raise RuntimeError(f"clean --spark of {log_dir}: {summaries}")
    total = total["total"]
    run.update(written={s["partition"]: s["records_written"] for s in summaries},
               rounds=sum(s["rounds"] for s in summaries), startup_s=total["spark_startup_s"],
               job_s=total["elapsed_s"], tasks=total["tasks"], work_s=sum(s["elapsed_s"] for s in summaries),
               read_bytes=sum(s["survey_bytes_read"] + s["bytes_read"] for s in summaries),
               written_bytes=sum(s["bytes_written"] for s in summaries))
    return run


def _plan_cost(work: Path, partitions: int) -> dict:
    """What the driver's planning costs for `partitions` small partitions on this machine's disk: a log dir of
    copies of one partition (4 segments of W2), then, timed in this process, the steps `clean --spark` takes
    before its job: finding the partitions, `plan_clean` (the policies and refusals), `dirty_section_sizes` (a
    listing and an `lstat` per segment) and `plan_tasks`."""
    import time

    from workloads import generate

    from cleaner.config_file import load_config
    from cleaner.oneshot import dirty_section_sizes, plan_clean
    from cleaner.spark_clean import plan_tasks
    from segments.files.pathcheck import find_partition_dirs

    template = work / "plan-template"
    generate("W2", template, scale=0.0005, seed=1)
    source = template / "w2-0"
    log_dir = work / "plan-logs"
    log_dir.mkdir()
    for p in range(partitions):
        shutil.copytree(source, log_dir / f"w2-{p}")
    subprocess.run(["sync"], check=True)
    settings = load_config(None, overrides={"cleanup.policy": "compact"}).settings
    steps = {}
    t = time.perf_counter()
    found, _ = find_partition_dirs([log_dir])
    steps["find_s"] = time.perf_counter() - t
    t = time.perf_counter()
    plan = plan_clean(found, settings)
    steps["plan_s"] = time.perf_counter() - t
    t = time.perf_counter()
    sizes = dirty_section_sizes(plan)
    steps["size_s"] = time.perf_counter() - t
    t = time.perf_counter()
    tasks = plan_tasks(sizes, 200)
    steps["tasks_s"] = time.perf_counter() - t
    segments = sum(1 for _ in log_dir.glob("*/*.log"))
    shutil.rmtree(log_dir)
    shutil.rmtree(template)
    return {"partitions": partitions, "segments": segments, "tasks": len(tasks), **steps}


def bench(args, cluster_holder: contextlib.ExitStack) -> tuple[list[dict], int]:
    work = Path(tempfile.mkdtemp(prefix="spark-clean-", dir=args.data_dir))
    try:
        src = work / "src"
        src.mkdir()
        now_ms, manifest = _generate("W2", src, args.partitions, args.partition_mb / W2_MB)
        input_bytes = _log_bytes(src)
        print(f"## W2: {args.partitions} partitions, {input_bytes / 1e6:,.0f} MB ({manifest['records']:,} records, "
              f"{manifest['segments']} segments each)", flush=True)
        counter = [0]

        def fresh() -> tuple[Path, float]:
            counter[0] += 1
            run_dir = work / f"run{counter[0]}" / "logs"
            run_dir.parent.mkdir()
            return run_dir, _copy(src, run_dir)

        run_dir, _ = fresh()
        expected = _clean(run_dir, now_ms, 1, MAP_BYTES)["written"]  # warm-up, untimed
        shutil.rmtree(run_dir.parent)
        cluster = None
        rows = []
        for mode in args.modes:
            if mode == "cluster" and cluster is None:
                cluster = cluster_holder.enter_context(standalone_cluster(work / "cluster", workers=SLOTS))
            runs = []
            load = os.getloadavg()[0]
            for _ in range(args.repeats):
                run_dir, cp_s = fresh()
                if mode in ("clean1", "clean2"):
                    threads = int(mode[-1])
                    run = _clean(run_dir, now_ms, threads, MAP_BYTES * threads)
                elif mode == "daemon":
                    run = _daemon(run_dir, now_ms, SLOTS, MAP_BYTES * SLOTS)
                elif mode == "local":
                    run = _spark(run_dir, now_ms, f"local[{SLOTS}]", None)
                elif mode == "cluster":
                    assert cluster is not None
                    run = _spark(run_dir, now_ms, cluster.master_url, cluster.client_env())
                else:
                    raise SystemExit(f"unknown mode {mode!r}")
                shutil.rmtree(run_dir.parent)
                if run["written"] != expected:
                    raise RuntimeError(f"{mode} kept other records than the warm-up clean")
                run["cp_s"] = cp_s
                runs.append(run)
                spark = (f", start-up {run['startup_s']:.1f} s, job {run['job_s']:.1f} s in {run['tasks']} tasks, "
                         f"partitions' own {run['work_s']:.1f} s" if "job_s" in run else "")
                print(f"  {mode}: {run['wall_s']:.1f} s, {run['rounds']} rounds, cp+sync {cp_s:.1f} s{spark}",
                      flush=True)
            row = {"mode": mode, "wall_s": statistics.median(r["wall_s"] for r in runs), "load": load,
                   "walls": [round(r["wall_s"], 1) for r in runs]}
            if "job_s" in runs[0]:
                for name in ("startup_s", "job_s", "work_s"):
                    row[name] = statistics.median(r[name] for r in runs)
                row["tasks"] = runs[0]["tasks"]
                row["read_per_input"] = runs[0]["read_bytes"] / input_bytes
                row["written_per_input"] = runs[0]["written_bytes"] / input_bytes
                row["overhead_s"] = statistics.median((r["job_s"] * SLOTS - r["work_s"]) / args.partitions
                                                      for r in runs)
            rows.append(row)
        return rows, input_bytes
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(rows: list[dict], input_bytes: int, args) -> None:
    mb = input_bytes / 1e6
    print(f"\nCommand: .venv/bin/python bench/spark_clean.py {' '.join(sys.argv[1:])}")
    print(f"Code: {_code_state()}; {os.cpu_count()} CPUs; Python {platform.python_version()}")
    print("\n| mode | wall s | partitions/s | MB/s | Spark start-up s | job s | job MB/s | tasks | partitions' own s "
          "| Spark overhead per partition s | load before | runs (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        spark = (f"{row['startup_s']:.1f} | {row['job_s']:.1f} | {mb / row['job_s']:,.0f} | {row['tasks']} | "
                 f"{row['work_s']:.1f} | {row['overhead_s']:.2f}" if "job_s" in row else "- | - | - | - | - | -")
        print(f"| {row['mode']} | {row['wall_s']:.1f} | {args.partitions / row['wall_s']:.2f} | {mb / row['wall_s']:,.0f} "
              f"| {spark} | {row['load']:.2f} | {', '.join(map(str, row['walls']))} |")
    for row in rows:
        if "read_per_input" in row:
            print(f"\n{row['mode']}: the rounds read {row['read_per_input']:.2f} and wrote "
                  f"{row['written_per_input']:.2f} bytes per input byte (survey, index and recopy reads; recopy writes)")
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--partition-mb", type=float, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", default="clean1,clean2,daemon,local,cluster")
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--plan-partitions", type=int, default=10_000,
                        help="also time the driver's planning of this many small partitions (0: not)")
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as cluster_holder:  # the cluster, if started, is stopped however the run ends
        rows, input_bytes = bench(args, cluster_holder)
    report(rows, input_bytes, args)
    if args.plan_partitions:
        work = Path(tempfile.mkdtemp(prefix="spark-clean-plan-", dir=args.data_dir))
        try:
            cost = _plan_cost(work, args.plan_partitions)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        total = cost["find_s"] + cost["plan_s"] + cost["size_s"] + cost["tasks_s"]
        print(f"\nThe driver's planning, {cost['partitions']} partitions of {cost['segments'] // cost['partitions']} "
              f"segments on local disk (warm cache), {cost['tasks']} tasks for 200 slots: find {cost['find_s']:.2f} s, "
              f"plan_clean {cost['plan_s']:.2f} s, dirty_section_sizes {cost['size_s']:.2f} s, plan_tasks "
              f"{cost['tasks_s']:.3f} s; {1e6 * total / cost['partitions']:.0f} us a partition")


if __name__ == "__main__":
    main()
