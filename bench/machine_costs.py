"""Two costs of this machine that a whole `logcleaner clean` process pays and a `cp -r` + `sync` does not (issue 19).

- `memory`: the first touch of fresh anonymous memory in a new process, against touching it again after an unmap
  in the same process, with and without transparent huge pages (`MADV_HUGEPAGE`, as the offset map is made).
  Each row is a fresh child process, started `--pause-s` after the last one, that maps 256 MiB, writes one byte
  per 4 KiB page, unmaps, and does it again; then hands the pages back with `MADV_DONTNEED` (as
  `OffsetMap.clear` does between a daemon's rounds), waits `--pause-s` and touches them a third time.
  A VM whose balloon device reports free pages to its host (virtio-balloon `FREE_PAGE_REPORTING`) gets free
  2 MiB blocks taken back by the host, so a huge page's first touch waits for the host to back it again.
- `unlink`: removing a 128 MiB file that was written and synced, with its pages in the page cache and without
  (`posix_fadvise(DONTNEED)` first), serially: the time the call takes and the CPU it uses. A file system mounted
  with `discard` may trim the freed blocks inside the call. A round's replaced segments are removed this way at
  its end (`segments.files.fileio.BackgroundRemover`), so a one-shot `clean` of one partition waits for them.

It also prints what it finds of both conditions (the mount options of `--data-dir`, the balloon's features).
Median of `--repeats` fresh processes or files per row. A benchmark measures; it never asserts a time.

Usage: python bench/machine_costs.py [--repeats 5] [--pause-s 3] [--data-dir bench/data]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
MIB = 1 << 20
TOUCH_BYTES = 256 * MIB
FILE_BYTES = 128 * MIB
FILES = 4
FREE_PAGE_REPORTING_BIT = 5  # virtio-balloon feature VIRTIO_BALLOON_F_REPORTING
VIRTIO_ID_BALLOON = "0x0005"


def _touch(view: memoryview) -> float:
    started = time.perf_counter()
    for position in range(0, TOUCH_BYTES, 4096):
        view[position] = 1
    return time.perf_counter() - started


def _touch_three_times(huge: bool, pause_s: float) -> list[float]:
    """(child) Seconds to write one byte per page of a fresh 256 MiB mapping; again in a new mapping after an
    unmap; and again after `MADV_DONTNEED` (what `OffsetMap.clear` does between a daemon's rounds) and a pause."""
    times = []
    for _ in range(2):
        mapping = mmap.mmap(-1, TOUCH_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if huge:
            mapping.madvise(mmap.MADV_HUGEPAGE)
        view = memoryview(mapping)
        times.append(_touch(view))
        if len(times) == 2:
            mapping.madvise(mmap.MADV_DONTNEED)
            time.sleep(pause_s)
            times.append(_touch(view))
        view.release()
        mapping.close()
    return times


def _fresh_child(huge: bool, pause_s: float) -> list[float]:
    time.sleep(pause_s)  # what the previous child freed has been reported to the host by then, if it is reported
    child = subprocess.run([sys.executable, __file__, "--child-touch", str(int(huge)), "--pause-s", str(pause_s)],
                           check=True, capture_output=True, text=True)
    return json.loads(child.stdout)


def _memory_rows(repeats: int, pause_s: float) -> list[str]:
    rows = []
    for huge in (True, False):
        runs = [_fresh_child(huge, pause_s) for _ in range(repeats)]
        first, again, cleared = (statistics.median(r[i] for r in runs) * 1e3 for i in range(3))
        rows.append(f"| {'2 MiB (MADV_HUGEPAGE)' if huge else '4 KiB'} | {first:.0f} | {first / 256:.2f} | "
                    f"{again:.0f} | {again / 256:.2f} | {first / again:.1f}x | {cleared:.0f} | {cleared / 256:.2f} |")
    return rows


def _write_file(path: Path) -> None:
    block = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(FILE_BYTES // MIB):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())


def _unlink_rows(folder: Path, repeats: int) -> list[str]:
    rows = []
    folder.mkdir(parents=True, exist_ok=True)
    for cached in (True, False):
        walls, cpus = [], []
        for _ in range(repeats):
            paths = [folder / f"machine-costs-{i}" for i in range(FILES)]
            for path in paths:
                _write_file(path)
                if not cached:
                    fd = os.open(path, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)
            time.sleep(0.5)
            for path in paths:
                started, cpu = time.perf_counter(), time.thread_time()
                os.unlink(path)
                walls.append(time.perf_counter() - started)
                cpus.append(time.thread_time() - cpu)
        wall, cpu = statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3
        rows.append(f"| {'in the page cache' if cached else 'evicted first'} | {wall:.1f} | {cpu:.1f} | "
                    f"{wall * 1024 / (FILE_BYTES / MIB):.0f} |")
    folder.rmdir()
    return rows


def _mount_options(folder: Path) -> str:
    best = ("", "")
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and str(folder.resolve()).startswith(fields[1]) and len(fields[1]) >= len(best[0]):
            best = (fields[1], f"{fields[2]} on {fields[1]} ({fields[3]})")
    return best[1] or "unknown"


def _free_page_reporting() -> str:
    for device in Path("/sys/bus/virtio/devices").glob("*"):
        try:
            if (device / "device").read_text().strip() == VIRTIO_ID_BALLOON:
                bits = (device / "features").read_text().strip()
                return "on" if len(bits) > FREE_PAGE_REPORTING_BIT and bits[FREE_PAGE_REPORTING_BIT] == "1" else "off"
        except OSError:
            continue
    return "no virtio balloon"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=BENCH / "data")
    parser.add_argument("--pause-s", type=float, default=3.0,
                        help="seconds before each fresh process (a bench's copy separates two cleans; the kernel "
                             "reports free pages about 2 s after they are freed)")
    parser.add_argument("--child-touch", type=int, choices=(0, 1), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_touch is not None:
        print(json.dumps(_touch_three_times(bool(args.child_touch), args.pause_s)))
        return
    print(f"data dir: {_mount_options(args.data_dir)}; virtio-balloon free page reporting: {_free_page_reporting()}")
    print()
    print(f"First touch of {TOUCH_BYTES // MIB} MiB of anonymous memory in a fresh process, again after an unmap, and "
          f"again after MADV_DONTNEED and {args.pause_s:g} s (median of {args.repeats} processes):")
    print()
    print("| pages | first touch ms | ms per MiB | again ms | ms per MiB | first / again | after DONTNEED and the pause ms "
          "| ms per MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in _memory_rows(args.repeats, args.pause_s):
        print(row)
    print()
    print(f"Removing a written and synced {FILE_BYTES // MIB} MiB file (median of {args.repeats * FILES} files):")
    print()
    print("| its pages | unlink ms | CPU ms | ms per GiB |")
    print("|---|---:|---:|---:|")
    for row in _unlink_rows(args.data_dir / "machine-costs", args.repeats):
        print(row)


if __name__ == "__main__":
    main()
