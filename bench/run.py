"""The benchmark of issue 6: one full clean (`logcleaner clean`) of each standard workload, against `cp -r` + `sync`.

For each workload (`bench/workloads.py`; `--workloads W1,W2,W3,W4`, `--scale 0.1` for a quick run), in one run:

1. generate it (in a child process) into a temporary directory under `--data-dir` (default `bench/data/`,
   gitignored; deleted at the end unless `--keep`): the pristine copy, never cleaned itself;
2. per measured run, `cp -r` the pristine partition directory into a fresh run directory followed by
   `sync` (timed: the physical baseline), then time `logcleaner clean DIR --json --now-ms T --set
   log.cleaner.dedupe.buffer.size=B` as a fresh subprocess (so interpreter start-up, imports and the numba
   cache load count). Page cache: `warm` = the run directory was just written by the cp (its pages are
   cached, clean); `cold` = the pristine files are dropped (posix_fadvise DONTNEED) before the cp, and the
   run directory's files before the clean, so both read from disk; in `cold` mode the run's `.log` files are
   also read once with `cat` (timed, then dropped again) before the clean: issue 19's cold baseline;
3. before the timed runs: one clean with an empty numba cache (`NUMBA_CACHE_DIR` = a new temporary
   directory; reported as the compile run) and one untimed warm-up clean with the normal on-disk cache;
4. median of `--repeats` (default 3) per cache mode; per-phase times (survey_s, index_s, recopy_s,
   elapsed_s) come from the clean's JSON; peak RSS, user and system CPU from `os.wait4` of that process; the
   wall time outside the round is split where the summary line arrives: before the round (start-up, imports,
   opening) and after the summary (removing the replaced segments, the interpreter's exit);
5. the daemon's case: one process (as a cleaner thread of `logcleaner run` is) cleans two fresh copies one
   after the other; the second clean pays no start-up, import or compilation cost, the first pays them all;
   as in the daemon, the old segments are unlinked by a background remover while the next clean runs
   (where `logcleaner clean` waits for it before it exits); the second one's round is printed too;
6. once per workload (untimed): `logcleaner verify --json` of a cleaned directory, and the record count
   against the workload's `expected_records_after_clean` (one record per distinct key in the cleanable
   section, plus markers, plus the active segment);
7. with `--profile`: the slowest phase once more, under cProfile (only that phase's function is profiled)
   and, if `py-spy` is installed, a whole clean sampled by py-spy, summarised for samples inside that phase.

The report ends with each workload against issue 6's targets (throughput, 0.7x of cp+sync, peak RSS within
the dedupe buffer + 200 MB).

Throughput is input bytes (all `.log` bytes of the partition) or records (all records) / wall time of the
whole process. `clean/cp` is the clean's throughput over the cp+sync throughput of the same directory in the
same cache mode. A benchmark measures; it never asserts a time.

Usage: python bench/run.py [--workloads W1,W2,W3,W4] [--scale 1] [--repeats 3] [--cache warm,cold]
                           [--dedupe-mb 256] [--profile] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LOGCLEANER = Path(sys.executable).parent / "logcleaner"
PY_SPY = Path(sys.executable).parent / "py-spy"
PHASE_FUNCTIONS = {  # the function of cleaner.round each phase's time is spent in
    "survey_s": "survey_log",
    "index_s": "build_offset_map",
    "recopy_s": "clean_group",
}
PROFILE_TOP = 15
TARGETS = {"W1": ("MB/s", 530), "W2": ("records/s", 2_000_000), "W3": ("MB/s", 300), "W4": ("records/s", 1_000_000)}
PY_SPY_RATE_HZ = 250


# ---- helpers ---------------------------------------------------------------------------------------------------


def _code_state() -> str:
    """The commit and any uncommitted change to the product code (others may be editing the work tree)."""
    def git(*a: str) -> str:
        res = subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT)
        return res.stdout.strip() if res.returncode == 0 else "?"

    dirty = git("status", "--short", "--", "cleaner", "segments", "offsetmap")
    digest = git("diff", "HEAD", "--", "cleaner", "segments", "offsetmap")
    sha = hashlib.sha1(digest.encode()).hexdigest()[:8]
    return f"{git('rev-parse', '--short', 'HEAD')}" + (
        f" + uncommitted product changes ({len(dirty.splitlines())} files, diff sha1 {sha})"
        if dirty else " (product code clean)")


def _drop_cache(directory: Path) -> None:
    """Drop the page-cache pages of every file under `directory` (dirty pages are written first)."""
    os.sync()
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def plot_argument(value: str) -> Path | None:
    """The `--plot` of a bench that draws one (argparse `type=`): '' for none; a path only where matplotlib is
    installed, so that a missing one is said at the start, not after the run (`pip install -e '.[bench]'`)."""
    if not value:
        return None
    if importlib.util.find_spec("matplotlib") is None:
        raise argparse.ArgumentTypeError(f"{value}: drawing a plot needs matplotlib (pip install -e '.[bench]'); "
                                         "--plot '' draws none")
    return Path(value)


def _cat_seconds(partition: Path) -> float:
    """Issue 19's cold baseline: `cat` of the partition's `.log` files to /dev/null from a cold page cache (the
    caller dropped it), timed; the pages are dropped again afterwards, so the clean that follows reads cold too."""
    started = time.perf_counter()
    subprocess.run(["cat", *map(str, sorted(partition.glob("*.log")))], stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - started
    _drop_cache(partition)
    return seconds


def _log_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.log"))


def _generate(workload: str, log_dir: Path, scale: float, seed: int | None = None) -> dict:
    """Generate in a child process, so this driver stays small (a child's peak RSS can include its parent's:
    Linux records the parent's high-water mark at the child's exec)."""
    res = subprocess.run(
        [sys.executable, str(BENCH / "workloads.py"), workload, str(log_dir), "--scale", str(scale),
         *(["--seed", str(seed)] if seed is not None else [])],
        capture_output=True, text=True, cwd=ROOT,
    )
    if res.returncode:
        raise RuntimeError(f"generating {workload} failed:\n{res.stderr}")
    return json.loads(res.stdout)


def _copy(src: Path, dst: Path) -> float:
    """`cp -r src dst` then `sync`; wall seconds."""
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t


def _run_measured(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> dict:
    """Run `cmd`; wall seconds (until the process itself exits), CPU seconds and peak RSS (from wait4, this child
    only), stdout, stderr, rc, and `last_line_s`: when its last line of stdout arrived (a clean's summary, printed
    once its work is done: what follows is removing the replaced segments and the interpreter's exit). stdout
    is read on a thread and stderr goes to a file, so that a process it started and that outlives it a moment
    (a worker, Spark's JVM) holds up neither the wall time nor the result beyond `_STDOUT_GRACE_S`."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=cwd, env=env)
        lines: list[tuple[bytes, float]] = []
        stdout = proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: lines.extend((line, time.perf_counter()) for line in stdout),
                                  daemon=True)
        reader.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        reader.join(_STDOUT_GRACE_S)  # what the process wrote is in the pipe by now
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        done = list(lines)
        return {
            "wall_s": wall,
            "last_line_s": (done[-1][1] if done else started) - started,
            "user_s": usage.ru_utime,
            "sys_s": usage.ru_stime,
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "rc": proc.returncode,
            "stdout": b"".join(line for line, _ in done).decode(),
            "stderr": err.read().decode(),
        }


_STDOUT_GRACE_S = 5.0


def _clean_cmd(part: Path, now_ms: int, dedupe_bytes: int) -> list[str]:
    return [
        str(LOGCLEANER), "clean", str(part), "--json", "--now-ms", str(now_ms),
        "--set", f"log.cleaner.dedupe.buffer.size={dedupe_bytes}",
    ]


def _clean(part: Path, now_ms: int, dedupe_bytes: int, env: dict | None = None) -> dict:
    load = os.getloadavg()[0]
    run = _run_measured(_clean_cmd(part, now_ms, dedupe_bytes), env)
    if run["rc"]:
        raise RuntimeError(f"clean of {part} failed (exit {run['rc']}):\n{run['stderr']}\n{run['stdout']}")
    summary = json.loads(run["stdout"].strip().splitlines()[-1])
    if summary.get("status") != "ok":
        raise RuntimeError(f"clean of {part}: {summary}")
    run.update(summary=summary, load_before=load, output_bytes=_log_bytes(part))
    return run


# ---- one workload ----------------------------------------------------------------------------------------------


def bench_workload(name: str, args) -> dict:
    dedupe = int(args.dedupe_mb * 2**20)
    work = Path(tempfile.mkdtemp(prefix=f"round-{name}-", dir=args.data_dir))
    try:
        manifest = _generate(name, work / "src", args.scale)
        part_name = Path(manifest["partition_dir"]).name
        src = work / "src" / part_name
        now_ms = manifest["now_ms"]
        input_bytes = _log_bytes(src)
        counter = [0]

        def fresh(cold: bool) -> tuple[Path, float]:
            counter[0] += 1
            run_dir = work / f"run{counter[0]}"
            run_dir.mkdir()
            if cold:
                _drop_cache(src)
            seconds = _copy(src, run_dir / part_name)
            if cold:
                _drop_cache(run_dir)
            return run_dir / part_name, seconds

        def done(part: Path) -> None:
            shutil.rmtree(part.parent)

        out: dict = {"workload": name, "manifest": manifest, "input_bytes": input_bytes, "runs": defaultdict(list)}
        print(f"\n## {name}: {manifest['records']:,} records, {input_bytes / 1e6:,.0f} MB in {manifest['segments']} "
              f"segments, {manifest['batches']:,} batches (generated in {manifest['generate_s']:.1f} s)", flush=True)

        # The compile run: an empty numba cache, so every kernel used is compiled in this process.
        part, _ = fresh(cold=False)
        with tempfile.TemporaryDirectory(dir=args.data_dir) as cache:
            out["compile"] = _clean(part, now_ms, dedupe, env=dict(os.environ, NUMBA_CACHE_DIR=cache))
        done(part)
        # Warm-up (untimed) with the normal on-disk cache; also the run that is verified.
        part, _ = fresh(cold=False)
        warmup = _clean(part, now_ms, dedupe)
        out["verify"] = _verify(part, manifest, warmup)
        done(part)
        first, second = fresh(cold=False)[0], fresh(cold=False)[0]
        out["in_process"] = _in_process(first, second, now_ms, dedupe)
        done(first)
        done(second)
        print(f"  one process, two cleans: first {out['in_process'][0]:.2f} s (process start to end of clean), "
              f"second {out['in_process'][1]:.2f} s (its round {out['in_process'][2]:.2f} s)", flush=True)
        for mode in args.cache:
            for _ in range(args.repeats):
                part, cp_s = fresh(cold=mode == "cold")
                cat_s = _cat_seconds(part) if mode == "cold" else None
                run = _clean(part, now_ms, dedupe)
                run["cp_s"], run["cat_s"] = cp_s, cat_s
                out["runs"][mode].append(run)
                print(f"  {mode}: clean {run['wall_s']:.2f} s (load {run['load_before']:.2f}), cp+sync {cp_s:.2f} s, "
                      f"{'' if cat_s is None else f'cat {cat_s:.2f} s, '}RSS {run['peak_rss_mib']:.0f} MiB", flush=True)
                done(part)
        if args.profile:
            out["profile"] = _profile(name, work, fresh, done, now_ms, dedupe, out, args)
        return out
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _in_process(first: Path, second: Path, now_ms: int, dedupe: int) -> tuple[float, float, float]:
    """Seconds of two cleans in one fresh process, as a daemon's thread runs them (the process's native settings,
    one background remover that unlinks each swap's old segments beside the next clean): the first from
    process start, the second alone, and the second one's round."""
    code = (
        "import sys, time, json\n"
        f"t0 = {time.time()!r}\n"  # this driver's clock just before the child starts
        # the native settings every `logcleaner` process (the daemon's included) applies at start
        "from cleaner.allocator import limit_blas_threads, tune_allocator\n"
        "limit_blas_threads(); tune_allocator()\n"
        "from cleaner.config_file import load_config\n"
        "from cleaner.oneshot import clean_partition\n"
        "from segments.files.fileio import BackgroundRemover\n"
        "remover = BackgroundRemover()\n"  # as the daemon's pool: old segments unlinked beside the next round
        "settings = load_config(None, overrides={'cleanup.policy': 'compact', "
        f"'log.cleaner.dedupe.buffer.size': '{dedupe}'}}).settings\n"
        "times = []\n"
        f"for part in ({str(first)!r}, {str(second)!r}):\n"
        f"    outcome = clean_partition(__import__('pathlib').Path(part), settings, now_ms={now_ms}, remover=remover)\n"
        "    assert outcome.ok and outcome.rounds and outcome.rounds[0].records_written, outcome\n"
        "    times.append(time.time())\n"
        "remover.drain()\n"  # untimed: the copies' old segments are gone before the bench removes them
        "print(json.dumps([times[0] - t0, times[1] - times[0], outcome.rounds[0].elapsed_s]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"in-process cleans failed:\n{res.stderr}")
    a, b, round_s = json.loads(res.stdout)
    return a, b, round_s


def _verify(part: Path, manifest: dict, run: dict) -> dict:
    res = subprocess.run([str(LOGCLEANER), "verify", "--json", str(part)], capture_output=True, text=True, cwd=ROOT)
    summary = json.loads(res.stdout)
    expected = manifest["expected_records_after_clean"]
    written = run["summary"]["records_written"] + manifest["active_segment_records"]
    return {
        "ok": res.returncode == 0 and not summary["problems"],
        "problems": summary["problems"][:5],
        "records_after": summary["records"],
        "records_expected": expected,
        "records_written_plus_active": written,
        "counts_ok": summary["records"] == expected == written,
        "segments_after": summary["segments"],
        "batches_after": summary["batches"],
    }


# ---- profiles ----------------------------------------------------------------------------------------------------


def _profile(name: str, work: Path, fresh, done, now_ms: int, dedupe: int, out: dict, args) -> dict:
    warm = out["runs"].get("warm") or next(iter(out["runs"].values()))
    phase = max(PHASE_FUNCTIONS, key=lambda p: statistics.median(r["summary"][p] for r in warm))
    function = PHASE_FUNCTIONS[phase]
    profile_dir = Path(args.profile_dir)
    profile_dir.mkdir(parents=True, exist_ok=True)
    result = {"phase": phase, "function": function}
    part, _ = fresh(cold=False)
    stats_path = profile_dir / f"{name}-{function}.prof"
    cmd = [sys.executable, __file__, "--profile-child", function, "--dir", str(part), "--now-ms", str(now_ms),
           "--dedupe-bytes", str(dedupe), "--stats", str(stats_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"profile child failed:\n{res.stderr}")
    result["cprofile"] = res.stdout
    done(part)
    if PY_SPY.exists():
        part, _ = fresh(cold=False)
        raw = profile_dir / f"{name}-py-spy.txt"
        spy = subprocess.run(
            [str(PY_SPY), "record", "-r", str(PY_SPY_RATE_HZ), "-f", "raw", "-o", str(raw), "--",
             *_clean_cmd(part, now_ms, dedupe)],
            capture_output=True, text=True, cwd=ROOT,
        )
        if spy.returncode == 0 and raw.exists():
            result["py_spy"] = _py_spy_breakdown(raw) + "\n" + _summarise_py_spy(raw, function)
        else:
            result["py_spy"] = f"py-spy failed (exit {spy.returncode}): {spy.stderr[-500:]}"
        done(part)
    print(f"\n### profile of {name} {phase} ({function}): cProfile (only {function} profiled)\n\n```\n"
          f"{result['cprofile']}```", flush=True)
    if "py_spy" in result:
        print(f"\npy-spy ({PY_SPY_RATE_HZ} Hz sampling of a whole clean; samples inside {function}):\n\n```\n"
              f"{result['py_spy']}```", flush=True)
    return result


BREAKDOWN = (  # (label, a function on the stack), first match wins, in this order
    ("survey phase", "survey_log"),
    ("index phase", "build_offset_map"),
    ("recopy phase", "clean_group"),
    ("swap (replace_segments)", "PartitionLog.replace_segments"),
    ("offset map allocation", "OffsetMap.__init__"),
    ("PartitionLog.open (index checks)", "PartitionLog.open"),
    ("rest of clean_partition", "clean_partition"),
)


def _py_spy_breakdown(raw: Path) -> str:
    """Where the whole process's samples fall; outside clean_partition = interpreter start-up, imports, exit."""
    counts: dict[str, int] = defaultdict(int)
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        names = {_frame_name(f).split(" ")[0] for f in stack.split(";")}
        label = next((lab for lab, fn in BREAKDOWN if fn in names), "start-up, imports, exit (outside clean_partition)")
        counts[label] += count
    lines = [f"whole process: {total} samples at {PY_SPY_RATE_HZ} Hz = {total / PY_SPY_RATE_HZ:.2f} s on CPU"
             " (idle/IO waits are not sampled)"]
    for label, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {100 * c / max(total, 1):5.1f}%  {c / PY_SPY_RATE_HZ:6.2f} s  {label}")
    return "\n".join(lines) + "\n"


def _summarise_py_spy(raw: Path, function: str) -> str:
    """Self and inclusive sample shares per function over the samples whose stack holds `function`."""
    self_counts: dict[str, int] = defaultdict(int)
    incl_counts: dict[str, int] = defaultdict(int)
    total = inside = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        names = [_frame_name(f) for f in frames]
        if not any(n.startswith(function + " ") for n in names):
            continue
        inside += count
        self_counts[names[-1]] += count
        for n in set(names):
            incl_counts[n] += count
    lines = [f"{inside} of {total} samples ({100 * inside / max(total, 1):.0f}%) are inside {function}",
             "", "self %  incl %  function (file:line of the function's frame)"]
    for n, c in sorted(self_counts.items(), key=lambda kv: -kv[1])[:PROFILE_TOP]:
        lines.append(f"{100 * c / max(inside, 1):6.1f} {100 * incl_counts[n] / max(inside, 1):6.1f}  {n}")
    lines += ["", "by inclusive share:"]
    for n, c in sorted(incl_counts.items(), key=lambda kv: -kv[1])[:PROFILE_TOP]:
        lines.append(f"       {100 * c / max(inside, 1):6.1f}  {n}")
    return "\n".join(lines) + "\n"


def _frame_name(frame: str) -> str:
    """`fn (path/to/file.py:123)` -> `fn (file.py)`: a function, not a line."""
    fn, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{fn} ({short})"


def profile_child(function: str, part: Path, now_ms: int, dedupe_bytes: int, stats_path: Path) -> None:
    """Clean `part` with cProfile enabled only inside cleaner.round.<function>; print the top entries."""
    import cProfile
    import io
    import pstats

    import cleaner.round as round_module
    from cleaner.config_file import load_config
    from cleaner.oneshot import clean_partition

    profiler = cProfile.Profile()
    original = getattr(round_module, function)

    def wrapped(*a, **k):
        profiler.enable()
        try:
            return original(*a, **k)
        finally:
            profiler.disable()

    setattr(round_module, function, wrapped)
    overrides = {"cleanup.policy": "compact", "log.cleaner.dedupe.buffer.size": str(dedupe_bytes)}
    loaded = load_config(None, overrides=overrides)
    t = time.perf_counter()
    outcome = clean_partition(part, loaded.settings, now_ms=now_ms)
    wall = time.perf_counter() - t
    if not outcome.ok:
        raise SystemExit(f"clean failed: {outcome.error}")
    profiler.dump_stats(stats_path)
    summary = outcome.summary()
    buf = io.StringIO()
    print(f"clean_partition {wall:.2f} s under the profiler; phases: survey {summary['survey_s']:.2f} s, "
          f"index {summary['index_s']:.2f} s, recopy {summary['recopy_s']:.2f} s", file=buf)
    for key in ("cumulative", "tottime"):
        stats = pstats.Stats(str(stats_path), stream=buf).strip_dirs().sort_stats(key)
        print(f"--- top {PROFILE_TOP} by {key} ---", file=buf)
        stats.print_stats(PROFILE_TOP)
    text = buf.getvalue()
    # pstats prints a preamble (file name, totals); keep the tables compact.
    print("\n".join(line for line in text.splitlines() if line.strip() and not line.startswith(str(stats_path))))


# ---- report ------------------------------------------------------------------------------------------------------


def _median(runs: list[dict], key) -> float:
    return statistics.median(key(r) for r in runs)


def report(results: list[dict], args) -> None:
    print("\n## Results (median of %d runs per row; wall = the whole `logcleaner clean` process)\n" % args.repeats)
    print("| workload | cache | input MB | records | wall s (min-max) | MB/s | records/s | survey s | index s | "
          "recopy s | other s | before the round s | after the summary s | CPU s | peak RSS MiB | output MB | "
          "cp+sync s | cp MB/s | clean/cp |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for res in results:
        m = res["manifest"]
        mb = res["input_bytes"] / 1e6
        for mode, runs in res["runs"].items():
            wall = _median(runs, lambda r: r["wall_s"])
            cp = _median(runs, lambda r: r["cp_s"])
            s = {k: _median(runs, lambda r, k=k: r["summary"][k])
                 for k in ("survey_s", "index_s", "recopy_s", "elapsed_s")}
            other = s["elapsed_s"] - s["survey_s"] - s["index_s"] - s["recopy_s"]
            before = _median(runs, lambda r: r["last_line_s"] - r["summary"]["elapsed_s"])
            after = _median(runs, lambda r: r["wall_s"] - r["last_line_s"])
            cpu = _median(runs, lambda r: r["user_s"] + r["sys_s"])
            rss = max(r["peak_rss_mib"] for r in runs)
            out_mb = _median(runs, lambda r: r["output_bytes"]) / 1e6
            lo, hi = min(r["wall_s"] for r in runs), max(r["wall_s"] for r in runs)
            print(f"| {res['workload']} | {mode} | {mb:,.0f} | {m['records']:,} | {wall:.2f} ({lo:.2f}-{hi:.2f}) | "
                  f"{mb / wall:,.0f} | {m['records'] / wall / 1e6:.2f} M | {s['survey_s']:.2f} | {s['index_s']:.2f} | "
                  f"{s['recopy_s']:.2f} | {other:.2f} | {before:.2f} | {after:.2f} | {cpu:.2f} | {rss:.0f} | {out_mb:,.1f} | "
                  f"{cp:.2f} | {mb / cp:,.0f} | {cp / wall:.2f} |")
    cold = [(res, res["runs"]["cold"]) for res in results if res["runs"].get("cold")]
    if cold:
        print("\nIssue 19's cold target: the clean within 1.3x of `cat` of the same `.log` files after the same "
              "eviction (each run's cat just before its clean; medians):\n")
        for res, runs in cold:
            wall, cat = _median(runs, lambda r: r["wall_s"]), _median(runs, lambda r: r["cat_s"])
            ratio = _median(runs, lambda r: r["wall_s"] / r["cat_s"])
            print(f"- {res['workload']}: clean {wall:.2f} s, cat {cat:.2f} s "
                  f"({res['input_bytes'] / 1e6 / cat:,.0f} MB/s): clean/cat {ratio:.2f}x")
    print("\nCompile runs (empty numba cache), warm page cache, one run each:\n")
    for res in results:
        c = res["compile"]
        warm = res["runs"].get("warm") or next(iter(res["runs"].values()))
        base = _median(warm, lambda r: r["wall_s"])
        cs = c["summary"]
        print(f"- {res['workload']}: wall {c['wall_s']:.2f} s (+{c['wall_s'] - base:.2f} s over the cached median), "
              f"before the round {c['last_line_s'] - cs['elapsed_s']:.2f} s, after the summary "
              f"{c['wall_s'] - c['last_line_s']:.2f} s, phases survey "
              f"{cs['survey_s']:.2f} / index {cs['index_s']:.2f} / recopy {cs['recopy_s']:.2f} s, "
              f"peak RSS {c['peak_rss_mib']:.0f} MiB")
    print("\nThe daemon's case, one process cleaning two fresh copies (warm page cache):\n")
    for res in results:
        a, b, round_s = res["in_process"]
        mb = res["input_bytes"] / 1e6
        print(f"- {res['workload']}: first clean {a:.2f} s from process start ({mb / a:,.0f} MB/s), second clean "
              f"{b:.2f} s ({mb / b:,.0f} MB/s, {res['manifest']['records'] / b / 1e6:.2f} M records/s); its round "
              f"{round_s:.2f} s ({mb / round_s:,.0f} MB/s, {res['manifest']['records'] / round_s / 1e6:.2f} M "
              "records/s)")
    print("\nAgainst issue 6's targets (warm medians, whole process):\n")
    dedupe_mib = args.dedupe_mb
    for res in results:
        warm = res["runs"].get("warm") or next(iter(res["runs"].values()))
        wall = _median(warm, lambda r: r["wall_s"])
        mb = res["input_bytes"] / 1e6
        kind, target = TARGETS.get(res["workload"], ("MB/s", 0))
        value = mb / wall if kind == "MB/s" else res["manifest"]["records"] / wall
        ratio = _median(warm, lambda r: r["cp_s"]) / wall
        rss = max(r["peak_rss_mib"] for runs in res["runs"].values() for r in runs)
        rss_limit = dedupe_mib + 200e6 / 2**20
        shown = f"{value:,.0f} MB/s" if kind == "MB/s" else f"{value / 1e6:.2f} M records/s"
        wanted = f"{target:,} MB/s" if kind == "MB/s" else f"{target / 1e6:g} M records/s"
        print(f"- {res['workload']}: {shown} vs {wanted} ({value / target:.2f}x, "
              f"{'met' if value >= target else 'not met'}); clean/cp {ratio:.2f} vs 0.7 "
              f"({'met' if ratio >= 0.7 else 'not met'}); peak RSS {rss:.0f} MiB vs {rss_limit:.0f} MiB "
              f"({'met' if rss <= rss_limit else 'not met'})")
    print("\nVerification (untimed, after the warm-up clean):\n")
    for res in results:
        v = res["verify"]
        s = res["runs"][next(iter(res["runs"]))][0]["summary"]
        m = res["manifest"]
        print(f"- {res['workload']}: verify {'OK' if v['ok'] else 'FAILED ' + str(v['problems'])}; records after "
              f"{v['records_after']:,} (expected {v['records_expected']:,}: {m['distinct_keys_cleanable']:,} "
              f"distinct keys + {m['markers_cleanable']:,} markers in the cleanable section + "
              f"{m['active_segment_records']:,} active-segment records) -> "
              f"{'match' if v['counts_ok'] else 'MISMATCH'}; {v['segments_after']} segments, {v['batches_after']:,} "
              f"batches; round: {s['records_read']:,} records read -> {s['records_written']:,} written, "
              f"{s['batches_read']:,} batches read -> {s['batches_written']:,} written, {s['rounds']} round(s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default="warm,cold", help="page-cache modes to time: warm, cold or both")
    parser.add_argument("--dedupe-mb", type=float, default=256, help="log.cleaner.dedupe.buffer.size in MiB")
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data")
    parser.add_argument("--profile", action="store_true", help="profile the slowest phase of each workload")
    parser.add_argument("--profile-dir", type=Path, default=BENCH / "data" / "profiles",
                        help="where .prof and py-spy files go (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--profile-child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--now-ms", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dedupe-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile_child:
        profile_child(args.profile_child, args.dir, args.now_ms, args.dedupe_bytes, args.stats)
        return
    args.cache = [c.strip() for c in args.cache.split(",") if c.strip()]
    if any(c not in ("warm", "cold") for c in args.cache):
        parser.error("--cache takes warm, cold or warm,cold")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    print(f"# cleaning benchmark {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"python {platform.python_version()}, numpy {version('numpy')}, numba {version('numba')}, crc32c "
          f"{version('crc32c')}; {os.cpu_count()} CPUs ({platform.machine()}), "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; scale {args.scale}, dedupe buffer {args.dedupe_mb:g} MiB, "
          f"cache modes {','.join(args.cache)}, {args.repeats} runs each")
    code_before = _code_state()
    print(f"code: {code_before}")
    results = [bench_workload(w.strip(), args) for w in args.workloads.split(",") if w.strip()]
    report(results, args)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    code_after = _code_state()
    if code_after != code_before:
        print(f"WARNING: the product code changed during the run: {code_before} -> {code_after}")
    if not args.keep:
        try:
            args.data_dir.rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    main()
