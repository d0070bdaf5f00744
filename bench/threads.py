"""`logcleaner clean LOGDIR` and the daemon on 1, 2, 4 ... threads (`log.cleaner.threads`), against `cp -r` + `sync`
(issue 22).

For each workload (`--workloads W1,W3`; `bench/workloads.py`), in one run:

1. generate `--partitions` (default 4) partitions of it at `--scale` (default 0.125: ~128 MB each), each with
   its own seed, into one log directory under `--data-dir` (default `bench/data/`, gitignored; deleted at the
   end unless `--keep`): the pristine copy, never cleaned itself;
2. one untimed warm-up clean (the numba cache loaded, the page cache warm);
3. per mode and thread count (`--threads 1,2,4`), `--repeats` (default 3) times, interleaved (each repeat runs
   every mode and count once, so the machine's drift falls on all alike): `cp -r` the pristine log directory to
   a fresh one and `sync` (timed: the physical baseline of that run), then time `logcleaner clean DIR --json
   --now-ms T --set cleanup.policy=compact --set log.cleaner.threads=N --set log.cleaner.dedupe.buffer.size=B`
   as a fresh subprocess (so
   start-up and imports count). Wall, user and system CPU from `os.wait4` of that process (this child only);
   CPU% = (user + system) / wall (200% = both cores of a 2-core machine busy all along);
4. the rows: medians per thread count; MB/s = the input `.log` bytes / wall of the whole process; `x T=1` =
   that throughput over the one-thread throughput; `clean/cp` over the cp+sync throughput of the same runs;
   "less fixed cost" = the same with the wall of a clean of one tiny partition (start-up, imports, the numba
   cache: median of 3) taken off, the part threads can speed up; "load before" = the 1-minute load average
   before the row's first run (the machine may be shared).
   Every run's partitions must come out `ok` with the same record counts as the one-thread run.
5. `--modes clean,clean-threads,daemon,daemon-threads`: `clean` and `daemon` run their threads past the first
   in worker processes (the default), the `-threads` modes the same with `LOGCLEANER_WORKERS=threads` (all in
   one process). `wait4`
   counts the workers' CPU in the command's (Linux adds a child's reaped children), and its peak RSS is the
   largest of the processes', not their sum; the daemon's rows time `logcleaner run` (a config over the log dir, the same
   settings, a clock file at T) from its start until its `/status` shows every partition with a round done
   and nothing cleanable left; CPU and peak RSS from /proc at that moment, then SIGTERM. `independent` is the
   machine's own bound, with nothing of ours shared: the partitions are dealt into T log directories by T
   concurrent `cp -r` (+ `sync`: that row's copy baseline, so `cp x T=1` says how the copy itself scales on
   this machine), then T separate one-thread `logcleaner clean` processes run at once, each with 1/T of the
   dedupe buffer; wall until the last exits;
6. `--gil`: one more `clean` per row under `py-spy record --gil --idle` (100 Hz): the share of the wall time
   during which some thread held the GIL (py-spy samples only a thread holding it; bench/gil_profile.py
   splits it by phase);
7. `--plot PNG`: MB/s against threads per workload, the ideal line (T x one thread) and Kafka 2.4's
   one-thread figure x T (`KAFKA_ONE_THREAD_MB_S`, issue 19's measurement on this machine class).

The dedupe buffer is the same total for every thread count (Kafka's meaning: the threads share it); at the
default 256 MiB each thread's share still indexes a whole partition in one round. A benchmark measures; it
never asserts a time.

Usage: python bench/threads.py [--workloads W1,W3] [--partitions 4] [--scale 0.125] [--threads 1,2,4]
                               [--repeats 3] [--dedupe-mb 256] [--modes clean,daemon,independent] [--gil] [--plot PNG] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# the sibling modules, from the path above
from run import LOGCLEANER, _code_state, _copy, _run_measured, plot_argument
from run import _generate as _generate_workload

PY_SPY = Path(sys.executable).parent / "py-spy"
GIL_RATE_HZ = 100
# Kafka 2.4's cleaner, one JIT-warm thread on this machine class (issue 19's measurement), in MB/s of input;
# W2 from its 0.72 M records/s at W2's 122 bytes a record. No figure for W4.
KAFKA_ONE_THREAD_MB_S = {"W1": 440 * 1.048576, "W2": 0.72 * 122.4, "W3": 239 * 1.048576}


def _log_bytes(directory: Path, pattern: str = "*/*.log") -> int:
    """The `.log` bytes of a log directory's partitions (or, with pattern `*.log`, of one partition)."""
    return sum(p.stat().st_size for p in directory.glob(pattern))


def _generate(name: str, log_dir: Path, partitions: int, scale: float) -> tuple[int, dict]:
    """`partitions` partitions of workload `name` in `log_dir` (seeds 1, 2, ...); the clock to clean them at
    and the first manifest. Each is generated in a child process (`run._generate`), so this driver stays
    small: the in-process generation used to put ~450 MiB into every clean's peak RSS from `wait4`."""
    now_ms, first = 0, {}
    with tempfile.TemporaryDirectory(dir=log_dir.parent) as scratch:
        for p in range(partitions):
            manifest = _generate_workload(name, Path(scratch) / str(p), scale, seed=p + 1)
            directory = Path(manifest["partition_dir"])
            directory.rename(log_dir / f"{directory.name.rsplit('-', 1)[0]}-{p}")
            now_ms = max(now_ms, manifest["now_ms"])
            first = first or manifest
    return now_ms, first


def _clean_args(log_dir: Path, now_ms: int, threads: int, dedupe_bytes: int) -> list[str]:
    return [str(LOGCLEANER), "clean", str(log_dir), "--json", "--now-ms", str(now_ms), "--set", "cleanup.policy=compact",
            "--set", f"log.cleaner.threads={threads}", "--set", f"log.cleaner.dedupe.buffer.size={dedupe_bytes}"]


def _outcomes(log_dir: Path, stdout: str) -> tuple[dict[str, int], int]:
    """Records written per partition, and rounds, from a clean's `--json` lines; raises unless every one is ok."""
    summaries = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if any(s["status"] != "ok" for s in summaries):
        raise RuntimeError(f"clean of {log_dir}: {summaries}")
    return {s["partition"]: s["records_written"] for s in summaries}, sum(s["rounds"] for s in summaries)


def _clean(log_dir: Path, now_ms: int, threads: int, dedupe_bytes: int, workers: str = "processes") -> dict:
    run = _run_measured(_clean_args(log_dir, now_ms, threads, dedupe_bytes),
                        env={**os.environ, "LOGCLEANER_WORKERS": workers})
    if run["rc"]:
        raise RuntimeError(f"clean of {log_dir} failed (exit {run['rc']}):\n{run['stderr']}\n{run['stdout']}")
    run["written"], run["rounds"] = _outcomes(log_dir, run["stdout"])
    return run


def _shares(names: list[str], count: int) -> list[list[str]]:
    """`names` (partition directories, largest first) dealt round robin into `count` shares."""
    return [names[i::count] for i in range(count)]


def _copy_shares(src: Path, dst: Path, count: int) -> float:
    """The copy baseline of `independent` runs: `count` concurrent `cp -r` of the shares of `src`'s partitions,
    each into its own log directory `dst/share-i`, then `sync`; wall seconds. At count 1 it is `_copy`'s work."""
    names = sorted((p.name for p in src.iterdir() if p.is_dir()), key=lambda n: -_log_bytes(src / n, "*.log"))
    t = time.perf_counter()
    copies = []
    for i, share in enumerate(_shares(names, count)):
        (dst / f"share-{i}").mkdir(parents=True)
        copies.append(subprocess.Popen(["cp", "-r", *(str(src / n) for n in share), str(dst / f"share-{i}")]))
    if any(c.wait() for c in copies):
        raise RuntimeError(f"a cp of a share of {src} failed")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t


def _independent(run_dir: Path, now_ms: int, threads: int, dedupe_bytes: int) -> dict:
    """`threads` separate `logcleaner clean` processes at once, one thread each, each over one log directory of
    `run_dir` (`_copy_shares`), each with its share of the dedupe buffer: what independent cleaners with
    nothing in common but the machine do, the bound any sharing of one process can reach. Wall until the last
    exits; CPU summed; peak RSS the largest."""
    shares = sorted(run_dir.iterdir())
    started = time.perf_counter()
    procs = []
    for share in shares:
        out = tempfile.TemporaryFile()
        procs.append((subprocess.Popen(_clean_args(share, now_ms, 1, dedupe_bytes // threads), stdout=out,
                                       stderr=subprocess.STDOUT, cwd=BENCH.parent), out))
    user = rss = 0.0
    written, rounds = {}, 0
    for proc, out in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        user += usage.ru_utime + usage.ru_stime
        rss = max(rss, usage.ru_maxrss / 1024)
        out.seek(0)
        text = out.read().decode()
        out.close()
        if os.waitstatus_to_exitcode(status):
            raise RuntimeError(f"a clean of a share of {run_dir} failed:\n{text}")
        share_written, share_rounds = _outcomes(run_dir, text)
        written.update(share_written)
        rounds += share_rounds
    return {"wall_s": time.perf_counter() - started, "user_s": user, "sys_s": 0.0, "peak_rss_mib": rss,
            "written": written, "rounds": rounds}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process and its finished children (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (the daemon's worker processes)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _peak_rss_mib(pid: int) -> float:
    return int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("VmHWM"))) / 1024


def _daemon(log_dir: Path, now_ms: int, threads: int, dedupe_bytes: int, workers: str = "processes") -> dict:
    """`logcleaner run` over `log_dir`: wall from process start until `/status` shows every partition cleaned
    (a round done, nothing cleanable left), CPU and peak RSS of the process at that moment, its worker processes
    included (CPU summed; RSS: the sum of each process's peak, an upper bound of their peak together)."""
    port = _free_port()
    config = log_dir.parent / f"{log_dir.name}.toml"
    config.write_text("\n".join([
        f'"log.dirs" = ["{log_dir}"]', '"cleanup.policy" = "compact"', f'"log.cleaner.threads" = {threads}',
        f'"log.cleaner.dedupe.buffer.size" = {dedupe_bytes}', '"log.cleaner.backoff.ms" = 50',
        "", "[server]", f'listen = "127.0.0.1:{port}"', "discovery_interval_ms = 200", "",
    ]))
    clock = log_dir.parent / f"{log_dir.name}.clock"
    clock.write_text(str(now_ms))
    env = dict(os.environ, LOGCLEANER_CLOCK_FILE=str(clock), LOGCLEANER_WORKERS=workers)
    started = time.perf_counter()
    proc = subprocess.Popen([str(LOGCLEANER), "run", "-c", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, cwd=BENCH.parent)
    try:
        partitions = None
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as response:
                    partitions = json.loads(response.read())["partitions"]
            except OSError:
                partitions = None
            if partitions and all(p["rounds"] >= 1 and p["cleanable_bytes"] == 0 for p in partitions):
                wall = time.perf_counter() - started
                break
            time.sleep(0.02)
        pids = [proc.pid, *_children(proc.pid)]
        cpu = sum(_cpu_s(pid) for pid in pids)
        rss = sum(_peak_rss_mib(pid) for pid in pids)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    written = {p["partition"]: p["last_round"]["records_written"] for p in partitions}
    return {"wall_s": wall, "user_s": cpu, "sys_s": 0.0, "peak_rss_mib": rss, "written": written,
            "rounds": sum(p["rounds"] for p in partitions)}


def _gil_share(log_dir: Path, now_ms: int, threads: int, dedupe_bytes: int) -> float:
    """Share of the wall time of one `logcleaner clean` run during which some thread held the GIL
    (`py-spy record --gil --idle` samples only a thread holding it; see bench/gil_profile.py)."""
    raw = log_dir.parent / f"{log_dir.name}.gil.txt"
    cmd = [str(PY_SPY), "record", "--gil", "--idle", "--threads", "-f", "raw", "-r", str(GIL_RATE_HZ), "-o", str(raw),
           "--", *_clean_args(log_dir, now_ms, threads, dedupe_bytes)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    samples = sum(int(line.rsplit(" ", 1)[1]) for line in raw.read_text().splitlines() if line.strip())
    return samples / GIL_RATE_HZ / wall


def bench_workload(name: str, args) -> list[dict]:
    dedupe = int(args.dedupe_mb * 2**20)
    work = Path(tempfile.mkdtemp(prefix=f"threads-{name}-", dir=args.data_dir))
    try:
        src = work / "src"
        src.mkdir()
        now_ms, manifest = _generate(name, src, args.partitions, args.scale)
        input_bytes = _log_bytes(src)
        print(f"\n## {name}: {args.partitions} partitions, {input_bytes / 1e6:,.0f} MB "
              f"({manifest['records']:,} records and {manifest['segments']} segments each)", flush=True)
        counter = [0]

        def fresh(shares: int = 0) -> tuple[Path, float]:
            counter[0] += 1
            run_dir = work / f"run{counter[0]}"
            return run_dir, _copy_shares(src, run_dir, shares) if shares else _copy(src, run_dir)

        run_dir, _ = fresh()
        expected = _clean(run_dir, now_ms, 1, dedupe)["written"]  # warm-up, untimed
        shutil.rmtree(run_dir)
        # the fixed cost of a clean: start-up, imports, the numba cache, on a partition of one tiny segment
        tiny = work / "tiny"
        _generate_workload(name, tiny, 1e-6, seed=1)
        fixed = statistics.median(_clean(tiny, now_ms, 1, dedupe)["wall_s"] for _ in range(3))
        print(f"  fixed cost (a clean of one tiny partition): {fixed:.2f} s", flush=True)
        run_of = {"clean": _clean, "daemon": _daemon,
                  "clean-threads": lambda *a: _clean(*a, workers="threads"),
                  "daemon-threads": lambda *a: _daemon(*a, workers="threads"),
                  "independent": _independent}
        cases = [(mode, threads) for mode in args.modes for threads in args.threads]
        runs: dict[tuple[str, int], list[dict]] = {case: [] for case in cases}
        loads: dict[tuple[str, int], float] = {}  # the 1-minute load before a case's first run
        # Interleaved: each repeat runs every case once, so the machine's drift falls on every case alike.
        for repeat in range(args.repeats):
            for mode, threads in cases:
                if repeat == 0:
                    loads[mode, threads] = os.getloadavg()[0]
                run_dir, cp_s = fresh(threads if mode == "independent" else 0)
                run = run_of[mode](run_dir, now_ms, threads, dedupe)
                shutil.rmtree(run_dir)
                if run["written"] != expected:
                    raise RuntimeError(f"{mode} on {threads} threads kept other records: {run['written']} != {expected}")
                run["cp_s"] = cp_s
                runs[mode, threads].append(run)
                print(f"  {mode} T={threads}: {run['wall_s']:.2f} s, CPU {run['user_s'] + run['sys_s']:.2f} s, "
                      f"cp+sync {cp_s:.2f} s, {run['rounds']} rounds, RSS {run['peak_rss_mib']:.0f} MiB", flush=True)
        rows = []
        for mode, threads in cases:
            gil = None
            if args.gil and mode == "clean":
                run_dir, _ = fresh()
                gil = _gil_share(run_dir, now_ms, threads, dedupe)
                shutil.rmtree(run_dir)
                print(f"  {mode} T={threads}: GIL held {100 * gil:.0f}% of the wall time (py-spy --gil)", flush=True)
            mine = runs[mode, threads]
            wall = statistics.median(r["wall_s"] for r in mine)
            cp = statistics.median(r["cp_s"] for r in mine)
            rows.append({
                "workload": name, "mode": mode, "threads": threads, "wall_s": wall,
                "mb_s": input_bytes / 1e6 / wall, "net_mb_s": input_bytes / 1e6 / max(wall - fixed, 1e-3),
                "load": loads[mode, threads], "gil": gil,
                "cpu_pct": statistics.median(100 * (r["user_s"] + r["sys_s"]) / r["wall_s"] for r in mine),
                "cp_mb_s": input_bytes / 1e6 / cp,
                "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine),
                "walls": [round(r["wall_s"], 2) for r in mine],
            })
        return rows
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(rows: list[dict], args) -> None:
    print(f"\nCommand: .venv/bin/python bench/threads.py {' '.join(sys.argv[1:])}")
    print(f"Code: {_code_state()}; {os.cpu_count()} CPUs; Python {platform.python_version()}; "
          f"load average before {os.getloadavg()[0]:.2f}")
    print("\n| workload | mode | threads | wall s (median) | MB/s | x T=1 | MB/s less fixed cost | x T=1 | CPU % | GIL held "
          "| cp+sync MB/s | cp x T=1 | clean/cp | peak RSS MiB | load before | runs (s) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        one = _one_thread(rows, row, args)
        gil = "-" if row["gil"] is None else f"{100 * row['gil']:.0f}%"
        print(f"| {row['workload']} | {row['mode']} | {row['threads']} | {row['wall_s']:.2f} | {row['mb_s']:,.0f} | "
              f"{row['mb_s'] / one['mb_s']:.2f} | {row['net_mb_s']:,.0f} | {row['net_mb_s'] / one['net_mb_s']:.2f} | "
              f"{row['cpu_pct']:.0f} | {gil} | {row['cp_mb_s']:,.0f} | {row['cp_mb_s'] / one['cp_mb_s']:.2f} | "
              f"{row['mb_s'] / row['cp_mb_s']:.2f} | "
              f"{row['peak_rss_mib']:.0f} | {row['load']:.2f} | {', '.join(map(str, row['walls']))} |")
    if args.plot:
        _plot(rows, args)


def _one_thread(rows: list[dict], row: dict, args) -> dict:
    return next(r for r in rows if r["workload"] == row["workload"] and r["mode"] == row["mode"]
                and r["threads"] == args.threads[0])


def _plot(rows: list[dict], args) -> None:
    """Throughput against threads per workload and mode, the ideal line (T x one thread) and Kafka's one-thread
    figure x T."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for mode, style in (("clean", "o-"), ("clean-threads", "^-"), ("daemon", "s-"), ("daemon-threads", "v-"),
                            ("independent", "x--")):
            mine = [r for r in rows if r["workload"] == name and r["mode"] == mode]
            if not mine:
                continue
            ts = [r["threads"] for r in mine]
            ax.plot(ts, [r["mb_s"] for r in mine], style, label=f"logcleaner {mode}")
            one = _one_thread(rows, mine[0], args)["mb_s"]
            ax.plot(ts, [one * t / args.threads[0] for t in ts], ":", color="grey",
                    label="ideal (T x one thread)" if mode == "clean" else None)
        kafka = KAFKA_ONE_THREAD_MB_S.get(name)
        if kafka:
            ts = sorted({r["threads"] for r in rows})
            ax.plot(ts, [kafka * t for t in ts], "--", color="tab:red", label="Kafka 2.4: one thread x T")
        ax.axvline(os.cpu_count() or 1, color="black", linewidth=0.5)
        ax.set_title(f"{name} ({os.cpu_count()} cores: the vertical line)")
        ax.set_xlabel("log.cleaner.threads")
        ax.set_ylabel("MB/s of input, whole process")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="W1,W3")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--scale", type=float, default=0.125)
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dedupe-mb", type=float, default=256, help="log.cleaner.dedupe.buffer.size in MiB (shared)")
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--modes", default="clean",
                        help="clean (`logcleaner clean LOGDIR`: threads past the first in worker processes), "
                             "daemon (`logcleaner run`), clean-threads and daemon-threads (the same with "
                             "LOGCLEANER_WORKERS=threads), independent (T separate one-thread `clean` "
                             "processes over T shares of the partitions, after T concurrent copies: the machine's "
                             "own bound)")
    parser.add_argument("--gil", action="store_true", help="one more clean per row under py-spy --gil: GIL-held share")
    parser.add_argument("--plot", type=plot_argument, help="a PNG of throughput against threads")
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    args.threads = [int(t) for t in args.threads.split(",")]
    args.data_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.workloads.split(","):
        rows.extend(bench_workload(name, args))
    report(rows, args)


if __name__ == "__main__":
    main()
