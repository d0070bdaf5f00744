"""The daemon's shared I/O budget (issue 23): how fast `logcleaner run` cleans under
`log.cleaner.io.max.bytes.per.second`, with 1, 2 and 4 cleaner threads, against one unthrottled run and `cp -r`.

The budget is one per device, shared by every cleaner thread and charged before each chunk of I/O (docs/design.md,
"The I/O budget"): over any L seconds a device sees at most budget x (L + WINDOW_S) of cleaning I/O, whatever
the thread count. In one run:

1. generate `--partitions` partitions (default 10) of topic `t`, ~`--partition-mb` MB each (default 5), 1,000
   keys rewritten over and over (`segments.tools.generate`, 1 MiB segments, seed = partition number): almost every
   byte is dirty. They are written once into a pristine directory (same spec and seed, same bytes);
2. an untimed warm-up `logcleaner clean` of a copy of one partition (loads or compiles the numba kernels);
3. per measured run (`--threads` x `--budgets`, then one unthrottled run with `--unthrottled-threads`):
   `cp -r` the pristine log dir into a fresh temporary log dir followed by `sync` (timed: the disk baseline
   of reading and writing the same bytes, measured in this run), write a daemon TOML config ("log.dirs",
   "cleanup.policy" = "compact", "log.cleaner.threads", "log.cleaner.io.max.bytes.per.second",
   "log.cleaner.backoff.ms" = 100, `[server]` on a free loopback port, discovery every 200 ms), start the real
   daemon (`<venv>/bin/logcleaner run -c CONFIG`) and poll `/status` every `--poll-s` until every partition
   has had a round and the log dir's `cleaner-offset-checkpoint` holds its log end offset; then read
   `logcleaner_io_bytes_total` (by direction) from `/metrics` and stop the daemon with SIGTERM;
4. the cleaning time ("wall s") runs from the last refused connection to the daemon's HTTP port (its server
   starts before its cleaner threads, so no cleaning I/O was done yet) to the checkpoint file's mtime when
   everything is cleaned (the last round's end); it overstates the cleaning time by at most one poll
   interval. "process s" is from the spawn of the daemon to the poll that saw it done (interpreter start-up
   and imports included);
5. per row: the I/O (read + write, from /metrics; "charged" is what went through the device's budgets, from
   /status), the rate (I/O / wall), the time the budget allows for that I/O (I/O / budget), rate / budget,
   and the bound the budget promises for this wall time: rate / budget <= 1 + WINDOW_S / wall.

Median of `--repeats` runs per row (the run with the median wall time; default 1, to keep the whole run near
two and a half minutes on the standard machine: pass --repeats 3 for steadier figures). Page cache warm (the
run's copy was just written). A benchmark measures; it never asserts a time.

Usage: python bench/throttle_bench.py [--partitions 10] [--partition-mb 5] [--threads 1,2,4]
                                      [--budgets 5000000] [--unthrottled-threads 2] [--repeats 1]
                                      [--poll-s 0.05] [--data-dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cleaner.throttle import WINDOW_S
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from segments.partition.log import PartitionLog
from segments.tools.generate import WorkloadSpec, generate_partition

LOGCLEANER = Path(sys.executable).parent / "logcleaner"
TOPIC = "t"
BYTES_PER_RECORD = 136  # what WorkloadSpec's defaults write per record, batch overhead included (measured)
SPEC = WorkloadSpec(keys=1_000, segment_bytes=1 << 20)
DONE_TIMEOUT_S = 600.0  # a hang guard only
HTTP_TIMEOUT_S = 5.0
MB = 1e6


# ---- helpers ---------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_bytes(log_dir: Path) -> int:
    return sum(p.stat().st_size for p in log_dir.glob("*/*.log"))


def _log_end(directory: Path) -> int:
    with PartitionLog.open(directory, mode="reader") as log:
        return log.log_end_offset


def _copy(src: Path, dst: Path) -> float:
    """`cp -r src dst` then `sync`; wall seconds (as bench/run.py's baseline)."""
    subprocess.run(["sync"], check=True)  # others' dirty pages are not this copy's to write
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t


def _write_config(path: Path, log_dir: Path, port: int, threads: int, budget: float | None) -> None:
    lines = [
        f'"log.dirs" = [{json.dumps(str(log_dir))}]',
        '"cleanup.policy" = "compact"',
        f'"log.cleaner.threads" = {threads}',
        '"log.cleaner.backoff.ms" = 100',
    ]
    if budget is not None:  # absent: Kafka's default, unlimited
        lines.append(f'"log.cleaner.io.max.bytes.per.second" = {float(budget)!r}')
    lines += ["", "[server]", f'listen = "127.0.0.1:{port}"', "discovery_interval_ms = 200", ""]
    path.write_text("\n".join(lines))


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=HTTP_TIMEOUT_S) as resp:
        return resp.read().decode()


def _io_by_direction(metrics_text: str) -> dict[str, float]:
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith("logcleaner_io_bytes_total{"):
            labels, value = line.rsplit(" ", 1)
            direction = labels.split('direction="', 1)[1].split('"', 1)[0]
            out[direction] = float(value)
    return out


# ---- one daemon run --------------------------------------------------------------------------------------------


def _run_daemon(pristine: Path, work: Path, ends: dict[int, int], threads: int, budget: float | None,
                poll_s: float) -> dict:
    """Copy the pristine log dir, clean it with a daemon until every partition's checkpoint is its log end."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log_dir = work / "logs"
    copy_s = _copy(pristine, log_dir)
    port = _free_port()
    config = work / "logcleaner.toml"
    _write_config(config, log_dir, port, threads, budget)
    checkpoint = log_dir / CLEANER_OFFSET_CHECKPOINT
    with open(work / "daemon.log", "wb") as daemon_log:
        spawned = time.perf_counter()
        proc = subprocess.Popen([str(LOGCLEANER), "run", "-c", str(config)], stdout=daemon_log,
                                stderr=subprocess.STDOUT, cwd=work)
        try:
            last_refused = time.time()
            http_up = False
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the daemon exited ({proc.returncode}):\n{(work / 'daemon.log').read_text()}")
                if time.perf_counter() - spawned > DONE_TIMEOUT_S:
                    raise RuntimeError("the daemon did not clean every partition in time")
                attempt = time.time()
                try:
                    status = json.loads(_get(port, "/status"))
                    http_up = True
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    if http_up:
                        raise
                    last_refused = attempt
                    time.sleep(poll_s)
                    continue
                parts = status["partitions"]
                done = len(parts) == len(ends) and all(p["rounds"] >= 1 for p in parts)
                if done:
                    cleaned = read_offset_checkpoint(checkpoint) if checkpoint.exists() else {}
                    done = all(cleaned.get((TOPIC, p)) == end for p, end in ends.items())
                if done:
                    process_s = time.perf_counter() - spawned
                    wall_s = checkpoint.stat().st_mtime_ns / 1e9 - last_refused
                    io = _io_by_direction(_get(port, "/metrics"))
                    charged = json.loads(_get(port, "/status"))["daemon"]["io_bytes_total"]
                    rounds = sum(p["rounds"] for p in parts)
                    break
                time.sleep(poll_s)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the daemon exited {proc.returncode} on SIGTERM:\n{(work / 'daemon.log').read_text()}")
    read, written = io.get("read", 0.0), io.get("write", 0.0)
    return {"threads": threads, "budget": budget, "copy_s": copy_s, "wall_s": wall_s, "process_s": process_s,
            "read": read, "written": written, "io": read + written, "charged": charged, "rounds": rounds,
            "output_bytes": _log_bytes(log_dir)}


# ---- main ------------------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--partition-mb", type=float, default=5.0, help="~MB of .log per partition")
    parser.add_argument("--threads", type=_ints, default=[1, 2, 4], help="log.cleaner.threads values, e.g. 1,2,4")
    parser.add_argument("--budgets", type=_ints, default=[5_000_000],
                        help="log.cleaner.io.max.bytes.per.second values (bytes/s), e.g. 5000000,10000000")
    parser.add_argument("--unthrottled-threads", type=int, default=2,
                        help="threads of the unthrottled comparison run (0: no such run)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--poll-s", type=float, default=0.05, help="how often /status is polled")
    parser.add_argument("--data-dir", type=Path, default=None, help="where the temporary log dirs go (default: TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="throttle-bench-", dir=args.data_dir))
    try:
        pristine = root / "pristine"
        spec = dataclasses.replace(SPEC, records=int(args.partition_mb * MB / BYTES_PER_RECORD))
        t = time.perf_counter()
        ends = {}
        for p in range(args.partitions):
            generate_partition(pristine / f"{TOPIC}-{p}", dataclasses.replace(spec, seed=p))
            ends[p] = _log_end(pristine / f"{TOPIC}-{p}")
        generate_s = time.perf_counter() - t
        input_bytes = _log_bytes(pristine)

        # warm-up (untimed): numba kernels loaded or compiled, as the daemon will find them
        warm = root / "warm-up"
        shutil.copytree(pristine / f"{TOPIC}-0", warm / f"{TOPIC}-0")
        subprocess.run([str(LOGCLEANER), "clean", str(warm / f"{TOPIC}-0"), "--set", "cleanup.policy=compact"],
                       check=True, capture_output=True)
        shutil.rmtree(warm)

        configs = [(t_, float(b)) for b in args.budgets for t_ in args.threads]
        if args.unthrottled_threads:
            configs.append((args.unthrottled_threads, None))
        results = []
        for threads, budget in configs:
            runs = [_run_daemon(pristine, root / "run", ends, threads, budget, args.poll_s)
                    for _ in range(args.repeats)]
            results.append((sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2], runs))
        if not args.keep:
            shutil.rmtree(root / "run", ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    total_s = time.perf_counter() - started
    copy_s = statistics.median(r["copy_s"] for _, runs in results for r in runs)

    print(f"logcleaner run under log.cleaner.io.max.bytes.per.second: {args.partitions} partitions x "
          f"{input_bytes / args.partitions / MB:.1f} MB ({input_bytes / MB:.1f} MB of .log, {spec.records:,} records "
          f"over {spec.keys:,} keys each, generated in {generate_s:.1f} s), median of {args.repeats} run(s) per row, "
          f"warm page cache, {os.cpu_count()} CPUs, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"whole benchmark {total_s:.0f} s")
    print()
    print("| threads | budget MB/s | I/O MB (read + write) | charged MB | rounds | wall s | process s | rate MB/s | "
          "budget allows s | rate/budget | bound 1+W/wall | output MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r, _ in results:
        rate = r["io"] / r["wall_s"]
        if r["budget"] is None:
            budget_cols = "unlimited", "-", "-", "-"
        else:
            b = r["budget"]
            budget_cols = (f"{b / MB:.1f}", f"{r['io'] / b:.2f}", f"{rate / b:.3f}", f"{1 + WINDOW_S / r['wall_s']:.3f}")
        print(f"| {r['threads']} | {budget_cols[0]} | {r['io'] / MB:.1f} ({r['read'] / MB:.1f} + {r['written'] / MB:.1f}) | "
              f"{r['charged'] / MB:.1f} | {r['rounds']} | {r['wall_s']:.2f} | {r['process_s']:.2f} | {rate / MB:.1f} | "
              f"{budget_cols[1]} | {budget_cols[2]} | {budget_cols[3]} | {r['output_bytes'] / MB:.2f} |")
    print(f"| cp -r + sync | - | {2 * input_bytes / MB:.1f} (read + write of the .log) | - | - | {copy_s:.2f} | - | "
          f"{2 * input_bytes / MB / copy_s:.1f} | - | - | - | {input_bytes / MB:.2f} |")
    print()
    print(f"W = {WINDOW_S} s (the budget banked while idle, cleaner/throttle.py WINDOW_S). wall s: last refused "
          f"connection to the daemon's port -> checkpoint mtime when all were cleaned (overstates by <= "
          f"{args.poll_s} s). cp -r + sync: median of the {sum(len(runs) for _, runs in results)} copies that "
          f"made each run's log dir, in this run.")


if __name__ == "__main__":
    main()
