"""Many tiny partitions (issue 19, "How the cost grows"): selection, rounds, idle CPU and memory of a real daemon.

For each partition count (`--partitions 1000,2000,5000,10000`):

1. generate: one small partition written with the project's writer (`PartitionLog`, 7 keyed records over 3 keys,
   two inactive segments and an empty active one, every record timestamp in the past), then its files copied
   into N partition directories `tNNNN-P` (100 partitions a topic; every name a distinct topic-partition) of a
   fresh log dir under `--data-dir` (default: a temporary directory on the local disk; deleted at the end unless
   `--keep`): the pristine copy, never cleaned itself;
2. selection, in this process (`cleaner.manager.CleanerManager` over a `cp -r` copy, the daemon's probe
   interval, `log.cleaner.backoff.ms`): the first pass (every partition read: what a daemon pays once at
   start), then `--passes` (default 200) passes while every partition is dirty, each `grab_filthiest` followed
   by `aborted` (the outcome of a round: that partition is worked out again at the next pass); "pass ms" is
   their median; then the idle passes (every partition clean, after the daemon below cleaned that copy): the
   median of `--passes` passes with nothing to hand out, and one pass after the probe interval has passed
   (every partition probed);
3. the daemon: a `cp -r` + `sync` copy, `logcleaner run -c CONFIG` (an operator's config: the copy in
   `log.dirs`, `"log.cleanup.policy" = "compact"`, one cleaner thread, every other setting Kafka's default,
   `[server] listen` a free local port) as a fresh process; timed from its start until `/status` shows every
   partition idle, cleaned (`rounds` ≥ 1) and at dirty ratio 0. `/status` of 10,000 partitions is a 14 MB JSON
   document that costs the daemon a fraction of a second, so it is asked only once the log dir's
   `cleaner-offset-checkpoint` (read by this process every `--poll-s`, default 0.5 s) holds every partition's
   active-segment base, and again every `--poll-s` until it shows them all clean; "per partition ms" = that time
   less the time to the first `/healthz` answer, over N (everything a partition costs the daemon: selection,
   opening, the round, checkpoints, metrics); "round ms" = the median of the rounds' own `elapsed_s`
   (`clean_round`, from `/status`); CPU = the daemon's user + system time from `/proc/<pid>/stat` over that
   time. Then `--settle-s` (default 30) seconds in which each cleaned partition is read once more (a round leaves
   its directory's mtime younger than `RACY_NS`, so its first probe after the round reads it again: "settle
   CPU %"), then `--idle-s` (default 60) seconds of the idle daemon: its CPU share (from /proc, 100% = one
   core) and its resident memory (`VmRSS`, and the peak `VmHWM`, from `/proc/<pid>/status`); SIGTERM, exit 0
   expected;
4. `logcleaner clean LOGDIR --json --set cleanup.policy=compact` over another copy, one thread: its wall and CPU
   time against the sum of its rounds' `elapsed_s` (what is not in a round: start-up, finding and planning the
   partitions, opening each, retention, the outcome lines).

The table: one row per partition count; "load" is the 1-minute load average before the row (the machine may be
shared). The plot (`--plot`, default `bench/many_partitions.png`): selection-pass time and per-partition daemon
cost against the partition count. A benchmark measures; it never asserts a time.

Usage: python bench/many_partitions.py [--partitions 1000,2000,5000,10000] [--passes 200] [--settle-s 30]
                                       [--idle-s 60] [--poll-s 0.5] [--skip-clean] [--data-dir DIR] [--keep] [--plot bench/many_partitions.png]
"""

from __future__ import annotations

import argparse
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
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the sibling modules, from the path above
from run import LOGCLEANER, _code_state, _run_measured, plot_argument

from cleaner.manager import CleanerManager
from cleaner.settings import Settings
from segments.codec.errors import CheckpointError
from segments.codec.records import Record, encode_batch
from segments.partition.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from segments.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000
_TICK_S = os.sysconf("SC_CLK_TCK")


def _template(directory: Path) -> None:
    """One tiny partition: 7 records over 3 keys, segments [0, 4) and [4, 7), an empty active segment."""
    with PartitionLog.open(directory, mode="writer", create=True, config=LogConfig()) as log:
        for i in range(7):
            log.append_batches(encode_batch([Record(0, T0 + i, b"key-%d" % (i % 3), b"value-%d" % i)], base_offset=0))
            if i == 3:
                log.roll()
        log.roll()
        log.flush()


def _generate(log_dir: Path, partitions: int) -> None:
    """`partitions` copies of the template partition's segment and index files, each its own topic-partition."""
    with tempfile.TemporaryDirectory(dir=log_dir.parent) as scratch:
        template = Path(scratch) / "template-0"
        _template(template)
        files = [(p.name, p.read_bytes()) for p in sorted(template.iterdir())
                 if p.is_file() and not p.name.startswith(".")]
    log_dir.mkdir()
    for k in range(partitions):
        directory = log_dir / f"t{k // 100:04d}-{k % 100}"
        directory.mkdir()
        for name, data in files:
            (directory / name).write_bytes(data)


def _copy(src: Path, dst: Path) -> None:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK_S  # utime, stime (fields 14 and 15 of stat)


def _proc_memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def _get(port: int, path: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as answer:
            return json.load(answer)
    except OSError:
        return None


def _checkpointed(log_dir: Path) -> int:
    """Partitions whose `cleaner-offset-checkpoint` entry is at their active segment's base (7)."""
    try:
        entries = read_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT)
    except (OSError, CheckpointError):
        return 0  # being replaced
    return sum(1 for offset in entries.values() if offset == 7)


def _all_clean(status: dict, partitions: int) -> bool:
    parts = status["partitions"]
    return len(parts) == partitions and all(
        p["state"] == "idle" and p["rounds"] >= 1 and p["dirty_ratio"] == 0 for p in parts)


def _daemon(log_dir: Path, partitions: int, *, poll_s: float, settle_s: float, idle_s: float,
            timeout_s: float) -> dict:
    """A real `logcleaner run` over `log_dir` until every partition is clean, then `idle_s` idle."""
    port = _free_port()
    config = log_dir.parent / f"{log_dir.name}.toml"
    config.write_text(f'"log.dirs" = ["{log_dir}"]\n"log.cleanup.policy" = "compact"\n"log.cleaner.threads" = 1\n'
                      f'[server]\nlisten = "127.0.0.1:{port}"\n')
    stderr = open(log_dir.parent / f"{log_dir.name}.daemon.log", "wb")
    started = time.perf_counter()
    proc = subprocess.Popen([str(LOGCLEANER), "run", "-c", str(config)], stdout=subprocess.DEVNULL, stderr=stderr,
                            cwd=ROOT)
    out: dict = {}
    try:
        while _get(port, "/healthz") is None:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({proc.returncode}); see {stderr.name}")
            time.sleep(0.05)
        first_answer = time.perf_counter() - started
        status = None
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the daemon exited ({proc.returncode}); see {stderr.name}")
            done = _checkpointed(log_dir)
            if done == partitions:
                status = _get(port, "/status")
                if status is not None and _all_clean(status, partitions):
                    break
            if time.perf_counter() - started > timeout_s:
                out["timed_out"] = f"{done} of {partitions} checkpointed after {timeout_s:.0f} s"
                status = _get(port, "/status")
                break
            time.sleep(poll_s)
        clean_s = time.perf_counter() - started
        cpu_clean = _proc_cpu_s(proc.pid)
        assert status is not None and first_answer is not None
        rounds = [p["last_round"]["elapsed_s"] for p in status["partitions"] if p["last_round"]]
        out.update(clean_s=clean_s, first_answer_s=first_answer, cpu_clean_s=cpu_clean,
                   per_partition_ms=1000 * (clean_s - first_answer) / partitions,
                   round_ms=1000 * statistics.median(rounds) if rounds else float("nan"),
                   rounds=sum(p["rounds"] for p in status["partitions"]))
        rss_clean, _ = _proc_memory_mib(proc.pid)
        settle_from, settle_cpu_from = time.perf_counter(), _proc_cpu_s(proc.pid)
        time.sleep(settle_s)
        out["settle_cpu_pct"] = 100 * (_proc_cpu_s(proc.pid) - settle_cpu_from) / (time.perf_counter() - settle_from)
        idle_from, idle_cpu_from = time.perf_counter(), _proc_cpu_s(proc.pid)
        time.sleep(idle_s)
        idle_wall = time.perf_counter() - idle_from
        rss, hwm = _proc_memory_mib(proc.pid)
        out.update(idle_cpu_pct=100 * (_proc_cpu_s(proc.pid) - idle_cpu_from) / idle_wall,
                   rss_clean_mib=rss_clean, rss_mib=rss, hwm_mib=hwm)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out["exit"] = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out["exit"] = "killed"
        stderr.close()
    return out


def _manager(log_dir: Path) -> CleanerManager:
    settings = Settings.from_mappings({"cleanup.policy": "compact", "log.dirs": str(log_dir)})
    manager = CleanerManager([log_dir], settings, clock_ms=lambda: int(time.time() * 1000),
                             probe_interval_ms=settings.cleaner.backoff_ms)
    manager.discover()
    return manager


def _selection_dirty(log_dir: Path, passes: int) -> dict:
    """The first pass, then the median of `passes` passes over dirty partitions (each pass's pick aborted)."""
    manager = _manager(log_dir)
    t = time.perf_counter()
    candidate = manager.grab_filthiest()
    first = time.perf_counter() - t
    assert candidate is not None
    manager.aborted(candidate.directory)
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        candidate = manager.grab_filthiest()
        times.append(time.perf_counter() - t)
        assert candidate is not None
        manager.aborted(candidate.directory)
    return {"first_pass_s": first, "pass_ms": 1000 * statistics.median(times)}


def _selection_idle(log_dir: Path, passes: int) -> dict:
    """Passes over clean partitions: the median of `passes` (nothing due to probe), and one with every
    partition's probe due (the probe interval made 0 for it)."""
    manager = _manager(log_dir)
    assert manager.grab_filthiest() is None  # the first pass reads every partition
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        assert manager.grab_filthiest() is None
        times.append(time.perf_counter() - t)
    manager.probe_interval_ms = 0
    t = time.perf_counter()
    assert manager.grab_filthiest() is None
    probe_all = time.perf_counter() - t
    return {"idle_pass_ms": 1000 * statistics.median(times), "probe_all_ms": 1000 * probe_all}


def _clean(log_dir: Path, partitions: int) -> dict:
    run = _run_measured([str(LOGCLEANER), "clean", str(log_dir), "--json", "--set", "cleanup.policy=compact",
                         "--set", "log.cleaner.threads=1"])
    if run["rc"]:
        raise RuntimeError(f"clean of {log_dir} failed (exit {run['rc']}):\n{run['stderr'][-2000:]}")
    summaries = [json.loads(line) for line in run["stdout"].splitlines() if line.startswith("{")]
    if len(summaries) != partitions or any(s["status"] != "ok" for s in summaries):
        raise RuntimeError(f"clean of {log_dir}: {len(summaries)} outcomes, not all ok")
    return {"clean_wall_s": run["wall_s"], "clean_cpu_s": run["user_s"] + run["sys_s"],
            "clean_rounds_s": sum(s.get("elapsed_s", 0.0) for s in summaries),
            "clean_peak_rss_mib": run["peak_rss_mib"]}


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["partitions"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [r["pass_ms"] for r in rows], "o-", label="selection pass, partitions dirty (median ms)")
    ax.plot(xs, [r["idle_pass_ms"] for r in rows], "s-", label="selection pass, all clean (median ms)")
    ax.plot(xs, [r["probe_all_ms"] for r in rows], "^--", label="idle pass probing every partition (ms)")
    ax.plot(xs, [r.get("per_partition_ms", float("nan")) for r in rows], "D-",
            label="daemon: per partition, selection + round + checkpoints (ms)")
    ax.plot(xs, [r.get("round_ms", float("nan")) for r in rows], "v:", label="daemon: a round's own time (median ms)")
    ax.axhline(10, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("partitions (7 records each, one cleaner thread)")
    ax.set_ylabel("ms")
    ax.set_title("Issue 19: cost per pass and per partition as partitions grow")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="1000,2000,5000,10000")
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--settle-s", type=float, default=30.0)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="give a daemon run up after this")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--skip-clean", action="store_true", help="leave out the logcleaner clean runs")
    parser.add_argument("--plot", type=plot_argument, default=str(BENCH / "many_partitions.png"),
                        help="the plot's PNG ('' for none)")
    args = parser.parse_args()
    counts = [int(x) for x in args.partitions.split(",")]
    args.data_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="many-partitions-", dir=args.data_dir))
    print(f"code: {_code_state()}; data in {root}", flush=True)
    rows = []
    try:
        for n in counts:
            row: dict = {"partitions": n, "load": os.getloadavg()[0]}
            pristine = root / f"pristine-{n}"
            t = time.perf_counter()
            _generate(pristine, n)
            row["generate_s"] = time.perf_counter() - t
            dirty = root / f"selection-{n}"
            _copy(pristine, dirty)
            row.update(_selection_dirty(dirty, args.passes))
            shutil.rmtree(dirty)
            daemon_dir = root / f"daemon-{n}"
            _copy(pristine, daemon_dir)
            row.update(_daemon(daemon_dir, n, poll_s=args.poll_s, settle_s=args.settle_s, idle_s=args.idle_s,
                               timeout_s=args.timeout_s))
            row.update(_selection_idle(daemon_dir, args.passes))
            if not args.skip_clean:
                clean_dir = root / f"clean-{n}"
                _copy(pristine, clean_dir)
                row.update(_clean(clean_dir, n))
                shutil.rmtree(clean_dir)
            if not args.keep:
                shutil.rmtree(daemon_dir)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    header = ("| partitions | load | first pass s | pass ms (dirty) | pass ms (idle) | probe-all pass ms | daemon: all "
              "clean s | per partition ms | round ms | daemon CPU s | settle CPU % | idle CPU % | RSS MiB (peak) | clean wall s | "
              "clean rounds s | clean CPU s |")
    print(header)
    print("|" + "---:|" * (header.count("|") - 1))
    for r in rows:
        print(f"| {r['partitions']} | {r['load']:.1f} | {r['first_pass_s']:.2f} | {r['pass_ms']:.2f} | "
              f"{r['idle_pass_ms']:.2f} | {r['probe_all_ms']:.1f} | {r['clean_s']:.1f}"
              f"{' (' + r['timed_out'] + ')' if 'timed_out' in r else ''} | {r['per_partition_ms']:.1f} | "
              f"{r['round_ms']:.1f} | {r['cpu_clean_s']:.1f} | {r['settle_cpu_pct']:.2f} | {r['idle_cpu_pct']:.2f} | {r['rss_mib']:.0f} "
              f"({r['hwm_mib']:.0f}) | {r.get('clean_wall_s', float('nan')):.1f} | "
              f"{r.get('clean_rounds_s', float('nan')):.1f} | {r.get('clean_cpu_s', float('nan')):.1f} |")
    if args.plot:
        _plot(rows, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
