"""numba's kernels compiled in a child process, so that a cleaning process never holds LLVM's compile memory.

numba compiles a kernel at its first call when its on-disk cache has nothing for this machine: ~10 s, and
~80-100 MB more peak RSS in the process that compiles (bench/RESULTS.md: compile runs peaked ~90 MiB above
cached ones). `ensure_compiled()` runs before a process's first round: when the stamp says the cache was
filled for these kernel sources, this numba and this CPU, it returns at once; otherwise it runs `python -m
cleaner.kernel_cache`, which cleans small synthetic logs (every codec, legacy v0/v1, transactions, tombstones,
the safety check) so that every kernel is compiled with the argument types a round uses, writes the stamp, and
exits; the caller then only loads from the cache. If the child fails, or the cache directory cannot be
written, the round compiles in-process as before (slower to start, bigger, never wrong).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["ensure_compiled", "stamp_path"]

log = logging.getLogger(__name__)

_PACKAGES = ("segments", "offsetmap", "cleaner")  # the kernels, and every module whose constants they freeze
_CHILD_TIMEOUT_S = 600
_NOW_MS = 1_900_000_000_000


def _package_root() -> Path:
    return Path(__file__).resolve().parents[1]


def _fingerprint() -> str:
    """What numba's cache depends on: the sources (every module of the three packages, by name, size and
    mtime, as numba stamps a kernel's file), numba's version, the Python and the CPU."""
    digest = hashlib.sha256()
    root = _package_root()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            st = path.stat()
            digest.update(f"{path.relative_to(root)} {st.st_size} {st.st_mtime_ns}\n".encode())
    spec = importlib.util.find_spec("numba")
    if spec is not None and spec.origin:
        st = Path(spec.origin).stat()
        digest.update(f"numba {spec.origin} {st.st_size} {st.st_mtime_ns}\n".encode())
    digest.update(sys.version.encode())
    digest.update(platform.machine().encode())
    try:
        cpu = Path("/proc/cpuinfo").read_text(errors="replace")
        digest.update("".join(line for line in cpu.splitlines(True) if line.startswith(("model name", "flags")))
                      .encode()[:8192])
    except OSError:
        digest.update(platform.processor().encode())
    return digest.hexdigest()


def stamp_path() -> Path:
    """Where the stamp lives: with numba's cache (NUMBA_CACHE_DIR if set, else the kernels' `__pycache__`)."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured) / "logcleaner-kernels.stamp"
    return _package_root() / "segments" / "codec" / "__pycache__" / "logcleaner-kernels.stamp"


_lock = threading.Lock()
_outcome: list[bool] = []  # the first call's answer, once known


def ensure_compiled() -> bool:
    """Make sure numba's on-disk cache holds every kernel before this process runs one (once per process;
    the daemon's threads wait for the first caller).

    Returns True if the cache is known to be filled (the stamp matched, or the child filled it), False if
    the process will compile in-process (the child failed or the cache directory is not writable)."""
    if _outcome:
        return _outcome[0]
    with _lock:
        if not _outcome:
            _outcome.append(_fill_cache())
    return _outcome[0]


def _fill_cache() -> bool:
    stamp = stamp_path()
    try:
        fingerprint = _fingerprint()
        if stamp.exists() and stamp.read_text().strip() == fingerprint:
            return True
        stamp.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(stamp.parent, os.W_OK):
            return False
    except OSError:
        return False
    log.info("compiling the cleaner's kernels in a child process (once per installation and machine)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_package_root()), env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", "cleaner.kernel_cache"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=_CHILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("compiling the kernels in a child process failed (%s); compiling in this process", exc)
        return False
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        log.warning("compiling the kernels in a child process failed (exit %d: %s); compiling in this process",
                    done.returncode, tail[0])
        return False
    return True


def _warm_up_logs(root: Path) -> list[Path]:
    """Small partitions whose rounds call every kernel: every codec, legacy v0 and v1 wrappers, a
    transactional producer with commits and aborts, tombstones."""
    from segments.codec import format as fmt
    from segments.codec.legacy import encode_legacy_wrapper
    from segments.codec.records import Record, encode_batch, encode_control_batch
    from segments.partition.log import LogConfig, PartitionLog
    from segments.tools.generate import WorkloadSpec, generate_partition

    parts = []
    for codec, name in sorted(fmt.COMPRESSION_NAMES.items()):
        part = root / f"warm{name}-0"
        generate_partition(part, WorkloadSpec(records=600, keys=40, records_per_batch=10, tombstone_fraction=0.2,
                                              compression=codec, segment_bytes=8 * 1024))
        parts.append(part)
    part = root / "warmtxn-0"
    with PartitionLog.open(part, mode="writer", create=True, config=LogConfig(segment_bytes=4 * 1024)) as log_:
        for i in range(60):
            key = b"k%d" % (i % 7)
            value = None if i % 5 == 0 else b"v%d" % i
            records = [Record(offset=0, timestamp=1_700_000_000_000 + i, key=key, value=value)]
            log_.append_batches(encode_batch(records, base_offset=0, is_transactional=True, producer_id=9,
                                             producer_epoch=0, base_sequence=i,
                                             compression=(fmt.COMPRESSION_LZ4 if i % 2 else fmt.COMPRESSION_NONE)))
            if i % 3 == 2:
                kind = fmt.CONTROL_TYPE_ABORT if i % 9 == 8 else fmt.CONTROL_TYPE_COMMIT
                log_.append_batches(encode_control_batch(offset=0, control_type=kind, timestamp=1_700_000_000_000 + i,
                                                         producer_id=9, producer_epoch=0))
        log_.roll()
    parts.append(part)
    for magic in (fmt.MAGIC_V0, fmt.MAGIC_V1):
        part = root / f"warmlegacy{magic}-0"
        part.mkdir()
        wrappers = []
        for i in range(0, 60, 3):
            inner = [Record(offset=i + j, timestamp=(-1 if magic == fmt.MAGIC_V0 else 1_700_000_000_000 + i),
                            key=b"k%d" % ((i + j) % 5), value=b"v%d" % i) for j in range(3)]
            wrappers.append(encode_legacy_wrapper(inner, magic=magic, codec=fmt.COMPRESSION_GZIP))
        # Legacy entries are not appended (a broker writes v2 only): the segment is written whole, as an old
        # broker left it; its indexes are rebuilt when the log is opened.
        (part / fmt.offset_file_name(0, fmt.LOG_SUFFIX)).write_bytes(b"".join(wrappers))
        with PartitionLog.open(part, mode="writer") as log_:
            log_.roll()
        parts.append(part)
    return parts


def _warm_up() -> None:
    """Compile every kernel a round runs (the child's work), then write the stamp."""
    from offsetmap import OffsetMap
    from segments.files.readahead import WindowRing
    from segments.partition.log import PartitionLog

    from .round import clean_round
    from .settings import Settings
    from .survey import WINDOW_BYTES

    fingerprint = _fingerprint()
    with tempfile.TemporaryDirectory(prefix="logcleaner-warm-up-") as tmp:
        for part in _warm_up_logs(Path(tmp)):
            topic = Settings.from_mappings({"cleanup.policy": "compact", "delete.retention.ms": 0}).topic(
                part.name.rsplit("-", 1)[0])
            for verify in (True, False):
                with PartitionLog.open(part, mode="cleaner") as log_:
                    clean_round(log_, topic, OffsetMap(1 << 20), now_ms=_NOW_MS, seed=7, verify=verify,
                                force_recopy=True, ring=WindowRing(WINDOW_BYTES))
    stamp = stamp_path()
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp_stamp = stamp.with_name(stamp.name + f".{os.getpid()}.tmp")
    tmp_stamp.write_text(fingerprint + "\n")
    os.replace(tmp_stamp, stamp)


if __name__ == "__main__":
    _warm_up()
