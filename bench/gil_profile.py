"""Issue 22's measurement: how much of a cleaning round's wall time holds the GIL, per phase and per workload.

The aim (issue 22) is that the GIL is held for at most 10% of a round's wall time on every workload, so that
8 or 16 cleaner threads scale. This script measures today's figure and names the steps that hold it.

For each workload (`bench/workloads.py`; `--workloads W1,W2,W3,W4`, sizes by `--scales`, chosen so that one
round takes ~5-20 s on the standard 2-core machine):

1. the pristine partition is generated once (in a child process) into `--data-dir` (default
   `bench/data/gil-profile/`, gitignored) and reused by later invocations with the same workload and scale;
2. one untimed warm-up clean (numba's on-disk cache is loaded or, after a kernel edit, filled: compilation
   never counts) on a fresh copy;
3. per repeat (`--repeats`, default 3), three fresh `logcleaner clean DIR --json --once --now-ms T --set
   cleanup.policy=compact --set log.cleaner.dedupe.buffer.size=B` processes, each on a fresh `cp -r` + `sync`
   copy (warm page cache), one partition, one round:
   - `plain`: no profiler: the wall time and the phase times of the clean's JSON (py-spy's overhead is the
     difference to the next two);
   - `gil`: under `py-spy record --gil --idle --threads --format raw --rate R` (default 100 Hz: py-spy
     pauses the process for each sample; at 250 Hz that slowed a clean by 20-40% on this machine, at 100 Hz
     by ~0-10%; `--nonblocking` does not pause but drops ~3% of the ticks as errors, more of them where
     Python stacks change fast, i.e. under the GIL): a sample of every thread that
     holds the GIL at each tick, whatever its OS state (a thread blocked in a syscall while holding the GIL
     counts: it holds it). py-spy reads CPython's current thread state (`_PyRuntime.gilstate.tstate_current`
     on 3.11), which is NULL while every thread has released the GIL (numba `nogil` kernels, the codecs'
     `Py_BEGIN_ALLOW_THREADS`, blocking I/O), so only GIL holders are recorded;
   - `all`: the same without `--gil`: every thread at every tick. The main thread exists for the whole
     process, so its samples count the ticks (the wall time); the samples of the thread running the round
     say which phase each tick is in.
4. each sample (a stack) is put in one category by the functions on it, first match first:
   `outside the clean` (no `clean_partition` / round / read-ahead frame: start-up, imports, CLI, output,
   interpreter exit); inside it the phases `survey` (`survey_log`, its read-ahead generator
   `_checked_windows`), `index` (`build_offset_map`, `_hashed_windows`), `recopy` (`clean_group`,
   `_decided_windows`), `safety` (`check_group`, `must_survive`), `swap` (`PartitionLog.replace_segments`),
   `round: rest` (the rest of `clean_round`: range, map reset, checkpoint) and `clean_partition: rest`
   (opening the log, the offset map's allocation, retention). The read-ahead threads' frames name their
   phase (the generator each one runs), so their GIL samples are attributed like the round thread's; a
   read-ahead sample with no generator on its stack (between two items) is `read-ahead hand-off`. A sample
   with an import or numba's first call of a kernel (loading it from the cache) on it is also marked a
   one-off load;
5. a category's wall time is that of the `gil` run, so that a GIL-held share compares samples and time of the
   same process: survey, index and recopy from that clean's JSON (`survey_s`, `index_s`, `recopy_s`; the JSON
   has no `verify_s`); the rest of the round (`elapsed_s` minus those: safety, swap, range, checkpoint) and of the process
   (its wall time minus the round) split between their categories in the proportions of the `all` run's ticks
   (the round thread's; outside the clean, the main thread's). Its GIL-held share = GIL samples in it, all
   threads, / rate / its wall time. The whole process: all GIL samples / rate / its wall time. One-off loads
   inside the clean are shown apart (a daemon pays them once per process, not per round); "without loads"
   takes their GIL samples out and their wall time (the `all` run's ticks of the round thread and the
   read-ahead threads in a load) too;
6. per thread (main, the clean thread, the read-ahead threads of all phases, others): GIL seconds and share
   of the process's wall time; the read-ahead threads also as a share of their own lifetime;
7. the top GIL holders of the round (`--top`, default 15): GIL samples by the deepest frame in this
   project's code (`segments/`, `offsetmap/`, `cleaner/`; the library or C call below it is shown beside it),
   as a share of the round's wall time; and the same samples summed into steps (`STEPS`: CRC checks, lz4
   decoding, rebuilding compressed batches, index entries, transactions, files, per-window glue).

The machine is shared: before each run the script waits (up to `--quiet-wait-s`, default 60 s) until other
processes use fewer than `--quiet-cpus` CPUs (default 0.5, over 2 s), and each run reports the CPUs other
processes used during it (machine busy time from /proc/stat minus the run's own CPU time): a GIL holder that
the OS preempts keeps the GIL while it waits for a CPU. Figures are medians over the repeats (per cell). `--verify-repeats N` (default 1) adds N runs pairs with
`log.cleaner.verify=true` per workload, to measure the safety phase, which is off by default.
`--cpu-split N` (or `--cpu-split-only`) also measures what the machine's load does not inflate: in a child process
running this tree, N rounds per workload on one thread (read-ahead made synchronous, after an untimed round that
loads every kernel), each kernel call and each blocking I/O call timed with the thread's CPU clock; the round's
Python CPU (its CPU less the kernels' and the I/O calls', the timers' own cost taken out) is the CPU it spends
holding the GIL. (A py-spy sample taken while a thread waits in a long read or write is only taken when the call
returns, and a GIL holder preempted by other processes holds the GIL meanwhile: on a loaded machine the `gil`
runs overstate the GIL-held time of the Python around I/O.) The clean processes run this tree's code
(PYTHONPATH), so a worktree of another commit can be measured by running its own copy of the script.
`--codec-check` (or `--codec-check-only`) also checks, in this process, whether each codec call the product
makes releases the GIL while it runs (`codec_check`: the longest stall of a spinner thread during a call on a
128 MiB buffer, as a share of the call's time; 1.0 = held from start to end). The raw py-spy files and a JSON
of every run are kept under `--data-dir`.

Usage: python bench/gil_profile.py [--workloads W1,W2,W3,W4] [--scales W1=4,W2=2,W3=2,W4=2] [--repeats 3]
                                   [--rate 100] [--nonblocking] [--dedupe-mb 256] [--verify-repeats 1]
                                   [--quiet-cpus 0.5] [--quiet-wait-s 60] [--codec-check] [--cpu-split N]
                                   [--top 15] [--data-dir DIR]
       python bench/gil_profile.py --codec-check-only
       python bench/gil_profile.py --cpu-split-only [--cpu-split N] [--workloads ...]
       python bench/gil_profile.py --reanalyze bench/data/gil-profile/results-<time>.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from run import _code_state  # bench/run.py: the commit and any uncommitted product change

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LOGCLEANER = Path(sys.executable).parent / "logcleaner"
PY_SPY = Path(sys.executable).parent / "py-spy"
DEFAULT_SCALES = {"W1": 4.0, "W2": 2.0, "W3": 2.0, "W4": 2.0}
PROJECT_DIRS = ("segments/", "offsetmap/", "cleaner/")

# ---- categories --------------------------------------------------------------------------------------------------

OUTSIDE = "outside the clean: start-up, imports, CLI, output, exit"
PART_REST = "clean_partition: rest (open, map alloc, retention)"
ROUND_REST = "round: rest (range, map reset, checkpoint)"
HANDOFF = "read-ahead hand-off (no phase on its stack)"
PHASES = (  # (category, functions that mark it), first match from the stack's root wins
    ("survey", ("survey_log", "_checked_windows")),
    ("index", ("build_offset_map", "_hashed_windows")),
    ("recopy", ("clean_group", "_decided_windows")),
    ("safety", ("check_group", "must_survive")),
    ("swap", ("PartitionLog.replace_segments",)),
)
ROUND_CATEGORIES = (*(p for p, _ in PHASES), ROUND_REST, HANDOFF)
CATEGORIES = (OUTSIDE, PART_REST, *ROUND_CATEGORIES)
IN_CLEAN = ("clean_partition", "clean_round", "clean_planned.<locals>.work")
READ_AHEAD = ("_threaded.<locals>.produce", "_in_order.<locals>.produce")  # the producers of segments/files/readahead.py
LOAD_FRAMES = ("_find_and_load", "_DispatcherBase._compile_for_args")
COMPILE_FRAMES = ("compile_extra", "_compile_core", "compile_ir")  # numba compiling (cache miss): reported
# The steps the GIL-holding samples of a round are summed into (the "by step" table): the first rule that matches
# (function name, file, phase) of the sample's deepest frame in this project's code.
STEPS = (
    ("CRC-32C check of every batch, per batch (survey)",
     lambda name, file, cat: cat == "survey" and (name.startswith("_first_bad_crc") or name in ("crc32c", "batch_crc"))),
    ("lz4 decode, per batch (index, recopy, safety)",
     lambda name, file, cat: name in ("_lz4_decompress", "decompress", "_decompress_all", "_lz4_frame_decompress_lenient",
                                      "_xerial_decompress", "_zstd_decompress")),
    ("rebuild of a compressed batch: copy, compress, header (recopy)",
     lambda name, file, cat: name in ("_rebuild_v2", "_rebuild_legacy", "compress", "encode_batch_from_region",
                                      "_xerial_compress")),
    ("CRC-32C of each written batch (recopy)", lambda name, file, cat: name in ("crc32c", "batch_crc")),
    ("index entries per written batch (append_batches, .index/.timeindex)",
     lambda name, file, cat: name == "LogSegment.append_batches" or file.startswith("segments/files/index.py")),
    ("transactions: producer states, control batches decoded in Python, markers",
     lambda name, file, cat: name in ("_track_producers", "_markers_discardable", "clean_group.<locals>.<genexpr>",
                                      "_txn_entries", "_producer_last_batches", "_producer_rows",
                                      "_decode_control_type", "TransactionTable.rows")
     or name.startswith("LogSurvey.") or file.startswith(("segments/codec/records.py", "segments/codec/varint.py",
                                                          "segments/codec/control.py"))),
    ("_window_output: its loop over batches the kernel hands back (recopy)", lambda name, file, cat: name == "_window_output"),
    ("files: swap, rename, remove, fsync", lambda name, file, cat: file.startswith("segments/files/fileio.py")
     or name.startswith("PartitionLog.") or name in ("segment_paths", "offset_file_name", "LogSegment.change_suffix",
                                                     "LogSegment.delete_files", "LogSegment.finalise")),
    ("the survey's own per-window checks and bookkeeping (cleaner/survey.py: offsets, legacy wrappers, its loop)",
     lambda name, file, cat: file.startswith("cleaner/survey.py")),
    ("segment reads and the I/O throttle (read syscalls, charge_io, progress)",
     lambda name, file, cat: name in ("LogSegment._read_into", "LogSegment.pread", "clean_planned.<locals>.counted",
                                      "_NoBar.update") or file.startswith("cleaner/throttle.py")),
    ("per-window glue: scan() around its kernels, _decide, _horizons, hashing and map calls, read-ahead hand-off",
     lambda name, file, cat: True),
)
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>\d+|0x[0-9a-f]+)\)(?::\s*(?P<name>.*))?$")


@dataclass
class Sample:
    tid: int
    frames: list[tuple[str, str, str]]  # (function, file, line), root first
    count: int
    role: str = ""
    category: str = ""
    load: bool = False  # an import or numba's first call of a kernel (loading it from the cache) is on the stack


def _frame(text: str) -> tuple[str, str, str]:
    m = _FRAME.match(text)
    return (m["name"], m["file"], m["line"] or "") if m else (text, "", "")


def _has(names: list[str], wanted: tuple[str, ...]) -> bool:
    return any(n == w or n.endswith("." + w) for n in names for w in wanted)


def parse_raw(path: Path) -> list[Sample]:
    """py-spy's raw (collapsed) output with --threads: `thread (TID)[: name];frame;...;frame COUNT`."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        m = _THREAD.match(parts[0])
        if m is None:
            continue
        tid = int(m["tid"], 0)
        out.append(Sample(tid, [_frame(f) for f in parts[1:]], int(count)))
    return out


def classify(samples: list[Sample]) -> None:
    """Set each sample's role (main / clean / read-ahead / other thread) and category."""
    main_tid = min((s.tid for s in samples), default=0)  # the main thread's OS id is the pid, the lowest
    for s in samples:
        names = [f[0] for f in s.frames]
        in_clean = _has(names, IN_CLEAN)
        if _has(names, READ_AHEAD):
            s.role = "read-ahead"
        elif in_clean:
            s.role = "main (runs the clean)" if s.tid == main_tid else "clean thread"
        else:
            s.role = "main" if s.tid == main_tid else "other"
        s.load = _has(names, LOAD_FRAMES)
        if not in_clean and s.role != "read-ahead":
            s.category = OUTSIDE
            continue
        s.category = ""
        for name in names:
            for phase, markers in PHASES:
                if any(name == m or name.endswith("." + m) for m in markers):
                    s.category = phase
                    break
            if s.category:
                break
        if not s.category:
            if s.role == "read-ahead":
                s.category = HANDOFF
            else:
                s.category = ROUND_REST if "clean_round" in names else PART_REST


@dataclass
class RunProfile:
    """The figures of one (gil, all) pair of runs, in seconds (samples / rate)."""

    rate: float
    ticks: int = 0  # main thread samples in the `all` run
    wall_s: dict = field(default_factory=dict)  # category -> s in the `gil` run (see `profile_pair`)
    tick_wall_s: dict = field(default_factory=dict)  # category -> s of ticks in the `all` run
    load_wall_s: dict = field(default_factory=dict)  # category -> s of one-off loads (round + read-ahead threads)
    gil_s: dict = field(default_factory=dict)  # category -> s (all threads)
    load_gil_s: dict = field(default_factory=dict)  # category -> s of it during one-off loads
    gil_read_ahead_s: dict = field(default_factory=dict)  # category -> s (read-ahead threads only)
    thread_gil_s: dict = field(default_factory=dict)  # role -> s
    thread_life_s: dict = field(default_factory=dict)  # role -> s (samples of that role in the `all` run)
    holders: Counter = field(default_factory=Counter)  # deepest project frame -> GIL samples in the round, no loads
    holder_leaves: dict = field(default_factory=lambda: defaultdict(Counter))
    lines: Counter = field(default_factory=Counter)  # deepest project frame with its line -> same
    holder_phases: dict = field(default_factory=lambda: defaultdict(Counter))  # deepest project frame -> phases
    steps: Counter = field(default_factory=Counter)  # STEPS label -> GIL samples in the round, no loads
    compile_samples: int = 0
    process_wall_s: float = 0.0  # the `gil` run's

    def steady(self, cats) -> tuple[float, float]:
        """(wall s, GIL s) of `cats` without the one-off loads (their wall time is estimated: the round thread's
        ticks in a load plus the read-ahead threads' ticks in one, as they load one after the other)."""
        wall = sum(max(self.wall_s.get(c, 0.0) - self.load_wall_s.get(c, 0.0), 0.0) for c in cats)
        gil = sum(self.gil_s.get(c, 0.0) - self.load_gil_s.get(c, 0.0) for c in cats)
        return wall, gil


def _project_frame(frames: list[tuple[str, str, str]]) -> int:
    for i in range(len(frames) - 1, -1, -1):
        if frames[i][1].startswith(PROJECT_DIRS):
            return i
    return len(frames) - 1


def profile_pair(gil_raw: Path, all_raw: Path, rate: float, gil_json: dict, gil_wall_s: float) -> RunProfile:
    """The categories' wall times are those of the `gil` run, so that GIL-held shares compare samples and time of
    the same process: survey, index and recopy from its JSON (`survey_s`, `index_s`, `recopy_s`; safety too if
    the JSON has `verify_s`), the rest of the round (`elapsed_s` minus those) and the rest of the process (its
    wall time minus the round) split between their categories in the proportions of the `all` run's ticks."""
    gil, every = parse_raw(gil_raw), parse_raw(all_raw)
    classify(gil)
    classify(every)
    p = RunProfile(rate=rate)
    main_tid = min((s.tid for s in every), default=0)
    p.ticks = sum(s.count for s in every if s.tid == main_tid)
    clean_ticks: Counter = Counter()
    load_ticks: Counter = Counter()
    for s in every:
        p.thread_life_s[s.role] = p.thread_life_s.get(s.role, 0.0) + s.count / rate
        if any(f[0] in COMPILE_FRAMES or f[0].endswith(COMPILE_FRAMES) for f in s.frames):
            p.compile_samples += s.count
        if s.role in ("clean thread", "main (runs the clean)"):
            clean_ticks[s.category] += s.count
            if s.load:
                load_ticks[s.category] += s.count
        elif s.role == "read-ahead":
            if s.load:
                load_ticks[s.category] += s.count
    in_clean = sum(clean_ticks.values())
    for cat in CATEGORIES:
        p.tick_wall_s[cat] = clean_ticks.get(cat, 0) / rate
        p.load_wall_s[cat] = min(load_ticks.get(cat, 0), clean_ticks.get(cat, 0)) / rate
    p.tick_wall_s[OUTSIDE] = max(p.ticks - in_clean, 0) / rate
    known = {"survey": gil_json["survey_s"], "index": gil_json["index_s"], "recopy": gil_json["recopy_s"]}
    if "verify_s" in gil_json:
        known["safety"] = gil_json["verify_s"]
    round_s = gil_json["elapsed_s"]
    p.wall_s.update(known)

    def split(total: float, cats: tuple[str, ...]) -> None:
        ticks = sum(p.tick_wall_s[c] for c in cats)
        for c in cats:
            p.wall_s[c] = total * p.tick_wall_s[c] / ticks if ticks else (total if c == cats[0] else 0.0)

    split(max(round_s - sum(known.values()), 0.0), (ROUND_REST, "swap", HANDOFF, *(() if "safety" in known else ("safety",))))
    split(max(gil_wall_s - round_s, 0.0), (OUTSIDE, PART_REST))
    p.process_wall_s = gil_wall_s
    for s in gil:
        p.gil_s[s.category] = p.gil_s.get(s.category, 0.0) + s.count / rate
        if s.load:
            p.load_gil_s[s.category] = p.load_gil_s.get(s.category, 0.0) + s.count / rate
        if s.role == "read-ahead":
            p.gil_read_ahead_s[s.category] = p.gil_read_ahead_s.get(s.category, 0.0) + s.count / rate
        role = "main" if s.role == "main (runs the clean)" else s.role
        p.thread_gil_s[role] = p.thread_gil_s.get(role, 0.0) + s.count / rate
        if s.category in ROUND_CATEGORIES and not s.load:
            i = _project_frame(s.frames)
            name, file, line = s.frames[i]
            key = f"{name} ({file})"
            p.holders[key] += s.count
            p.holder_phases[key][s.category] += s.count
            p.steps[next(label for label, rule in STEPS if rule(name, file, s.category))] += s.count
            p.lines[f"{file}:{line} {name}"] += s.count
            if i < len(s.frames) - 1:
                leaf = s.frames[-1]
                p.holder_leaves[key][f"{leaf[0]} ({leaf[1]})"] += s.count
            else:
                p.holder_leaves[key]["(itself)"] += s.count
    return p


# ---- running -----------------------------------------------------------------------------------------------------


def _pristine(name: str, scale: float, data_dir: Path) -> tuple[Path, dict]:
    """The generated partition of `name` at `scale` (generated once, then reused) and its manifest."""
    home = data_dir / f"{name}-scale{scale:g}"
    manifest_path = home / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        part = home / "src" / Path(manifest["partition_dir"]).name
        if part.is_dir():
            return part, manifest
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    res = subprocess.run([sys.executable, str(BENCH / "workloads.py"), name, str(home / "src"), "--scale", str(scale)],
                         capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise RuntimeError(f"generating {name} failed:\n{res.stderr}")
    manifest = json.loads(res.stdout)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return home / "src" / Path(manifest["partition_dir"]).name, manifest


def _fresh(src: Path, data_dir: Path) -> Path:
    run = data_dir / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(src), str(run / src.name)], check=True)
    subprocess.run(["sync"], check=True)
    return run / src.name


def _clean_cmd(part: Path, now_ms: int, dedupe: int, verify: bool) -> list[str]:
    cmd = [str(LOGCLEANER), "clean", str(part), "--json", "--once", "--now-ms", str(now_ms),
           "--set", "cleanup.policy=compact", "--set", f"log.cleaner.dedupe.buffer.size={dedupe}"]
    if verify:
        cmd += ["--set", "log.cleaner.verify=true"]
    return cmd


def _summary(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return json.loads(stdout)


def _machine_busy_s() -> float:
    """CPU-seconds the whole machine has been busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _wait_quiet(max_cpus: float, max_wait_s: float) -> float:
    """Wait (up to `max_wait_s`) until the other processes use less than `max_cpus` CPUs over 2 s (the machine
    is shared: a GIL holder that the OS preempts holds the GIL while it waits for a CPU). Returns that use."""
    deadline = time.monotonic() + max_wait_s
    while True:
        b = _machine_busy_s()
        time.sleep(2.0)
        busy = (_machine_busy_s() - b) / 2.0
        if busy < max_cpus or time.monotonic() > deadline:
            return busy


def _children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _run(cmd: list[str]) -> tuple[float, dict, str, float]:
    """Run `cmd`; (wall s, the clean's JSON, stderr, CPUs used by other processes meanwhile)."""
    busy, mine = _machine_busy_s(), _children_cpu_s()
    t = time.perf_counter()
    with open(os.devnull, "rb") as stdin:
        # PYTHONPATH: the clean runs this tree's code (a worktree's too, not the venv's editable install)
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        out, err = proc.communicate()
    wall = time.perf_counter() - t
    # the child's CPU time (py-spy's includes the clean's, which it waits for) is not the other processes'
    others = max((_machine_busy_s() - busy) - (_children_cpu_s() - mine), 0.0)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    # py-spy passes the child's stdout through; its own messages go to stderr
    return wall, _summary(out), err, others / wall


def _spy(mode: str, rate: float, out: Path, cmd: list[str], nonblocking: bool) -> list[str]:
    flags = (["--gil"] if mode == "gil" else []) + (["--nonblocking"] if nonblocking else [])
    return [str(PY_SPY), "record", "--idle", "--threads", "--format", "raw", "--rate", str(int(rate)),
            "--output", str(out), *flags, "--", *cmd]


def bench_workload(name: str, scale: float, args) -> dict:
    dedupe = int(args.dedupe_mb * 2**20)
    src, manifest = _pristine(name, scale, args.data_dir)
    now_ms = manifest["now_ms"]
    raw_dir = args.data_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    log_mb = sum(p.stat().st_size for p in src.glob("*.log")) / 1e6
    print(f"\n## {name} (scale {scale:g}): {manifest['records']:,} records, {log_mb:,.0f} MB, "
          f"{manifest['segments']} segments, {manifest['batches']:,} batches", flush=True)
    part = _fresh(src, args.data_dir)
    wall, summary, _, _ = _run(_clean_cmd(part, now_ms, dedupe, False))  # warm-up: numba cache, page cache
    print(f"  warm-up: {wall:.2f} s (round {summary.get('elapsed_s', 0):.2f} s)", flush=True)
    out: dict = {"workload": name, "scale": scale, "manifest": manifest, "log_mb": log_mb, "runs": []}
    plans = [(False, r) for r in range(args.repeats)] + [(True, r) for r in range(args.verify_repeats)]
    for verify, r in plans:
        run: dict = {"verify": verify, "repeat": r, "load_before": os.getloadavg()[0]}
        part = _fresh(src, args.data_dir)
        run["quiet_before"] = _wait_quiet(args.quiet_cpus, args.quiet_wait_s)
        run["plain_wall_s"], run["plain"], _, run["plain_others"] = _run(_clean_cmd(part, now_ms, dedupe, verify))
        tag = f"{name}-{'verify-' if verify else ''}{r}"
        for mode in ("gil", "all"):
            part = _fresh(src, args.data_dir)
            raw = raw_dir / f"{tag}-{mode}.txt"
            _wait_quiet(args.quiet_cpus, args.quiet_wait_s)
            run[f"{mode}_wall_s"], run[mode], err, run[f"{mode}_others"] = _run(_spy(mode, args.rate, raw, _clean_cmd(part, now_ms, dedupe, verify),
                                                            args.nonblocking))
            m = re.search(r"Samples: (\d+) Errors: (\d+)", err)
            run[f"{mode}_spy"] = {"samples": int(m[1]), "errors": int(m[2])} if m else err[-300:]
            if "behind in sampling" in err:
                run[f"{mode}_spy_lag"] = True
        p = profile_pair(raw_dir / f"{tag}-gil.txt", raw_dir / f"{tag}-all.txt", args.rate, run["gil"],
                         run["gil_wall_s"])
        run["profile"] = p
        if any(run[m].get("rounds", 1) != 1 for m in ("plain", "gil", "all")):
            print(f"  warning: not one round per clean: {[run[m].get('rounds') for m in ('plain', 'gil', 'all')]}")
        gil_total = sum(p.gil_s.values())
        round_wall = sum(p.wall_s[c] for c in ROUND_CATEGORIES)
        round_gil = sum(p.gil_s.get(c, 0.0) for c in ROUND_CATEGORIES)
        steady_wall, steady_gil = p.steady(ROUND_CATEGORIES)
        print(f"  {'verify ' if verify else ''}repeat {r + 1}: plain {run['plain_wall_s']:.2f} s (round "
              f"{run['plain']['elapsed_s']:.2f} s); under py-spy gil {run['gil_wall_s']:.2f} s / all "
              f"{run['all_wall_s']:.2f} s ({p.ticks / args.rate:.2f} s of ticks); GIL held "
              f"{_pct(gil_total, p.process_wall_s):.1f}% of the process, {_pct(round_gil, round_wall):.1f}% of "
              f"the round, {_pct(steady_gil, steady_wall):.1f}% without one-off loads; other processes used "
              f"{run['plain_others']:.2f} / {run['gil_others']:.2f} / {run['all_others']:.2f} CPUs"
              + (f"; {p.compile_samples} samples compiling!" if p.compile_samples else ""), flush=True)
        out["runs"].append(run)
    return out


# ---- reporting ---------------------------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _pct(a: float, b: float) -> float:
    return 100.0 * a / b if b > 0 else float("nan")


def _row(profiles: list[RunProfile], cats: tuple[str, ...]) -> dict:
    walls = [sum(p.wall_s.get(c, 0.0) for c in cats) for p in profiles]
    gils = [sum(p.gil_s.get(c, 0.0) for c in cats) for p in profiles]
    steady = [p.steady(cats) for p in profiles]
    return {
        "wall_s": _med(walls),
        "process_pct": _med([_pct(w, p.process_wall_s) for w, p in zip(walls, profiles)]),
        "gil_s": _med(gils),
        "gil_pct": _med([_pct(g, w) for g, w in zip(gils, walls) if w > 0]) if max(walls) > 0 else float("nan"),
        "read_ahead_gil_s": _med([sum(p.gil_read_ahead_s.get(c, 0.0) for c in cats) for p in profiles]),
        "load_gil_s": _med([sum(p.load_gil_s.get(c, 0.0) for c in cats) for p in profiles]),
        "load_wall_s": _med([sum(p.load_wall_s.get(c, 0.0) for c in cats) for p in profiles]),
        # without the one-off loads: only inside the clean, where they are a start-up cost in disguise
        "steady_gil_pct": (_med([_pct(g, w) for w, g in steady if w > 0])
                           if max(w for w, _ in steady) > 0 and all(c in ROUND_CATEGORIES or c == PART_REST for c in cats)
                           else float("nan")),
    }


def _fmt_pct(x: float) -> str:
    return "-" if x != x else f"{x:.0f}%"  # NaN: no wall time of its own


def report(results: list[dict], args) -> dict:
    table: dict = {}
    print("\n### GIL-held share per phase (median of the repeats)\n")
    print("wall = the phase's time in the `gil` run (survey, index, recopy: the clean's JSON; the rest "
          "of the round and of the process split by the `all` run's ticks); GIL-held = samples of any thread "
          "holding the GIL in the phase (the round thread's stack, or a read-ahead thread's generator, names it); "
          "loads = one-off imports and numba cache loads (the first call of each kernel in the process), which a "
          "daemon pays once, not per round; without loads = (GIL-held - loads) / (wall - their estimated wall)."
          "\n")
    print("| workload | phase | wall s | % of process | GIL-held s | GIL-held % | of which read-ahead threads s | "
          "of which loads s | GIL-held % without loads |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for res in results:
        profiles: list[RunProfile] = [r["profile"] for r in res["runs"] if not r["verify"]]
        rows = {}
        for cat in CATEGORIES:
            if max([p.wall_s.get(cat, 0.0) + p.gil_s.get(cat, 0.0) for p in profiles], default=0) < 0.5 / args.rate:
                continue
            rows[cat] = _row(profiles, (cat,))
        rows["ROUND (clean_round)"] = _row(profiles, ROUND_CATEGORIES)
        rows["ROUND (clean_round)"]["per_run_gil_pct"] = [
            _pct(sum(p.gil_s.get(c, 0.0) for c in ROUND_CATEGORIES), sum(p.wall_s.get(c, 0.0) for c in ROUND_CATEGORIES))
            for p in profiles]
        rows["WHOLE PROCESS"] = _row(profiles, CATEGORIES)
        for label, row in rows.items():
            b = "**" if label.isupper() or label.startswith("ROUND") else ""
            print(f"| {res['workload']} | {b}{label}{b} | {row['wall_s']:.2f} | {row['process_pct']:.0f}% | "
                  f"{row['gil_s']:.2f} | {b}{_fmt_pct(row['gil_pct'])}{b} | {row['read_ahead_gil_s']:.2f} | "
                  f"{row['load_gil_s']:.2f} | {b}{_fmt_pct(row['steady_gil_pct'])}{b} |")
        table[res["workload"]] = {"rows": rows}
    print("\nRound GIL-held % per run: " + "; ".join(
        f"{w}: " + ", ".join(f"{x:.0f}%" for x in t["rows"]["ROUND (clean_round)"]["per_run_gil_pct"])
        for w, t in table.items()))
    print("\n### Per thread (median): GIL-held seconds and share of the process's wall time; the read-ahead threads "
          "also as a share of their own lifetime\n")
    print("| workload | process wall s | plain process s | plain round s | main | clean thread | read-ahead "
          "threads | other |")
    print("|---|---:|---:|---:|---|---|---|---|")
    for res in results:
        runs = [r for r in res["runs"] if not r["verify"]]
        profiles = [r["profile"] for r in runs]
        wall = _med([p.process_wall_s for p in profiles])

        def cell(role: str) -> str:
            g = _med([p.thread_gil_s.get(role, 0.0) for p in profiles])
            return f"{g:.2f} s ({_med([_pct(p.thread_gil_s.get(role, 0.0), p.process_wall_s) for p in profiles]):.0f}%)"

        ra = _med([p.thread_gil_s.get("read-ahead", 0.0) for p in profiles])
        # their lifetime in the `gil` run: their share of the `all` run's ticks times the `gil` run's wall time
        life = _med([p.thread_life_s.get("read-ahead", 0.0) / max(p.ticks / p.rate, 1e-9) * p.process_wall_s
                     for p in profiles])
        print(f"| {res['workload']} | {wall:.2f} | {_med([r['plain_wall_s'] for r in runs]):.2f} | "
              f"{_med([r['plain']['elapsed_s'] for r in runs]):.2f} | {cell('main')} | {cell('clean thread')} | "
              f"{ra:.2f} s ({_pct(ra, wall):.0f}%; {_pct(ra, life):.0f}% of their {life:.2f} s) | {cell('other')} |")
        table[res["workload"]]["threads"] = {
            role: _med([p.thread_gil_s.get(role, 0.0) for p in profiles])
            for role in ("main", "clean thread", "read-ahead", "other")
        }
    print("\n### Phase times from the clean's JSON (median): plain run vs the two runs under py-spy (its overhead)\n")
    print("| workload | run | survey s | index s | recopy s | round s | process s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for res in results:
        runs = [r for r in res["runs"] if not r["verify"]]
        for mode in ("plain", "gil", "all"):
            print(f"| {res['workload']} | {mode} | " + " | ".join(
                f"{_med([r[mode][k] for r in runs]):.2f}" for k in ("survey_s", "index_s", "recopy_s", "elapsed_s"))
                + f" | {_med([r[f'{mode}_wall_s'] for r in runs]):.2f} |")
    if any(r["verify"] for res in results for r in res["runs"]):
        print("\n### With log.cleaner.verify=true: the safety phase (median of the verify runs)\n")
        print("| workload | safety wall s | safety GIL-held s | GIL-held % of safety | round wall s | round GIL-held % "
              "without loads |")
        print("|---|---:|---:|---:|---:|---:|")
        for res in results:
            profiles = [r["profile"] for r in res["runs"] if r["verify"]]
            if not profiles:
                continue
            safety, whole = _row(profiles, ("safety",)), _row(profiles, ROUND_CATEGORIES)
            print(f"| {res['workload']} | {safety['wall_s']:.2f} | {safety['gil_s']:.2f} | "
                  f"{_fmt_pct(safety['gil_pct'])} | {whole['wall_s']:.2f} | {_fmt_pct(whole['steady_gil_pct'])} |")
            table[res["workload"]]["verify"] = {"safety": safety, "round": whole}
    names = [res["workload"] for res in results]
    print("\n### GIL-held time of the round by step (one-off loads excluded; mean of the runs; share of the round's "
          "wall time)\n")
    print("| step | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    shares = {}
    for res in results:
        profiles = [r["profile"] for r in res["runs"] if not r["verify"]]
        wall = sum(sum(p.wall_s.get(c, 0.0) for c in ROUND_CATEGORIES) for p in profiles)
        steps: Counter = Counter()
        for p in profiles:
            steps.update(p.steps)
        shares[res["workload"]] = {label: (steps[label] / args.rate / len(profiles), _pct(steps[label] / args.rate, wall))
                                   for label, _ in STEPS}
        shares[res["workload"]]["all steps"] = (sum(steps.values()) / args.rate / len(profiles),
                                                _pct(sum(steps.values()) / args.rate, wall))
        table[res["workload"]]["steps"] = shares[res["workload"]]
    for label in [lab for lab, _ in STEPS] + ["all steps"]:
        print(f"| {label} | " + " | ".join(f"{shares[w][label][0]:.2f} s ({shares[w][label][1]:.1f}%)" for w in names)
              + " |")
    for res in results:
        profiles = [r["profile"] for r in res["runs"] if not r["verify"]]
        holders: Counter = Counter()
        lines: Counter = Counter()
        leaves: dict = defaultdict(Counter)
        phases: dict = defaultdict(Counter)
        for p in profiles:
            holders.update(p.holders)
            lines.update(p.lines)
            for k, c in p.holder_leaves.items():
                leaves[k].update(c)
            for k, c in p.holder_phases.items():
                phases[k].update(c)
        n = len(profiles)
        round_samples = sum(sum(p.wall_s.get(c, 0.0) for c in ROUND_CATEGORIES) * p.rate for p in profiles)
        print(f"\n### {res['workload']}: top {args.top} GIL holders in the round, one-off loads excluded (deepest "
              f"frame in this project's code; mean of {n} runs; % of the round's wall time, "
              f"{round_samples / n / args.rate:.2f} s)\n")
        print("| # | function (file) | phase | GIL-held s per round | % of round wall | what runs below it (share) |")
        print("|---:|---|---|---:|---:|---|")
        top = []
        for i, (key, c) in enumerate(holders.most_common(args.top), 1):
            below = leaves[key].most_common(2)
            below_text = "; ".join(f"{k} ({100 * v / c:.0f}%)" for k, v in below)
            secs = c / args.rate / n
            phase = "/".join(k.split(" ")[0] for k, _ in phases[key].most_common(2))
            print(f"| {i} | `{key}` | {phase} | {secs:.3f} | {_pct(c, round_samples):.1f}% | {below_text} |")
            top.append({"function": key, "phase": phase, "gil_s": secs, "round_pct": _pct(c, round_samples),
                        "below": below_text})
        print("\nTop lines: " + "; ".join(f"`{k}` {_pct(c, round_samples):.1f}%" for k, c in lines.most_common(8)))
        table[res["workload"]]["top"] = top
        table[res["workload"]]["top_lines"] = [(k, _pct(c, round_samples)) for k, c in lines.most_common(25)]
    return table


# ---- the codecs and the GIL ----------------------------------------------------------------------------------------


def codec_check(size: int = 128 * 2**20, small: int = 16 * 1024) -> list[dict]:
    """Does each codec call the product makes release the GIL while it runs? A spinner thread notes every pause
    of more than 1 ms between two of its iterations; a call that holds the GIL from start to end shows as one
    pause covering the whole call (held share 1.0), a call that releases it as none (held share ~0, if a core is
    free for the spinner). `size`-byte buffers (crc32c: 8x), so that a call lasts far longer than the switch
    interval (0.5 ms here). Also the time of one call on `small` bytes (a typical batch), no spinner running."""
    import zlib

    import cramjam
    import crc32c
    import lz4.block
    import lz4.frame
    import numpy as np
    import zstandard

    rng = np.random.default_rng(1)
    words = rng.integers(0, 256, size // 4, dtype=np.uint8).tobytes()
    data = (words * 4)[:size]  # compressible 4x, so decompression has work to do
    big = data * 8
    def make_calls(data: bytes, big: bytes, n: int) -> list:
        lz4_frame = lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                                       content_checksum=False, store_size=False)
        lz4_block = lz4.block.compress(data, store_size=False)
        zstd_frame = zstandard.ZstdCompressor(level=3).compress(data)
        snappy_raw = bytes(cramjam.snappy.compress_raw(data))
        gz = zlib.compress(data, 1)
        return [
            ("crc32c.crc32c (default mode -1)", lambda: crc32c.crc32c(big)),
            ("crc32c.crc32c(gil_release_mode=0)", lambda: crc32c.crc32c(big, gil_release_mode=0)),
            ("crc32c.crc32c(gil_release_mode=1)", lambda: crc32c.crc32c(big, gil_release_mode=1)),
            ("lz4.frame.compress", lambda: lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                                                              block_linked=False, store_size=False)),
            ("lz4.frame.LZ4FrameDecompressor().decompress",
             lambda: lz4.frame.LZ4FrameDecompressor().decompress(lz4_frame)),
            ("lz4.block.compress", lambda: lz4.block.compress(data, store_size=False)),
            ("lz4.block.decompress", lambda: lz4.block.decompress(lz4_block, uncompressed_size=n)),
            ("zstandard.ZstdCompressor(level=3).compress", lambda: zstandard.ZstdCompressor(level=3).compress(data)),
            ("zstandard.ZstdDecompressor().decompressobj().decompress",
             lambda: zstandard.ZstdDecompressor().decompressobj().decompress(zstd_frame)),
            ("cramjam.snappy.compress_raw", lambda: cramjam.snappy.compress_raw(data)),
            ("cramjam.snappy.decompress_raw", lambda: cramjam.snappy.decompress_raw(snappy_raw)),
            ("zlib.compress (gzip)", lambda: zlib.compress(data, 1)),
            ("zlib.decompress (gzip)", lambda: zlib.decompress(gz)),
            ("bytes(memoryview(data)) (a copy under the GIL: the control)", lambda: bytes(memoryview(big))),
        ]

    small_data = data[:small]
    per_call_us = {}
    for label, call in make_calls(small_data, small_data, small):
        reps = 2000
        t = time.perf_counter()
        for _ in range(reps):
            call()
        per_call_us[label] = 1e6 * (time.perf_counter() - t) / reps
    calls = make_calls(data, big, size)
    stop = threading.Event()
    pauses: list[tuple[float, float]] = []

    def spin() -> None:
        clock = time.perf_counter
        last = clock()
        while not stop.is_set():
            now = clock()
            if now - last > 0.001:
                pauses.append((last, now))
            last = now

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    rows = []
    for label, call in calls:
        held, seconds = [], []
        for _ in range(3):
            time.sleep(0.05)
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            time.sleep(0.01)  # let the spinner note the pause that ends now
            longest = max((min(b, t1) - max(a, t0) for a, b in list(pauses) if b > t0 and a < t1), default=0.0)
            held.append(max(longest, 0.0) / (t1 - t0))
            seconds.append(t1 - t0)
        rows.append({"call": label, "ms": 1000 * statistics.median(seconds), "held_share": statistics.median(held),
                     "small_call_us": per_call_us[label]})
    stop.set()
    spinner.join()
    sys.setswitchinterval(switch)
    print(f"\n### Codec calls and the GIL ({size >> 20} MiB per call, crc32c {8 * size >> 20} MiB; held share = the "
          "longest pause of a spinner thread during the call / the call's time: 1.0 = the GIL was held from start to "
          f"end; median of 3; and the time of one call on {small >> 10} KiB, single-threaded)\n")
    print(f"| call | ms | held share | releases the GIL while it runs | µs per {small >> 10} KiB call |")
    print("|---|---:|---:|---|---:|")
    for r in rows:
        verdict = "NO" if r["held_share"] > 0.8 else ("yes" if r["held_share"] < 0.2 else "partly")
        print(f"| {r['call']} | {r['ms']:.1f} | {r['held_share']:.2f} | {verdict} | {r['small_call_us']:.1f} |")
    return rows


# ---- the round's Python CPU, whatever the machine's load (--cpu-split) --------------------------------------------

# Every kernel of these modules (numba dispatcher or `compiled.Kernel`) is timed; their kernels never call back into Python.
_KERNEL_MODULES = ("segments.codec._scan_kernels", "segments.codec._crc_kernels", "segments.codec._lz4_kernels",
                   "segments.codec._header_kernels", "segments.codec._control_kernels", "cleaner._kernels",
                   "offsetmap._kernels", "segments.files._index_kernels")
# The blocking calls that release the GIL while the kernel works (reads, writes, file operations).
_IO_CALLS = ("preadv", "pread", "pwrite", "pwritev", "fsync", "fdatasync", "write", "read", "rename", "replace",
             "remove", "unlink", "posix_fadvise", "open", "close", "stat", "fstat", "scandir", "listdir")


def cpu_split_child(src: Path, now_ms: int, dedupe: int, repeats: int) -> dict:
    """(A child process whose PYTHONPATH is the tree measured.) The round's CPU split on one thread: one untimed
    warm-up round (every kernel loaded), then `repeats` rounds of fresh copies of `src` with `read_ahead` made
    synchronous, each kernel call and each blocking I/O call timed with the thread's CPU clock. Python CPU = the
    thread's CPU - kernels - I/O (the timers' own cost, calibrated, taken out): the CPU the round spends holding
    the GIL, which the machine's load does not inflate (a preempted GIL holder does, in the py-spy runs)."""
    import importlib
    import tempfile

    from numba.core.dispatcher import Dispatcher

    from cleaner import group_runs, indexing, recopy, survey
    from cleaner import round as round_mod
    from cleaner.settings import Settings
    from offsetmap import OffsetMap, per_thread_memory_bytes
    from segments.codec.compiled import Kernel
    from segments.partition.log import PartitionLog

    clock = time.thread_time
    acc = {"kernel": 0.0, "io": 0.0, "calls": 0}

    def timed(fn, key):
        def wrapper(*args, **kwargs):
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[key] += clock() - t
                acc["calls"] += 1
        return wrapper

    offset_map = OffsetMap(per_thread_memory_bytes(dedupe, 1))
    topic = Settings.from_mappings({"cleanup.policy": "compact"}).topic(src.name.rsplit("-", 1)[0])
    work = Path(tempfile.mkdtemp(prefix="gil-cpu-split-"))
    phases: dict = {}

    def one_round() -> tuple[float, float]:
        """(wall s, thread CPU s) of a round of a fresh copy of `src` (the copy not counted)."""
        run = work / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(src, run / src.name)
        os.sync()
        phases.clear()
        acc.update(kernel=0.0, io=0.0, calls=0)
        started, cpu = time.perf_counter(), clock()
        with PartitionLog.open(run / src.name, mode="cleaner") as log:
            round_mod.clean_round(log, topic, offset_map, now_ms=now_ms, seed=7)
        return time.perf_counter() - started, clock() - cpu

    try:
        one_round()

        from segments.files import readahead

        def synchronous(source, *, name="read-ahead", total_bytes=None):
            return readahead.read_ahead(source, total_bytes=0)  # a phase under the limit: on this thread

        def synchronous_in_order(sources, rings, *, name="read-ahead", total_bytes=None):
            return readahead.read_ahead_in_order(sources, rings[:1], total_bytes=0)

        for module in (indexing, recopy):
            module.read_ahead = synchronous  # type: ignore[attr-defined]
        survey.read_ahead_in_order = synchronous_in_order  # type: ignore[attr-defined]
        for name in _KERNEL_MODULES:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            for attr, obj in list(vars(module).items()):
                if isinstance(obj, (Dispatcher, Kernel)):  # numba's, or the module built ahead of time
                    setattr(module, attr, timed(obj, "kernel"))
            if hasattr(module, "_KERNELS"):  # _crc_kernels' variants
                module._KERNELS = {v: tuple(timed(f, "kernel") for f in fns) for v, fns in module._KERNELS.items()}
        for attr in _IO_CALLS:
            if hasattr(os, attr):
                setattr(os, attr, timed(getattr(os, attr), "io"))
        # the timers' own cost per call (two clock reads and the wrapper), taken out of the Python CPU below
        probe = timed(len, "kernel")
        t = clock()
        for _ in range(20000):
            probe(())
        bare = clock()
        for _ in range(20000):
            len(())
        overhead = max((bare - t) - (clock() - bare), 0.0) / 20000

        def phase(fn, label):
            def wrapper(*args, **kwargs):
                before = dict(acc)
                t = clock()
                try:
                    return fn(*args, **kwargs)
                finally:
                    p = phases.setdefault(label, {"cpu": 0.0, "kernel": 0.0, "io": 0.0, "calls": 0})
                    p["cpu"] += clock() - t
                    for key in ("kernel", "io", "calls"):
                        p[key] += acc[key] - before[key]
            return wrapper
        round_mod.survey_log = phase(round_mod.survey_log, "survey")  # type: ignore[attr-defined]
        round_mod.build_offset_map = phase(round_mod.build_offset_map, "index")  # type: ignore[attr-defined]
        group_runs.clean_group = phase(group_runs.clean_group, "recopy")  # type: ignore[attr-defined]
        rounds = []
        for _ in range(repeats):
            wall, cpu = one_round()
            split = {"wall_s": wall, "cpu_s": cpu, "kernel_s": acc["kernel"], "io_s": acc["io"], "calls": acc["calls"],
                     "python_s": cpu - acc["kernel"] - acc["io"] - overhead * acc["calls"], "phases": {}}
            for label, p in phases.items():
                split["phases"][label] = {"cpu_s": p["cpu"], "kernel_s": p["kernel"], "io_s": p["io"],
                                          "python_s": p["cpu"] - p["kernel"] - p["io"] - overhead * p["calls"]}
            rounds.append(split)
        return {"rounds": rounds, "timer_overhead_us": overhead * 1e6}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cpu_split(args, scales: dict) -> dict:
    """`cpu_split_child` per workload, in a child process running this tree; prints the table."""
    out = {}
    print(f"\n### The round's CPU on one thread: kernels, I/O and Python (holding the GIL), per round (median of "
          f"{args.cpu_split} rounds; read-ahead made synchronous; the timers' cost taken out)\n")
    print("| workload | round CPU s | kernels s | I/O s | Python s | Python % of the CPU | Python: survey / index / "
          "recopy / rest s |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in args.workloads.split(","):
        src, manifest = _pristine(name, scales[name], args.data_dir)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cpu-split-child", str(src), str(manifest["now_ms"]),
               str(int(args.dedupe_mb * 2**20)), str(args.cpu_split)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        if res.returncode:
            raise RuntimeError(f"--cpu-split of {name} failed:\n{res.stderr[-3000:]}")
        result = _summary(res.stdout)
        r = sorted(result["rounds"], key=lambda x: x["python_s"])[len(result["rounds"]) // 2]
        ph = {k: r["phases"].get(k, {}).get("python_s", 0.0) for k in ("survey", "index", "recopy")}
        rest = r["python_s"] - sum(ph.values())
        print(f"| {name} | {r['cpu_s']:.2f} | {r['kernel_s']:.2f} | {r['io_s']:.2f} | **{r['python_s']:.3f}** | "
              f"{_pct(r['python_s'], r['cpu_s']):.1f}% | {ph['survey']:.3f} / {ph['index']:.3f} / {ph['recopy']:.3f} / "
              f"{rest:.3f} |", flush=True)
        out[name] = result
    return out


# ---- main --------------------------------------------------------------------------------------------------------


def reanalyze(args) -> None:
    """The report of an earlier run, from its results JSON and the raw py-spy files next to it."""
    dump = json.loads(args.reanalyze.read_text())
    raw_dir = args.reanalyze.parent / "raw"
    args.rate = float(dump["args"]["rate"])
    print(f"# GIL share per phase (reanalysed): run of {dump['started'][:16]} UTC, code {dump['code']}")
    results = []
    for res in dump["results"]:
        for run in res["runs"]:
            tag = f"{res['workload']}-{'verify-' if run['verify'] else ''}{run['repeat']}"
            run["profile"] = profile_pair(raw_dir / f"{tag}-gil.txt", raw_dir / f"{tag}-all.txt", args.rate,
                                          run["gil"], run["gil_wall_s"])
        results.append(res)
    report(results, args)
    if dump.get("codecs"):
        print("\n(codec check of that run in its JSON)")


def _parse_scales(text: str) -> dict[str, float]:
    scales = dict(DEFAULT_SCALES)
    for part in filter(None, text.split(",")):
        k, _, v = part.partition("=")
        scales[k.strip()] = float(v)
    return scales


def _versions() -> str:
    from importlib.metadata import version

    names = ("numpy", "numba", "crc32c", "lz4", "zstandard", "cramjam", "py-spy")
    out = []
    for n in names:
        try:
            out.append(f"{n} {version(n)}")
        except Exception:  # noqa: BLE001 - a missing package is reported as such
            out.append(f"{n} ?")
    return ", ".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="W1,W2,W3,W4")
    parser.add_argument("--scales", default="", help="e.g. W1=4,W2=2 (defaults: %s)" % DEFAULT_SCALES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verify-repeats", type=int, default=1)
    parser.add_argument("--rate", type=float, default=100.0, help="py-spy samples per second")
    parser.add_argument("--nonblocking", action="store_true", help="py-spy --nonblocking (no pause per sample)")
    parser.add_argument("--dedupe-mb", type=float, default=256)
    parser.add_argument("--quiet-cpus", type=float, default=0.5,
                        help="before each run, wait until other processes use fewer CPUs than this (over 2 s)")
    parser.add_argument("--quiet-wait-s", type=float, default=60, help="... but no longer than this")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data" / "gil-profile")
    parser.add_argument("--codec-check", action="store_true")
    parser.add_argument("--codec-check-only", action="store_true")
    parser.add_argument("--cpu-split", type=int, default=0, metavar="ROUNDS",
                        help="also measure the round's CPU on one thread (kernels, I/O, Python), ROUNDS rounds each")
    parser.add_argument("--cpu-split-only", action="store_true", help="only --cpu-split (default 3 rounds)")
    parser.add_argument("--cpu-split-child", nargs=4, metavar=("SRC", "NOW_MS", "DEDUPE", "ROUNDS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--reanalyze", type=Path, metavar="RESULTS_JSON",
                        help="report again from a results JSON of an earlier run and its raw py-spy files (no run)")
    args = parser.parse_args()
    if args.cpu_split_child:
        src, now_ms, dedupe, rounds = args.cpu_split_child
        print(json.dumps(cpu_split_child(Path(src), int(now_ms), int(dedupe), int(rounds))))
        return
    if args.codec_check_only:
        codec_check()
        return
    if args.reanalyze:
        reanalyze(args)
        return
    if not PY_SPY.exists():
        sys.exit(f"py-spy not found at {PY_SPY}: pip install py-spy (the bench extra)")
    args.data_dir = args.data_dir.resolve()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    scales = _parse_scales(args.scales)
    if args.cpu_split_only:
        args.cpu_split = args.cpu_split or 3
        print(f"# The round's CPU split: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, code {_code_state()}; "
              f"load average {os.getloadavg()[0]:.2f}")
        cpu_split(args, scales)
        return
    started = dt.datetime.now(dt.timezone.utc)
    print(f"# GIL share per phase: {started:%Y-%m-%d %H:%M} UTC, code {_code_state()}")
    print(f"python {platform.python_version()}, {_versions()}; {os.cpu_count()} CPUs; load average "
          f"{os.getloadavg()[0]:.2f}; py-spy rate {args.rate:g} Hz; dedupe buffer {args.dedupe_mb:g} MiB")
    results = [bench_workload(w, scales[w], args) for w in args.workloads.split(",")]
    table = report(results, args)
    split = cpu_split(args, scales) if args.cpu_split else None
    codecs = codec_check() if args.codec_check else None
    dump = {"started": started.isoformat(), "code": _code_state(), "args": {k: str(v) for k, v in vars(args).items()},
            "table": table, "codecs": codecs, "cpu_split": split, "results": [
                {**res, "runs": [{**r, "profile": {k: (dict(v) if isinstance(v, (dict, Counter)) else v)
                                                   for k, v in vars(r["profile"]).items()
                                                   if k not in ("holder_leaves", "holder_phases", "steps")}}
                                 for r in res["runs"]]} for res in results]}
    out = args.data_dir / f"results-{started:%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(dump, indent=1, default=str))
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}; raw py-spy files in {args.data_dir / 'raw'}; "
          f"all figures in {out}")


if __name__ == "__main__":
    main()
