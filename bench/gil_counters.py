"""Issue 22's GIL share measured with counters instead of samples: CPU time each thread spends holding the GIL.

`bench/gil_profile.py` samples with `py-spy record --gil`, which also counts part of a GIL-free system call as
GIL-held (bench/RESULTS.md, ninth round: a thread that only loops over `os.pwrite` showed 11% of its wall time
"under the GIL"). This script measures the same quantity another way, in one process, for one round:

1. a fresh `cp -r` + `sync` copy of the partition (warm page cache), opened in cleaner mode;
2. every call that releases the GIL is wrapped with the calling thread's CPU clock (`time.thread_time`): the
   built kernels (every variant of every `segments.codec.compiled.Kernel`), the file system calls a round makes
   (`os.pread`, `os.preadv`, `os.pwrite`, `os.fsync`, `os.posix_fadvise`, renames and removals) and the
   mapping, populate and unmapping of a mapped window (`segments.files.mapped`, ctypes calls) and the copy of a
   cleaned segment's output into its direct-write staging buffer (`segments.files.direct._copy`, numpy: no GIL);
3. one `cleaner.round.clean_round` on the main thread (its read-ahead threads are the kept producer threads of
   `segments.files.readahead`); the CPU time of every thread of the process is read from its own CPU clock
   before and after;
4. GIL-held CPU = the threads' CPU time in the round minus their CPU time inside the wrapped calls. Waiting for
   the GIL takes no CPU, so it is not counted; C code that keeps the GIL (numpy's small operations, page
   faults taken under it) is. The share is GIL-held CPU over the round's wall time: the fraction of the round
   during which some thread held the GIL, the figure that bounds how far more threads can scale.

The wrappers run under the GIL themselves (a few µs a call, ~2,500 calls a GB); their cost falls on the
GIL-held side, so the share is, if anything, overstated by them. A benchmark measures; it never asserts a time.

Usage: python bench/gil_counters.py PARTITION_DIR [PARTITION_DIR ...] [--runs 3] [--dedupe-mb 256]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NOW_MS = 1_900_000_000_000
_free = threading.local()  # per thread: CPU seconds inside GIL-free calls


def _counted(function):
    def wrapper(*args, **kwargs):
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            _free.seconds = getattr(_free, "seconds", 0.0) + time.thread_time() - started
            _by_thread[threading.get_ident()] = _free.seconds
    return wrapper


_by_thread: dict[int, float] = {}


_instrumented: list[bool] = []
_kernels_done: set[int] = set()


def _instrument() -> None:
    """Wrap every GIL-releasing call a round makes (see the module docstring), once per process."""
    if _instrumented:
        return
    _instrumented.append(True)
    import importlib

    import segments.codec.compiled as compiled
    import segments.files.direct as direct
    import segments.files.mapped as mapped

    for path in sorted(ROOT.glob("*/**/_*kernels.py")):  # every kernel module, imported now: they load lazily
        if path.parts[len(ROOT.parts)] in ("segments", "offsetmap", "cleaner"):
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))

    for name in ("open", "close", "read", "write", "pread", "preadv", "pwrite", "fsync", "fdatasync", "ftruncate",
                 "posix_fadvise", "stat", "fstat", "lstat", "rename", "replace", "remove", "unlink"):
        setattr(os, name, _counted(getattr(os, name)))
    for name in ("_map", "_populate", "_unmap"):
        setattr(mapped, name, _counted(getattr(mapped, name)))
    direct._copy = _counted(direct._copy)
    for module in list(sys.modules.values()):
        for value in list(vars(module).values()) if module is not None else ():
            if isinstance(value, compiled.Kernel) and id(value) not in _kernels_done:
                value._variants = [(_counted(function), checks) for function, checks in value._variants]
                _kernels_done.add(id(value))


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of every live thread, by ident, from its own CPU clock."""
    found = {}
    for thread in threading.enumerate():
        try:
            found[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, TypeError):  # ended meanwhile
            continue
    return found


def _one(partition: Path, run_dir: Path, dedupe_bytes: int) -> dict[str, float]:
    from cleaner.round import clean_round
    from cleaner.settings import Settings
    from offsetmap import OffsetMap
    from segments.partition.log import PartitionLog

    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    target = run_dir / partition.name
    subprocess.run(["cp", "-r", str(partition), str(target)], check=True)
    subprocess.run(["sync"], check=True)
    topic = Settings.from_mappings({"cleanup.policy": "compact"}).topic(partition.name.rsplit("-", 1)[0])
    offset_map = OffsetMap(dedupe_bytes)
    with PartitionLog.open(target, mode="cleaner") as log_:
        _instrument()  # after the open: the kernel modules are imported by then
        free_before = dict(_by_thread)
        cpu_before = _thread_cpu()
        started = time.monotonic()
        result = clean_round(log_, topic, offset_map, now_ms=NOW_MS, seed=7)
        wall = time.monotonic() - started
        cpu_after = _thread_cpu()
        free_after = dict(_by_thread)
    cpu = sum(cpu_after[t] - cpu_before.get(t, 0.0) for t in cpu_after)
    free = sum(free_after[t] - free_before.get(t, 0.0) for t in free_after)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"wall_s": wall, "round_s": result.elapsed_s, "cpu_s": cpu, "gil_free_cpu_s": free,
            "gil_held_s": cpu - free, "share": (cpu - free) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("partitions", nargs="+", type=Path, help="partition directories (copies are cleaned)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dedupe-mb", type=float, default=256)
    parser.add_argument("--data-dir", type=Path, default=ROOT / "bench" / "data" / "gil-counters")
    args = parser.parse_args()
    from cleaner.allocator import limit_blas_threads, tune_allocator

    limit_blas_threads()  # as every logcleaner process does
    tune_allocator()
    print("| partition | round wall s | threads' CPU s | CPU in GIL-free calls s | GIL-held CPU s | GIL-held share of the "
          "round (per run) |")
    print("|---|---:|---:|---:|---:|---|")
    for partition in args.partitions:
        runs = [_one(partition.resolve(), args.data_dir, int(args.dedupe_mb * 2**20)) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        shares = ", ".join(f"{100 * r['share']:.0f}%" for r in runs)
        print(f"| {partition.name} | {med['wall_s']:.2f} | {med['cpu_s']:.2f} | {med['gil_free_cpu_s']:.2f} | "
              f"{med['gil_held_s']:.2f} | **{100 * med['share']:.0f}%** ({shares}) |", flush=True)


if __name__ == "__main__":
    main()
